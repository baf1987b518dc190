"""The update's products with a LoRA policy's frozen bf16 base weights, run in fp32 where
that is faster.

In a LoRA update on a CPU with bf16 weights, the frozen base weights' products are over
half of the time (57% of a 600-token forward and backward of SmolLM2 on the CPU below):
every body linear once in the forward and once more in the backward (the gradient at its
input; the base weights get none). oneDNN multiplies bf16 matrices with
the CPU's bf16 dot-product instructions, and on a CPU that has `avx512_bf16` but no AMX
tiles those run *slower* than its fp32 FMAs: on a 2-core Xeon with avx512_bf16 and no amx
(2026-12-02) a 2048^3 product took bf16 140 and fp32 268 GFLOP/s (`benchmarks/decode_floor.py`).
There the update runs faster when the base products are fp32 products of fp32 copies of
the bf16 weights. On a CPU with AMX, bf16 wins by far and the copies would only cost memory.

A bf16 x bf16 product is exact in fp32, and oneDNN's bf16 kernels accumulate in fp32 too;
the fp32 product's output is rounded to bf16 where the bf16 kernel's would be (the base
layer's output, and the base path's share of the input gradient), so the update's values
are the bf16 products' up to the order of their sums (`tests/test_fp32_products.py`).

Measured there (2026-12-02, 2 threads, load 1.2-1.7, `python benchmarks/fp32_products.py
--rounds 9`): the update of one GRPO batch of update.py (SmolLM2, 8 completions, 1172
tokens) took 3.94 s with bf16 base products and 3.22 s with fp32 ones (medians; 1.23x);
the timed product behind "auto" was 6.4 ms in bf16 and 4.1 ms in fp32.

`model.fp32_base_products` decides: "auto" times one product of the model's own shape
(`TIMED_ROWS` rows, hidden -> intermediate, forward) both ways, once per process and shape
(`time_products`), and takes fp32 when it is at least `MIN_SPEEDUP` times faster; "on" / "off" force it. It
applies only where the policy's weights are bf16 on a CPU and the layer is one
`LoraLinearFunction` computes (`lora_linear.py`: one plain adapter, frozen base). The
copies (4 bytes per base weight, twice the bf16 bytes) are made on the first product
that needs them, and made again when a weight was written in place or replaced. A
product of fewer than `MIN_ROWS` rows (a few decoded tokens) stays bf16.
"""
from __future__ import annotations

import threading
import time
import weakref
from typing import Any

import torch
import torch.nn.functional as F

from workbench.config import FP32_PRODUCTS_CHOICES

#: fp32 is taken by "auto" when its timed product is at least this many times faster.
MIN_SPEEDUP = 1.15
#: Rows of the timed product (an update's micro-batch holds hundreds of tokens).
TIMED_ROWS = 512
#: Products of fewer rows stay bf16 (a decode step through the policy itself, a few rows a
#: step): at 32 rows and fewer the two ran about even or bf16 ahead on the CPU above
#: (`workbench.engines.packed_matmul.Fp32Products`).
MIN_ROWS = 64

#: (hidden, intermediate, threads) -> (fp32 chosen, bf16 ms, fp32 ms): one timing per process and shape.
_timings: dict[tuple[int, int, int], tuple[bool, float, float]] = {}
_timing_lock = threading.Lock()


class Fp32BaseWeights:
    """fp32 copies of frozen bf16 base weights, keyed by the weight, made on first use."""

    def __init__(self, min_rows: int = MIN_ROWS) -> None:
        self.min_rows = min_rows  # products of fewer rows stay bf16
        # id(weight) -> (weakref to it, its _version, its data_ptr, fp32 copy)
        self._copies: dict[int, tuple[weakref.ref, int, int, torch.Tensor]] = {}
        self._lock = threading.Lock()
        self.copies_made = 0

    def get(self, weight: torch.Tensor) -> torch.Tensor:
        """`weight` in fp32 (a copy kept while `weight` lives and is not written)."""
        key = id(weight)
        with self._lock:
            held = self._copies.get(key)
            if (held is not None and held[0]() is weight and held[1] == weight._version
                    and held[2] == weight.data_ptr()):
                return held[3]
            copy = weight.detach().to(torch.float32)  # (N, K)
            self._copies[key] = (weakref.ref(weight), weight._version, weight.data_ptr(), copy)
            self.copies_made += 1
            return copy

    def __reduce__(self) -> tuple:
        # A copied or pickled model (async sampling's copy, a Ray actor) gets an empty store of
        # its own: its weights are other tensors, and a lock does not pickle.
        return (Fp32BaseWeights, (self.min_rows,))

    @property
    def bytes(self) -> int:
        return sum(c[3].numel() * 4 for c in self._copies.values())


