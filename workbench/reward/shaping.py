"""Environment rewards and reward functions: the seeds' `RewardManager` shaping,
reward-function calling, the checks every reward passes, and the overlong penalty.
`workbench.reward.scoring` puts them together (`score_batch`).

A reward function takes `(trajectory)` or `(trajectory, environment)` and returns a
float, the episode's outcome score; the environment it gets is the copy that played
that episode (`Episode.environment`), else the one passed in (e.g. the trainer's
prototype, for episodes loaded from a file). Without a reward function, the episode's
environment rewards are shaped by the `reward` config section (`RewardConfig`, the
`RewardManager` weights; the defaults leave them as they are):

    score = step_reward_weight * sum(env rewards)
          + success_bonus * [episode succeeded]
          - invalid_action_penalty * (#turns with info["invalid_action"])
          + efficiency_bonus * (max_steps - #turns)        (only when it succeeded)

    score += sum over model replies of overlong_penalty(reply)      (with or without a reward function)

The overlong penalty is DAPO's soft overlong punishment (`overlong_penalty`): with L the
reply's sampled tokens, Lmax = `inference.max_tokens` (passed in as `max_tokens`),
W = `reward.overlong_buffer` and f = `reward.overlong_penalty`,

    penalty(L) = 0                              if L <= Lmax - W
               = -f * (L - (Lmax - W)) / W      if Lmax - W < L < Lmax    (a linear ramp)
               = -f                             if L >= Lmax              (the reply hit the limit)

as in DAPO's reward manager (`min(-(L - (Lmax - W)) / W * f, 0)`, here also capped at -f).
It is a length term, not a shaping of environment rewards, so it applies with a reward
function too; each reply's penalty sits on that reply's last sampled token.

On tokens (`token_level_scores`): without a reward function each turn's weighted
environment reward sits on that turn's last policy token and the other shaping terms on
the episode's last policy token; with one, its score sits on the last policy token.
Either way each reply's overlong penalty sits on the reply's last sampled token, so the
token sum is the score. A reward function replaces the shaping weights: with both, the
weights of the `reward` section are not applied and `score_batch` warns.

`score_batch(batch, ...)` sets `episode.score` and the token fields; `rescore` sets
only `episode.score` (a stored batch, no new rollout); `episode_advantages` gives the
per-episode advantages of a configured estimator (the reward tuner shows them).

Every reward is checked before anything is stored: a reward function's return value
and every environment turn reward must be a finite float that a float32 tensor can
hold (|r| <= 3.4e38); anything else raises `RewardError` naming the episode (and the
turn). Scoring a batch is all-or-nothing: if one episode fails, no episode's `score`
changes.
"""
from __future__ import annotations

import dataclasses
import inspect
import math
import warnings
from typing import Any, Callable, Mapping, Sequence

import torch

from workbench.config.sections import RewardConfig
from workbench.trajectory import Episode, TrajectoryBatch

