"""MKL's packed GEMM for the fp32 decode step's matmuls on a CPU.

A decode step multiplies a few rows (the batch's live rows) by every weight of the
model once. MKL's plain `sgemm` runs such skinny products far below the CPU's rate.
Measured on a 2-core Intel Xeon (avx2 avx512f avx512_bf16 amx_bf16, 2026-11-26, load
0.4-1), SmolLM2-135M's 121 decode matmuls in fp32 on 2 threads, ms per step, plain ->
packed: 4 rows 36.6 -> 24.4, 8 rows 47.2 -> 29.3, 16 rows 49.5 -> 34.8, 32 rows 58.1 ->
44.1, 64 rows 87.9 -> 62.3; 1-3 rows 20-24 either way (MKL's matrix-vector regime).
`cblas_sgemm_pack` lays a weight out once for one row count
(`torch.ops.mkl._mkl_reorder_linear_weight`); products at that row count then read the
packed copy (`torch.ops.mkl._mkl_linear`; at any other count torch runs the plain one).

So `PackedWeights` keeps, per row bucket (the live rows rounded up to a power of two,
at least `PACKED_MIN_ROWS`), a packed copy of each weight it is asked for, and a product
of B rows runs at its bucket's row count with the input padded to it. Rows of a
product are independent: a row's output does not depend on what the padding holds
(`tests/test_packed_matmul.py`), so one input buffer per shape is kept (zeros at first)
and only the live rows are written into it. Below `PACKED_MIN_ROWS` rows the plain
product runs.
At most `MAX_BUCKETS` buckets are kept (the least recently used is dropped): each costs
about one copy of the weights in memory (540 MB for SmolLM2 in fp32; `available` refuses
models over `MAX_WEIGHT_BYTES`) and ~0.12 s to pack on the CPU above. A weight written
in place (an optimizer step, a LoRA copy merged again) or replaced is packed again.

A policy in training changes its weights before every call, so every bucket a call uses
is packed again. After `weights_changed()`, a step whose bucket was not packed since,
while the next bucket up was, may run in that one instead (its rows padded to it), as
long as the time this costs stays below what packing its own bucket cost: steps so far x
(a step's products in the bigger bucket - in its own) < the last pack of its own, all
three timed here (`product_seconds`: products per step by bucket, from steps that packed
nothing; `pack_seconds`: each bucket's last pack). Until both buckets were timed, it
packs. In `benchmarks/update.py`'s GRPO steps (8 rows, SmolLM2 fp32, the CPU above, passive waits):
products per step 43 ms in bucket 8 and 35 ms in bucket 4, a pack of bucket 4 0.12 s, so
up to ~15 four-row steps per rollout run in bucket 8; packs per 8 calls 1744 -> 1264.

With `inference.packed_decode` on (the default), every decode mode of an fp32 step on a
CPU multiplies through these (`decode_threads.py`). A packed product rounds differently from the plain
one (~1e-6 relative in fp32): the sampled ids are the plain path's except where a
uniform falls that close to a boundary, as between one and two threads.
"""
from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict

import torch

#: Fewer live rows than this run the plain product (measured above: no gain there), as
#: x @ W.T: on the CPU above, W @ x.T (the unpacked fp32 decode step's orientation, chosen
#: at 8 rows on a 2-core EPYC) took 59 ms at 2 and 3 rows on 2 threads against 25-28 ms.
PACKED_MIN_ROWS = 4
#: Row buckets whose packed copies are kept at once (each about one copy of the weights).
MAX_BUCKETS = 2
#: Models whose decode weights are larger than this (in fp32) are not packed (MAX_BUCKETS copies).
MAX_WEIGHT_BYTES = 1 << 30


def available(weight_bytes: int) -> bool:
    """Whether this torch has MKL's packed GEMM and a model of `weight_bytes` is small enough."""
    mkl = getattr(torch.ops, "mkl", None)
    return (torch.backends.mkl.is_available() and mkl is not None and hasattr(mkl, "_mkl_linear")
            and weight_bytes <= MAX_WEIGHT_BYTES)


def bucket(rows: int) -> int:
    """The row count a product of `rows` rows runs at: the next power of two (>= PACKED_MIN_ROWS)."""
    return max(PACKED_MIN_ROWS, 1 << max(rows - 1, 0).bit_length())


