"""bf16 decode weights packed once for oneDNN's matmul kernels, on a CPU.

torch runs a bf16 `F.linear` on a CPU through oneDNN's matmul with the weight as it is
stored, (N, K) row-major. oneDNN's bf16 kernels (brgemm, `avx512_core_bf16` here; AMX
where the CPU has it) read the weight in a blocked layout with pairs of K interleaved,
so every call first reorders the weight into that layout and then multiplies: for a
decode step's few rows, that copy is a large part of the product. Inductor's CPU
`freezing` packs frozen weights once for this reason (`torch.ops.mkldnn._reorder_linear_weight`)
and calls `torch.ops.mkldnn._linear_pointwise` on the packed copy; `OneDNNWeights` does
the same for the decode step (`decode_step._Proj`).

Unlike MKL's packed fp32 GEMM (`packed_matmul.py`, a copy per row count), one packed copy
serves every row count: on a 2-core Xeon (avx512_bf16, no amx; 2026-12-01, one thread,
30 copies of a 3072 x 576 weight, ms), packed for 1, 8 or 128 rows and run at 1 to 128
rows, the three copies took the same time within 10% at every count, and the outputs
equal `F.linear`'s bit for bit. Against `F.linear`, SmolLM2's 121 decode products: 8 rows
142 -> 72 ms, 128 rows 518 -> 491 ms (one thread, load ~3). A copy costs the
weights' bytes once more (269 MB for SmolLM2) and is made again only when its weight
changed (its version counter or storage: an optimizer step, `load_state_dict`); the
frozen base of a LoRA policy is packed once.
"""
from __future__ import annotations

import threading
import weakref

import torch

#: Models whose decode weights are larger than this are not packed (one more copy of them).
MAX_WEIGHT_BYTES = 4 << 30


def available(dtype: torch.dtype, weight_bytes: int = 0) -> bool:
    """Whether this torch and CPU run oneDNN's packed bf16 products (and a model of
    `weight_bytes` is small enough to pack)."""
    if dtype != torch.bfloat16 or not torch.backends.mkldnn.is_available():
        return False
    ops = getattr(torch.ops, "mkldnn", None)
    try:
        return bool(ops is not None and hasattr(ops, "_reorder_linear_weight") and hasattr(ops, "_linear_pointwise")
                    and ops._is_mkldnn_bf16_supported() and weight_bytes <= MAX_WEIGHT_BYTES)
    except (AttributeError, RuntimeError):
        return False


class OneDNNWeights:
    """Packed copies of bf16 weights for oneDNN; `linear(x, weight, bias)` multiplies through them.

    The same calls as `packed_matmul.PackedWeights` (the decode step takes either):
    `pad(x)` is x itself (no row buckets), `product(x, weight, bias, part)` the product
    through the packed copy of `weight` (of its rows `part` only, when given: a split half).
    """

    dtype = torch.bfloat16

    def __init__(self) -> None:
        # (weight's data_ptr, part) -> (weakref to the weight, its _version, packed copy)
        self._packs: dict[tuple, tuple[weakref.ref, int, torch.Tensor]] = {}
        self.packs = 0  # weights packed so far (stats)
        self._lock = threading.Lock()  # the split decode step asks from two threads at once

    def _packed(self, weight: torch.Tensor, part: tuple[int, int] | None) -> torch.Tensor:
        key = (weight.data_ptr(), part)
        with self._lock:
            entry = self._packs.get(key)
            if entry is not None and entry[0]() is weight and entry[1] == weight._version:
                return entry[2]
            for k in [k for k, (ref, _, _) in self._packs.items() if ref() is None]:
                del self._packs[k]  # weights that are gone
            with torch.no_grad():
                w = weight if part is None else weight[part[0]:part[1]]
                packed = torch.ops.mkldnn._reorder_linear_weight(w.contiguous(), None)
            self._packs[key] = (weakref.ref(weight), weight._version, packed)
            self.packs += 1
            return packed

    def begin_step(self, rows: int) -> None:
        """Nothing to choose per step (one copy for every row count)."""

    def weights_changed(self) -> None:
        """Nothing to do: a changed weight is packed again at its next product."""

    def pad(self, x: torch.Tensor) -> torch.Tensor:
        return x

    def product(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                part: tuple[int, int] | None = None) -> torch.Tensor:
        """x (B, K) bf16, weight (N, K) bf16 -> (B, N) = x @ weight.T + bias, through the
        packed copy; `part` (start, end): only those outputs (rows of `weight`, entries of `bias`)."""
        packed = self._packed(weight, part)
        if part is not None and bias is not None:
            bias = bias[part[0]:part[1]]
        return torch.ops.mkldnn._linear_pointwise(x, packed, bias, "none", [], "")  # (B, N)

    def linear(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return self.product(x, weight, bias)

    def half_operands(self, xp: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                      h: int) -> tuple:
        """`cpu_kernels.linear_halves`' operands after x for `weight`'s outputs [0, h) and [h, N):
        (kind 0, packed half 0, packed half 1, the same two, bias halves, 0)."""
        w0, w1 = self._packed(weight, (0, h)), self._packed(weight, (h, weight.shape[0]))
        b0, b1 = (bias[:h], bias[h:]) if bias is not None else (None, None)
        return 0, w0, w1, w0, w1, b0, b1, 0

    def clear(self) -> None:
        with self._lock:
            self._packs.clear()

    def stats(self) -> dict[str, float]:
        return {"decode_packed_weights": float(self.packs), "decode_packed_buckets": 1.0 if self._packs else 0.0}
