"""Rewards, in one home: environment rewards shaped, reward functions called, and rewards
from models (LLM judges and reward models), put together by `score_batch`, the one scoring
function the trainer, the CLI and the reward tuner use.

    shaping.py   RewardManager shaping, reward-function calling, the reward checks, the overlong penalty
    scoring.py   score_batch / rescore / token_level_scores / episode_advantages: the outcome score and
                 its rewards on tokens

Every name that was importable from the single module `workbench.reward` still is.
"""
from workbench.reward.scoring import (
    episode_advantages, episode_scores, rescore, score_batch, token_level_scores,
)
from workbench.reward.shaping import (
    FLOAT32_MAX, LENGTH_FIELDS, SHAPING_DEFAULTS, RewardError, RewardFn, RewardManager, _as_float, _check_fits,
    _environments, _overlong_settings, _parts, _pick, _shaping, _where, call_reward_fn, check_env_rewards,
    overlong_penalties, overlong_penalty, overlong_summary, takes_environment,
)

__all__ = [
    "FLOAT32_MAX", "LENGTH_FIELDS", "SHAPING_DEFAULTS", "RewardError", "RewardFn", "RewardManager",
    "call_reward_fn", "check_env_rewards", "episode_advantages", "episode_scores", "overlong_penalties",
    "overlong_penalty", "overlong_summary", "rescore", "score_batch", "takes_environment", "token_level_scores",
]
