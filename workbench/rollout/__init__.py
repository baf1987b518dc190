"""Rollouts: token-exact chat rendering and the batched, stepwise multi-turn `Rollout`."""
from workbench.rollout.chat import AlignmentReport, ChatRenderer, TemplateError, check_token_alignment, stop_token_ids
from workbench.rollout.rollout import Rollout