class PackedWeights:
    """Packed copies of fp32 weights per row bucket; `linear(x, weight, bias)` uses them."""

    dtype = torch.float32  # the weights it packs (decode_step._Proj asks)

    def __init__(self, max_buckets: int = MAX_BUCKETS):
        self.max_buckets = max_buckets
        # bucket -> (weight's data_ptr, output rows packed) -> (weakref to the weight, its _version, packed copy)
        self._buckets: OrderedDict[int, dict[tuple, tuple[weakref.ref, int, torch.Tensor]]] = OrderedDict()
        self.packs = 0  # weights packed so far (stats: made again after every weight change)
        self._lock = threading.Lock()  # the split decode step asks from two threads at once
        # (P, K, dtype, device) -> a (P, K) input buffer, zeros at first: `pad` writes the live rows
        # into it, and rows past them keep earlier rows' finite values (rows are independent)
        self._inputs: dict[tuple, torch.Tensor] = {}
        # `weights_changed()` count, and per bucket the count it was last used at (None before the
        # first call: every bucket is its own); steps run one bucket up since the last change
        self._generation: int | None = None
        self._used_at: dict[int, int] = {}
        self._reused = 0
        self._step: tuple[int, int] | None = None  # (rows, bucket) of the step `begin_step` chose for
        # timings (module docstring): seconds of a step's products by bucket (from steps that packed
        # nothing), of each bucket's last full pack, and of this generation's packs so far
        self.product_seconds: dict[int, float] = {}
        self.pack_seconds: dict[int, float] = {}
        self._packing: dict[int, float] = {}
        self._step_products = 0.0  # this step's product seconds so far
        self._step_packs = 0  # `packs` when the step began

    def weights_changed(self) -> None:
        """The weights are new (the engine's next call after an optimizer step): until a
        bucket is packed again, its products may run one bucket up (module docstring)."""
        self._end_step()
        self.pack_seconds.update(self._packing)
        self._packing = {}
        self._generation = (self._generation or 0) + 1
        self._reused = 0

    def begin_step(self, rows: int) -> None:
        """A decode step of `rows` rows starts: choose the bucket its products run in, its
        own, or after `weights_changed()` the next one up when only that one was packed
        since and running there has cost less than packing its own (module docstring)."""
        self._end_step()
        if rows < PACKED_MIN_ROWS:  # the plain product: no bucket
            self._step = None
            return
        P, gen = bucket(rows), self._generation
        if gen is not None and self._used_at.get(P) != gen and self._used_at.get(2 * P) == gen:
            own, up, pack = self.product_seconds.get(P), self.product_seconds.get(2 * P), self.pack_seconds.get(P)
            if own is not None and up is not None and pack is not None and (self._reused + 1) * (up - own) < pack:
                self._reused += 1
                self._step = (rows, 2 * P)
                return
        if gen is not None:
            self._used_at[P] = gen
        self._step = (rows, P)

    def _end_step(self) -> None:
        """Record the last step's product seconds under its bucket if it packed nothing."""
        if self._step is not None and self._step_products > 0 and self.packs == self._step_packs:
            P = self._step[1]
            last = self.product_seconds.get(P)
            # a running mean of recent steps: one slow step (a busy machine) moves it a quarter
            self.product_seconds[P] = self._step_products if last is None else 0.75 * last + 0.25 * self._step_products
        self._step, self._step_products, self._step_packs = None, 0.0, self.packs

    def clear(self) -> None:
        with self._lock:
            self._buckets.clear()
            self._inputs.clear()

    def _packed(self, weight: torch.Tensor, rows: int, part: tuple[int, int] | None) -> torch.Tensor:
        with self._lock:
            return self._packed_locked(weight, rows, part)

    def _packed_locked(self, weight: torch.Tensor, rows: int, part: tuple[int, int] | None) -> torch.Tensor:
        packs = self._buckets.get(rows)
        if packs is None:
            packs = self._buckets[rows] = {}
            while len(self._buckets) > self.max_buckets:
                self._buckets.popitem(last=False)
        else:
            self._buckets.move_to_end(rows)
        key = (weight.data_ptr(), part)
        entry = packs.get(key)
        if entry is not None and entry[0]() is weight and entry[1] == weight._version:
            return entry[2]
        # a new or changed weight: drop entries whose weight is gone, then pack this one
        for k in [k for k, (ref, _, _) in packs.items() if ref() is None]:
            del packs[k]
        start = time.perf_counter()
        with torch.no_grad():
            w = weight if part is None else weight[part[0]:part[1]]
            packed = torch.ops.mkl._mkl_reorder_linear_weight(w.to(torch.float32).contiguous(), rows)
        packs[key] = (weakref.ref(weight), weight._version, packed)
        self.packs += 1
        self._packing[rows] = self._packing.get(rows, 0.0) + time.perf_counter() - start
        return packed

    def pad(self, x: torch.Tensor) -> torch.Tensor | None:
        """x (B, K) as the (P, K) input of its bucket (x's rows, then padding rows: a buffer kept
        per shape, valid until the next call), or None below `PACKED_MIN_ROWS` rows (the
        caller runs the plain product)."""
        B, K = x.shape
        if B < PACKED_MIN_ROWS:
            return None
        P = self._step[1] if self._step is not None and self._step[0] == B else bucket(B)
        if B == P and x.is_contiguous() and x.dtype == torch.float32:
            return x
        key = (P, K, x.device)
        xp = self._inputs.get(key)
        if xp is None:
            xp = self._inputs[key] = x.new_zeros((P, K), dtype=torch.float32)  # (P, K)
        xp[:B] = x  # the live rows; the rest are padding (zeros, or earlier steps' rows)
        return xp

    def product(self, xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                part: tuple[int, int] | None = None) -> torch.Tensor:
        """xp (P, K) from `pad`, weight (N, K) contiguous fp32 -> (P, N) = xp @ weight.T + bias
        through the packed copy for P rows; `part` (start, end): only those outputs (rows of
        `weight` and entries of `bias`), packed apart (`decode_step`'s split halves)."""
        P = xp.shape[0]
        packed = self._packed(weight, P, part)
        if part is not None:
            weight, bias = weight[part[0]:part[1]], bias[part[0]:part[1]] if bias is not None else None
        if weight.dtype != torch.float32:  # `Fp32Products`: the fp32 kernel's weight argument only gives
            weight = weight.new_zeros((), dtype=torch.float32).expand(weight.shape)  # the output width (P = rows)
            bias = bias.float() if bias is not None else None
        if part is not None:  # a split half, run beside the other: not timed
            return torch.ops.mkl._mkl_linear(xp, packed, weight, bias, P).to(self.dtype)  # (P, N_i)
        start = time.perf_counter()
        out = torch.ops.mkl._mkl_linear(xp, packed, weight, bias, P).to(self.dtype)  # (P, N)
        self._step_products += time.perf_counter() - start
        return out

    def half_operands(self, xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      h: int) -> tuple:
        """`cpu_kernels.linear_halves`' operands after xp (P, K) for `weight`'s outputs [0, h) and
        [h, N): (kind 1, packed halves for P rows, their fp32 weight arguments, bias halves, P);
        the result is fp32 (`Fp32Products` casts it back)."""
        P, N = xp.shape[0], weight.shape[0]
        packs = self._packed(weight, P, (0, h)), self._packed(weight, P, (h, N))
        halves = weight[:h], weight[h:]
        if weight.dtype != torch.float32:  # as `product`: only the output width is read
            halves = tuple(weight.new_zeros((), dtype=torch.float32).expand(w.shape) for w in halves)
        b = (bias[:h].float(), bias[h:].float()) if bias is not None else (None, None)
        return 1, *packs, *halves, *b, P

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor | None:
        """x (B, K) fp32, weight (N, K) contiguous fp32 -> (B, N) = x @ weight.T + bias through
        the packed copy at B's bucket (x padded to it, `pad`); None below `PACKED_MIN_ROWS`
        rows (the caller runs the plain product)."""
        xp = self.pad(x)
        return None if xp is None else self.product(xp, weight, bias)[: x.shape[0]]  # (B, N)

    def stats(self) -> dict[str, float]:
        return {"decode_packed_weights": float(self.packs),
                "decode_packed_buckets": float(len(self._buckets))}