RewardFn = Callable[..., float]

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
"""Largest magnitude a reward may have: rewards are placed in float32 tensors."""


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable; names the episode."""


#: The shaping weights of `RewardManager` (and the `reward` config section), with the
#: values that leave environment rewards unchanged.
SHAPING_DEFAULTS: dict[str, float] = {"step_reward_weight": 1.0, "success_bonus": 0.0,
                                      "invalid_action_penalty": 0.0, "efficiency_bonus": 0.0}


#: Fields of the `reward` config section that are not `RewardManager` weights: the overlong
#: penalty, a term on reply lengths (`overlong_penalties`).
LENGTH_FIELDS = ("overlong_penalty", "overlong_buffer")

#: Fields of the `reward` config section that set rewards from models (judges, a reward model:
#: `workbench.reward.sources` reads them), not `RewardManager` weights.
MODEL_REWARD_FIELDS = tuple(f.name for f in dataclasses.fields(RewardConfig)
                            if f.name not in (*SHAPING_DEFAULTS, "max_steps", *LENGTH_FIELDS))


class RewardManager:
    """The seeds' trajectory reward with tunable weights (see module docstring).

        RewardManager(environment)                          # seed 000: weights at their defaults
        RewardManager(environment, success_bonus=5.0, invalid_action_penalty=0.5, efficiency_bonus=0.1)
        RewardManager.from_config(config.reward, environment)
        manager.compute_trajectory_reward(trajectory)      # float
        manager.compute_batch_rewards(trajectories)        # tensor (B,) float32

    Args:
        environment: the environment (its `max_steps` is the efficiency bonus's budget);
            optional. Weights are keyword-only, so an environment is never taken for one.
        step_reward_weight: weight of the summed environment rewards.
        success_bonus: added when the episode succeeded (the seeds use 5.0).
        invalid_action_penalty: subtracted per turn flagged `invalid_action` (the seeds use 0.5).
        efficiency_bonus: per unused step, added on success (the seeds use 0.1).
        max_steps: step budget for the efficiency bonus; default: the environment's `max_steps`.

    Trajectories are `Episode`s or the seeds' dicts (`rewards`, `infos`, optional
    `num_turns` and `success`).
    """

    def __init__(self, environment: Any = None, *, step_reward_weight: float = 1.0, success_bonus: float = 0.0,
                 invalid_action_penalty: float = 0.0, efficiency_bonus: float = 0.0, max_steps: int | None = None):
        if isinstance(environment, (int, float)) and not isinstance(environment, bool):
            raise TypeError(f"RewardManager's first argument is the environment, got the number {environment!r}; "
                            "pass weights by keyword, e.g. RewardManager(env, step_reward_weight=1.0)")
        weights = {"step_reward_weight": step_reward_weight, "success_bonus": success_bonus,
                   "invalid_action_penalty": invalid_action_penalty, "efficiency_bonus": efficiency_bonus}
        for name, value in weights.items():
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
                raise TypeError(f"RewardManager {name} must be a finite number, got {value!r}")
        if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int)
                                      or max_steps < 1):
            raise TypeError(f"RewardManager max_steps must be an integer >= 1 or None, got {max_steps!r}")
        self.environment = environment
        self.step_reward_weight = float(step_reward_weight)
        self.success_bonus = float(success_bonus)
        self.invalid_action_penalty = float(invalid_action_penalty)
        self.efficiency_bonus = float(efficiency_bonus)
        self.max_steps = max_steps

    @classmethod
    def from_config(cls, reward: Any = None, environment: Any = None) -> "RewardManager":
        """A manager with the weights of a `reward` config section (`RewardConfig`), a
        mapping of them, or another manager; None: the defaults."""
        if reward is None:
            return cls(environment)
        if isinstance(reward, RewardManager):
            return cls(environment if environment is not None else reward.environment,
                       max_steps=reward.max_steps, **reward.weights())
        values = dict(reward) if isinstance(reward, Mapping) else {
            k: getattr(reward, k) for k in (*SHAPING_DEFAULTS, "max_steps") if hasattr(reward, k)}
        for key in (*LENGTH_FIELDS, *MODEL_REWARD_FIELDS):  # read by `overlong_penalties` and the model rewards
            values.pop(key, None)
        return cls(environment, **values)

    def __call__(self, trajectory: Any, environment: Any = None) -> float:
        return self.compute_trajectory_reward(trajectory, environment)

    def compute_trajectory_reward(self, trajectory: Any, environment: Any = None) -> float:
        """The shaped score of one episode (an `Episode` or the seeds' dict)."""
        rewards, infos, turns, success = _parts(trajectory)
        score = self.step_reward_weight * math.fsum(rewards)
        if success:
            score += self.success_bonus
            env = environment if environment is not None else self.environment
            if env is None:
                env = getattr(trajectory, "environment", None)
            budget = self.max_steps or getattr(env, "max_steps", None) or turns
            score += self.efficiency_bonus * max(0, budget - turns)
        invalid = sum(1 for info in infos if (info or {}).get("invalid_action"))
        score -= self.invalid_action_penalty * invalid
        return float(score)

    def compute_batch_rewards(self, trajectories: Sequence[Any], environment: Any = None) -> torch.Tensor:
        """Scores of the trajectories (a `TrajectoryBatch` or a list): tensor (B,) float32."""
        return torch.tensor([self.compute_trajectory_reward(t, environment) for t in trajectories],
                            dtype=torch.float32)  # (B,)

    def weights(self) -> dict[str, float]:
        """The four shaping weights."""
        return {name: getattr(self, name) for name in SHAPING_DEFAULTS}

    @property
    def is_identity(self) -> bool:
        """True when the weights leave environment rewards unchanged (the defaults)."""
        return self.weights() == SHAPING_DEFAULTS

    def __repr__(self) -> str:
        env = type(self.environment).__name__ if self.environment is not None else None
        args = ", ".join(f"{k}={v:g}" for k, v in self.weights().items())
        return f"RewardManager({env}, {args}, max_steps={self.max_steps})"


def _parts(trajectory: Any) -> tuple[list[float], list[dict], int, bool]:
    """(rewards, infos, number of turns, success) of an `Episode` or a seeds'-style dict."""
    if isinstance(trajectory, Mapping):
        rewards = [float(r) for r in trajectory.get("rewards", [])]
        infos = list(trajectory.get("infos", []) or [])
        turns = int(trajectory.get("num_turns", len(rewards)))
        success = trajectory.get("success")
        if success is None:
            success = bool(infos and (infos[-1] or {}).get("success", False))
        return rewards, infos, turns, bool(success)
    return ([float(r) for r in trajectory.rewards], list(trajectory.infos), len(trajectory.turns),
            bool(trajectory.success))


def takes_environment(fn: RewardFn) -> bool:
    """Whether `fn` is called as `fn(trajectory, environment)`: it accepts a second
    positional argument, required or not (`RewardManager.__call__(trajectory,
    environment=None)` does), or `*args`. Otherwise it is called as `fn(trajectory)`."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return False
    if any(p.kind is p.VAR_POSITIONAL for p in params):
        return True
    return sum(p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) for p in params) >= 2


def _as_float(value: Any) -> float:
    """A reward function's result as a float: a number, a mapping with "score"/"reward"/
    "total", or an object with `.score`."""
    if isinstance(value, Mapping):
        for key in ("score", "reward", "total"):
            if key in value:
                return float(value[key])
        raise TypeError(f"a dict without 'score'/'reward' ({sorted(value)})")
    if hasattr(value, "score") and not isinstance(value, (int, float)):
        return float(value.score)
    return float(value)


def call_reward_fn(fn: RewardFn, episode: Episode, environment: Any = None, own_first: bool = True) -> float:
    """Call `fn(trajectory)` or `fn(trajectory, environment)`; errors name the episode.

    The environment is the episode's own (`episode.environment`, the copy that played
    it) when it has one, else `environment` (`own_first=False`: `environment` unless
    it is None)."""
    env = _pick(episode, environment, own_first)
    try:
        value = fn(episode, env) if takes_environment(fn) else fn(episode)
    except Exception as exc:
        raise RewardError(
            f"reward_fn raised {type(exc).__name__} on episode {episode.episode_id} "
            f"(group {episode.group_id!r}, env seed {episode.env_seed}): {exc}"
        ) from exc
    try:
        value = _as_float(value)
    except (TypeError, ValueError) as exc:
        raise RewardError(
            f"reward_fn returned {type(value).__name__} for episode {episode.episode_id}; return a float ({exc})"
        ) from exc
    if not math.isfinite(value):
        raise RewardError(f"reward_fn returned {value} for episode {episode.episode_id}; return a finite float")
    _check_fits(value, f"reward_fn returned {value!r} for episode {episode.episode_id}")
    return value


def _where(episode: Episode) -> str:
    return f"episode {episode.episode_id} (group {episode.group_id!r}, env seed {episode.env_seed})"


def _check_fits(value: float, what: str) -> None:
    if abs(value) > FLOAT32_MAX:
        raise RewardError(f"{what}, which overflows float32 (largest magnitude {FLOAT32_MAX:.4g}); "
                          "rescale the reward")


def check_env_rewards(episode: Episode) -> None:
    """Raise `RewardError` naming the episode and turn if an environment reward is not a
    finite float within float32 range (nor is their sum)."""
    rewards = [(t.index, t.reward) for t in episode.turns] if episode.turns else list(enumerate(episode.rewards))
    for k, r in rewards:
        try:
            value = float(r)
        except (TypeError, ValueError) as exc:
            raise RewardError(f"environment reward {r!r} at turn {k} of {_where(episode)} is not a number; "
                              "environment.step must return a finite float reward") from exc
        if not math.isfinite(value):
            raise RewardError(f"environment reward {value} at turn {k} of {_where(episode)}; "
                              "environment.step must return a finite float reward")
        _check_fits(value, f"environment reward {value!r} at turn {k} of {_where(episode)}")
    total = math.fsum(float(r) for _, r in rewards)
    _check_fits(total, f"environment rewards of {_where(episode)} sum to {total!r}")


def _environments(batch: TrajectoryBatch, environment: Any) -> list[Any]:
    """The environment argument per episode: one for all, or a list with one per episode."""
    if isinstance(environment, (list, tuple)):
        if len(environment) != len(batch):
            raise ValueError(f"{len(environment)} environments for {len(batch)} episodes")
        return list(environment)
    return [environment] * len(batch)


def _pick(episode: Episode, environment: Any, own_first: bool) -> Any:
    own = episode.environment
    if own_first:
        return own if own is not None else environment
    return environment if environment is not None else own


def _shaping(reward: Any) -> RewardManager:
    return reward if isinstance(reward, RewardManager) else RewardManager.from_config(reward)


def overlong_penalty(length: int, max_tokens: int, buffer: int, factor: float) -> float:
    """DAPO's soft overlong punishment of one reply of `length` sampled tokens (a number
    <= 0): 0 up to `max_tokens - buffer` tokens, then a linear ramp down to `-factor` at
    `max_tokens`, and `-factor` from there on (see the module docstring)."""
    exceed = length - (max_tokens - buffer)
    if factor == 0 or exceed <= 0:
        return 0.0
    return -factor * min(exceed / buffer, 1.0)


def _overlong_settings(reward: Any) -> tuple[float, int]:
    """(overlong_penalty, overlong_buffer) of a `reward` config section or mapping; (0.0, 1)
    for None or a `RewardManager` (which has no overlong penalty). The one reader of these
    two settings."""
    if reward is None or isinstance(reward, RewardManager):
        return 0.0, 1
    get = reward.get if isinstance(reward, Mapping) else (lambda k, d: getattr(reward, k, d))
    return float(get("overlong_penalty", 0.0)), int(get("overlong_buffer", 1))


def overlong_penalties(episode: Episode, reward: Any, max_tokens: int | None) -> list[tuple[int, float]]:
    """(position of the reply's last sampled token, penalty) for each model reply of
    `episode` that the overlong penalty of `reward` hits (penalty < 0); [] when
    `reward.overlong_penalty` is 0. A reply's length is its sampled (loss-mask 1) tokens;
    typed turns have none. A reply cut short by the context budget (finish reason "length"
    below `max_tokens`) is judged by its length like any other.

    Raises ValueError when the penalty is on and `max_tokens` (`inference.max_tokens`,
    the limit the replies were sampled under) is not given."""
    factor, buffer = _overlong_settings(reward)
    if factor == 0:
        return []
    if max_tokens is None:
        raise ValueError("reward.overlong_penalty needs the token limit the replies were sampled under: pass "
                         "max_tokens=config.inference.max_tokens to the scoring function")
    out = []
    for turn in episode.turns:
        sampled = [i for i in range(turn.token_start, turn.token_end) if episode.loss_mask[i]]
        penalty = overlong_penalty(len(sampled), max_tokens, buffer, factor) if sampled else 0.0
        if penalty:
            out.append((sampled[-1], penalty))
    return out


def overlong_summary(batch: TrajectoryBatch, reward: Any, max_tokens: int | None) -> dict[str, float]:
    """The overlong penalty's metrics for a batch: `reward/overlong_penalty_mean` (the
    penalty per episode, averaged over the batch) and `reward/overlong_reply_rate` (the
    share of model replies it hit); {} when the penalty is off."""
    if _overlong_settings(reward)[0] == 0:
        return {}
    hits = [overlong_penalties(ep, reward, max_tokens) for ep in batch]
    replies = sum(1 for ep in batch for t in ep.turns if t.source == "model")
    return {"reward/overlong_penalty_mean": math.fsum(p for h in hits for _, p in h) / max(len(batch), 1),
            "reward/overlong_reply_rate": sum(len(h) for h in hits) / max(replies, 1)}
