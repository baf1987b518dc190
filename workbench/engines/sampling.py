"""Sampling one id per row from logits, on the logits' device, from uniforms drawn on the host.

The randomness is CPU generators' on purpose, whatever the model's device: one seed
gives the same uniforms on any device. The host draws one float64 uniform per row and
step (`draw_uniforms`) and uploads it without waiting (`non_blocking=True`); the draw
itself is an inverse CDF on the device (`_inverse_cdf`), so the sampled ids are the only
thing the decode loop has to read back. The top-p path reads one more value per step:
whether the top `_NUCLEUS_CANDIDATES` ids hold every row's nucleus.
"""
from __future__ import annotations

import torch

from workbench.engines.base import SamplingParams

#: Candidates sorted for top-p before falling back to a full-vocabulary sort.
_NUCLEUS_CANDIDATES = 512
#: Ids per block of the two-level inverse CDF (`_inverse_cdf`).
_CDF_BLOCK = 1024


def _sample(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None,
            logprobs: torch.Tensor | None = None) -> torch.Tensor:
    """One id per row of (B, V) logits with temperature / top-k / top-p: (B,) on logits' device.

    `u`: (B,) float64 uniforms in [0, 1) on the logits' device (unused when greedy).
    `logprobs`: the (B, V) `log_softmax(logits)` when the caller has it: at temperature 1
    without top-k / top-p the weights are its exp (one pass) instead of a softmax.
    """
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    assert u is not None, "sampling needs one uniform per row"
    if logprobs is not None and params.temperature == 1 and params.top_k <= 0 and params.top_p >= 1.0:
        return _inverse_cdf(logprobs.exp(), u)
    scaled = logits / params.temperature  # (B, V)
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = torch.softmax(scaled, dim=-1)  # (B, V)
        # The nucleus nearly always lies among the most likely few hundred ids: sort only
        # those (a full (B, V) sort per step is slow on CPU); if they hold less than top_p
        # of some row's mass, sort everything. Same nucleus either way.
        k = min(_NUCLEUS_CANDIDATES, probs.shape[-1])
        top_probs, top_idx = torch.topk(probs, k, dim=-1)  # (B, k), descending
        if k < probs.shape[-1] and not bool((top_probs.sum(-1) >= params.top_p).all()):  # a host read
            top_probs, top_idx = torch.sort(probs, descending=True, dim=-1)  # (B, V)
        # Drop tokens once the mass before them already reaches top_p (keep at least one),
        # then draw among the kept candidates only (the inverse CDF renormalises).
        keep_sorted = (top_probs.cumsum(dim=-1) - top_probs) < params.top_p
        weights = top_probs * keep_sorted  # (B, k)
        return top_idx.gather(-1, _inverse_cdf(weights, u)[:, None]).squeeze(-1)
    return _inverse_cdf(torch.softmax(scaled, dim=-1), u)


