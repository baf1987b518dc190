"""Rewards, in one home: environment rewards shaped, reward functions called, and rewards
from models (LLM judges and reward models), put together by `score_batch`, the one scoring
function the trainer, the CLI and the reward tuner use.

    shaping.py   RewardManager shaping, reward-function calling, the reward checks, the overlong penalty
    scoring.py   score_batch / rescore / token_level_scores / episode_advantages: the outcome score and
                 its rewards on tokens
    sources.py   ModelRewards: the judges and reward model the `reward` section turns on, combined by weight
    backends.py  where a judge runs: an OpenAI-compatible server by URL, an engine in this process, a function
    judgments.py Judgment (kept in Episode.judgments), the transcript a judge reads, scores read from replies
    judges.py    Judge: one episode, a rubric, a score and a reason (verifiers' JudgeRubric)
    group_judge.py GroupJudge: a whole group in one prompt, its common opening once (ART's RULER)
    reward_model.py RewardModel: a sequence classifier's score, or a causal LM's probability of "Yes"
    audit.py     audit_judge: agreement with the environment, position and length bias, consistency, cost

Every name that was importable from the single module `workbench.reward` still is.
"""
from workbench.reward.audit import JudgeAudit, audit_judge
from workbench.reward.backends import (
    Completion, EngineBackend, FunctionBackend, JudgeBackend, ServerBackend, make_backend,
)
from workbench.reward.group_judge import GroupJudge
from workbench.reward.judges import DEFAULT_RUBRIC, ChatJudge, Judge
from workbench.reward.judgments import (
    Judgment, judge_score, judgments_of, model_score, parse_group_scores, parse_score, transcript,
)
from workbench.reward.reward_model import RewardModel
from workbench.reward.scoring import (
    episode_advantages, episode_scores, recorded_model_scores, rescore, score_batch, token_level_scores,
)
from workbench.reward.sources import ModelRewards, model_reward_summary, model_rewards_on
from workbench.reward.shaping import (
    FLOAT32_MAX, LENGTH_FIELDS, SHAPING_DEFAULTS, RewardError, RewardFn, RewardManager, _as_float, _check_fits,
    _environments, _overlong_settings, _parts, _pick, _shaping, _where, call_reward_fn, check_env_rewards,
    overlong_penalties, overlong_penalty, overlong_summary, takes_environment,
)

__all__ = [
    "ChatJudge", "Completion", "DEFAULT_RUBRIC", "EngineBackend", "FunctionBackend", "GroupJudge", "Judge",
    "JudgeBackend", "Judgment", "ModelRewards", "RewardModel", "ServerBackend", "judge_score", "judgments_of",
    "make_backend", "model_reward_summary", "model_rewards_on", "model_score", "parse_group_scores", "parse_score",
    "recorded_model_scores", "transcript", "JudgeAudit", "audit_judge",
    "FLOAT32_MAX", "LENGTH_FIELDS", "SHAPING_DEFAULTS", "RewardError", "RewardFn", "RewardManager",
    "call_reward_fn", "check_env_rewards", "episode_advantages", "episode_scores", "overlong_penalties",
    "overlong_penalty", "overlong_summary", "rescore", "score_batch", "takes_environment", "token_level_scores",
]
