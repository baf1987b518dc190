"""Rewards: the seeds' `RewardManager` shaping, reward-function calling, re-scoring.

A reward function takes `(trajectory)` or `(trajectory, environment)` and returns a
float, the episode's outcome score. Without one, the environment's per-turn rewards
are used as they are. `RewardManager` is the seeds' shaping, with weights:

    score = step_reward_weight * sum(env rewards)
          + success_bonus * [episode succeeded]
          - invalid_action_penalty * (#turns with info["invalid_action"])
          + efficiency_bonus * (max_steps - #turns)        (only when it succeeded)

`rescore(batch, reward_fn)` recomputes scores on a stored batch without rolling
out again (the reward tuner uses it).
"""
from __future__ import annotations

import inspect
import math
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from workbench.trajectory import Episode, TrajectoryBatch

RewardFn = Callable[..., float]


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
    return value


def episode_scores(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None) -> list[float]:
    """Outcome score per episode: reward_fn if given, else the summed env rewards."""
    if reward_fn is None:
        return [ep.total_reward for ep in batch]
    return [call_reward_fn(reward_fn, ep, environment) for ep in batch]


def rescore(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None) -> TrajectoryBatch:
    """Set `episode.score` for every episode of a stored batch (no new rollout)."""
    for ep, s in zip(batch, episode_scores(batch, reward_fn, environment)):
        ep.score = s
    return batch
