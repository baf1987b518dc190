"""peft's LoRA linear layer as one autograd node instead of a chain of them.

A peft `lora.Linear` computes `base(x) + B(A(dropout(x))) * scale`, with `x` cast to
the adapters' dtype first (fp32 adapters over a bf16 base) and the sum cast back. In
autograd that is a chain of module calls and small ops per layer (cast, two linears,
a scale over the full output width, an add with type promotion, a cast back), and the
same again in backward; SmolLM2 has 210 such layers.

`LoraLinearFunction` computes the same sum as one node:

    y   = x W^T + bias                    (the base layer, in the model's dtype)
    h   = x32 A^T                          (x32: x in the adapters' dtype; (n, r))
    out = (y32 + scale * h B^T) in x's dtype          (one addmm over (n, N))

and its backward returns the gradients peft's graph gives (x, A, B; the base weights
are frozen), with the scale applied on the (n, r) side instead of the (n, N) side.
The results agree with peft's to float rounding (`tests/test_lora_linear.py`).
Given fp32 copies of bf16 base weights (`fp32_products.py`), the base products run in
fp32 and are rounded to the model's dtype where the bf16 products' outputs are.

`use_lean_lora(model)` switches a model's peft LoRA linears to `LeanLoraLinear`, a
subclass whose forward takes this path when it reproduces peft exactly (one active
plain adapter, no dropout in training mode, frozen base, no autocast, unmerged) and
calls peft's forward otherwise (disabled adapters, DoRA and other variants, mixed
adapter batches, a bias on B, quantized base layers).
"""
from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F