def time_products(hidden: int, intermediate: int) -> tuple[bool, float, float]:
    """(fp32 faster by `MIN_SPEEDUP`, bf16 ms, fp32 ms) for one (TIMED_ROWS, hidden) x
    (hidden, intermediate) product on this CPU with torch's current threads; timed once
    per process and shape. The two are timed in turn, 7 times each after a warm-up, and
    each one's fastest run counts: a burst of other work on the machine slows both alike
    or only some runs, so the choice holds under load (several learners timing at once)."""
    key = (hidden, intermediate, torch.get_num_threads())
    with _timing_lock:
        if key not in _timings:
            gen = torch.Generator().manual_seed(0)
            x = torch.rand(TIMED_ROWS, hidden, generator=gen).to(torch.bfloat16)  # (M, K)
            w = (torch.rand(intermediate, hidden, generator=gen) - 0.5).to(torch.bfloat16)  # (N, K)
            w32 = w.float()
            runs: dict[str, list[float]] = {"bf16": [], "fp32": []}
            products = {"bf16": lambda: F.linear(x, w),
                        "fp32": lambda: F.linear(x.float(), w32).to(torch.bfloat16)}
            with torch.no_grad():
                for fn in products.values():
                    fn()  # warm-up (oneDNN's kernel choice, first touches)
                for _ in range(7):
                    for name, fn in products.items():
                        start = time.perf_counter()
                        fn()
                        runs[name].append(time.perf_counter() - start)
            bf16_ms, fp32_ms = min(runs["bf16"]) * 1e3, min(runs["fp32"]) * 1e3
            _timings[key] = (bf16_ms >= MIN_SPEEDUP * fp32_ms, bf16_ms, fp32_ms)
        return _timings[key]


def wants_fp32_products(setting: str, model: torch.nn.Module) -> tuple[bool, str]:
    """(whether `model`'s LoRA base products run in fp32, why) for `model.fp32_base_products`
    = `setting`: never unless its weights are bf16 on a CPU; "auto" times it (`time_products`)."""
    if setting not in FP32_PRODUCTS_CHOICES:
        raise ValueError(f"model.fp32_base_products must be one of {list(FP32_PRODUCTS_CHOICES)}, got {setting!r}")
    param = next(model.parameters(), None)
    if param is None or param.device.type != "cpu" or param.dtype != torch.bfloat16:
        return False, "the weights are not bf16 on a CPU"
    if setting != "auto":
        return setting == "on", f"model.fp32_base_products={setting}"
    config = getattr(model, "config", None)
    hidden = getattr(config, "hidden_size", None)
    intermediate = getattr(config, "intermediate_size", None) or (4 * hidden if hidden else None)
    if not hidden:
        return False, "the model's config has no hidden_size to time a product with"
    fp32, bf16_ms, fp32_ms = time_products(int(hidden), int(intermediate))
    return fp32, (f"a {TIMED_ROWS}x{hidden}x{intermediate} product: bf16 {bf16_ms:.1f} ms, fp32 {fp32_ms:.1f} ms "
                  f"({'fp32' if fp32 else 'bf16'} chosen)")


def use_fp32_products(model: torch.nn.Module, weights: Fp32BaseWeights | None) -> int:
    """Give every `LeanLoraLinear` of `model` the fp32 copies `weights` (None: bf16 products
    again); how many layers."""
    from workbench.training.lora_linear import is_lean_lora

    n = 0
    for module in model.modules():
        if is_lean_lora(module):
            module.fp32_base_weights = weights
            n += 1
    return n


__all__ = ["Fp32BaseWeights", "MIN_ROWS", "MIN_SPEEDUP", "time_products", "use_fp32_products",
           "wants_fp32_products"]
