"""`hf` backend: batched sampling with a transformers model (the CPU default).

One call samples every prompt together: prompts are left-padded into one (B, T)
batch, prefilled once, then decoded token by token with the KV cache. Rows that
hit a stop id, or complete a stop string (`SamplingParams.stop`, the engine's `stop`
from `inference.stop`; see `base.StopStrings`: the ids are kept as sampled up to and
including the token that completes it), leave the batch (the cache is compacted), so
short answers don't pay for long ones. The loop is ours rather than `model.generate` so that the raw-model
logprob of each sampled id comes out of the same forward that sampled it, without
storing (B, V) logits per step.

The engine holds a reference to the policy module, so after an optimizer step it
already samples from the new weights; `sync_weights(model)` just swaps the module.
A LoRA policy is sampled through a merged copy (`merged.py`) that re-merges itself
whenever the policy's weights changed.

Prefix cache (multi-turn): when a row finishes, its KV (prompt + sampled ids) is kept,
keyed by those ids. A later prompt that extends a kept sequence -- the same episode's
next turn: its previous context, the sampled turn, the observation delta -- prefills
only the new tokens on top of the kept KV, instead of the whole conversation again.
Entries are LRU-bounded (`prefix_cache_mb`), a row's newer entry replaces the one it
extended, and the cache is dropped whenever the weights change (optimizer step,
`load_state_dict`, `sync_weights`, adapters switched off or on: checked with
`merged.weights_state_key`), so
a sample never sees KV from other weights. Only models whose cache layers are plain
full-attention `DynamicLayer`s use it (sliding-window models fall back to full prefill).

Decoding appends each step's keys/values into preallocated room (`_GrowingLayerMixin`)
instead of `DynamicLayer`'s `torch.cat`, which copied every layer's whole cache per step.

Grouped-query attention: during the engine's forwards a model using transformers'
"sdpa" attention runs `_sdpa_gqa_forward` instead -- the same math, but torch's
`enable_gqa` rather than `repeat_kv` when a padding mask is present (transformers only
skips the copy without a mask, for CUDA kernels' sake). On CPU that copy of the whole
KV cache, per layer and step, cost more than the matmuls (SmolLM2: 20 ms vs 2.7 ms per
layer at 32 rows x 300 tokens).

`submit(prompt, params)` (the request API of `AsyncRollout`) goes through a
`DynamicBatcher`: one worker thread runs a batched generate over whatever requests are
queued. There every request samples from its own generator seeded with its
`params.seed`, so a seeded request gets the same tokens whichever batch it lands in
(`generate_ids` keeps one generator per call, seeded with `params.seed`).
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from contextlib import contextmanager
from concurrent.futures import Future
from typing import Any

import torch

from workbench.engines.base import GenerationEngine, GenerationResult, SamplingParams
from workbench.engines.batching import DynamicBatcher
from workbench.engines.merged import merged_copy, weights_state_key


class HFEngine(GenerationEngine):
    """Batched sampler over a Hugging Face causal LM (plain or peft-wrapped)."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 64, prefix_cache: bool = True,
                 prefix_cache_mb: float = 1024.0, merge_lora: bool = True):
        super().__init__(tokenizer)
        self.model = model
        self.merge_lora = merge_lora
        self._merged = merged_copy(model) if merge_lora else None  # see merged.py
        self.max_batch_size = max_batch_size
        self.prefix_cache = _PrefixCache(int(prefix_cache_mb * 2**20)) if prefix_cache else None
        self._weights_key: tuple[int, int, tuple[bool, ...]] | None = None
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._generated = 0
        self._prompt_tokens = 0
        self._batcher = None
        self._batcher_lock = threading.Lock()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync_weights(self, model: Any) -> None:
        if model is not self.model:
            self.model = model
            self._merged = merged_copy(model) if self.merge_lora else None
        self.clear_cache()

    def clear_cache(self) -> None:
        """Forget the kept KV of earlier calls (the prefix cache)."""
        if self.prefix_cache is not None:
            self.prefix_cache.clear()

    def stats(self) -> dict[str, float]:
        out = {"prompt_tokens": self._prompt_tokens, "generated_tokens": self._generated,
               "lora_merges": self._merged.merges if self._merged is not None else 0}
        if self.prefix_cache is not None:
            out.update(self.prefix_cache.stats())
        if self._batcher is not None:
            out.update({f"batcher_{k}": v for k, v in self._batcher.stats().items()})
        return out

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        # A CPU generator on purpose, whatever the model's device: `_sample` draws from
        # probabilities moved to the CPU, so one seed gives the same tokens on any device.
        gen = torch.Generator(device="cpu")
        if params.seed is not None:
            gen.manual_seed(params.seed)
        else:
            gen.seed()
        return self._generate(prompts, params, gen)

    def submit(self, prompt: list[int], params: SamplingParams) -> "Future[GenerationResult]":
        """Queue one prompt for the dynamic batcher (see the module docstring)."""
        if self._batcher is None:
            with self._batcher_lock:
                if self._batcher is None:
                    self._batcher = DynamicBatcher(self._run_batch, max_batch_size=4 * self.max_batch_size,
                                                   name="wb-hf-batcher")
        return self._batcher.submit(prompt, params)

    def _run_batch(self, prompts: list[list[int]], params_list: list[SamplingParams]) -> list[GenerationResult]:
        """One batched generate; every row samples from a generator seeded with its own seed."""
        gens = []
        for p in params_list:
            g = torch.Generator(device="cpu")
            if p.seed is not None:
                g.manual_seed(p.seed)
            else:
                g.seed()
            gens.append(g)
        return self._generate(prompts, params_list[0], gens)

    def close(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.close()
        super().close()

    def _generate(self, prompts: list[list[int]], params: SamplingParams,
                  gen: torch.Generator | list[torch.Generator]) -> list[GenerationResult]:
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        key = weights_state_key(self.model)  # changes with the weights or the adapters' on/off state
        if self.prefix_cache is not None and key != self._weights_key:  # new weights: kept KV is stale
            self.prefix_cache.clear()
        self._weights_key = key
        model = self._merged.refresh(key) if self._merged is not None else self.model  # (merged copy: merged.py)
        # Sort by length so each chunk pads little; restore the order afterwards.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        by_index: dict[int, GenerationResult] = {}
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            chunk_gen = [gen[i] for i in chunk] if isinstance(gen, list) else gen
            for i, res in zip(chunk, self._generate_chunk(model, [prompts[i] for i in chunk], params, chunk_gen)):
                by_index[i] = res
        return [by_index[i] for i in range(len(prompts))]

    @torch.no_grad()
    def _generate_chunk(self, model: Any, prompts: list[list[int]], params: SamplingParams,
                        gen: torch.Generator | list[torch.Generator]) -> list[GenerationResult]:
        """`gen`: one generator for the chunk, or one per row (rows keep theirs as others finish)."""
        with gqa_attention(model):
            return self._decode_chunk(model, prompts, params, gen)

    def _decode_chunk(self, model: Any, prompts: list[list[int]], params: SamplingParams,
                      gen: torch.Generator | list[torch.Generator]) -> list[GenerationResult]:
        device = self.device
        B = len(prompts)
        # Identical prompts (a GRPO group's opening turn, greedy episodes that agree so
        # far) are prefilled once; their cache rows are copied before sampling.
        unique: dict[tuple[int, ...], int] = {}
        inverse = [unique.setdefault(tuple(p), len(unique)) for p in prompts]
        uprompts = [list(p) for p in unique]
        U = len(uprompts)
        # Prefix cache: row u reuses the kept KV of its first `kept[u]` tokens.
        hits = [self.prefix_cache.lookup(p) if self.prefix_cache is not None else (0, None) for p in uprompts]
        kept = [n for n, _ in hits]
        C = max(kept)  # (U, C) kept KV, right-aligned, then (U, S) new tokens, right-aligned
        S = max(len(p) - n for p, n in zip(uprompts, kept))
        input_ids = torch.full((U, S), self.pad_id, dtype=torch.long)  # (U, S) left-padded suffixes
        attention = torch.zeros((U, C + S), dtype=torch.long)  # (U, C + S)
        positions = torch.zeros((U, S), dtype=torch.long)  # (U, S)
        for b, (p, n) in enumerate(zip(uprompts, kept)):
            s = len(p) - n
            input_ids[b, S - s:] = torch.tensor(p[n:], dtype=torch.long)
            attention[b, C - n:C] = 1
            attention[b, C + S - s:] = 1
            positions[b, S - s:] = torch.arange(n, len(p))
        input_ids, attention, positions = input_ids.to(device), attention.to(device), positions.to(device)
        past = None
        if C > 0:
            past = _build_cache([layers for _, layers in hits], kept, C, device)
        self._prompt_tokens += sum(len(p) for p in prompts)

        stop = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=device)
        stop_strings = self.stop_strings(params)  # checked per row after every sampled token
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        finish: list[str] = ["length"] * B
        alive = torch.arange(B, device=device)  # rows of the original chunk still decoding

        # logits_to_keep=1: only the last position's logits are needed (skips a (B, T, V) LM head).
        out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                         past_key_values=past, logits_to_keep=1)
        cache = out.past_key_values
        plain = _plain_layers(cache)
        if self.prefix_cache is not None and not plain:
            self.prefix_cache = None  # e.g. sliding-window layers: keep nothing
        if plain and params.max_tokens > 1:  # room for the new tokens: no torch.cat per step
            cache.layers = [_GrowingLayer(layer, params.max_tokens - 1) for layer in cache.layers]
        keys = [tuple(p) for p in prompts]  # ids whose KV each row holds (grows as it decodes)
        logits = out.logits[:, -1, :].float()  # (U, V)
        next_pos = positions[:, -1:] + 1  # (U, 1)
        if U < B:  # expand the unique rows back to one row per prompt
            inv = torch.tensor(inverse, dtype=torch.long, device=device)  # (B,)
            cache = _select_rows(cache, inv)
            logits, next_pos, attention = logits[inv], next_pos[inv], attention[inv]  # (B, ...)
        for step in range(params.max_tokens):
            logprobs = torch.log_softmax(logits, dim=-1)  # (B, V) raw model distribution
            row_gen = [gen[r] for r in alive.tolist()] if isinstance(gen, list) else gen
            tokens = _sample(logits, params, row_gen)  # (B,)
            chosen_lp = logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # (B,)
            tok_list, lp_list = tokens.tolist(), chosen_lp.tolist()
            done_mask = torch.isin(tokens, stop) if stop.numel() else torch.zeros_like(tokens, dtype=torch.bool)
            done_list = done_mask.tolist()
            last_step = step == params.max_tokens - 1
            for j, row in enumerate(alive.tolist()):
                out_ids[row].append(tok_list[j])
                out_lp[row].append(lp_list[j])
                if stop_strings is not None and not done_list[j] and stop_strings.completes(out_ids[row]):
                    done_list[j] = True  # this token completed a stop string: the reply ends with it
                    done_mask[j] = True
                if done_list[j]:
                    finish[row] = "stop"
                if (done_list[j] or last_step) and self.prefix_cache is not None:
                    # KV held now: prompt + every sampled id but this last one (not fed yet).
                    self.prefix_cache.store(keys[row] + tuple(out_ids[row][:-1]), _row_kv(cache, j, attention[j]))
            self._generated += len(tok_list)
            keep = ~done_mask
            if not keep.any() or last_step:
                break
            if not keep.all():
                idx = keep.nonzero().squeeze(-1)
                alive, tokens, next_pos, attention = alive[idx], tokens[idx], next_pos[idx], attention[idx]
                cache = _select_rows(cache, idx)
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)  # (B', T+1)
            out = model(
                input_ids=tokens[:, None], attention_mask=attention, position_ids=next_pos,
                past_key_values=cache, use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        return [GenerationResult(token_ids=out_ids[b], logprobs=out_lp[b], finish_reason=finish[b],  # type: ignore[arg-type]
                                 num_cached_tokens=kept[inverse[b]])
                for b in range(B)]


_GQA_SDPA = "workbench_sdpa_gqa"
_gqa_registered: bool | None = None


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


def _register_gqa_attention() -> bool:
    global _gqa_registered
    if _gqa_registered is None:
        try:
            from transformers import AttentionInterface
            from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

            AttentionInterface.register(_GQA_SDPA, _sdpa_gqa_forward)
            AttentionMaskInterface.register(_GQA_SDPA, sdpa_mask)
            _gqa_registered = True
        except (ImportError, AttributeError):
            _gqa_registered = False
    return _gqa_registered


@contextmanager
def gqa_attention(model: Any):
    """Run `model` with `_sdpa_gqa_forward` while inside (only models on "sdpa" attention)."""
    config = getattr(model, "config", None)
    if config is None or getattr(config, "_attn_implementation", None) != "sdpa" or not _register_gqa_attention():
        yield
        return
    config._attn_implementation = _GQA_SDPA
    try:
        yield
    finally:
        config._attn_implementation = "sdpa"


class _PrefixCache:
    """KV of finished rows keyed by their token ids; LRU-bounded by bytes, thread-safe."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = self.reused_tokens = 0
        self.lock = threading.Lock()

    def lookup(self, prompt: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(n, per-layer (keys, values)) of the longest kept proper prefix of `prompt`, or (0, None)."""
        p = tuple(prompt)
        with self.lock:
            best = max((k for k in self.entries if len(k) < len(p) and p[: len(k)] == k), key=len, default=None)
            if best is None:
                self.misses += 1
                return 0, None
            self.entries.move_to_end(best)
            self.hits += 1
            self.reused_tokens += len(best)
            return len(best), self.entries[best][0]

    def store(self, key: tuple[int, ...], layers: list[tuple[torch.Tensor, torch.Tensor]]) -> None:
        nbytes = sum(k.numel() * k.element_size() + v.numel() * v.element_size() for k, v in layers)
        if not key or nbytes > self.max_bytes:
            return
        with self.lock:
            # The row's earlier entry (a prefix of this one) is superseded.
            for old in [k for k in self.entries if len(k) <= len(key) and key[: len(k)] == k]:
                self.bytes -= self.entries.pop(old)[1]
            self.entries[key] = (layers, nbytes)
            self.bytes += nbytes
            while self.bytes > self.max_bytes:
                self.bytes -= self.entries.popitem(last=False)[1][1]

    def clear(self) -> None:
        with self.lock:
            self.entries.clear()
            self.bytes = 0

    def stats(self) -> dict[str, float]:
        return {"prefix_cache_hits": self.hits, "prefix_cache_misses": self.misses,
                "prefix_cache_reused_tokens": self.reused_tokens, "prefix_cache_entries": len(self.entries),
                "prefix_cache_mb": self.bytes / 2**20}


def _dynamic_layer_class() -> type:
    from transformers.cache_utils import DynamicLayer

    return DynamicLayer


class _GrowingLayerMixin:
    """A full-attention cache layer that appends into preallocated room instead of `torch.cat`.

    `DynamicLayer.update` concatenates, copying the layer's whole cache every decode
    step; here the keys/values live in a buffer with spare room and `keys`/`values` are
    views of its filled part. Falls back to reallocating (doubling) when the room is used up.
    """

    def _init_from(self, layer: Any, room: int) -> None:
        keys, values = layer.keys, layer.values  # (B, H, T, D)
        self.dtype, self.device, self.is_initialized = keys.dtype, keys.device, True
        self._length = keys.shape[-2]
        self._kbuf = keys.new_empty((*keys.shape[:2], self._length + room, keys.shape[-1]))
        self._vbuf = values.new_empty((*values.shape[:2], self._length + room, values.shape[-1]))
        self._kbuf[:, :, : self._length] = keys
        self._vbuf[:, :, : self._length] = values
        self._views()

    def _views(self) -> None:
        self.keys = self._kbuf[:, :, : self._length]
        self.values = self._vbuf[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        n = key_states.shape[-2]
        if self._length + n > self._kbuf.shape[-2]:
            extra = max(n, self._kbuf.shape[-2])
            self._kbuf = torch.cat([self._kbuf, self._kbuf.new_empty((*self._kbuf.shape[:2], extra, self._kbuf.shape[-1]))], -2)
            self._vbuf = torch.cat([self._vbuf, self._vbuf.new_empty((*self._vbuf.shape[:2], extra, self._vbuf.shape[-1]))], -2)
        self._kbuf[:, :, self._length : self._length + n] = key_states
        self._vbuf[:, :, self._length : self._length + n] = value_states
        self._length += n
        self._views()
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._kbuf, self._vbuf = self._kbuf[indices], self._vbuf[indices]
        self._views()


_growing_class: type | None = None


def _GrowingLayer(layer: Any, room: int) -> Any:
    """`layer`'s contents in a `_GrowingLayerMixin` + DynamicLayer with `room` spare positions."""
    global _growing_class
    if _growing_class is None:
        _growing_class = type("GrowingLayer", (_GrowingLayerMixin, _dynamic_layer_class()), {})
    new = _growing_class()
    new._init_from(layer, room)
    return new


def _plain_layers(cache: Any) -> bool:
    """True when every cache layer is a plain full-attention DynamicLayer (safe to slice and rebuild)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(type(layer) is DynamicLayer for layer in layers)


def _row_kv(cache: Any, j: int, attention_row: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Row j's keys/values at its real (non-padding) positions: per layer (H, n, D) copies."""
    real = attention_row.bool()
    return [(layer.keys[j][:, real].clone(), layer.values[j][:, real].clone()) for layer in cache.layers]


def _build_cache(rows: list[list[tuple[torch.Tensor, torch.Tensor]] | None], kept: list[int], C: int,
                 device: torch.device) -> Any:
    """A DynamicCache of length C holding each row's kept KV right-aligned (zeros before it)."""
    from transformers import DynamicCache

    ref = next(r for r in rows if r is not None)
    data = []
    for li, (k0, v0) in enumerate(ref):
        H, _, D = k0.shape
        keys = torch.zeros((len(rows), H, C, D), dtype=k0.dtype, device=device)  # (U, H, C, D)
        values = torch.zeros((len(rows), v0.shape[0], C, v0.shape[2]), dtype=v0.dtype, device=device)
        for b, (r, n) in enumerate(zip(rows, kept)):
            if r is not None and n:
                keys[b, :, C - n:] = r[li][0]
                values[b, :, C - n:] = r[li][1]
        data.append((keys, values))
    return DynamicCache(data)


def _select_rows(cache: Any, idx: torch.Tensor) -> Any:
    """Keep only rows `idx` of a KV cache (finished rows leave the batch)."""
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(idx)
        return cache
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            layer.keys = layer.keys[idx]
            layer.values = layer.values[idx]
        return cache
    raise TypeError(f"cannot select rows of cache type {type(cache).__name__}")


#: Candidates sorted for top-p before falling back to a full-vocabulary sort.
_NUCLEUS_CANDIDATES = 512


def _sample(logits: torch.Tensor, params: SamplingParams,
            gen: torch.Generator | list[torch.Generator]) -> torch.Tensor:
    """Sample one id per row from (B, V) logits with temperature / top-k / top-p.

    `gen`: one generator for all rows, or a list with one per row.
    """
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / params.temperature  # (B, V)
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        probs = torch.softmax(scaled, dim=-1)  # (B, V)
        # The nucleus nearly always lies among the most likely few hundred ids: sort only
        # those (a full (B, V) sort per step is slow on CPU); if they hold less than top_p
        # of some row's mass, sort everything. Same nucleus either way.
        k = min(_NUCLEUS_CANDIDATES, probs.shape[-1])
        top_probs, top_idx = torch.topk(probs, k, dim=-1)  # (B, k), descending
        if k < probs.shape[-1] and not bool((top_probs.sum(-1) >= params.top_p).all()):
            top_probs, top_idx = torch.sort(probs, descending=True, dim=-1)  # (B, V)
        # Drop tokens once the mass before them already reaches top_p (keep at least one),
        # then draw among the kept candidates only (multinomial renormalises the weights).
        keep_sorted = (top_probs.cumsum(dim=-1) - top_probs) < params.top_p
        weights = (top_probs * keep_sorted).cpu()  # (B, k)
        return top_idx.gather(-1, _multinomial(weights, gen).to(top_idx.device)[:, None]).squeeze(-1)
    probs = torch.softmax(scaled, dim=-1).cpu()  # (B, V)
    return _multinomial(probs, gen).to(logits.device)


def _multinomial(weights: torch.Tensor, gen: torch.Generator | list[torch.Generator]) -> torch.Tensor:
    """One draw per row of (B, N) non-negative weights: (B,) column indices.

    Inverse CDF: one uniform per row against the float64 cumulative weights. A
    zero-weight id can never be drawn (its cumulative value equals its neighbour's).
    `torch.multinomial` draws N exponentials per row instead (13 ms vs 0.2 ms at 8 x 49k).
    """
    cdf = weights.to(torch.float64).cumsum(-1)  # (B, N)
    if isinstance(gen, list):
        u = torch.cat([torch.rand(1, generator=g, dtype=torch.float64) for g in gen])  # (B,)
    else:
        u = torch.rand(weights.shape[0], generator=gen, dtype=torch.float64)  # (B,)
    draw = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)  # (B,)
    return draw.clamp_(max=weights.shape[-1] - 1)
