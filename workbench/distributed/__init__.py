"""Scaling out with Ray: data-parallel learners (`learners.py`) and rollout workers."""
from workbench.distributed.learners import LearnerGroup, LearnerLostError, LearnerWorker, shard_model
from workbench.distributed.rollout_workers import RolloutWorker, RolloutWorkerGroup, WorkerLostError

__all__ = ["LearnerGroup", "LearnerLostError", "LearnerWorker", "RolloutWorker", "RolloutWorkerGroup", "WorkerLostError", "shard_model"]
