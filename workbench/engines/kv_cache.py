"""The hf engine's KV caches: decode room without `torch.cat`, and the prefix cache.

* `_GrowingLayer`: a full-attention cache layer that appends each decode step's
  keys/values into preallocated room (`DynamicLayer.update` concatenates, copying the
  layer's whole cache per step).
* `_PrefixCache`: finished rows' KV keyed by their token ids (prompt + sampled ids but
  the last), so the same episode's next turn prefills only its new tokens (see hf.py).
* `_build_cache`, `_select_rows`, `_row_kv`: a cache from kept rows, a cache's rows
  kept in place (finished rows leaving the batch), one row's KV copied out.
"""
from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import torch


class _PrefixCache:
    """KV of finished rows keyed by their token ids; LRU-bounded by bytes, thread-safe."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        self.entries: OrderedDict[tuple[int, ...], tuple[list[tuple[torch.Tensor, torch.Tensor]], int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = self.reused_tokens = 0
        self.lock = threading.Lock()

    def _longest_kept(self, p: tuple[int, ...]) -> tuple[int, ...] | None:
        """The key of the longest kept proper prefix of `p` (call with the lock held)."""
        return max((k for k in self.entries if len(k) < len(p) and p[: len(k)] == k), key=len, default=None)

    def lookup(self, prompt: list[int]) -> tuple[int, list[tuple[torch.Tensor, torch.Tensor]] | None]:
        """(n, per-layer (keys, values)) of the longest kept proper prefix of `prompt`, or (0, None)."""
        p = tuple(prompt)
        with self.lock:
            best = self._longest_kept(p)
            if best is None:
                self.misses += 1
                return 0, None
            self.entries.move_to_end(best)
            self.hits += 1
            self.reused_tokens += len(best)
            return len(best), self.entries[best][0]

    def cached_length(self, prompt: list[int]) -> int:
        """Tokens of `prompt` that `lookup` would reuse now (no effect on the LRU order or stats)."""
        with self.lock:
            best = self._longest_kept(tuple(prompt))
            return len(best) if best is not None else 0

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


def _row_kv(cache: Any, j: int, positions: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Row j's keys/values at cache `positions` (its real, non-padding ones, a (n,) index
    built on the host and uploaded without waiting): per layer (H, n, D) copies."""
    return [(layer.keys[j].index_select(1, positions), layer.values[j].index_select(1, positions))
            for layer in cache.layers]


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
