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
copies the weights again only when that key changed (SmolLM2: ~0.1 s, against seconds
of decoding). Logprobs from the copy equal the peft forward's to float rounding.

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
from workbench.engines.weights import hf_weight_items, is_lora_layer, is_peft_model


def weights_state_key(model: Any) -> tuple[int, int, tuple[bool, ...]]:
    """Changes whenever `model` computes with other weights: (module id, sum of parameter
    version counters, disabled flag of each LoRA layer)."""
    versions = sum(p._version for p in model.parameters())
    disabled = tuple(bool(getattr(m, "disable_adapters", False)) for m in model.modules() if is_lora_layer(m))
    return id(model), versions, disabled


class MergedLoraCopy:
    """A plain module computing what `source` (a peft LoRA model) computes."""

    def __init__(self, source: Any, model: torch.nn.Module):
        self.source = source
        self.model = model  # plain module used for decoding
        self._tensors = model.state_dict()  # name -> tensor sharing the copy's storage
        self._key: tuple[int, int, tuple[bool, ...]] | None = None
        self.merges = 0

    @torch.no_grad()
    def refresh(self, key: tuple[int, int, tuple[bool, ...]] | None = None) -> torch.nn.Module:
        """Copy the source's merged weights in if `key` (default: `weights_state_key(source)`)
        differs from the last copy's; returns the copy."""
        key = weights_state_key(self.source) if key is None else key
        if key != self._key:
            for name, tensor in hf_weight_items(self.source):
                self._tensors[name].copy_(tensor)
            self._key = key
            self.merges += 1
        return self.model


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
