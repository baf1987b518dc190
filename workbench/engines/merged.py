"""A merged copy of a LoRA policy, for decoding.

Sampling through peft's LoRA layers runs, for every wrapped linear, the frozen matmul
plus two thin adapter matmuls, a scale and an add: with "all-linear" on SmolLM2 that
is 210 extra small ops per decoded token, ~15-20% of a CPU decode step. The engine
decodes with a plain copy of the model whose weights are `W + scale * B @ A` instead.

The copy's weights are exactly what the vLLM engine's sync loads: `hf_weight_items`
(weights.py), the policy's tensors with the active adapters merged in. It follows the
policy: `weights_state_key` sums every parameter's version counter (bumped by an
optimizer step, `load_state_dict`, any in-place write) and records which LoRA layers
have adapters disabled (`disable_adapter()`, the reference policy), and `refresh(key)`
copies the weights again only when that key changed. Logprobs from the copy equal the
peft forward's to float rounding.

A refresh writes in place and only what changed: a tensor outside the LoRA layers (the
embedding, the norms: frozen in LoRA training) is copied when its version changed; a
LoRA layer with one plain active adapter is merged as one `addmm` into the copy's
tensor (`W + scale * B @ A`, no temporaries) when its base or adapter changed; anything
else (several adapters, adapters off, a fan-in-fan-out layout) goes through
`hf_weight_items`'s merge. SmolLM2 with LoRA r=16 on every linear, after an optimizer
step, on a 2-core Xeon (2026-11-26): 0.28 s per refresh through `hf_weight_items` for
every tensor, against a GRPO rollout of ~5 s; in place, 0.02 s.

Only plain LoRA adapters may be trained: anything else trainable (peft
`modules_to_save`, full fine-tuning) or a LoRA variant (DoRA, ...) makes `merged_copy`
return None and the engine decodes through the policy itself. So do base weights in a
16-bit dtype: `W + scale * B @ A` rounded to bf16 loses every change below ~1/256 of a
weight (the first optimizer steps' whole update, at the demo's learning rate), so the
copy would sample from an older policy than the one trained; through peft the adapter
branch runs in fp32, as in the trainer's forward.
"""
from __future__ import annotations

import copy
from typing import Any

import torch

from workbench.engines.base import EngineError
from workbench.engines.weights import hf_name, hf_weight_items, is_lora_layer, is_peft_model, version_signature


def weights_state_key(model: Any) -> tuple[int, int, tuple[bool, ...]]:
    """Changes whenever `model` computes with other weights: (module id, sum of parameter
    version counters, disabled flag of each LoRA layer)."""
    versions = sum(p._version for p in model.parameters())
    disabled = tuple(bool(getattr(m, "disable_adapters", False)) for m in model.modules() if is_lora_layer(m))
    return id(model), versions, disabled


#: `_refresh_in_place`'s answer when every tensor goes through `hf_weight_items`.
ALL: Any = frozenset({"*"})


