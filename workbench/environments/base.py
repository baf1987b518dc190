"""The environment contract: `BaseEnvironment`, the thing a model acts in.

An environment is a plain Python class with the seeds' API:

    obs = env.reset()                          # -> str, the first observation
    obs, reward, done, info = env.step(action) # action is the model's text
    env.get_state_description()                # -> str, current state as text
    env.is_done(), env.max_steps, env.get_prompt_prefix()

The base class owns episode bookkeeping so subclasses stay small: every call to a
subclass's `reset` first sets `step_count = 0` and `_done = False`, and every call
to its `step` increments `step_count`, records `done`, and ends the episode with
`info["truncated"] = True` once `max_steps` is reached. This is done by wrapping the
subclass methods in `__init_subclass__`, so the seed's Simple Text Game (which only
sets `self._done`) runs unchanged.

Seeding: `env.reset(seed=3)` reseeds `env.rng` (a `random.Random`) before the
subclass's reset runs; environments draw all randomness from `self.rng`.

Optional hooks: `get_tools()` returns tools the model may call in this environment
(see `workbench.tools`), `action_parser` names a parser ("json", "react",
"function_calling") when the environment expects tool calls, `end_episode()` frees what
an episode holds outside the process (a server session) when the rollout ends it, and
`expert_action()` gives a scripted expert's reply in the current state (what the SFT
warm-up learns from, `workbench.training.sft`).

An environment whose server has no room for another episode right now raises
`EnvironmentBusy` from `reset`; the rollout keeps that episode waiting and resets it
again when one of its own episodes ends (see `workbench.rollout.waiting`).

Strict format: `config.strict_format` (`environment.strict_format` in a run's config) is
read here, once, into `env.strict_format`. An environment that has a strict mode sets the
class attribute `supports_strict_format = True` and, when `self.strict_format` is set,
takes only a reply that is exactly the action (whitespace around it allowed) and answers
anything else with a format error: an observation saying what to write, and
`info["invalid_action"] = True` plus `info["parse_error"] = "<why>"` (which the rollout
records as the turn's `parse_error`). The rollout builds the environment's parser strict
too (`workbench.tools.MultiTurnManager`). Asking a class without a strict mode for one
raises a `ConfigError`, so the setting is never ignored in silence.

Constrained decoding: `config.constrained_decoding` is read into `env.constrained_decoding`.
An environment whose action format is a grammar overrides `action_constraint()` to return it
(a `workbench.engines.constraints.Constraint`: a regex, choices, a JSON schema, tool calls);
the rollout then samples every model turn under it, so a reply is always in the format. A
class that does not override it refuses the setting with a `ConfigError`.
"""
from __future__ import annotations

import functools
import math
import random
from typing import Any, Mapping

from workbench.config import ConfigError, EnvironmentConfig

StepResult = tuple[str, float, bool, dict]


class EnvironmentError_(RuntimeError):
    """Raised for misuse of an environment (e.g. stepping a finished episode)."""


class EnvironmentBusy(RuntimeError):
    """Raised by `reset` when the environment's server has no room for another episode
    now: it serves a limited number at once and all are taken (an OpenEnv server at its
    `max_concurrent_envs`). Nothing was started. A rollout keeps the episode waiting and
    resets it again when one of its own episodes ends; the message says what holds the
    room (the server's own words when it refused)."""


def as_environment_config(config: EnvironmentConfig | Mapping[str, Any] | None) -> EnvironmentConfig:
    """`config` as an EnvironmentConfig: itself, read from a dict, or the defaults for None."""
    if config is None:
        return EnvironmentConfig()
    if isinstance(config, EnvironmentConfig):
        return config
    if isinstance(config, Mapping):
        return EnvironmentConfig.from_dict(dict(config))
    raise TypeError(
        f"environment config must be an EnvironmentConfig, a dict or None, got {type(config).__name__}"
    )


