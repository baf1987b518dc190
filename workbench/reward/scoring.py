"""`score_batch`, the one scoring function the trainer, the CLI and the reward tuner use:
an episode's outcome score and its rewards placed on tokens, from the shaping and reward
functions of `workbench.reward.shaping` (see its docstring for the terms and where they sit).
`rescore` sets only `episode.score` (a stored batch, no new rollout); `episode_advantages`
gives the per-episode advantages of a configured estimator (the reward tuner shows them).
Rewards from models (judges, a reward model: `workbench.reward.sources`) are added by weight:
`score = reward.env_weight * environment score + model reward`.
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


def recorded_model_scores(batch: TrajectoryBatch, reward: Any = None) -> list[float | None]:
    """Each episode's model reward from the judgments it already carries (no judge is asked
    again): sum of weight x score, with the weights of `reward` (a `reward` section; None: the
    weights recorded on the judgments); None for an episode whose judgment failed, 0.0 for one
    without judgments."""
    from workbench.reward.judgments import judgments_of

    out: list[float | None] = []
    for ep in batch:
        js = judgments_of(ep)
        if any(j.failed for j in js):
            out.append(None)
            continue
        w = {name: (getattr(reward, f"{name}_weight") if reward is not None and hasattr(reward, f"{name}_weight")
                    else None) for name in ("judge", "group_judge", "reward_model")}
        out.append(math.fsum((w[j.source] if w.get(j.source) is not None else j.weight) * j.score for j in js))
    return out


def _env_weight(reward: Any, model_rewards: Any) -> float:
    if model_rewards is not None:
        return model_rewards.env_weight
    return float(getattr(reward, "env_weight", 1.0)) if reward is not None and not isinstance(reward, dict) else 1.0


def rescore(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None,
            reward: Any = None, max_tokens: int | None = None, model_rewards: Any = None) -> TrajectoryBatch:
    """Set `episode.score` for every episode of a stored batch (no new rollout).

    Episodes that carry judgments (`Episode.judgments`, a run with a model reward) keep them:
    their score is `reward.env_weight` x the environment's score plus the recorded model
    reward with the weights of `reward` (`recorded_model_scores`); `model_rewards`
    (`workbench.reward.sources.ModelRewards`) judges them again instead. An episode whose
    judgment failed gets no score (None).

    All-or-nothing: every score is computed (and checked) first; if the reward function
    fails on one episode, `RewardError` names it and no episode's score changes.
    """
    scores = episode_scores(batch, reward_fn, environment, reward, max_tokens=max_tokens)
    judged = model_rewards is not None or any(ep.judgments for ep in batch)
    if not judged:
        for ep, s in zip(batch, scores):
            ep.score = s
        return batch
    overlong = [math.fsum(p for _, p in overlong_penalties(ep, reward, max_tokens)) for ep in batch]
    model = model_rewards.judge_batch(batch) if model_rewards is not None else recorded_model_scores(batch, reward)
    env_w = _env_weight(reward, model_rewards)
    for ep, s, o, m in zip(batch, scores, overlong, model):
        ep.env_score = s - o
        ep.score = None if m is None else env_w * (s - o) + o + m
    return batch


def token_level_scores(batch: TrajectoryBatch, reward_fn: RewardFn | None, environment: Any = None,
                       reward: Any = None, own_first: bool = True, max_tokens: int | None = None,
                       model_rewards: Any = None) -> tuple[torch.Tensor, list[float | None]]:
    """Rewards placed on tokens, and the outcome score per episode; nothing is stored but the
    judgments (with `model_rewards`).

    With `reward_fn`, its score sits on the episode's last policy token; without, each
    turn's environment reward times `step_reward_weight` sits on that turn's last policy
    token (the episode's last policy token for a turn with none, e.g. a typed one), and
    the other shaping terms of `reward` on the episode's last policy token. Each reply's
    overlong penalty (`overlong_penalties`, needs `max_tokens`) sits on the reply's last
    sampled token. So the tokens sum to the score. Episodes without policy tokens get no
    token reward.

    With `model_rewards` (`workbench.reward.sources.ModelRewards`: judges, a reward model),
    they judge every episode first (`ModelRewards.judge_batch`, recorded on the episodes);
    the environment's part is then scaled by `reward.env_weight` where it sits, and the model
    reward sits on the episode's last policy token. An episode whose judgment failed gets no
    token reward and the outcome None (the update leaves it out, `Episode.reward_error`).

    Returns:
        (scores (B, T) float32, outcome score per episode). Raises `RewardError` naming
        the episode for a failing reward function or an unusable reward.
    """
    outcome: list[float | None] = list(episode_scores(batch, reward_fn, environment, reward, own_first,
                                                      max_tokens))  # checks rewards first
    model = model_rewards.judge_batch(batch) if model_rewards is not None else None
    env_w = model_rewards.env_weight if model_rewards is not None else 1.0
    weight = _shaping(reward).step_reward_weight
    scores = torch.zeros_like(batch.loss_mask, dtype=torch.float32)  # (B, T)
    for b, ep in enumerate(batch):
        policy_pos = [i for i, m in enumerate(ep.loss_mask) if m]
        overlong = overlong_penalties(ep, reward, max_tokens)  # only replies with sampled tokens: on policy_pos
        rest = outcome[b] - math.fsum(p for _, p in overlong)  # the score without the overlong penalty
        if model is not None:
            ep.env_score = rest
            if model[b] is None:  # a failed judgment: no score, no token reward (left out of the update)
                outcome[b] = None
                continue
            outcome[b] = env_w * rest + math.fsum(p for _, p in overlong) + model[b]
            if model[b] and policy_pos:
                scores[b, policy_pos[-1]] += model[b]
        for pos, penalty in overlong:
            scores[b, pos] += penalty
        if reward_fn is not None:
            if policy_pos:
                scores[b, policy_pos[-1]] += env_w * rest
            continue
        for turn in ep.turns:
            ends = [i for i in range(turn.token_start, turn.token_end) if ep.loss_mask[i]]
            pos = ends[-1] if ends else (policy_pos[-1] if policy_pos else None)
            if pos is not None:
                scores[b, pos] += env_w * weight * turn.reward
        extra = rest - weight * math.fsum(float(r) for r in ep.rewards)  # the other shaping terms
        if extra and policy_pos:
            scores[b, policy_pos[-1]] += env_w * extra
        if not bool(torch.isfinite(scores[b]).all()):  # float32 sums of in-range rewards can overflow
            raise RewardError(f"environment rewards of {_where(ep)} overflow float32 when added on one token; "
                              "rescale the reward")
    return scores, outcome


def score_batch(batch: TrajectoryBatch, reward_fn: RewardFn | None = None, environment: Any = None,
                reward: Any = None, own_first: bool = True, max_tokens: int | None = None,
                model_rewards: Any = None) -> TrajectoryBatch:
    """The scoring function (`Trainer.score`, the CLI and `RewardTuner.apply` use it).

    Sets `episode.score` (the outcome) of every episode and the batch's
    `token_level_scores` and `token_level_rewards` (a copy, before any KL penalty); see
    `token_level_scores` for the placement. `max_tokens` is the token limit the replies
    were sampled under (`inference.max_tokens`), which the overlong penalty needs.

    Model rewards (`reward.judge`, `reward.group_judge`, `reward.reward_model`): the
    `model_rewards` given (`workbench.reward.sources.ModelRewards`; the trainer keeps one),
    else the ones `reward` turns on, built for this call and closed after it. Each episode
    then records its judgments and its environment score (`Episode.env_score`); one whose
    judgment failed gets `score` None and `reward_error` (the update leaves it out).

    All-or-nothing: a failing reward function or an unusable reward raises `RewardError`
    naming the episode, and nothing changes.
    """
    own = None
    if model_rewards is None:
        from workbench.reward.sources import ModelRewards

        model_rewards = own = ModelRewards.from_config(reward)
    try:
        scores, outcome = token_level_scores(batch, reward_fn, environment, reward, own_first,
                                             max_tokens, model_rewards)  # (B, T), (B,)
    finally:
        if own is not None:
            own.close()
    for ep, value in zip(batch, outcome):
        ep.score = value
        if model_rewards is None:
            ep.judgments, ep.env_score, ep.reward_error = [], None, None
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
