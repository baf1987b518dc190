"""Masked tensor statistics and loss aggregation shared by the RL numerics.

Same names and semantics as verl's ``verl/utils/torch_functional.py`` helpers
(``masked_sum``, ``masked_mean``, ``masked_var``, ``masked_whiten``,
``entropy_from_logits``) and ``core_algos.agg_loss``.

Simplified relative to verl:
  * ``agg_loss`` has no data-parallel arguments (``dp_size``, ``batch_num_tokens``,
    ``global_batch_size``): it aggregates over the tensors it is given, which is
    what current verl does when those arguments are left at their defaults.
  * Masks of any dtype (bool, int, float) are accepted; they are cast to the
    dtype of the values before any arithmetic.

Shape letters: B batch, T tokens, V vocab.
"""

from __future__ import annotations

import torch

__all__ = [
    "LOSS_AGG_MODES",
    "masked_sum",
    "masked_mean",
    "masked_var",
    "masked_whiten",
    "entropy_from_logits",
    "agg_loss",
]

#: Valid ``loss_agg_mode`` strings for :func:`agg_loss`.
LOSS_AGG_MODES: tuple[str, ...] = (
    "token-mean",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Sum of ``values`` where ``mask`` is non-zero.

    Positions outside the mask are replaced by 0 before multiplying, so NaN/inf
    there (e.g. garbage log-probs on padding) cannot leak into the sum.

    Args:
        values: Tensor of any shape.
        mask: Same shape as ``values``; 1/True selects a position.
        axis: Dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        The masked sum, ``values`` reduced over ``axis``.
    """
    m = mask.to(values.dtype)
    safe = torch.where(mask.bool(), values, torch.zeros_like(values))
    if axis is None:
        return (safe * m).sum()
    return (safe * m).sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of ``values`` over the positions selected by ``mask``.

    Like verl, the denominator gets ``+ 1e-8`` instead of a check, so an
    all-zero mask gives 0 rather than NaN.

    Args:
        values: Tensor of any shape.
        mask: Same shape as ``values``; 1/True selects a position.
        axis: Dimension to reduce; ``None`` reduces everything to a scalar.

    Returns:
        The masked mean, ``values`` reduced over ``axis``.
    """
    m = mask.to(values.dtype)
    count = m.sum() if axis is None else m.sum(dim=axis)
    return masked_sum(values, mask, axis) / (count + 1e-8)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of ``values`` over all positions selected by ``mask`` (a scalar).

    Args:
        values: Tensor of any shape.
        mask: Same shape as ``values``; 1/True selects a position.
        unbiased: Apply Bessel's correction ``n / (n - 1)`` with n = number of
            selected positions.

    Returns:
        Scalar tensor.

    Raises:
        ValueError: if ``unbiased`` and the mask selects fewer than 2 positions.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = mask.to(values.dtype).sum()
        if n == 0:
            raise ValueError("masked_var: the mask selects no position.")
        if n == 1:
            raise ValueError("masked_var: the mask selects a single position; the unbiased variance is undefined.")
        variance = variance * (n / (n - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Standardise ``values`` with the masked mean and unbiased masked variance.

    ``(values - mean) / sqrt(var + 1e-8)`` is applied to *every* position,
    including the ones outside the mask (verl does not zero them; callers that
    need zeros multiply by the mask).

    Args:
        values: Tensor of any shape.
        mask: Same shape as ``values``; selects the positions used for the statistics.
        shift_mean: If False, the mean is added back (scale only).

    Returns:
        Tensor shaped like ``values``.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask)
    whitened = (values - mean) * torch.rsqrt(var + 1e-8)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical distribution ``softmax(logits)`` along the last dim.

    Uses ``logsumexp(z) - sum(softmax(z) * z)``, equal to ``-sum(p log p)``.

    Args:
        logits: Shape (..., V).

    Returns:
        Shape (...), in nats.
    """
    probs = torch.softmax(logits, dim=-1)
    return torch.logsumexp(logits, dim=-1) - (probs * logits).sum(dim=-1)


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Reduce a per-token loss matrix to a scalar.

    Modes (with S_b = sum_t loss[b, t] * mask[b, t], n_b = sum_t mask[b, t]):
      * ``token-mean``: sum_b S_b / sum_b n_b (every token weighs the same).
      * ``seq-mean-token-sum``: mean_b S_b.
      * ``seq-mean-token-mean``: mean_b S_b / (n_b + 1e-8) (every sequence weighs
        the same; a fully masked row contributes 0 but still counts in the mean).
      * ``seq-mean-token-sum-norm``: mean_b S_b / L with the constant
        L = ``loss_scale_factor`` or, if None, ``loss_mask.shape[-1]`` (Dr.GRPO).

    Args:
        loss_mat: Shape (B, T).
        loss_mask: Shape (B, T); 1/True for tokens that count.
        loss_agg_mode: One of :data:`LOSS_AGG_MODES`.
        loss_scale_factor: Constant normaliser for ``seq-mean-token-sum-norm``.

    Returns:
        Scalar tensor.

    Raises:
        ValueError: for an unknown ``loss_agg_mode``.
    """
    if loss_agg_mode == "token-mean":
        return masked_mean(loss_mat, loss_mask)
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"Unknown loss_agg_mode {loss_agg_mode!r}; valid modes: {list(LOSS_AGG_MODES)}")

    seq_sums = masked_sum(loss_mat, loss_mask, axis=-1)  # (B,)
    if loss_agg_mode == "seq-mean-token-mean":
        counts = loss_mask.to(loss_mat.dtype).sum(dim=-1)  # (B,)
        seq_losses = seq_sums / (counts + 1e-8)
    elif loss_agg_mode == "seq-mean-token-sum-norm":
        scale = loss_mask.shape[-1] if loss_scale_factor is None else loss_scale_factor
        seq_losses = seq_sums / scale
    else:  # seq-mean-token-sum
        seq_losses = seq_sums
    return seq_losses.mean()