class BaseEnvironment:
    """Base class for text environments. Subclass and implement `reset` and `step`.

    Attributes:
        config: the `EnvironmentConfig` (a dict passed in is converted; unknown keys
            land in `config.params`).
        params: shortcut for `config.params`, environment-specific settings.
        max_steps: episode length limit (from the config).
        step_count: steps taken in the current episode.
        rng: `random.Random` seeded from `config.seed` or `reset(seed=...)`.

    Seeding: the rollout resets every episode with `reset(seed=s)`; the episodes of one
    GRPO group share `s` and must be the same task. The wrapper installed around a
    subclass's `reset` calls `self.seed(s)` (a fresh `self.rng = random.Random(s)`)
    *before* the subclass's own `reset()` runs, which is why that `reset` takes no seed
    argument. So:

      * draw every random choice from `self.rng` (for numpy:
        `np.random.default_rng(self.rng.getrandbits(64))`), never from the global
        `random` / `numpy.random` modules, time or `hash()` of strings;
      * to seed a wrapped library, derive its seed from `self.rng` in `reset`
        (`lib_env.reset(seed=self.rng.getrandbits(31))`) or override `seed(seed)` to
        remember `seed` and pass it on at the next reset (`GymTextEnvironment`,
        `TextArenaEnvironment` do this), calling `super().seed(seed)` first;
      * a library that only draws from the global RNG must run with its own saved
        state: swap it in around each call and back out (`TextArenaEnvironment` shows
        how), or episodes of one group differ.

    `check_env` tests this (check `global_rng`; `fresh_process=True` for per-process state).

    `info` keys that workbench reads (all optional; any others are kept in the
    trajectory as they are):

      * `success` (bool): the episode reached its goal; `Episode.success` is True when
        any step said so, and `env/success_rate` averages it. An environment whose steps never
        say (and whose `reports_success` is not True) has no success rate: NaN, shown "-".
      * `invalid_action` (bool): the reply could not be used as an action (give a hint
        in the observation rather than raising; the tool manager also sets it when a
        tool call cannot be parsed); `RewardManager(invalid_action_penalty=...)`
        subtracts that penalty once per flagged turn.
      * `truncated` (bool): the episode ended by a limit, not by its goal; the base
        class sets it when `max_steps` is reached.
      * `parse_error` (str): the reply was not in the action format (a strict-format
        refusal); the rollout records it as the turn's `parse_error`, which
        `env/parse_error_rate` and the run doctor's format-errors check count. Set
        `invalid_action` with it.
    """

    #: Name of the action parser this environment expects, or None for plain text.
    action_parser: str | None = None
    #: Whether this environment reports success (`info["success"]`, True or False, on its
    #: steps): True says it always can, so a batch where no step mentioned it (every reply
    #: invalid) has a success rate of 0; None (the default) judges by the infos seen, so a task
    #: that has no success (judged by a reward model, say) shows its success rate as not
    #: reported ("-") instead of a false 0.
    reports_success: bool | None = None
    #: Whether this class has a strict format mode (see the module docstring); a config
    #: with `strict_format=True` is refused by a class that leaves this False.
    supports_strict_format: bool = False

    def __init__(self, config: EnvironmentConfig | Mapping[str, Any] | None = None):
        self.config = as_environment_config(config)
        self.params: dict[str, Any] = self.config.params
        self.max_steps: int = self.config.max_steps
        self.step_count: int = 0
        self._done: bool = False
        self.last_observation: str = ""
        self.rng = random.Random(self.config.seed)
        self._seed = self.config.seed
        #: Strict action format (`config.strict_format`; see the module docstring).
        strict = getattr(self.config, "strict_format", False)
        if not isinstance(strict, bool):
            raise ConfigError(f"environment.strict_format must be true or false, got {strict!r}")
        self.strict_format: bool = strict
        if self.strict_format and not type(self).supports_strict_format:
            raise ConfigError(
                f"environment.strict_format is true but {type(self).__name__} has no strict format mode "
                f"(its class does not set supports_strict_format = True); set environment.strict_format "
                f"to false, or give the environment a strict mode (refuse a reply that is not exactly the "
                f"action with an observation and info['parse_error']) and set supports_strict_format = True")
        constrained = getattr(self.config, "constrained_decoding", False)
        if not isinstance(constrained, bool):
            raise ConfigError(f"environment.constrained_decoding must be true or false, got {constrained!r}")
        #: Sample model turns under `action_constraint()` (see the module docstring).
        self.constrained_decoding: bool = constrained
        if constrained and type(self).action_constraint is BaseEnvironment.action_constraint:
            raise ConfigError(
                f"environment.constrained_decoding is true but {type(self).__name__} has no action grammar (its "
                f"class does not override action_constraint()); set environment.constrained_decoding to false, or "
                f"give the environment an action_constraint() returning a workbench.engines.constraints.Constraint")

    # -- seed-compatible aliases ------------------------------------------------
    @property
    def done(self) -> bool:
        """Whether the episode has ended (alias of `_done`, used by seed 000)."""
        return self._done

    @done.setter
    def done(self, value: bool) -> None:
        self._done = bool(value)

    # -- subclass API -------------------------------------------------------------
    def reset(self) -> str:  # pragma: no cover - always overridden
        """Start a new episode and return the first observation."""
        raise NotImplementedError(f"{type(self).__name__} must implement reset() -> str")

    def step(self, action: str) -> StepResult:  # pragma: no cover - always overridden
        """Apply `action` and return (observation, reward, done, info)."""
        raise NotImplementedError(
            f"{type(self).__name__} must implement step(action) -> (obs, reward, done, info)"
        )

    def get_state_description(self) -> str:
        """The current state as text; defaults to the last observation."""
        return self.last_observation

    def get_prompt_prefix(self) -> str:
        """System prompt for the model. Override to describe the task."""
        return self.config.system_prompt or "You are a helpful assistant."

    def action_constraint(self) -> Any:
        """The grammar every reply must follow when `constrained_decoding` is set (a
        `workbench.engines.constraints.Constraint`, asked before each model turn), or None for
        free text. Default: None, and a class that keeps it refuses `constrained_decoding`."""
        return None

    def get_tools(self) -> list:
        """Tools the model may call in this environment (default: none)."""
        return []

    def is_done(self) -> bool:
        """True when the episode has ended or the step budget is used up."""
        return self._done or self.step_count >= self.max_steps

    def on_truncate(self, reason: str) -> float | None:
        """Settle an episode that the workbench ends before the environment does.

        Called once per episode, after its last step, when it is cut by `max_steps`,
        by the rollout's `max_turns`, or by the context budget (`reason` is
        "max_steps", "max_turns" or "context"). Return the reward the episode has earned
        so far at this point (a game's partial credit, say), or None for nothing. The
        value is added to the last turn's reward and recorded as
        `info["settled_reward"]`. Default: None (an unfinished episode earns nothing more).
        """
        return None

    def end_episode(self) -> None:
        """Free what the episode holds outside this process (a server session, a place in
        a server's limit). A rollout calls it once when an episode ends, for any reason
        (done, truncated, failed), after `on_truncate`; the next `reset()` takes them up
        again. Default: nothing."""

    def settle(self, reason: str) -> float:
        """`on_truncate(reason)` at most once per episode; 0.0 when it returns None or
        was already called. Raises ValueError for a non-finite value."""
        if getattr(self, "_settled", False):
            return 0.0
        self._settled = True
        value = self.on_truncate(reason)
        if value is None:
            return 0.0
        value = float(value)
        if not math.isfinite(value):
            raise ValueError(f"{type(self).__name__}.on_truncate({reason!r}) returned {value}; "
                             "return a finite reward or None")
        return value

    def seed(self, seed: int | None) -> None:
        """Reseed `self.rng`; the next `reset()` starts from this seed."""
        self._seed = seed
        self.rng = random.Random(seed)

    # -- bookkeeping wrappers ---------------------------------------------------
    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        if "reset" in cls.__dict__:
            cls.reset = _wrap_reset(cls.__dict__["reset"])
        if "step" in cls.__dict__:
            cls.step = _wrap_step(cls.__dict__["step"])


