"""PPO-style policy losses (vanilla clipped / dual-clip / clip-higher, GSPO) and the clipped value loss.

Same numbers as verl's ``compute_policy_loss_vanilla``, ``compute_policy_loss_gspo``
and ``compute_value_loss`` in ``verl/trainer/ppo/core_algos.py``.

Simplified / changed relative to verl:
  * Clip ranges are keyword arguments instead of an ``ActorConfig``; both policy
    losses share one signature so :func:`get_policy_loss_fn` callers can pass the
    same keywords to either.
  * Every loss returns ``(loss, metrics)`` where ``metrics`` is a dict of Python
    floats with fixed names (``actor/pg_loss``, ``actor/pg_clipfrac``,
    ``actor/pg_clipfrac_lower``, ``actor/ppo_kl``; ``critic/vf_loss``,
    ``critic/vf_clipfrac``).
  * No rollout importance-sampling weights, no data-parallel loss scaling, and
    only the "vanilla" and "gspo" policy losses (no clip_cov/kl_cov/gpg/geo_mean).

Shape letters: B batch, T tokens.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from workbench.algo.utils import LOSS_AGG_MODES, agg_loss, masked_mean

__all__ = [
    "PolicyLossFn",
    "register_policy_loss",
    "get_policy_loss_fn",
    "compute_policy_loss",
    "compute_policy_loss_gspo",
    "compute_value_loss",
]

#: ``fn(old_log_probs, log_probs, advantages, response_mask, **clip_kwargs) -> (loss, metrics)``.
PolicyLossFn = Callable[..., tuple[torch.Tensor, dict[str, float]]]

_POLICY_LOSSES: dict[str, PolicyLossFn] = {}


def register_policy_loss(name: str) -> Callable[[PolicyLossFn], PolicyLossFn]:
    """Decorator registering a policy loss under ``name`` (re-registering replaces).

    Args:
        name: Registry key, e.g. ``"vanilla"``.

    Returns:
        The decorator; it returns the function unchanged.
    """

    def decorator(fn: PolicyLossFn) -> PolicyLossFn:
        _POLICY_LOSSES[name] = fn
        return fn

    return decorator


def get_policy_loss_fn(name: str) -> PolicyLossFn:
    """Look up a registered policy loss (``"vanilla"``, ``"gspo"``, or your own).

    Raises:
        ValueError: for an unknown name, listing the known ones.
    """
    if name not in _POLICY_LOSSES:
        raise ValueError(f"Unknown policy loss {name!r}; known: {sorted(_POLICY_LOSSES)}")
    return _POLICY_LOSSES[name]


def _clip_bounds(clip_ratio: float, clip_ratio_low: float | None, clip_ratio_high: float | None) -> tuple[float, float]:
    low = clip_ratio if clip_ratio_low is None else clip_ratio_low
    high = clip_ratio if clip_ratio_high is None else clip_ratio_high
    return low, high


@register_policy_loss("vanilla")
def compute_policy_loss(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped PPO surrogate with dual-clip and asymmetric (clip-higher) ranges.

    ``ratio = exp(clamp(logp - old_logp, -20, 20))``; per token
    ``l = max(-A * ratio, -A * clamp(ratio, 1 - low, 1 + high))``; where ``A < 0``
    the loss is further capped at ``-A * clip_ratio_c`` (dual-clip, so a huge
    ratio on a bad token cannot blow up the loss).  Aggregated by :func:`agg_loss`.

    Metrics (Python floats, over masked tokens):
      * ``actor/pg_loss``: the aggregated loss.
      * ``actor/pg_clipfrac``: fraction where the clipped term was strictly larger.
      * ``actor/pg_clipfrac_lower``: fraction with ``A < 0`` capped by the dual clip.
      * ``actor/ppo_kl``: mean of ``old_logp - logp`` (clamped as above).

    Args:
        old_log_probs: (B, T) log-probs of the sampled tokens under the behaviour policy.
        log_probs: (B, T) log-probs under the current policy (carries the gradient).
        advantages: (B, T).
        response_mask: (B, T), 1 on tokens that count.
        clip_ratio: Symmetric clip epsilon, the default for both sides.
        clip_ratio_low: Lower epsilon (ratio floor ``1 - low``); None -> ``clip_ratio``.
        clip_ratio_high: Upper epsilon (ratio ceiling ``1 + high``); None -> ``clip_ratio``.
        clip_ratio_c: Dual-clip constant, must be > 1.
        loss_agg_mode: See :func:`workbench.algo.utils.agg_loss`.

    Returns:
        ``(loss, metrics)``: scalar tensor and dict of floats.

    Raises:
        ValueError: if ``clip_ratio_c <= 1`` or the aggregation mode is unknown.
    """
    if clip_ratio_c <= 1.0:
        raise ValueError(f"clip_ratio_c must be > 1 for dual-clip PPO, got {clip_ratio_c}.")
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)

    log_ratio = torch.clamp(log_probs - old_log_probs, min=-20.0, max=20.0)  # (B, T)
    ratio = torch.exp(log_ratio)
    ppo_kl = masked_mean(-log_ratio, response_mask)

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    loss_ppo = torch.maximum(loss_unclipped, loss_clipped)
    clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).to(ratio.dtype), response_mask)

    loss_cap = -advantages * clip_ratio_c
    loss_dual = torch.minimum(loss_ppo, loss_cap)
    negative = advantages < 0
    clipfrac_lower = masked_mean((torch.gt(loss_ppo, loss_cap) & negative).to(ratio.dtype), response_mask)

    per_token = torch.where(negative, loss_dual, loss_ppo)  # (B, T)
    loss = agg_loss(per_token, response_mask, loss_agg_mode)
    metrics = {
        "actor/pg_loss": loss.detach().item(),
        "actor/pg_clipfrac": clipfrac.detach().item(),
        "actor/pg_clipfrac_lower": clipfrac_lower.detach().item(),
        "actor/ppo_kl": ppo_kl.detach().item(),
    }
    return loss, metrics


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_probs: torch.Tensor,
    log_probs: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    clip_ratio: float = 0.2,
    clip_ratio_low: float | None = None,
    clip_ratio_high: float | None = None,
    clip_ratio_c: float = 3.0,
    loss_agg_mode: str = "seq-mean-token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """GSPO: clip a sequence-level (geometric-mean) importance ratio (arXiv 2507.18071).

    ``log s_b = mean over masked t of (logp - old_logp)``; each token uses
    ``log s_{b,t} = sg[log s_b] + logp_t - sg[logp_t]`` (value = the sequence
    ratio, gradient = the token's own log-prob), clamped above at 10, then the
    usual ``max(-A * s, -A * clamp(s, 1 - low, 1 + high))``.  As in verl the loss
    is always aggregated with ``seq-mean-token-mean``; ``loss_agg_mode`` is only
    validated, and ``clip_ratio_c`` is unused (same signature as the vanilla loss).
    The GSPO paper uses much smaller ranges than PPO (around 3e-4 / 4e-4).

    Args:
        old_log_probs: (B, T).
        log_probs: (B, T), carries the gradient.
        advantages: (B, T), normally constant along each sequence.
        response_mask: (B, T).
        clip_ratio: Default for both clip epsilons.
        clip_ratio_low: Lower epsilon; None -> ``clip_ratio``.
        clip_ratio_high: Upper epsilon; None -> ``clip_ratio``.
        clip_ratio_c: Unused.
        loss_agg_mode: Validated but ignored (always ``seq-mean-token-mean``).

    Returns:
        ``(loss, metrics)`` with the same metric names as :func:`compute_policy_loss`
        (``actor/pg_clipfrac_lower`` is always 0; ``actor/ppo_kl`` is unclamped).
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"Unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {list(LOSS_AGG_MODES)}")
    low, high = _clip_bounds(clip_ratio, clip_ratio_low, clip_ratio_high)
    mask = response_mask.to(log_probs.dtype)

    log_ratio = log_probs - old_log_probs  # (B, T)
    seq_len = mask.sum(dim=-1).clamp(min=1)  # (B,)
    seq_log_ratio = (log_ratio * mask).sum(dim=-1) / seq_len  # (B,)
    token_log_ratio = log_probs - log_probs.detach() + seq_log_ratio.detach().unsqueeze(-1)  # (B, T)
    ratio = torch.exp(torch.clamp(token_log_ratio, max=10.0))

    loss_unclipped = -advantages * ratio
    loss_clipped = -advantages * torch.clamp(ratio, 1 - low, 1 + high)
    per_token = torch.maximum(loss_unclipped, loss_clipped)  # (B, T)
    loss = agg_loss(per_token, response_mask, "seq-mean-token-mean")

    clipfrac = masked_mean(torch.gt(loss_clipped, loss_unclipped).to(ratio.dtype), response_mask)
    ppo_kl = masked_mean(-log_ratio, response_mask)
    metrics = {
        "actor/pg_loss": loss.detach().item(),
        "actor/pg_clipfrac": clipfrac.detach().item(),
        "actor/pg_clipfrac_lower": 0.0,
        "actor/ppo_kl": ppo_kl.detach().item(),
    }
    return loss, metrics


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    old_values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped value loss: ``0.5 * agg(max((v - R)^2, (clip(v, v_old +- c) - R)^2))``.

    Args:
        vpreds: (B, T) current critic predictions (carry the gradient).
        returns: (B, T) targets, e.g. the GAE returns.
        old_values: (B, T) critic values at rollout time.
        response_mask: (B, T).
        cliprange_value: c, how far the prediction may move from ``old_values``.
        loss_agg_mode: See :func:`workbench.algo.utils.agg_loss`.

    Returns:
        ``(loss, metrics)``; metrics ``critic/vf_loss`` and ``critic/vf_clipfrac``
        (fraction of masked tokens where the clipped error was strictly larger).
    """
    vpred_clipped = torch.clamp(vpreds, old_values - cliprange_value, old_values + cliprange_value)
    err_unclipped = (vpreds - returns) ** 2  # (B, T)
    err_clipped = (vpred_clipped - returns) ** 2  # (B, T)
    loss = 0.5 * agg_loss(torch.maximum(err_unclipped, err_clipped), response_mask, loss_agg_mode)
    clipfrac = masked_mean(torch.gt(err_clipped, err_unclipped).to(vpreds.dtype), response_mask)
    metrics = {
        "critic/vf_loss": loss.detach().item(),
        "critic/vf_clipfrac": clipfrac.detach().item(),
    }
    return loss, metrics
