"""Scaling out with Ray: data-parallel learners (`learners.py`) and rollout workers."""
from workbench.distributed.learners import LearnerGroup, LearnerWorker, shard_model

__all__ = ["LearnerGroup", "LearnerWorker", "shard_model"]
