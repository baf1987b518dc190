"""`GymTextEnvironment`: use a Gymnasium environment with text observations and
actions (`gymnasium.spaces.Text`) as a workbench `BaseEnvironment`.

    env = GymTextEnvironment(MyTextGymEnv())          # or GymTextEnvironment("MyEnv-v0")
    obs = env.reset(seed=0)                            # gym reset(seed=0), returns the obs str
    obs, reward, done, info = env.step("hello")        # done = terminated or truncated
    info["terminated"], info["truncated"]

What it maps:
  * `reset(seed=s)` calls the gym env's `reset(seed=s)`; a reset without a seed
    calls `reset()` (Gymnasium continues its own RNG), the first one after
    construction uses `config.seed`.
  * `step` returns the 4-tuple; `info` keeps the gym info and adds `terminated`
    and `truncated`. The workbench `max_steps` limit applies on top of the gym
    env's own time limit (default: the gym spec's `max_episode_steps`, else 100).
  * observations that are not str go through `obs_to_text` (default `str`);
    actions go through `text_to_action` (default: the text unchanged). Actions are
    not validated against the Text space's charset or length (a model's reply often
    is not), the gym env sees exactly what the model wrote. Without `text_to_action`
    `info["action_span"]` is the whole reply (the gym env received all of it); with one
    the adapter cannot know which part it read and sets none.
  * the system prompt is `config.system_prompt`, else the gym env's
    `metadata["system_prompt"]`, else a generic one.
  * success: `success_fn(obs, reward, terminated, truncated, info)` when given (True/False,
    or None for "not known at this step"), else the gym info's `"success"`, else its
    `"is_success"` (Gymnasium-robotics' and SB3's key), copied into `info["success"]`. An env
    that reports none of these has no success rate ("-", left out of the doctor's success
    checks), rather than a false 0.
  * global random state: every call into the gym env runs under the adapter's own
    `random`/`numpy.random` state (`GlobalRNGScope`, reseeded by each seeded reset), so a
    suite that seeds and draws from the global RNGs gives the same episode for the same seed
    in any process state and any thread, and passes `check_env`.

The wrapped env's API is checked at construction (`check_gym_api`): a TextArena env, a
question/answer dataset, a workbench environment or a `reset` that needs arguments
other than `seed`/`options` is refused with a TypeError that names the adapter to use.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping

from workbench.config import EnvironmentConfig
from workbench.environments.base import BaseEnvironment, StepResult
from workbench.environments.global_rng import GlobalRNGScope

DEFAULT_MAX_STEPS = 100


def _make(gym_env: Any, kwargs: Mapping[str, Any]) -> Any:
    if isinstance(gym_env, str):
        import gymnasium

        return gymnasium.make(gym_env, **kwargs)
    if kwargs:
        raise TypeError("gym_kwargs are only used when gym_env is an environment id (str)")
    check_gym_api(gym_env)
    return gym_env


def check_gym_api(env: Any) -> None:
    """Raise TypeError, naming the adapter to use instead, when `env` does not have
    Gymnasium's API (`reset(*, seed=None, options=None) -> (obs, info)`, `step(action)`)."""
    name = type(env).__name__
    if isinstance(env, BaseEnvironment):
        raise TypeError(f"{name} is already a workbench BaseEnvironment; use it directly, without "
                        "GymTextEnvironment")
    module = type(env).__module__ or ""
    if module.split(".")[0] == "textarena":
        raise TypeError(f"{name} is a TextArena environment (reset(num_players, seed), step -> (done, info), "
                        "rewards from close()), not a Gymnasium one; use workbench.TextArenaEnvironment(env_id) "
                        "or make_env('textarena:<env id>')")
    if callable(getattr(env, "score_answer", None)) and callable(getattr(env, "__getitem__", None)):
        raise TypeError(f"{name} looks like a question/answer dataset (score_answer, items); use "
                        "workbench.VerifierEnvironment (for reasoning-gym: make_env('reasoning_gym:<task>'))")
    if not (callable(getattr(env, "reset", None)) and callable(getattr(env, "step", None))):
        raise TypeError(f"gym_env must be a gymnasium.Env or an id, got {name}")
    try:
        signature = inspect.signature(env.reset)
    except (TypeError, ValueError):  # a builtin without a signature: nothing to check
        return
    params = signature.parameters.values()
    required = [p.name for p in params if p.default is p.empty
                and p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)]
    takes_seed = any(p.name == "seed" or p.kind == p.VAR_KEYWORD for p in params)
    if required or not takes_seed:
        what = f"requires {required}" if required else "takes no seed keyword"
        raise TypeError(f"{name}.reset{signature} {what}; GymTextEnvironment calls reset(seed=..., "
                        "options=...) and expects (obs, info) back, as Gymnasium does. For another API "
                        "write a small BaseEnvironment subclass (see workbench.environments.base), or use "
                        "TextArenaEnvironment / VerifierEnvironment where they fit.")