def _wrap_reset(user_reset):
    if getattr(user_reset, "_workbench_wrapped", False):
        return user_reset

    @functools.wraps(user_reset)
    def reset(self: BaseEnvironment, *args: Any, seed: int | None = None, **kwargs: Any) -> str:
        if seed is not None:
            self.seed(seed)
        self.step_count = 0
        self._done = False
        self._settled = False
        obs = user_reset(self, *args, **kwargs)
        if not isinstance(obs, str):
            raise TypeError(
                f"{type(self).__name__}.reset() must return the first observation as str, "
                f"got {type(obs).__name__}"
            )
        self.last_observation = obs
        return obs

    reset._workbench_wrapped = True  # type: ignore[attr-defined]
    return reset


def _wrap_step(user_step):
    if getattr(user_step, "_workbench_wrapped", False):
        return user_step

    @functools.wraps(user_step)
    def step(self: BaseEnvironment, action: str, *args: Any, **kwargs: Any) -> StepResult:
        if self._done:
            raise EnvironmentError_(
                f"{type(self).__name__}.step() called after the episode ended; call reset() first"
            )
        count_before = self.step_count
        result = user_step(self, action, *args, **kwargs)
        if not (isinstance(result, tuple) and len(result) == 4):
            raise TypeError(
                f"{type(self).__name__}.step() must return (observation, reward, done, info), "
                f"got {type(result).__name__}"
            )
        obs, reward, done, info = result
        info = dict(info or {})
        # Subclasses may count steps themselves (seed 000 does); count once either way.
        if self.step_count == count_before:
            self.step_count += 1
        done = bool(done) or self._done
        if not done and self.step_count >= self.max_steps:
            done = True
            info.setdefault("truncated", True)
            settled = self.settle("max_steps")
            if settled:
                info["settled_reward"] = settled
                reward = float(reward) + settled
        self._done = done
        self.last_observation = str(obs)
        return str(obs), float(reward), done, info

    step._workbench_wrapped = True  # type: ignore[attr-defined]
    return step