def sample_with_logprobs(logits: torch.Tensor, params: SamplingParams, u: torch.Tensor | None,
                         buffer: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """One id per row of (B, V) fp32 logits (`_sample`'s draw) and its logprob under
    `log_softmax(logits)` (temperature 1, the raw distribution): ((B,) ids, (B,) fp32).

    No (B, V) log-softmax is made: a row's logprob is its logit less the row's
    log-sum-exp. At temperature 1 without top-k / top-p the draw's weights are
    `exp(logits - row max)`, unnormalised (the inverse CDF divides by the row's total), written
    into `buffer` (a (>= B, V) fp32 scratch tensor, e.g. kept by the caller across steps,
    so no fresh (B, V) allocation faults in pages), and the log-sum-exp is the row max
    plus the log of their sum. At 128 x 49152 on a 2-core Xeon (one thread, 2026-12-01):
    log_softmax 23 ms and its exp 5-9 ms, against a max, a subtraction and an exp in
    place, ~10 ms.
    """
    if params.temperature == 1 and params.top_k <= 0 and params.top_p >= 1.0:
        assert u is not None, "sampling needs one uniform per row"
        B, V = logits.shape
        top = logits.amax(dim=-1, keepdim=True)  # (B, 1)
        weights = torch.sub(logits, top, out=buffer[:B] if buffer is not None else None).exp_()  # (B, V)
        tokens = _inverse_cdf(weights, u)  # (B,)
        lse = top.squeeze(-1) + weights.sum(-1).log()  # (B,)
    else:
        tokens = _sample(logits, params, u)  # (B,)
        lse = torch.logsumexp(logits, dim=-1)  # (B,)
    return tokens, logits.gather(-1, tokens[:, None]).squeeze(-1) - lse


def _inverse_cdf(weights: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """One draw per row of (B, N) non-negative weights given (B,) uniforms: (B,) column indices.

    Each uniform, times the row's total, is placed in the float64 cumulative weights. A
    zero-weight id can never be drawn (its cumulative value equals its neighbour's).
    `torch.multinomial` draws N exponentials per row instead (13 ms vs 0.2 ms at 8 x 49k
    on CPU). Over more than `_CDF_BLOCK` ids the search has two levels: the float64 sums
    of blocks of ids, accumulated, find the block; the float64 cumulative weights of that
    block alone find the id. On the CPU at 128 x 49152 that is 15 ms against 24 ms for a
    float64 copy and cumulative sum of the whole (B, N) (fp32 weights, 2 threads, Xeon,
    2026-11-26). Each block's own sum is taken in the weights' dtype (fp32: ~1e-7 relative)
    and only the block sums accumulate in float64: a float64 sum of every block converted
    the whole (B, N) first, 40 ms against 1.2 ms at 128 x 49152 (one thread, 2-core Xeon
    avx512_bf16 without amx, 2026-12-01). The two orders of summation round differently, so
    a uniform within ~1e-7 of a block's edge (~1e-16 of a boundary inside a block) may pick
    a neighbouring id.
    """
    B, N = weights.shape
    u = u.to(weights.device)
    if N <= _CDF_BLOCK:
        cdf = weights.to(torch.float64).cumsum(-1)  # (B, N)
        draw = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)  # (B,)
        return draw.clamp_(max=N - 1)
    C = _CDF_BLOCK
    nb = -(-N // C)
    w = weights if nb * C == N else torch.nn.functional.pad(weights, (0, nb * C - N))  # zero-weight padding
    w = w.view(B, nb, C)  # (B, nb, C)
    # each block summed in the weights' dtype, the sums accumulated in float64 (docstring)
    block_cdf = w.sum(-1).to(torch.float64).cumsum(-1)  # (B, nb)
    target = u * block_cdf[:, -1]  # (B,)
    block = torch.searchsorted(block_cdf, target[:, None], right=True).squeeze(-1).clamp_(max=nb - 1)  # (B,)
    before = block_cdf.gather(-1, (block - 1).clamp(min=0)[:, None]).squeeze(-1) * (block > 0)  # (B,)
    inner = w.gather(1, block[:, None, None].expand(B, 1, C)).squeeze(1).to(torch.float64).cumsum(-1)  # (B, C)
    # The rest of the target inside the block, kept in [0, the block's total): rounding between
    # the two sums must not step past the block's last positive weight or before its first.
    rest = torch.minimum((target - before).clamp_(min=0), torch.nextafter(inner[:, -1], torch.zeros_like(target)))
    draw = block * C + torch.searchsorted(inner, rest[:, None], right=True).squeeze(-1)  # (B,)
    return draw.clamp_(max=N - 1)


def draw_uniforms(n: int, gen: torch.Generator | list[torch.Generator]) -> torch.Tensor:
    """(n,) float64 uniforms on the CPU: `n` from one generator, or one from each of `gen`'s."""
    if isinstance(gen, list):
        assert len(gen) == n
        return torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gen]) if gen else torch.zeros(0)
    return torch.rand(n, generator=gen, dtype=torch.float64)


def _multinomial(weights: torch.Tensor, gen: torch.Generator | list[torch.Generator]) -> torch.Tensor:
    """One draw per row of (B, N) CPU weights from `gen` (one generator, or one per row): (B,)."""
    return _inverse_cdf(weights, draw_uniforms(weights.shape[0], gen))
