"""`TextArenaEnvironment`: a single-player TextArena game as a workbench environment.

    env = TextArenaEnvironment("GuessTheNumber-v0")        # or make_env("textarena:GuessTheNumber-v0")
    obs = env.reset(seed=0)          # the game's player prompt (and board, if it shows one)
    obs, reward, done, info = env.step("I guess [10]")

TextArena (`pip install textarena`, tested with 0.7.4) has its own API, not Gymnasium's:
`reset(num_players, seed)` returns nothing, `step(action)` returns `(done, info)`,
observations are message lists fetched with `get_observation()`, and rewards come from
`close()` when the game is over. This adapter maps it:

  * observation: the text of the messages the player received since its last action
    (the game's echo of the player's action is left out: the model wrote it, and in a
    single-player game every action is the player's), one message per line; on the
    last step the game's closing reason is added. `get_state_description()` is the last
    observation (TextArena's board renderers are for people and can show hidden state,
    e.g. GuessTheNumber's target).
  * reward: 0 until the game ends, then the player's TextArena reward (1 for a win in
    the single-player games; a partial score such as "share of disks placed" otherwise).
  * info: TextArena's step info plus `success` (final reward >= 1), `invalid_action`
    (the game rejected the move) and, at the end, `reason` (why the game ended).
  * actions: the env id's default *action* wrappers are kept (for most games
    `ActionFormattingWrapper`, which writes "7" as "[7]"); its observation wrappers are
    dropped, since the chat already holds the history.
  * `max_steps` (when the config does not set it): twice the game's `max_turns`
    (an invalid move does not use a turn), else 100.

Seeding: TextArena seeds and draws from the *global* `random` module. The adapter gives
each instance a private copy of that state: every `reset`/`step` swaps it in, runs the
game, and swaps the caller's global state back (under a lock, since rollouts step
environments in threads). So episodes with the same seed are the same game, the
process's own `random` stream is untouched, and `reset(seed=s)` passes `s` to
TextArena (a reset without a seed passes one drawn from `self.rng`).
"""
from __future__ import annotations

import dataclasses
import difflib
from typing import Any, Mapping

from workbench.config import EnvironmentConfig
from workbench.environments.base import BaseEnvironment, StepResult, as_environment_config
from workbench.environments.global_rng import _LOCK as GLOBAL_RANDOM_LOCK  # noqa: F401 - the one lock of every scope
from workbench.environments.global_rng import GlobalRNGScope

DEFAULT_MAX_STEPS = 100
PLAYER_ID = 0


def _import_textarena() -> Any:
    try:
        import textarena
    except ImportError as exc:
        raise ImportError("TextArenaEnvironment needs the textarena package: pip install textarena "
                          "(tested with 0.7.4)") from exc
    return textarena


def _make_game(env_id: str, kwargs: Mapping[str, Any]) -> Any:
    """`textarena.make(env_id)` without its observation wrappers (action wrappers kept)."""
    ta = _import_textarena()
    from textarena.envs.registration import ENV_REGISTRY

    if env_id not in ENV_REGISTRY:
        close = difflib.get_close_matches(env_id, list(ENV_REGISTRY), n=5, cutoff=0.5)
        raise ValueError(f"TextArena has no environment {env_id!r}"
                         + (f"; did you mean {close}?" if close else "; see textarena.envs.registration."
                            "ENV_REGISTRY for the ids"))
    try:
        made = ta.make(env_id, **dict(kwargs))
    except TypeError as exc:
        raise ValueError(f"TextArena {env_id!r}: bad game setting {sorted(kwargs)} ({exc}); the settings are "
                         f"the arguments of {ENV_REGISTRY[env_id].entry_point}") from exc
    action_wrappers, game = [], made
    while isinstance(game, ta.Wrapper):
        if isinstance(game, ta.ActionWrapper):
            action_wrappers.append(type(game))
        game = game.env
    for wrapper in reversed(action_wrappers):  # innermost first, as textarena.make applied them
        game = wrapper(game)
    return game


def _replace(cfg: EnvironmentConfig, **changes: Any) -> EnvironmentConfig:
    """A copy of `cfg` with `changes` (params copied, never shared)."""
    out = dataclasses.replace(cfg, **changes)
    out.params = dict(out.params)
    return out