class Fp32Products(PackedWeights):
    """bf16 weights multiplied in fp32 through MKL's packed GEMM (the module docstring's
    buckets), their inputs widened to fp32 and the outputs rounded back to bf16.

    A bf16 x bf16 product is exact in fp32 and oneDNN's bf16 kernels accumulate in fp32 too,
    so the outputs agree to bf16 rounding (the sums run in another order). It pays where a
    step is matmul-bound on a CPU whose fp32 kernels outrun its bf16 ones: on a 2-core Xeon
    with avx512_bf16 and no amx (2026-12-01, one thread, load ~4), SmolLM2's 121 decode
    products through oneDNN's packed bf16 weights against these: 16 rows 106 vs 191 ms,
    32 rows 289 vs 276, 64 rows 498 vs 352, 128 rows 1149 vs 494 (a 2048^3 matmul there:
    bf16 ~70, fp32 ~100-130 GFLOP/s). Each bucket costs the weights' fp32 bytes (twice
    their bf16 bytes); the engine times it as a decode mode of its own on large row
    buckets (`decode_threads.FP32_PRODUCTS`).
    """

    dtype = torch.bfloat16

    def stats(self) -> dict[str, float]:
        return {"decode_fp32_packed_weights": float(self.packs),
                "decode_fp32_packed_buckets": float(len(self._buckets))}