class LoraLinearFunction(torch.autograd.Function):
    """out = (x W^T + bias + scale * (x32 A^T) B^T) in x's dtype (module docstring)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                lora_a: torch.Tensor, lora_b: torch.Tensor, scale: float,
                weight32: torch.Tensor | None = None) -> torch.Tensor:
        x32 = x.to(lora_a.dtype)  # (..., K) what peft feeds the adapters
        if weight32 is None:
            y = F.linear(x, weight, bias)  # (..., N) the base layer, model dtype
        else:  # the same product in fp32 (fp32_products.py), rounded as the base layer's output is
            xw = x32 if x32.dtype == weight32.dtype else x.to(weight32.dtype)  # (..., K)
            y = F.linear(xw, weight32, None if bias is None else bias.to(weight32.dtype)).to(x.dtype)
        h = F.linear(x32, lora_a)  # (..., r)
        n_out = y.shape[-1]
        out = torch.addmm(y.reshape(-1, n_out).to(lora_a.dtype), h.reshape(-1, h.shape[-1]), lora_b.t(),
                          alpha=scale)  # (n, N) in the adapters' dtype
        ctx.save_for_backward(x32, h, weight if weight32 is None else weight32, lora_a, lora_b)
        ctx.scale, ctx.x_dtype, ctx.fp32_base = scale, x.dtype, weight32 is not None
        return out.view(y.shape).to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor | None, ...]:
        x32, h, weight, lora_a, lora_b = ctx.saved_tensors
        g = grad.reshape(-1, grad.shape[-1])  # (n, N) x's dtype
        g32 = g.to(lora_a.dtype)  # (n, N)
        h2, x2 = h.reshape(-1, h.shape[-1]), x32.reshape(-1, x32.shape[-1])  # (n, r), (n, K)
        gh = torch.mm(g32, lora_b).mul_(ctx.scale)  # (n, r) gradient at h
        grad_a = torch.mm(gh.t(), x2) if ctx.needs_input_grad[3] else None  # (r, K)
        grad_b = torch.mm(g32.t(), h2).mul_(ctx.scale) if ctx.needs_input_grad[4] else None  # (N, r)
        grad_x = None
        if ctx.needs_input_grad[0]:
            # as peft's graph sums them: the base path in x's dtype plus the adapter path cast to it
            # (with fp32 base weights the base path's product runs in fp32, rounded to g's dtype)
            if ctx.fp32_base:  # g32 is g in fp32 already when the adapters are fp32 (peft's default over bf16)
                gw = g32 if g32.dtype == weight.dtype else g.to(weight.dtype)  # (n, N)
                base = torch.mm(gw, weight).to(g.dtype)  # (n, K)
            else:
                base = torch.mm(g, weight.to(g.dtype))  # (n, K)
            grad_x = base.add_(torch.mm(gh, lora_a).to(g.dtype))  # (n, K)
            grad_x = grad_x.view(*grad.shape[:-1], -1).to(ctx.x_dtype)
        return grad_x, None, None, grad_a, grad_b, None, None


def _lean_args(module: Any, x: torch.Tensor, args: tuple, kwargs: dict) -> tuple | None:
    """(weight, bias, A, B, scale, fp32 copy of weight or None) when `LoraLinearFunction`
    computes what peft's forward would for this call, else None. The fp32 copy is given
    when the module holds `fp32_base_weights` (`fp32_products.py`), x and weight are bf16
    on the CPU and x has at least its `min_rows` rows."""
    if args or kwargs or module.disable_adapters or module.merged:
        return None
    active = [a for a in module.active_adapters if a in module.lora_A]
    if len(active) != 1:
        return None
    name = active[0]
    if name in (getattr(module, "lora_variant", None) or {}) or (getattr(module, "lora_bias", {}) or {}).get(name):
        return None
    if not getattr(module, "cast_input_dtype_enabled", True):
        return None
    dropout = module.lora_dropout[name]
    if module.training and not isinstance(dropout, torch.nn.Identity) and getattr(dropout, "p", 1.0) > 0:
        return None
    base = module.get_base_layer()
    if type(base) is not torch.nn.Linear or base.weight.requires_grad or (
            base.bias is not None and base.bias.requires_grad):
        return None
    if torch.is_autocast_enabled(x.device.type):
        return None
    a, b = module.lora_A[name].weight, module.lora_B[name].weight
    if a.dtype != b.dtype or not x.is_floating_point():
        return None
    fp32 = getattr(module, "fp32_base_weights", None)  # fp32_products.py
    weight32 = (fp32.get(base.weight) if fp32 is not None and base.weight.dtype == torch.bfloat16
                and x.dtype == torch.bfloat16 and x.device.type == "cpu"
                and x.numel() >= fp32.min_rows * x.shape[-1] else None)
    return base.weight, base.bias, a, b, float(module.scaling[name]), weight32


_classes: dict[type, type] = {}


def _lean_class(cls: type) -> type:
    """The `LeanLoraLinear` subclass of peft's `cls` (made once per class)."""
    if cls not in _classes:
        def forward(self: Any, x: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            lean = _lean_args(self, x, args, kwargs)
            if lean is None:
                return cls.forward(self, x, *args, **kwargs)
            return LoraLinearFunction.apply(x, *lean)

        _classes[cls] = type("LeanLoraLinear", (cls,), {"forward": forward, "__module__": __name__,
                                                         "__doc__": "peft's LoRA Linear computed as one autograd "
                                                                    "node where that is exact (lora_linear.py)."})
    return _classes[cls]


def __getattr__(name: str) -> Any:  # pickle finds LeanLoraLinear here in a fresh process
    if name == "LeanLoraLinear":
        from peft.tuners.lora.layer import Linear

        return _lean_class(Linear)
    raise AttributeError(name)


def is_lean_lora(module: Any) -> bool:
    """Whether `module` is a `LeanLoraLinear` (`use_lean_lora` switched it)."""
    return type(module) in _classes.values()


def use_lean_lora(model: torch.nn.Module) -> int:
    """Switch `model`'s peft LoRA linears to `LeanLoraLinear` (in place); how many."""
    from peft.tuners.lora.layer import Linear

    n = 0
    for module in model.modules():
        if type(module) is Linear:
            module.__class__ = _lean_class(Linear)
            n += 1
    return n


__all__ = ["LoraLinearFunction", "is_lean_lora", "use_lean_lora"]