class TextArenaEnvironment(BaseEnvironment):
    """A single-player TextArena game behind the workbench API (see the module docstring).

    Args:
        env_id: a TextArena id, e.g. "GuessTheNumber-v0", "TowerOfHanoi-v0".
        config: `EnvironmentConfig` or dict; its `params` (except `env_id`) are passed to
            `textarena.make` as game settings (e.g. {"max_turns": 8}).
        **game_kwargs: more game settings for `textarena.make` (stored in `config.params`).

    Raises:
        ImportError: textarena is not installed.
        ValueError: the id is unknown (close matches are listed).
        TypeError: the game is not a single-player game.
    """

    #: Every scored step says `info["success"]`.
    reports_success = True

    def __init__(self, env_id: str, config: EnvironmentConfig | Mapping[str, Any] | None = None,
                 **game_kwargs: Any):
        cfg = as_environment_config(config)
        explicit_steps = isinstance(config, EnvironmentConfig) or (
            isinstance(config, Mapping) and "max_steps" in config)
        kwargs = {k: v for k, v in {**cfg.params, **game_kwargs}.items() if k != "env_id"}
        self.env_id = env_id
        self.game = _make_game(env_id, kwargs)
        self._rng_scope = GlobalRNGScope(0)  # the game's own random/numpy global state (global_rng)
        try:
            self._in_own_random(self.game.reset, num_players=1, seed=0)
        except Exception as exc:
            raise TypeError(f"TextArenaEnvironment plays single-player games; {env_id!r} refused "
                            f"num_players=1 ({type(exc).__name__}: {exc})") from exc
        max_turns = getattr(self.game, "max_turns", None)
        max_steps = cfg.max_steps if explicit_steps else (2 * int(max_turns) if max_turns else DEFAULT_MAX_STEPS)
        super().__init__(_replace(cfg, name=f"textarena:{env_id}", max_steps=max_steps,
                                  params={"env_id": env_id, **kwargs}))
        self._seed_pending = self.config.seed is not None
        self.last_info: dict[str, Any] = {}

    @classmethod
    def from_config(cls, config: EnvironmentConfig | Mapping[str, Any]) -> "TextArenaEnvironment":
        """Rebuild from a recorded config: `params["env_id"]` names the game."""
        data = as_environment_config(config)
        if "env_id" not in data.params:
            raise ValueError("TextArenaEnvironment.from_config needs params['env_id'] (e.g. "
                             "'GuessTheNumber-v0'); or use make_env('textarena:<id>')")
        return cls(data.params["env_id"], config)

    # -- the private global-random state --------------------------------------------
    def _in_own_random(self, fn: Any, *args: Any, **kwargs: Any) -> Any:
        """Call `fn` with this instance's `random` and `numpy.random` state installed as the
        global one (`workbench.environments.global_rng`)."""
        with self._rng_scope.active():
            return fn(*args, **kwargs)

    def seed(self, seed: int | None) -> None:
        """Reseed; the next `reset()` passes `seed` to the TextArena game."""
        super().seed(seed)
        self._seed_pending = seed is not None

    # -- episode ---------------------------------------------------------------------
    def _observation(self) -> str:
        _, messages = self.game.get_observation()
        ta = _import_textarena()
        lines = [str(text) for _, text, kind in messages if kind != ta.ObservationType.PLAYER_ACTION]
        return "\n".join(line.strip() for line in lines if line.strip())

    def reset(self) -> str:
        """Start a game (seeded, see the module docstring) and return the player's first observation."""
        seed = self._seed if self._seed_pending else self.rng.getrandbits(31)
        self._seed_pending = False
        self._in_own_random(self.game.reset, num_players=1, seed=seed)
        self.last_info = {}
        return self._in_own_random(self._observation)

    def step(self, action: str) -> StepResult:
        """Play `action`; the reward is 0 until the game ends, then TextArena's reward."""
        done, ta_info = self._in_own_random(self.game.step, action)
        obs = self._in_own_random(self._observation)
        info: dict[str, Any] = dict(ta_info or {})
        state = getattr(self.game, "state", None)
        game_info = (getattr(state, "game_info", None) or {}).get(PLAYER_ID, {})
        info["invalid_action"] = bool(getattr(state, "error_count", 0) or game_info.get("invalid_move"))
        reward = 0.0
        info["success"] = False
        if done:
            rewards, final_info = self._in_own_random(self.game.close)
            reward = float((rewards or {}).get(PLAYER_ID, 0.0))
            reason = str(((final_info or {}).get(PLAYER_ID) or {}).get("reason", ""))
            info.update(success=reward >= 1.0, reason=reason)
            if reason and reason not in obs:
                obs = f"{obs}\n{reason}".strip()
        self.last_info = info
        return obs, reward, bool(done), info

    def on_truncate(self, reason: str) -> float | None:
        """The game's own partial credit at the cut (`_get_percentage_completion()`, which
        TextArena pays when its turn limit ends a game), or None for games without it."""
        game = self.game
        while not hasattr(game, "_get_percentage_completion") and hasattr(game, "env"):
            game = game.env
        partial = getattr(game, "_get_percentage_completion", None)
        if partial is None or getattr(getattr(self.game, "state", None), "done", False):
            return None
        return float(self._in_own_random(partial))

    # -- text ------------------------------------------------------------------------
    def get_prompt_prefix(self) -> str:
        """`config.system_prompt`, else a short generic one (the game's rules come in the first observation)."""
        return self.config.system_prompt or (
            f"You are playing the TextArena game {self.env_id}. Read the rules in the first message "
            f"and reply with your move in the format they ask for.")

    def __repr__(self) -> str:
        return f"TextArenaEnvironment({self.env_id!r}, max_steps={self.max_steps})"
