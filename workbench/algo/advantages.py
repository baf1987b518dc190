"""Advantage estimators (GAE, GRPO, RLOO, REINFORCE++, REINFORCE++-baseline) and their registry.

Same names, arguments and numbers as verl's ``verl/trainer/ppo/core_algos.py``
(``compute_gae_advantage_return``, ``compute_grpo_outcome_advantage``,
``compute_rloo_outcome_advantage``, ``compute_reinforce_plus_plus_outcome_advantage``,
``compute_reinforce_plus_plus_baseline_outcome_advantage``), written in plain torch.

Multi-turn: ``response_mask`` is 1 on tokens the policy generated and 0 on
everything else inside the response window (tool output, environment
observations, chat-template tokens, right padding).  GAE skips the 0 tokens
(values and TD errors pass through them), as current verl does.

Simplified / changed relative to verl:
  * The grouped estimators (GRPO, RLOO, RF++-baseline) are vectorised with
    ``index_add_`` instead of per-sample Python loops; ``index`` may be a list,
    tuple, numpy array or 1-D tensor of hashable ids (tensors are converted with
    ``tolist()`` so equal ids group together; verl would hash 0-d tensors by
    identity).
  * No ``config`` object: hyper-parameters are plain keyword arguments, and every
    registered estimator takes ``**kwargs`` and ignores what it does not use.
  * ``compute_gae_advantage_return`` has ``whiten=True`` (False returns the raw
    GAE advantages, for inspection and tests).
  * ``compute_reinforce_plus_plus_advantage`` carries the return-to-go through
    mask-0 tokens (``multi_turn=True``, the default, as current verl does), so the
    final reward of a multi-turn episode reaches its earlier turns; returns are
    reported as 0 on mask-0 tokens. ``multi_turn=False`` is the older verl
    behaviour that resets the return at every mask-0 token.
  * Only these five estimators; no REMAX/OPO/GPG/pass@k.

Shape letters: B batch, T tokens, G groups.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable, Sequence
from typing import TYPE_CHECKING, Any, Union

import torch

from workbench.algo.utils import masked_whiten

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "AdvantageEstimator",
    "AdvantageFn",
    "GROUP_RELATIVE_ESTIMATORS",
    "register_advantage_estimator",
    "get_advantage_estimator",
    "compute_gae_advantage_return",
    "compute_grpo_advantage",
    "compute_rloo_advantage",
    "compute_reinforce_plus_plus_advantage",
    "compute_reinforce_plus_plus_baseline_advantage",
]

#: An estimator takes keyword arguments and returns ``(advantages, returns)``, both (B, T).
AdvantageFn = Callable[..., tuple[torch.Tensor, torch.Tensor]]

#: Group ids, one per sample: list/tuple/numpy array/1-D tensor of hashables.
GroupIndex = Union[Sequence[Hashable], torch.Tensor, "np.ndarray"]

_ADVANTAGE_ESTIMATORS: dict[str, AdvantageFn] = {}


class AdvantageEstimator:
    """Names of the built-in estimators (plain strings, to avoid typos)."""

    GAE = "gae"
    GRPO = "grpo"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"


#: Built-in estimators whose advantages are rewards relative to the episode's group: a group
#: with identical rewards contributes nothing to the update (the trainer's zero-variance
#: warning and `training.dynamic_sampling` apply to these).
GROUP_RELATIVE_ESTIMATORS = (AdvantageEstimator.GRPO, AdvantageEstimator.RLOO,
                             AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)


def register_advantage_estimator(name: str) -> Callable[[AdvantageFn], AdvantageFn]:
    """Decorator registering ``fn`` under ``name`` for :func:`get_advantage_estimator`.

    Re-registering a name replaces the previous function (so re-running a
    notebook cell works).  Trainers call estimators with keyword arguments only
    (``token_level_rewards=``, ``response_mask=``, ``index=``, ``values=``,
    ``gamma=``, ...), so ``fn`` should swallow the keys it does not use with
    ``**kwargs``.

    Args:
        name: Registry key, e.g. ``"my_estimator"``.

    Returns:
        The decorator; it returns ``fn`` unchanged.
    """

    def decorator(fn: AdvantageFn) -> AdvantageFn:
        _ADVANTAGE_ESTIMATORS[name] = fn
        return fn

    return decorator


def get_advantage_estimator(name: str) -> AdvantageFn:
    """Look up a registered estimator.

    Args:
        name: e.g. ``"gae"``, ``"grpo"``, ``"rloo"``, ``"reinforce_plus_plus"``,
            ``"reinforce_plus_plus_baseline"``.

    Returns:
        The estimator; call it with keyword arguments.

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in _ADVANTAGE_ESTIMATORS:
        raise ValueError(f"Unknown advantage estimator {name!r}; known: {sorted(_ADVANTAGE_ESTIMATORS)}")
    return _ADVANTAGE_ESTIMATORS[name]


# --------------------------------------------------------------------------- helpers


