"""`score_batch`, the one scoring function the trainer, the CLI and the reward tuner use:
an episode's outcome score and its rewards placed on tokens, from the shaping and reward
functions of `workbench.reward.shaping` (see its docstring for the terms and where they sit).
`rescore` sets only `episode.score` (a stored batch, no new rollout); `episode_advantages`
gives the per-episode advantages of a configured estimator (the reward tuner shows them).
"""
from __future__ import annotations

import math
import warnings
from typing import Any, Sequence

import torch

from workbench.reward.shaping import (
    RewardError, RewardFn, _environments, _pick, _shaping, _where, call_reward_fn, check_env_rewards,
    overlong_penalties,
)
from workbench.trajectory import TrajectoryBatch


def episode_scores(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None,
                   reward: Any = None, own_first: bool = True, max_tokens: int | None = None) -> list[float]:
    """Outcome score per episode: `reward_fn` if given, else the environment rewards
    shaped by `reward` (a `RewardConfig`, `RewardManager` or mapping of its weights;
    None: unshaped); plus, either way, the overlong penalty of `reward` for replies near
    `max_tokens` (`overlong_penalties`). Nothing is stored.

    `environment`: one environment for every episode, or a list with one per episode;
    an episode's own `environment` (the copy that played it) comes first (with
    `own_first=False`, a given one does: the reward tuner's explicit `environment=`).
    Environment rewards are checked either way (`check_env_rewards`). An episode that
    ended with an error before its first turn scores 0.0 without calling `reward_fn`.
    """
    for ep in batch:
        check_env_rewards(ep)
    envs = _environments(batch, environment)
    overlong = [math.fsum(p for _, p in overlong_penalties(ep, reward, max_tokens)) for ep in batch]
    if reward_fn is None:
        manager = _shaping(reward)
        return [manager.compute_trajectory_reward(ep, _pick(ep, env, own_first)) + extra
                for ep, env, extra in zip(batch, envs, overlong)]
    if reward is not None and not _shaping(reward).is_identity:
        warnings.warn("a reward_fn is given, so the reward shaping weights (the `reward` config section: "
                      f"{_shaping(reward).weights()}) are not applied; shape inside the reward_fn, or drop it "
                      "to use the weights", UserWarning, stacklevel=3)
    # An episode that failed before its first turn has nothing to score: 0.0, reward_fn not called.
    return [0.0 if ep.error and not ep.turns else call_reward_fn(reward_fn, ep, env, own_first) + extra
            for ep, env, extra in zip(batch, envs, overlong)]


def rescore(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None,
            reward: Any = None, max_tokens: int | None = None) -> TrajectoryBatch:
    """Set `episode.score` for every episode of a stored batch (no new rollout).

    All-or-nothing: every score is computed (and checked) first; if the reward function
    fails on one episode, `RewardError` names it and no episode's score changes.
    """
    scores = episode_scores(batch, reward_fn, environment, reward, max_tokens=max_tokens)
    for ep, s in zip(batch, scores):
        ep.score = s
    return batch


def token_level_scores(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None,
                       reward: Any = None, own_first: bool = True,
                       max_tokens: int | None = None) -> tuple[torch.Tensor, list[float]]:
    """Rewards placed on tokens, and the outcome score per episode; nothing is stored.

    With `reward_fn`, its score sits on the episode's last policy token; without, each
    turn's environment reward times `step_reward_weight` sits on that turn's last policy
    token (the episode's last policy token for a turn with none, e.g. a typed one), and
    the other shaping terms of `reward` on the episode's last policy token. Each reply's
    overlong penalty (`overlong_penalties`, needs `max_tokens`) sits on the reply's last
    sampled token. So the tokens sum to the score. Episodes without policy tokens get no
    token reward.

    Returns:
        (scores (B, T) float32, outcome score per episode). Raises `RewardError` naming
        the episode for a failing reward function or an unusable reward.
    """
    outcome = episode_scores(batch, reward_fn, environment, reward, own_first, max_tokens)  # checks rewards first
    weight = _shaping(reward).step_reward_weight
    scores = torch.zeros_like(batch.loss_mask, dtype=torch.float32)  # (B, T)
    for b, ep in enumerate(batch):
        policy_pos = [i for i, m in enumerate(ep.loss_mask) if m]
        overlong = overlong_penalties(ep, reward, max_tokens)  # only replies with sampled tokens: on policy_pos
        rest = outcome[b] - math.fsum(p for _, p in overlong)  # the score without the overlong penalty
        for pos, penalty in overlong:
            scores[b, pos] += penalty
        if reward_fn is not None:
            if policy_pos:
                scores[b, policy_pos[-1]] += rest
            continue
        for turn in ep.turns:
            ends = [i for i in range(turn.token_start, turn.token_end) if ep.loss_mask[i]]
            pos = ends[-1] if ends else (policy_pos[-1] if policy_pos else None)
            if pos is not None:
                scores[b, pos] += weight * turn.reward
        extra = rest - weight * math.fsum(float(r) for r in ep.rewards)  # the other shaping terms
        if extra and policy_pos:
            scores[b, policy_pos[-1]] += extra
        if not bool(torch.isfinite(scores[b]).all()):  # float32 sums of in-range rewards can overflow
            raise RewardError(f"environment rewards of {_where(ep)} overflow float32 when added on one token; "
                              "rescale the reward")
    return scores, outcome


def score_batch(batch: TrajectoryBatch, reward_fn: RewardFn | None = None, environment: Any = None,
                reward: Any = None, own_first: bool = True, max_tokens: int | None = None) -> TrajectoryBatch:
    """The scoring function (`Trainer.score`, the CLI and `RewardTuner.apply` use it).

    Sets `episode.score` (the outcome) of every episode and the batch's
    `token_level_scores` and `token_level_rewards` (a copy, before any KL penalty); see
    `token_level_scores` for the placement. `max_tokens` is the token limit the replies
    were sampled under (`inference.max_tokens`), which the overlong penalty needs.
    All-or-nothing: a failing reward function or an unusable reward raises `RewardError`
    naming the episode, and nothing changes.
    """
    scores, outcome = token_level_scores(batch, reward_fn, environment, reward, own_first,
                                         max_tokens)  # (B, T), (B,)
    for ep, value in zip(batch, outcome):
        ep.score = value
    batch.set("token_level_scores", scores)
    batch.set("token_level_rewards", scores.clone())
    return batch


def episode_advantages(scores: Sequence[float], group_ids: Sequence[Any], adv_estimator: str = "grpo",
                       norm_adv_by_std_in_grpo: bool = True, gamma: float = 1.0, lam: float = 1.0) -> list[float]:
    """Per-episode advantage of outcome scores under a registered estimator
    (`training.adv_estimator`): each score as a one-token episode's reward, grouped by
    `group_ids`. "gae" has no critic here: values are taken as 0, so its advantage is the
    (whitened) score itself. This is what the update sees on an episode's last token."""
    from workbench import algo

    if not len(scores):
        return []
    rewards = torch.tensor([float(s) for s in scores], dtype=torch.float32)[:, None]  # (B, 1)
    mask = torch.ones_like(rewards)
    estimator = algo.get_advantage_estimator(adv_estimator)
    adv, _ = estimator(token_level_rewards=rewards, response_mask=mask, index=list(group_ids),
                       values=torch.zeros_like(rewards), gamma=gamma, lam=lam,
                       norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)
    return adv[:, 0].tolist()
