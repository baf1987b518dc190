"""A trainer's model (plain Hugging Face or peft LoRA) as the weights it computes with.

`hf_weight_items(model)` yields `(name, tensor)` pairs in plain Hugging Face naming,
LoRA adapters merged in one layer at a time (the vLLM engine's weight sync feeds them
to vLLM's loader); `lora_delta` is the merged update of one LoRA layer (also used by
the HF engine's merged decoding copy, `merged.py`).
"""
from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from workbench.engines.base import EngineError

PEFT_PREFIX = "base_model.model."



def version_signature(tensors: Iterable[Any]) -> tuple:
    """Changes when any of `tensors` is replaced (another object or storage) or written in
    place (its version counter: an optimizer step, `copy_`, `load_state_dict`); None entries
    are skipped. What the merged copy (`merged.py`) and the decode step's fused copies
    (`decode_step.py`) compare to know whether to write again."""
    return tuple((id(t), t.data_ptr(), t._version) for t in tensors if t is not None)


def is_lora_layer(module: Any) -> bool:
    return hasattr(module, "base_layer") and hasattr(module, "lora_A") and hasattr(module, "get_delta_weight")


def lora_delta(module: Any, path: str) -> tuple[Any, Any]:
    """(delta_weight, delta_bias) of the active, unmerged adapters of a LoRA layer."""
    if getattr(module, "disable_adapters", False):
        return None, None
    merged = set(getattr(module, "merged_adapters", []) or [])
    variants = getattr(module, "lora_variant", {}) or {}
    delta_w = None
    delta_b = None
    owned = set(getattr(module, "lora_A", {}).keys()) | set(getattr(module, "lora_embedding_A", {}).keys())
    for adapter in module.active_adapters:
        if adapter in merged or adapter not in owned:
            continue
        if adapter in variants:
            raise EngineError(
                f"cannot merge LoRA variant {type(variants[adapter]).__name__} of adapter "
                f"{adapter!r} at {path} on the fly (only plain LoRA is supported); "
                "sync a merged copy instead: sync_weights(peft_model.merge_and_unload()) on a copy"
            )
        d = module.get_delta_weight(adapter)
        delta_w = d if delta_w is None else delta_w + d
        lora_bias = getattr(module, "lora_bias", {}) or {}
        if lora_bias.get(adapter):
            b = module.lora_B[adapter].bias * module.scaling[adapter]
            delta_b = b if delta_b is None else delta_b + b
    return delta_w, delta_b


def is_peft_model(model: Any) -> bool:
    return hasattr(model, "peft_config") and hasattr(model, "base_model")


def hf_weight_items(model: Any) -> Iterator[tuple[str, Any]]:
    """Yield `(name, tensor)` in plain Hugging Face naming for `model`.

    A plain transformers model yields its state dict. A peft model yields the weights
    the adapted model computes with: for every LoRA-wrapped layer W + sum over active
    adapters of scaling * B @ A (peft's `get_delta_weight`, one layer at a time),
    names stripped of `base_model.model.` and `.base_layer`, `lora_*` tensors dropped,
    `modules_to_save` copies of the active adapter renamed to the original module.
    The trainer's model is never modified.
    """
    import torch

    model = getattr(model, "_orig_mod", model)  # torch.compile wrapper
    if type(model).__name__ in ("DistributedDataParallel", "DataParallel"):
        model = model.module
    if not is_peft_model(model):
        with torch.no_grad():
            for name, tensor in model.state_dict().items():
                yield name, tensor.detach()
        return

    modules = dict(model.named_modules())
    active = getattr(model, "active_adapter", None)
    active_set = set([active] if isinstance(active, str) else (active or []))
    with torch.no_grad():
        for name, tensor in model.state_dict().items():
            if ".lora_" in name or ".original_module." in name:
                continue
            out_name = name
            if ".modules_to_save." in name:
                head, _, rest = name.partition(".modules_to_save.")
                adapter, _, leaf = rest.partition(".")
                if adapter not in active_set:
                    continue
                out_name = f"{head}.{leaf}"
            tensor = tensor.detach()
            if ".base_layer." in name:
                path, _, leaf = name.partition(".base_layer.")
                module = modules.get(path)
                if module is not None and is_lora_layer(module):
                    delta_w, delta_b = lora_delta(module, path)
                    if leaf == "weight" and delta_w is not None:
                        tensor = tensor + delta_w.to(tensor.dtype)
                    elif leaf == "bias" and delta_b is not None:
                        tensor = tensor + delta_b.to(tensor.dtype)
            yield hf_name(out_name), tensor


def normalise_state_dict_items(items: Iterable[tuple[str, Any]]) -> Iterator[tuple[str, Any]]:
    for name, tensor in items:
        if ".lora_" in name:
            continue
        yield hf_name(name), tensor.detach() if hasattr(tensor, "detach") else tensor


def hf_name(name: str) -> str:
    """A peft state-dict name in plain Hugging Face naming: `base_model.model.` and
    `.base_layer` dropped (`base_model.model.model.layers.0.mlp.up_proj.base_layer.weight` ->
    `model.layers.0.mlp.up_proj.weight`); a plain name is returned as it is."""
    name = name[len(PEFT_PREFIX):] if name.startswith(PEFT_PREFIX) else name
    return name.replace(".base_layer.", ".")
