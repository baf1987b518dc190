"""Off-policy correction against the sampling engine's logprobs (verl's rollout correction).

    weights, metrics = rollout_is_weights(old_log_probs, rollout_log_probs, response_mask,
                                          level="token", threshold=2.0)

The engine that sampled a batch may hold other weights than the trainer that updates on
it (asynchronous training: weights one or more updates older), or compute its logprobs
another way (bf16 kernels). PPO's ratio is taken against `old_log_probs` (the trainer's
policy before the update: the "proximal" policy of decoupled PPO), and the importance
weight pi_old / pi_rollout corrects for the policy that really sampled the tokens
(verl's decoupled mode). Weights are truncated from above at `threshold` (truncated IS,
verl's `rollout_is_threshold`); they multiply each token's policy-gradient loss.

Levels (verl's `rollout_is`):
  * "token": w_t = min(exp(old_t - rollout_t), threshold) per token.
  * "sequence": w = min(exp(sum_t (old_t - rollout_t)), threshold), one per sequence,
    on all its tokens.

Log ratios are bounded to [-20, 20] before `exp` (verl's safety bound). Tokens the engine
returned no logprob for (`rollout_log_probs` == 0) get weight 1 and are not counted.
Shapes: B sequences, T tokens.
"""
from __future__ import annotations

import torch

ROLLOUT_IS_LEVELS = ("token", "sequence")
_SAFETY = 20.0


def rollout_is_weights(old_log_probs: torch.Tensor, rollout_log_probs: torch.Tensor, response_mask: torch.Tensor,
                       level: str = "token", threshold: float = 2.0) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated importance weights (B, T) and their metrics.

    Args:
        old_log_probs: (B, T) the trainer's logprobs before the update.
        rollout_log_probs: (B, T) the sampling engine's logprobs (0 where it gave none).
        response_mask: (B, T) 1 on trained tokens.
        level: "token" or "sequence".
        threshold: upper cap of the weights (>= 1).

    Returns:
        weights: (B, T) float32, 0 off the response mask, 1 on trained tokens without an
            engine logprob.
        metrics: `rollout_corr/clipped_fraction` (share of the weighted tokens whose ratio
            exceeded the cap), `rollout_corr/is_weight_mean`, `rollout_corr/log_ratio_abs_mean` (mean |old - rollout|: the engine-trainer gap),
            `rollout_corr/tokens` (tokens weighted).
    """
    if level not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is level must be one of {ROLLOUT_IS_LEVELS}, got {level!r}")
    mask = response_mask.bool()  # (B, T)
    valid = mask & (rollout_log_probs != 0)  # (B, T) trained tokens with an engine logprob
    log_ratio = torch.where(valid, old_log_probs.float() - rollout_log_probs.float(),
                            torch.zeros((), dtype=torch.float32))  # (B, T)
    if level == "token":
        ratio = torch.exp(log_ratio.clamp(-_SAFETY, _SAFETY))  # (B, T)
    else:
        seq = log_ratio.sum(dim=-1, keepdim=True).clamp(-_SAFETY, _SAFETY)  # (B, 1)
        ratio = torch.exp(seq).expand_as(log_ratio)  # (B, T)
    clipped = valid & (ratio > threshold)  # (B, T)
    weights = torch.where(valid, ratio.clamp(max=threshold), torch.ones((), dtype=torch.float32))
    weights = weights * mask  # (B, T)
    n = int(valid.sum())
    metrics = {"rollout_corr/tokens": float(n)}
    if n:
        metrics.update({
            "rollout_corr/clipped_fraction": float(clipped.sum()) / n,
            "rollout_corr/is_weight_mean": float(weights[valid].mean()),
            "rollout_corr/log_ratio_abs_mean": float(log_ratio[valid].abs().mean()),
        })
    return weights, metrics


__all__ = ["ROLLOUT_IS_LEVELS", "rollout_is_weights"]
