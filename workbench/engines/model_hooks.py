"""Pieces of a transformers forward that the engine and the trainer swap while they run.

* Attention implementations: `register_attention(name, forward)` registers one with
  transformers once; `sdpa_replaced(model, name)` runs a model on it while inside, when
  the model uses transformers' "sdpa". `gqa_attention(model)` is the engine's: sdpa with
  grouped KV heads handed to torch as they are (`enable_gqa`), where transformers copies
  them per layer with `repeat_kv` whenever a padding mask is present (SmolLM2 on this
  CPU, 32 rows x 300 tokens: 20 ms vs 2.7 ms per layer). The trainer's packed attention
  (`training/packing.py`) registers its own the same way.
* `dense_head_input(model)`: the LM head gets its input with fresh strides (see there).
"""
from __future__ import annotations

from contextlib import contextmanager
from typing import Any

import torch

_GQA_SDPA = "workbench_sdpa_gqa"
_registered: dict[str, bool] = {}


def _sdpa_gqa_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                      attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                      is_causal: bool | None = None, **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers' sdpa attention, with grouped KV heads passed to torch as they are (`enable_gqa`)."""
    if kwargs.get("position_bias") is not None or kwargs.get("cache") is not None:
        from transformers.integrations.sdpa_attention import sdpa_attention_forward

        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout,
                                      scaling=scaling, is_causal=is_causal, **kwargs)
    causal = is_causal if is_causal is not None else getattr(module, "is_causal", True)
    causal = query.shape[2] > 1 and attention_mask is None and causal
    if causal and key.shape[2] > query.shape[2]:
        causal = False  # upper-left aligned is_causal would be wrong; build the mask instead
        q, k = query.shape[2], key.shape[2]
        attention_mask = torch.ones(q, k, dtype=torch.bool, device=query.device).tril(k - q)
    out = torch.nn.functional.scaled_dot_product_attention(
        query, key, value, attn_mask=attention_mask, dropout_p=dropout, scale=scaling, is_causal=causal,
        enable_gqa=query.shape[1] != key.shape[1],
    )  # (B, H, q, D)
    return out.transpose(1, 2).contiguous(), None


def register_attention(name: str, forward: Any, mask: Any = None) -> bool:
    """Register `forward` as transformers attention implementation `name` (with `mask`,
    default `sdpa_mask`, as its mask builder), once; False when transformers lacks the API."""
    if name not in _registered:
        try:
            from transformers import AttentionInterface
            from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

            AttentionInterface.register(name, forward)
            AttentionMaskInterface.register(name, mask or sdpa_mask)
            _registered[name] = True
        except (ImportError, AttributeError):
            _registered[name] = False
    return _registered[name]


@contextmanager
def sdpa_replaced(model: Any, name: str):
    """Run `model` with the registered attention implementation `name` while inside, when
    it runs on transformers' "sdpa" (anything else runs as it is)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or not _registered.get(name):
        yield
        return
    config._attn_implementation = name
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


def _gqa_mask(*args: Any, **kwargs: Any) -> Any:
    """`sdpa_mask`, but a one-token query always gets its (B, 1, 1, K) mask built:
    deciding to skip it reads `padding_mask.all()` back from the device every step."""
    from transformers.masking_utils import sdpa_mask

    if kwargs.get("q_length") == 1:
        kwargs["allow_is_causal_skip"] = False
    return sdpa_mask(*args, **kwargs)


def gqa_attention(model: Any):
    """Run `model` with `_sdpa_gqa_forward` while inside (only models on "sdpa" attention)."""
    register_attention(_GQA_SDPA, _sdpa_gqa_forward, _gqa_mask)
    return sdpa_replaced(model, _GQA_SDPA)


def _standard_strides(module: Any, args: tuple) -> tuple | None:
    """Forward pre-hook: the LM head's input with the strides of a fresh tensor."""
    x = args[0]
    if not isinstance(x, torch.Tensor) or x.dim() < 3:
        return None
    expected, step = [], 1
    for size in reversed(x.shape):
        expected.append(step)
        step *= size
    if list(x.stride()) == expected[::-1]:
        return None
    return (x.clone(memory_format=torch.contiguous_format), *args[1:])


@contextmanager
def dense_head_input(model: Any):
    """While inside, the LM head gets its input with fresh strides.

    `logits_to_keep=1` hands the head `hidden[:, -1:, :]`, a (B, 1, E) view with the
    strides of the whole (B, T, E) sequence. For the trainer's bf16 policy (peft LoRA) on
    a CPU, torch's matmul did not fold that into one matrix product: the profile shows
    the (V, E) head weight copied per row. Measured on SmolLM2 + LoRA r=16, bf16, one
    thread, 74-token rows: a prefill took 174 ms for one row and 1.21 s for eight, 98 and
    568 ms with the input copied fresh (the plain model without peft was not affected).
    Copying the (B, 1, E) input costs next to nothing.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    if not isinstance(head, torch.nn.Module):
        yield
        return
    handle = head.register_forward_pre_hook(_standard_strides)
    try:
        yield
    finally:
        handle.remove()
