"""Scaling out with Ray: data-parallel learners (`learners.py`) and rollout workers.

    rollout_workers.py  RolloutWorkerGroup: Ray actors with their own engine and environments
    learners.py         LearnerGroup: Ray actors in one torch.distributed group, FSDP2
    controller.py       RayStages: the stage methods of Trainer with ray.use_ray=True
    placement.py        placement groups reserved up front, PlacementError / ActorStartError
    reward_workers.py   the reward-model worker (Role.RewardModel): reward.reward_model in a Ray actor
"""
from workbench.distributed.learners import LearnerGroup, LearnerLostError, LearnerWorker, shard_model
from workbench.distributed.rollout_workers import RolloutWorker, RolloutWorkerGroup, WorkerLostError

__all__ = ["LearnerGroup", "LearnerLostError", "LearnerWorker", "RolloutWorker", "RolloutWorkerGroup", "WorkerLostError", "shard_model"]