class GymTextEnvironment(BaseEnvironment):
    """A Gymnasium env (text observations and actions) behind the workbench API.

    Args:
        gym_env: a `gymnasium.Env` instance, or an id for `gymnasium.make`.
        config: `EnvironmentConfig` or dict; when it does not set `max_steps` the gym
            spec's `max_episode_steps` is used (else 100).
        obs_to_text: turns a non-str observation into text (default `str`).
        text_to_action: turns the model's text into the gym action (default: as is).
        success_fn: `success_fn(obs, reward, terminated, truncated, info) -> bool | None`, whether
            the step reached the goal (None: not known at this step); default: the gym info's
            "success", else "is_success".
        gym_kwargs: keyword arguments for `gymnasium.make` when `gym_env` is an id.
    """

    def __init__(
        self,
        gym_env: Any,
        config: EnvironmentConfig | Mapping[str, Any] | None = None,
        obs_to_text: Callable[[Any], str] = str,
        text_to_action: Callable[[str], Any] | None = None,
        success_fn: Callable[..., bool | None] | None = None,
        **gym_kwargs: Any,
    ):
        self._rng = GlobalRNGScope()
        with self._rng.active():  # gymnasium.make may draw from the global state too
            self.gym_env = _make(gym_env, gym_kwargs)
        spec = getattr(self.gym_env, "spec", None)
        spec_steps = getattr(spec, "max_episode_steps", None)
        env_id = getattr(spec, "id", None) or type(getattr(self.gym_env, "unwrapped", self.gym_env)).__name__
        if config is None or (isinstance(config, Mapping) and "max_steps" not in config):
            config = {"name": env_id, **dict(config or {}), "max_steps": spec_steps or DEFAULT_MAX_STEPS}
        super().__init__(config)
        self.env_id = env_id
        self.obs_to_text = obs_to_text
        self.text_to_action = text_to_action
        self.success_fn = success_fn
        self.reports_success = True if success_fn is not None else None  # else: judged by the infos
        self._seed_pending = self.config.seed is not None
        self.last_info: dict[str, Any] = {}

    # -- spaces ------------------------------------------------------------------
    @property
    def observation_space(self) -> Any:
        """The wrapped env's observation space."""
        return self.gym_env.observation_space

    @property
    def action_space(self) -> Any:
        """The wrapped env's action space."""
        return self.gym_env.action_space

    def seed(self, seed: int | None) -> None:
        """Reseed; the next `reset()` passes `seed` to the gym env's reset."""
        super().seed(seed)
        self._seed_pending = seed is not None

    # -- episode -----------------------------------------------------------------
    def _text(self, obs: Any) -> str:
        return obs if isinstance(obs, str) else self.obs_to_text(obs)

    def reset(self, options: dict | None = None) -> str:
        """Reset the gym env (with the pending seed, if any) and return the observation text."""
        kwargs: dict[str, Any] = {}
        if self._seed_pending:
            kwargs["seed"] = self._seed
            self._seed_pending = False
        if options is not None:
            kwargs["options"] = options
        with self._rng.active(seed=kwargs.get("seed")):
            obs, info = self.gym_env.reset(**kwargs)
        self.last_info = dict(info or {})
        return self._text(obs)

    def step(self, action: str) -> StepResult:
        """Step the gym env; done = terminated or truncated, both copied into info."""
        gym_action = self.text_to_action(action) if self.text_to_action else action
        with self._rng.active():
            obs, reward, terminated, truncated, info = self.gym_env.step(gym_action)
        info = dict(info or {})
        success = (self.success_fn(obs, reward, terminated, truncated, info) if self.success_fn is not None
                   else info.get("success", info.get("is_success")))
        if success is not None:
            info["success"] = bool(success)
        info["terminated"], info["truncated"] = bool(terminated), bool(truncated)
        if self.text_to_action is None and isinstance(action, str):
            info.setdefault("action_span", [0, len(action)])
        if not (terminated or truncated) and self.step_count + 1 >= self.max_steps:
            info["truncated"] = True  # the workbench max_steps limit ends this episode
        self.last_info = info
        return self._text(obs), float(reward), bool(terminated or truncated), info

    # -- text ---------------------------------------------------------------------
    def get_prompt_prefix(self) -> str:
        """`config.system_prompt`, else the gym env's `metadata["system_prompt"]`, else generic."""
        metadata = getattr(self.gym_env, "metadata", None) or {}
        return (self.config.system_prompt or metadata.get("system_prompt")
                or f"You are acting in the text environment {self.env_id}. Reply with your action as text.")

    def render(self) -> Any:
        """The gym env's `render()`."""
        with self._rng.active():
            return self.gym_env.render()

    def close(self) -> None:
        """Close the gym env."""
        self.gym_env.close()

    def __repr__(self) -> str:
        return f"GymTextEnvironment({self.env_id!r}, max_steps={self.max_steps})"
