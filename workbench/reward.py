"""Rewards: the seeds' `RewardManager` shaping, reward-function calling, re-scoring.

A reward function takes `(trajectory)` or `(trajectory, environment)` and returns a
float, the episode's outcome score. Without one, the environment's per-turn rewards
are used as they are. `RewardManager` is the seeds' shaping, with weights:

    score = step_reward_weight * sum(env rewards)
          + success_bonus * [episode succeeded]
          - invalid_action_penalty * (#turns with info["invalid_action"])
          + efficiency_bonus * (max_steps - #turns)        (only when it succeeded)

`rescore(batch, reward_fn)` recomputes scores on a stored batch without rolling
out again (the reward tuner uses it); `token_level_scores` places them on tokens for
training (`Trainer.score`).

Every reward is checked before anything is stored: a reward function's return value
and every environment turn reward must be a finite float that a float32 tensor can
hold (|r| <= 3.4e38); anything else raises `RewardError` naming the episode (and the
turn). Scoring a batch is all-or-nothing: if one episode fails, no episode's `score`
changes.
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from workbench.trajectory import Episode, TrajectoryBatch

RewardFn = Callable[..., float]

FLOAT32_MAX = float(torch.finfo(torch.float32).max)
"""Largest magnitude a reward may have: rewards are placed in float32 tensors."""


class RewardError(RuntimeError):
    """A reward function failed or returned something unusable; names the episode."""


@dataclass
class RewardManager:
    """The seeds' trajectory reward with tunable weights (see module docstring)."""

    step_reward_weight: float = 1.0
    """Weight of the summed environment rewards."""
    success_bonus: float = 0.0
    """Added when the episode succeeded (the seeds use 5.0)."""
    invalid_action_penalty: float = 0.0
    """Subtracted per turn flagged invalid_action (the seeds use 0.5)."""
    efficiency_bonus: float = 0.0
    """Per unused step, added on success (the seeds use 0.1)."""
    max_steps: int | None = None
    """Step budget for the efficiency bonus; defaults to the environment's max_steps."""

    def __call__(self, trajectory: Episode, environment: Any = None) -> float:
        return self.compute_trajectory_reward(trajectory, environment)

    def compute_trajectory_reward(self, trajectory: Episode, environment: Any = None) -> float:
        """The shaped score of one episode."""
        score = self.step_reward_weight * sum(trajectory.rewards)
        if trajectory.success:
            score += self.success_bonus
            budget = self.max_steps or getattr(environment, "max_steps", None) or len(trajectory.turns)
            score += self.efficiency_bonus * max(0, budget - len(trajectory.turns))
        invalid = sum(1 for info in trajectory.infos if info.get("invalid_action"))
        score -= self.invalid_action_penalty * invalid
        return float(score)

    def compute_batch_rewards(self, trajectories: Sequence[Episode], environment: Any = None) -> list[float]:
        return [self.compute_trajectory_reward(t, environment) for t in trajectories]

    def weights(self) -> dict[str, float]:
        return {"step_reward_weight": self.step_reward_weight, "success_bonus": self.success_bonus,
                "invalid_action_penalty": self.invalid_action_penalty, "efficiency_bonus": self.efficiency_bonus}


def _arity(fn: RewardFn) -> int:
    try:
        params = [p for p in inspect.signature(fn).parameters.values()
                  if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
        return len(params)
    except (TypeError, ValueError):
        return 1


def call_reward_fn(fn: RewardFn, episode: Episode, environment: Any = None) -> float:
    """Call `fn(trajectory)` or `fn(trajectory, environment)`; errors name the episode."""
    try:
        value = fn(episode, environment) if _arity(fn) >= 2 else fn(episode)
    except Exception as exc:
        raise RewardError(
            f"reward_fn raised {type(exc).__name__} on episode {episode.episode_id} "
            f"(group {episode.group_id!r}, env seed {episode.env_seed}): {exc}"
        ) from exc
    try:
        value = float(value)
    except (TypeError, ValueError) as exc:
        raise RewardError(
            f"reward_fn returned {type(value).__name__} for episode {episode.episode_id}; return a float"
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


def episode_scores(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None) -> list[float]:
    """Outcome score per episode: reward_fn if given, else the summed env rewards.

    Environment rewards are checked either way (`check_env_rewards`); nothing is stored.
    """
    for ep in batch:
        check_env_rewards(ep)
    if reward_fn is None:
        return [ep.total_reward for ep in batch]
    return [call_reward_fn(reward_fn, ep, environment) for ep in batch]


def rescore(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None) -> TrajectoryBatch:
    """Set `episode.score` for every episode of a stored batch (no new rollout).

    All-or-nothing: every score is computed (and checked) first; if the reward function
    fails on one episode, `RewardError` names it and no episode's score changes.
    """
    scores = episode_scores(batch, reward_fn, environment)
    for ep, s in zip(batch, scores):
        ep.score = s
    return batch


def token_level_scores(batch: TrajectoryBatch, reward_fn: RewardFn | None,
                       environment: Any = None) -> tuple[torch.Tensor, list[float]]:
    """Rewards placed on tokens, and the outcome score per episode; nothing is stored.

    With `reward_fn`, its score sits on the episode's last policy token; without, each
    turn's environment reward sits on that turn's last policy token (the episode's last
    policy token for a turn with none, e.g. a typed one). Episodes without policy tokens
    get no token reward.

    Returns:
        (scores (B, T) float32, outcome score per episode). Raises `RewardError` naming
        the episode for a failing reward function or an unusable reward.
    """
    outcome = episode_scores(batch, reward_fn, environment)  # checks every reward first
    scores = torch.zeros_like(batch.loss_mask, dtype=torch.float32)  # (B, T)
    for b, ep in enumerate(batch):
        policy_pos = [i for i, m in enumerate(ep.loss_mask) if m]
        if reward_fn is not None:
            if policy_pos:
                scores[b, policy_pos[-1]] = outcome[b]
            continue
        for turn in ep.turns:
            ends = [i for i in range(turn.token_start, turn.token_end) if ep.loss_mask[i]]
            pos = ends[-1] if ends else (policy_pos[-1] if policy_pos else None)
            if pos is not None:
                scores[b, pos] += turn.reward
        if not bool(torch.isfinite(scores[b]).all()):  # float32 sums of in-range rewards can overflow
            raise RewardError(f"environment rewards of {_where(ep)} overflow float32 when added on one token; "
                              "rescale the reward")
    return scores, outcome
