"""Weights packed for the compiled skinny product, for a CPU decode step of few rows.

A decode step of B rows multiplies every weight by B rows: at 8 rows that is 16 flops per
weight element read, so the step's products are bound by reading the weights, and MKL's
packed fp32 GEMM and oneDNN's bf16 one, made for products with reuse, read them far below
the machine's bandwidth (`benchmarks/decode_floor.py`). `cpu_kernels.skinny_linear`
(`csrc/skinny_linear.cpp`) reads each weight once as panels of 16 outputs, contiguous, with
every row's sums in registers; `pack(weight)` lays a weight out that way, once.

`SkinnyWeights` is the decode step's packer (the calls of `packed_matmul.PackedWeights` and
`onednn_weights.OneDNNWeights`) in front of one of those (`fallback`). Products of at most
`ALWAYS_ROWS` rows run through its panels. For larger row counts it times both ways on the first
product of each weight shape in each row bucket and keeps the faster for that shape and bucket:
on a 2-core AMD EPYC (Zen 3, avx2, fp32, 2026-12-03; `benchmarks/skinny_products.py`) the panels
were 3.0x MKL's packed GEMM over SmolLM2's products at 8 rows and 1.5x at 128 (MKL's kernels
on AMD CPUs), but one shape, the LM head at 128 rows (a 25 MB output written in blocks of 6
rows), was timed faster through MKL in one run and through the panels in another, and an
Intel CPU need not repeat either. A panel copy costs the
weights' bytes once more and is made again only when its weight changed (its version counter
or storage: an optimizer step, `load_state_dict`); a LoRA policy's frozen base is packed once;
the fallback packs only for the buckets and shapes it runs (and once to be timed).

The sums run over K in order in fp32 and are rounded once, so outputs are the plain product's
to fp32 rounding (fp32) or within one bf16 rounding of oneDNN's (bf16).
"""
from __future__ import annotations

import statistics
import threading
import time
import weakref
from typing import Any

import torch

from workbench.engines.decode_threads import row_bucket  # the decode modes' buckets: the same powers of two

#: Products of at most this many rows always run the skinny kernel (more: timed against the fallback).
ALWAYS_ROWS = 16
#: Timed products of each way per weight shape and row bucket (after one untimed each: the fallback packs there).
TIMED_REPS = 3
#: Outputs per panel (`csrc/skinny_linear.cpp`'s kPanel).
PANEL = 16
#: Models whose decode weights are larger than this are not packed (one more copy of them).
MAX_WEIGHT_BYTES = 4 << 30


