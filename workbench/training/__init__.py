"""Learning: policy/reference/critic models, the stepwise Trainer, checkpoints."""
from workbench.training.checkpoint import CheckpointError, latest_checkpoint
from workbench.training.policy import Critic, Policy
from workbench.training.trainer import Trainer
