"""Rollouts: token-exact chat rendering, the batched stepwise `Rollout` and `AsyncRollout`,
and `make_rollout`, which builds either from a run's config."""
from workbench.rollout.async_rollout import AsyncRollout, RolloutEvent
from workbench.rollout.chat import AlignmentReport, ChatRenderer, TemplateError, check_token_alignment, stop_token_ids
from workbench.rollout.configured import make_rollout
from workbench.rollout.rollout import Rollout