def pack(weight: torch.Tensor) -> torch.Tensor:
    """weight (N, K) -> (ceil(N / 16), K, 16) in its dtype: panel p holds outputs 16p..16p+15,
    K-major, the last one padded with zero outputs."""
    N, K = weight.shape
    P = -(-N // PANEL)
    with torch.no_grad():
        w = weight.detach()
        if P * PANEL != N:
            w = torch.cat([w, w.new_zeros((P * PANEL - N, K))])
        return w.reshape(P, PANEL, K).transpose(1, 2).contiguous()  # (P, K, 16)


class SkinnyWeights:
    """Panel copies of a decode step's weights for products of few rows; other products go to
    `fallback` where it was timed faster (module docstring). `kernels` is the loaded `cpu_kernels`
    module."""

    def __init__(self, fallback: Any, kernels: Any, always_rows: int = ALWAYS_ROWS):
        self.fallback, self.kernels, self.always_rows = fallback, kernels, always_rows
        self.dtype = fallback.dtype  # the weights it packs (decode_step._Proj asks)
        # (weight's data_ptr, part) -> (weakref to the weight, its _version, packed copy)
        self._packs: dict[tuple, tuple[weakref.ref, int, torch.Tensor]] = {}
        self.packs = 0  # weights packed so far (stats)
        self._lock = threading.Lock()  # the split decode step may ask from two threads
        # (row bucket, N, K) -> True (the panels) / False (the fallback), once timed, and the medians timed
        self.choice: dict[tuple[int, int, int], bool] = {}
        self.timings: dict[tuple[int, int, int], tuple[float, float]] = {}

    def _packed(self, weight: torch.Tensor, part: tuple[int, int] | None = None) -> torch.Tensor:
        key = (weight.data_ptr(), part)
        with self._lock:
            entry = self._packs.get(key)
            if entry is not None and entry[0]() is weight and entry[1] == weight._version:
                return entry[2]
            for k in [k for k, (ref, _, _) in self._packs.items() if ref() is None]:
                del self._packs[k]  # weights that are gone
            packed = pack(weight if part is None else weight[part[0]:part[1]])
            self._packs[key] = (weakref.ref(weight), weight._version, packed)
            self.packs += 1
            return packed

    def skinny(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> bool:
        """Whether x @ weight.T runs through the panels (else through `fallback`): up to
        `always_rows` rows, yes; above, the way timed faster for this shape and row bucket
        (timed here on its first product)."""
        rows = x.shape[0]
        if rows <= self.always_rows:
            return True
        key = (row_bucket(rows), *weight.shape)
        if key not in self.choice:
            self.choice[key] = self._time(key, x, weight, bias)
        return self.choice[key]

    def _time(self, key: tuple[int, int, int], x: torch.Tensor, weight: torch.Tensor,
              bias: torch.Tensor | None) -> bool:
        """Both ways on this product, `TIMED_REPS` times each in turn after one untimed each; True
        where the panels' median is the lower (or the fallback runs no packed product here)."""
        packed, n = self._packed(weight), weight.shape[0]
        ways = {True: lambda: self.kernels.skinny_linear(x, packed, bias, n),
                False: lambda: self.fallback.linear(x, weight, bias)}
        seconds: dict[bool, list[float]] = {True: [], False: []}
        for rep in range(TIMED_REPS + 1):
            for way, run in ways.items():
                start = time.perf_counter()
                if run() is None:  # below the fallback's packed row minimum
                    return True
                if rep:
                    seconds[way].append(time.perf_counter() - start)
        med = {way: statistics.median(t) for way, t in seconds.items()}
        self.timings[key] = (med[True], med[False])
        return med[True] <= med[False]

    def begin_step(self, rows: int) -> None:
        if rows > self.always_rows:
            self.fallback.begin_step(rows)

    def weights_changed(self) -> None:
        self.fallback.weights_changed()

    def pad(self, x: torch.Tensor) -> torch.Tensor | None:
        """x itself up to `always_rows` rows, else the fallback's padded input (either way runs on it)."""
        return x if x.shape[0] <= self.always_rows else self.fallback.pad(x)

    def product(self, xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                part: tuple[int, int] | None = None) -> torch.Tensor:
        """xp (P, K) from `pad`, weight (N, K) -> (P, N) = xp @ weight.T + bias, in xp's dtype;
        `part` (start, end): only those outputs (the Python helper's halves)."""
        if not self.skinny(xp, weight, bias):
            return self.fallback.product(xp, weight, bias, part)
        if part is not None and bias is not None:
            bias = bias[part[0]:part[1]]
        n = weight.shape[0] if part is None else part[1] - part[0]
        return self.kernels.skinny_linear(xp, self._packed(weight, part), bias, n)  # (P, N)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """x (B, K) @ weight.T + bias -> (B, N) on torch's threads (None where the fallback
        runs no packed product: below its row minimum)."""
        if self.skinny(x, weight, bias):
            return self.kernels.skinny_linear(x, self._packed(weight), bias, weight.shape[0])  # (B, N)
        return self.fallback.linear(x, weight, bias)

    def skinny_halves(self, xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """xp (P, K) from `pad` @ weight.T + bias -> (P, N), half of the panels on the calling thread
        and half on the spinning helper's (`cpu_kernels.skinny_halves`); None where the fallback runs."""
        if not self.skinny(xp, weight, bias):
            return None
        return self.kernels.skinny_halves(xp, self._packed(weight), bias, weight.shape[0])  # (P, N)

    def half_operands(self, xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, h: int) -> tuple:
        """The fallback's `cpu_kernels.linear_halves` operands (shapes and buckets that run the fallback)."""
        return self.fallback.half_operands(xp, weight, bias, h)

    def clear(self) -> None:
        with self._lock:
            self._packs.clear()
        self.fallback.clear()

    def stats(self) -> dict[str, float]:
        """The fallback's, `decode_skinny_weights` (panel copies made) and per timed row bucket
        `decode_skinny_rows_<bucket>`: the share of its weight shapes that run through the panels."""
        out = {**self.fallback.stats(), "decode_skinny_weights": float(self.packs)}
        buckets: dict[int, list[bool]] = {}
        for (b, _, _), won in self.choice.items():
            buckets.setdefault(b, []).append(won)
        out.update({f"decode_skinny_rows_{b}": sum(w) / len(w) for b, w in sorted(buckets.items())})
        return out
