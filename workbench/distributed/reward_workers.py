"""The reward-model worker (verl's `RewardModelWorker`, the seeds' `Role.RewardModel`): the
reward model of `reward.reward_model` in a Ray actor of its own, so the controller loads no
reward model and the worker can sit on a GPU of its own.

    rewards = ray_model_rewards(config.reward)      # what RayStages gives the trainer with ray.use_ray
    rewards.source("reward_model")                   # RewardModelWorkerGroup: .judge(episodes) on the worker

The worker builds `workbench.reward.RewardModel.from_config` from the same `reward` section
and runs its `judge` on the episodes it is sent (episodes travel without their environment
objects); the judgments come back as they would from the model in this process, so scoring
(`workbench.reward.score_batch`), the recorded judgments and the metrics are the same. The
judges (`reward.judge`, `reward.group_judge`) stay on the controller: they are HTTP clients or
engines of their own. The worker reserves one GPU when the controller sees CUDA, else no CPU
(it computes only while the controller waits for it).
"""
from __future__ import annotations

import dataclasses
from typing import Any

from workbench.reward.judgments import Judgment
from workbench.reward.sources import ModelRewards


class RewardModelWorker:
    """The actor's body: one `RewardModel` built from a `reward` section (as a dict)."""

    def __init__(self, reward: dict[str, Any]):
        from workbench.config import RewardConfig
        from workbench.reward.reward_model import RewardModel

        self.model = RewardModel.from_config(RewardConfig(**reward))

    def judge(self, episodes: list[Any]) -> list[dict[str, Any]]:
        return [j.to_dict() for j in self.model.judge(episodes)]

    def name(self) -> str:
        return self.model.name


class RewardModelWorkerGroup:
    """The controller's handle on the reward-model worker: `judge(episodes)` as `RewardModel`'s."""

    source = "reward_model"

    def __init__(self, reward: Any):
        import ray
        import torch

        self.ray = ray
        gpus = 1.0 if torch.cuda.is_available() else 0.0
        actor_cls = ray.remote(num_cpus=0, num_gpus=gpus)(RewardModelWorker)
        self.actor = actor_cls.remote(dataclasses.asdict(reward))
        self.name = ray.get(self.actor.name.remote())  # the model loaded (or its error) before the first step

    def judge(self, episodes: list[Any]) -> list[Judgment]:
        return [Judgment.from_dict(d) for d in self.ray.get(self.actor.judge.remote(list(episodes)))]

    def close(self) -> None:
        if self.actor is not None:
            self.ray.kill(self.actor)
            self.actor = None

    def __repr__(self) -> str:
        return f"RewardModelWorkerGroup({self.name!r})"


def ray_model_rewards(reward: Any) -> ModelRewards | None:
    """The model rewards of a `reward` section with its reward model on a Ray worker (None
    when no model reward is on); the trainer keeps it while the section's settings stay."""
    if reward.reward_model is None:
        return ModelRewards.from_config(reward)
    section = dataclasses.replace(reward)
    return ModelRewards.from_config(reward, reward_model=lambda: RewardModelWorkerGroup(section))


__all__ = ["RewardModelWorker", "RewardModelWorkerGroup", "ray_model_rewards"]
