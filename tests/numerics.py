"""Comparing sampled turns across computations whose float kernels may differ.

Two runs of the same sampling over another batch layout, thread count, decode mode (the hf
engine times its decode modes and may pick another one under load) or CPU instruction set
round differently: on a 2-core AMD EPYC with avx512_bf16 two batch layouts of the same rows
gave logprobs differing in the 7th digit where an Intel Xeon gave the same bits. So tests
compare what must be equal exactly (the sampled ids) and the logprobs within a stated
tolerance, never their bits.
"""
from __future__ import annotations

from typing import Sequence

#: |logprob difference| allowed between two fp32 computations of the same sample.
FP32_LOGPROB_TOL = 1e-4
#: The same between two bf16 computations (a KV-cached decode step against one forward of the
#: whole sequence, say): each rounds its activations to bf16 (8 bits of mantissa) at other
#: points. Measured on the tiny test model (tests/conftest.py, 10 sampled tokens a row) on a
#: 2-core Xeon with avx512_bf16: at most 0.03 (plain weights) and 0.08 (LoRA adapters); the
#: previous weights' forward, after an update, was 6.4 away.
BF16_LOGPROB_TOL = 0.15


def assert_same_samples(a: Sequence[tuple[list[int], list[float]]], b: Sequence[tuple[list[int], list[float]]],
                        tol: float = FP32_LOGPROB_TOL) -> float:
    """(ids, logprobs) pairs of two runs: the same ids, logprobs within `tol`; returns the
    largest logprob difference."""
    assert len(a) == len(b), (len(a), len(b))
    worst = 0.0
    for i, ((ids_a, lp_a), (ids_b, lp_b)) in enumerate(zip(a, b)):
        assert ids_a == ids_b, f"turn {i}: ids differ: {ids_a} vs {ids_b}"
        assert len(lp_a) == len(lp_b) == len(ids_a), i
        gap = max((abs(x - y) for x, y in zip(lp_a, lp_b)), default=0.0)
        assert gap <= tol, f"turn {i}: logprobs differ by {gap} > {tol}"
        worst = max(worst, gap)
    return worst