def _group_ids(index: GroupIndex | None, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable ids to dense ints 0..G-1; returns (ids (B,), G)."""
    if index is None:
        raise ValueError("This advantage estimator groups samples and needs index= (one group id per sample).")
    keys = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(keys) != batch_size:
        raise ValueError(f"index has {len(keys)} entries but the batch has {batch_size} samples.")
    dense: dict[Hashable, int] = {}
    ids = [dense.setdefault(k, len(dense)) for k in keys]
    return torch.tensor(ids, dtype=torch.long, device=device), len(dense)


def _group_stats(scores: torch.Tensor, gid: torch.Tensor, num_groups: int) -> tuple[torch.Tensor, ...]:
    """Per-sample group mean, unbiased std and size, each (B,).

    Singleton groups get mean 0 and std 1, as in verl.
    """
    zeros = scores.new_zeros(num_groups)  # (G,)
    counts = zeros.index_add(0, gid, torch.ones_like(scores))  # (G,)
    mean = zeros.index_add(0, gid, scores) / counts  # (G,)
    sq_dev = zeros.index_add(0, gid, (scores - mean[gid]) ** 2)  # (G,)
    std = torch.sqrt(sq_dev / (counts - 1).clamp(min=1))  # (G,)
    single = counts == 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(std), std)
    return mean[gid], std[gid], counts[gid]  # each (B,)


def _scores_and_group_stats(token_level_rewards: torch.Tensor,
                            index: GroupIndex | None) -> tuple[torch.Tensor, ...]:
    """Sequence scores (sum over all T) and their per-sample group mean, std and size, each (B,)."""
    scores = token_level_rewards.sum(dim=-1)  # (B,)
    gid, num_groups = _group_ids(index, scores.shape[0], scores.device)
    return (scores, *_group_stats(scores, gid, num_groups))


# --------------------------------------------------------------------------- estimators


def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation that skips non-policy tokens (multi-turn aware).

    Backwards over t, with carried ``next_value`` and ``gae`` (both 0 past the end):
    ``delta = r_t + gamma * next_value - v_t``; ``gae_t = delta + gamma * lam * gae``.
    On tokens with mask 1 the carry becomes ``(v_t, gae_t)``; on mask-0 tokens it
    passes through unchanged, so an observation between two turns is skipped
    rather than treated as an episode end (its own reward and value are ignored).
    ``returns = advantages + values`` before whitening; the advantages are then
    whitened over the masked tokens of the whole batch (mask-0 positions are
    whitened too, not zeroed).

    Args:
        token_level_rewards: (B, T) rewards, usually non-zero on the last token of a turn.
        values: (B, T) critic values V(s_t).
        response_mask: (B, T), 1 on policy-generated tokens.
        gamma: Discount factor.
        lam: GAE lambda.
        whiten: If False, return the raw (unwhitened) advantages.

    Returns:
        ``(advantages, returns)``, both (B, T), without gradient.

    Raises:
        ValueError: if ``values`` is None.
    """
    if values is None:
        raise ValueError("GAE needs values= (critic value estimates, shape (B, T)).")
    with torch.no_grad():
        mask = response_mask.to(values.dtype)
        rewards = token_level_rewards.to(values.dtype)
        next_value = torch.zeros_like(values[:, 0])  # (B,)
        gae = torch.zeros_like(values[:, 0])  # (B,)
        advantages = torch.empty_like(values)  # (B, T)
        for t in reversed(range(values.shape[1])):
            m = mask[:, t]
            delta = rewards[:, t] + gamma * next_value - values[:, t]
            gae_t = delta + gamma * lam * gae
            next_value = values[:, t] * m + (1 - m) * next_value
            gae = gae_t * m + (1 - m) * gae
            advantages[:, t] = gae
        returns = advantages + values
        if whiten:
            advantages = masked_whiten(advantages, response_mask)
    return advantages, returns


@register_advantage_estimator(AdvantageEstimator.GAE)
def _gae_estimator(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    values: torch.Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 1.0,
    whiten: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Registry entry for ``"gae"``: keyword call of :func:`compute_gae_advantage_return`."""
    if values is None:
        raise ValueError(
            "Advantage estimator 'gae' needs values= (critic value estimates, shape (B, T)); "
            "without a critic use 'grpo', 'rloo' or 'reinforce_plus_plus'."
        )
    return compute_gae_advantage_return(token_level_rewards, values, response_mask, gamma, lam, whiten=whiten)


@register_advantage_estimator(AdvantageEstimator.GRPO)
def compute_grpo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex | None = None,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage: the sequence score standardised within its group.

    ``score_b = sum_t r[b, t]`` (over all T, masked or not); per group mean and
    unbiased std; ``A_b = (score_b - mean) / (std + epsilon)``, or
    ``score_b - mean`` when ``norm_adv_by_std_in_grpo=False`` (Dr.GRPO).  A group
    of one has mean 0 and std 1, so its advantage is its raw score (/(1+eps)).
    ``A_b`` is broadcast over the tokens and multiplied by the mask.

    Args:
        token_level_rewards: (B, T).
        response_mask: (B, T).
        index: One group id per sample (e.g. the prompt uid), length B.
        epsilon: Added to the std.
        norm_adv_by_std_in_grpo: Divide by the group std (GRPO) or not (Dr.GRPO).
        **kwargs: Ignored.

    Returns:
        ``(advantages, returns)``, equal, both (B, T).

    Raises:
        ValueError: if ``index`` is missing or has the wrong length.
    """
    with torch.no_grad():
        scores, mean, std, _ = _scores_and_group_stats(token_level_rewards, index)  # each (B,)
        adv = scores - mean
        if norm_adv_by_std_in_grpo:
            adv = adv / (std + epsilon)
        advantages = adv.unsqueeze(-1) * response_mask.to(adv.dtype)  # (B, T)
    return advantages, advantages.clone()


@register_advantage_estimator(AdvantageEstimator.RLOO)
def compute_rloo_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex | None = None,
    epsilon: float = 1e-6,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO: score minus the mean score of the *other* samples of its group.

    For a group of n > 1, ``A_b = score_b * n/(n-1) - mean * n/(n-1)``, which
    equals ``score_b - mean(others)``.  A group of one keeps its raw score.

    Args:
        token_level_rewards: (B, T).
        response_mask: (B, T).
        index: One group id per sample, length B.
        epsilon: Unused (kept for a uniform signature, as in verl).
        **kwargs: Ignored.

    Returns:
        ``(advantages, returns)``, equal, both (B, T).
    """
    with torch.no_grad():
        scores, mean, _, n = _scores_and_group_stats(token_level_rewards, index)  # each (B,)
        factor = n / (n - 1).clamp(min=1)
        adv = torch.where(n > 1, scores * factor - mean * factor, scores)
        advantages = adv.unsqueeze(-1) * response_mask.to(adv.dtype)  # (B, T)
    return advantages, advantages.clone()


@register_advantage_estimator(AdvantageEstimator.REINFORCE_PLUS_PLUS)
def compute_reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float = 1.0,
    multi_turn: bool = True,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++: discounted return-to-go, whitened over the batch.

    Backwards over t. With ``multi_turn=True`` (default): on a mask-1 token
    ``G = r_t + gamma * G`` and ``returns_t = G``; a mask-0 token (observation,
    tool output, template glue, padding) passes ``G`` through untouched, its reward
    ignored, and reports ``returns_t = 0``. So the reward at the end of the last turn
    reaches every earlier turn, discounted once per policy token. With
    ``multi_turn=False`` (older verl): ``G_t = r_t + gamma * G`` is stored on every
    token, then the carried ``G`` is ``G_t * mask_t``, which resets the return at
    every mask-0 token (it assumed 0 only appears as padding after EOS), so earlier
    turns get no credit for a final reward.
    Advantages are ``masked_whiten(returns) * mask``.

    Args:
        token_level_rewards: (B, T).
        response_mask: (B, T).
        gamma: Discount factor.
        multi_turn: Carry the return through mask-0 tokens instead of resetting.
        **kwargs: Ignored.

    Returns:
        ``(advantages, returns)``, both (B, T).
    """
    with torch.no_grad():
        mask = response_mask.to(token_level_rewards.dtype)
        returns = torch.zeros_like(token_level_rewards)  # (B, T)
        running = torch.zeros_like(token_level_rewards[:, 0])  # (B,)
        for t in reversed(range(token_level_rewards.shape[1])):
            m = mask[:, t]
            if multi_turn:
                running = (token_level_rewards[:, t] + gamma * running) * m + (1 - m) * running
                returns[:, t] = running * m
            else:
                running = token_level_rewards[:, t] + gamma * running
                returns[:, t] = running
                running = running * m
        advantages = masked_whiten(returns, response_mask) * mask
    return advantages, returns


@register_advantage_estimator(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
def compute_reinforce_plus_plus_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: GroupIndex | None = None,
    epsilon: float = 1e-6,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline: score minus group mean, broadcast, then whitened over the batch.

    ``A_b = score_b - mean_group`` (a group of one has mean 0), broadcast over
    the tokens, times the mask, then ``masked_whiten(., mask) * mask``.

    Args:
        token_level_rewards: (B, T).
        response_mask: (B, T).
        index: One group id per sample, length B.
        epsilon: Unused (kept for a uniform signature, as in verl).
        **kwargs: Ignored.

    Returns:
        ``(advantages, returns)``, equal, both (B, T).
    """
    with torch.no_grad():
        scores, mean, _, _ = _scores_and_group_stats(token_level_rewards, index)  # each (B,)
        mask = response_mask.to(scores.dtype)
        advantages = (scores - mean).unsqueeze(-1) * mask  # (B, T)
        advantages = masked_whiten(advantages, response_mask) * mask
    return advantages, advantages.clone()