class MergedLoraCopy:
    """A plain module computing what `source` (a peft LoRA model) computes."""

    def __init__(self, source: Any, model: torch.nn.Module):
        self.source = source
        self.model = model  # plain module used for decoding
        self._tensors = model.state_dict()  # name -> tensor sharing the copy's storage
        self._key: tuple[int, int, tuple[bool, ...]] | None = None
        self.merges = 0
        self._written: dict[str, tuple] = {}  # copy's tensor name -> signature of what it was written from

    @torch.no_grad()
    def refresh(self, key: tuple[int, int, tuple[bool, ...]] | None = None) -> torch.nn.Module:
        """Write the source's merged weights in if `key` (default: `weights_state_key(source)`)
        differs from the last copy's, each tensor only if its sources changed (module
        docstring); returns the copy."""
        key = weights_state_key(self.source) if key is None else key
        if key != self._key:
            slow = self._refresh_in_place()
            if slow:
                for name, tensor in hf_weight_items(self.source):
                    if slow is ALL or name in slow:
                        self._tensors[name].copy_(tensor)
                        self._written.pop(name, None)
            self._key = key
            self.merges += 1
        return self.model

    def _refresh_in_place(self) -> set[str]:
        """Write every tensor that can be written in place (changed sources only); the
        names left to `hf_weight_items`'s merge (`ALL`: peft's `modules_to_save` copies,
        whose names only that merge maps)."""
        slow: set[str] = set()
        modules = dict(self.source.named_modules())
        lora_paths = {name for name, m in modules.items() if is_lora_layer(m)}
        state = self.source.state_dict(keep_vars=True)
        if any(".modules_to_save." in name or ".original_module." in name for name in state):
            return ALL
        for name, tensor in state.items():
            if ".lora_" in name:
                continue
            out = hf_name(name)
            dst = self._tensors.get(out)
            path, _, leaf = name.rpartition(".base_layer.")
            if dst is None:
                slow.add(out)  # a name only the generic merge maps: it raises if the copy lacks it
                continue
            in_lora = path in lora_paths  # "" (no `.base_layer.` in the name) is never one
            adapter = _plain_adapter(modules[path]) if in_lora else None
            if not in_lora or (leaf == "bias" and adapter is not None):
                # a tensor outside the LoRA layers, or the bias of one whose adapter adds none
                sig = version_signature((tensor,))
                if self._written.get(out) != sig:
                    dst.copy_(tensor)
                    self._written[out] = sig
                continue
            if adapter is None or leaf != "weight":  # a layer the generic merge handles
                slow.add(out)
                continue
            a, b, scale = adapter  # (r, K), (N, r)
            sig = version_signature((tensor, a, b)) + (scale,)
            if self._written.get(out) != sig:
                torch.addmm(tensor, b, a, alpha=scale, out=dst)  # (N, K) = W + scale * B @ A
                self._written[out] = sig
        return slow


def _plain_adapter(module: Any) -> tuple[torch.Tensor, torch.Tensor, float] | None:
    """(A (r, K), B (N, r), scale) of a LoRA layer whose merge is one `addmm`: one active,
    unmerged, plain adapter on an fp32 linear without fan-in-fan-out or a bias on B; else None."""
    if getattr(module, "disable_adapters", False) or getattr(module, "merged_adapters", None):
        return None
    active = [a for a in module.active_adapters if a in getattr(module, "lora_A", {})]
    if len(active) != 1 or getattr(module, "fan_in_fan_out", False):
        return None
    name = active[0]
    if name in (getattr(module, "lora_variant", {}) or {}) or (getattr(module, "lora_bias", {}) or {}).get(name):
        return None
    lin_a, lin_b = module.lora_A[name], module.lora_B[name]
    if type(lin_a) is not torch.nn.Linear or type(lin_b) is not torch.nn.Linear:
        return None
    base = module.get_base_layer()
    a, b = lin_a.weight, lin_b.weight
    if type(base) is not torch.nn.Linear or {base.weight.dtype, a.dtype, b.dtype} != {torch.float32}:
        return None
    return a, b, float(module.scaling[name])


def merged_copy(source: Any) -> MergedLoraCopy | None:
    """A `MergedLoraCopy` of a peft LoRA model, or None when it cannot be merged exactly."""
    if not is_peft_model(source) or not hasattr(source, "merge_and_unload"):
        return None
    adapters = {id(p) for m in source.modules() if is_lora_layer(m)
                for p in list(m.lora_A.parameters()) + list(m.lora_B.parameters())}
    if not adapters or any(p.requires_grad and id(p) not in adapters for p in source.parameters()):
        return None  # nothing to merge, or something trained besides the adapters
    if any(m.get_base_layer().weight.dtype != torch.float32 for m in source.modules()
           if is_lora_layer(m) and hasattr(m.get_base_layer(), "weight")):
        return None  # a bf16/fp16 merge would round small adapter updates away (module docstring)
    with torch.no_grad():
        plain = copy.deepcopy(source).merge_and_unload()
    plain.requires_grad_(False).eval()
    merged = MergedLoraCopy(source, plain)
    try:
        merged.refresh()
    except (EngineError, KeyError):  # a LoRA variant, or names the plain model lacks
        return None
    return merged
