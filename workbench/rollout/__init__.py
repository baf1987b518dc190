"""Rollouts: token-exact chat rendering, the batched stepwise `Rollout` and `AsyncRollout`,
and `make_rollout`, which builds either from a run's config.

    template.py       what a chat template can express (roles, prefix stability, thinking, tools), probed at start
    chat.py           token-exact chat deltas and the alignment check
    rollout.py        Rollout: N episodes, one batched generate call per turn, human turns, budgets
    opening.py        an episode's opening prompt within the context budget (a cut first observation)
    async_rollout.py  AsyncRollout: each episode steps its environment while others generate
    configured.py     make_rollout(config, ...): the one place rollout settings are read from a config
    fork.py           replay an episode's recorded turns on a fresh environment (checked), then branch from a turn
    waiting.py        episodes whose environment's server is full (EnvironmentBusy) wait and are reset later
"""
from workbench.rollout.async_rollout import AsyncRollout, RolloutEvent
from workbench.rollout.chat import AlignmentReport, ChatRenderer, TemplateError, check_token_alignment, stop_token_ids
from workbench.rollout.configured import make_rollout
from workbench.rollout.rollout import Rollout
