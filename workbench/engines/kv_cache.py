"""The hf engine's KV caches: decode room without `torch.cat`, and the prefix cache.

* `_GrowingLayer`: a full-attention cache layer that appends each decode step's
  keys/values into preallocated room (`DynamicLayer.update` concatenates, copying the
  layer's whole cache per step). A cache's layers share one `_KVBlock` buffer.
* `_PrefixCache`: finished rows' KV keyed by their token ids (prompt + sampled ids but
  the last), so the same episode's next turn prefills only its new tokens (see hf.py).
* `_build_cache`, `_select_rows`, `_row_kv`: a cache from kept rows (with room for the
  new tokens and the decode steps; optionally into rows of a larger buffer), a cache's
  rows kept (finished rows leaving the batch: holes filled from the tail in place on the
  CPU, `_tail_fill`), one row's KV copied out.
* `_kv_buffer`: a cache buffer; on a Linux CPU its memory asks for transparent huge
  pages before anything is written (`madvise(MADV_HUGEPAGE)`). A decode step writes one
  position of every row and KV head into room no one touched yet, so with 4 KiB pages
  every 16 steps each (row, head) faulted in a fresh page: at 64 rows SmolLM2's 30
  layers took ~720 page faults per step. Measured on a 2-core Xeon VM (fp32, 64 rows x
  175 positions, 2026-11-26): the cache writes 8.4-10.6 -> 1.8 ms per step, the step 176-184
  -> 168 ms; at 8 rows no change. The price is the first huge-page faults of a process:
  on that VM a 470 MB buffer's first fill took 0.3-0.7 s against 0.07 s on 4 KiB pages,
  and later fills 0.04 s (freed huge pages are reused); in the 128 x 4 engines benchmark
  the first later turn's cache build paid it once (0.84 vs 0.09 s) and the run as a whole
  still gained (fp32 208.4 -> 216.9 tok/s). Where the kernel's THP setting is "never", or
  off Linux, the advice is not given (or ignored) and nothing else changes.
"""
from __future__ import annotations

import ctypes
import sys
import threading
from collections import OrderedDict
from typing import Any

import torch

_MADV_HUGEPAGE = 14  # <linux/mman.h>
_HUGE_PAGE = 2 << 20  # x86-64 and arm64 (4 KiB base pages): the transparent huge page size
_libc: Any = None  # loaded on first use, False where unavailable


def _advise_huge_pages(t: torch.Tensor) -> bool:
    """Ask the kernel for transparent huge pages under `t`'s whole 2 MiB-aligned pages
    (call before writing it); True when advised. Linux CPU tensors only."""
    global _libc
    if t.device.type != "cpu" or not sys.platform.startswith("linux"):
        return False
    if _libc is None:
        try:
            _libc = ctypes.CDLL(None, use_errno=True)
            _libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    if not _libc:
        return False
    start = t.data_ptr()
    lo = -(-start // _HUGE_PAGE) * _HUGE_PAGE
    hi = (start + t.numel() * t.element_size()) // _HUGE_PAGE * _HUGE_PAGE
    return hi > lo and _libc.madvise(lo, hi - lo, _MADV_HUGEPAGE) == 0


def _kv_buffer(shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
    """An uninitialised cache buffer, huge pages asked for on a Linux CPU (module docstring)."""
    buf = torch.empty(shape, dtype=dtype, device=device)
    _advise_huge_pages(buf)
    return buf


class _PrefixCache:
    """KV of finished rows keyed by their token ids; LRU-bounded by bytes, thread-safe."""

    def __init__(self, max_bytes: int):
        self.max_bytes = max_bytes
        # key -> (the row's KV: one (L_b, 2, KV, n, D) tensor per block (`_row_kv`), bytes)
        self.entries: OrderedDict[tuple[int, ...], tuple[list[torch.Tensor], int]] = OrderedDict()
        self.bytes = 0
        self.hits = self.misses = self.reused_tokens = 0
        self.lock = threading.Lock()

    def _longest_kept(self, p: tuple[int, ...]) -> tuple[int, ...] | None:
        """The key of the longest kept proper prefix of `p` (call with the lock held)."""
        return max((k for k in self.entries if len(k) < len(p) and p[: len(k)] == k), key=len, default=None)

    def lookup(self, prompt: list[int]) -> tuple[int, list[torch.Tensor] | None]:
        """(n, the kept KV) of the longest kept proper prefix of `prompt`, or (0, None)."""
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

    def store(self, key: tuple[int, ...], kv: list[torch.Tensor], extends: int = 0) -> None:
        """Keep `kv` under `key`. `extends`: the length of the entry this row's prompt reused
        (0: none); that entry, the row's previous turn, is superseded and dropped. Only that
        one: another entry that happens to be a prefix of `key` is another row's (a group
        member that sampled the first ids of this row's reply and stopped), still wanted."""
        nbytes = sum(t.numel() * t.element_size() for t in kv)
        if not key or nbytes > self.max_bytes:
            return
        with self.lock:
            old = key[:extends] if 0 < extends < len(key) else None
            if old in self.entries:
                self.bytes -= self.entries.pop(old)[1]
            if key in self.entries:
                self.bytes -= self.entries.pop(key)[1]
            self.entries[key] = (kv, nbytes)
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


class _KVBlock:
    """Keys and values of several same-shaped cache layers in one buffer: (L, 2, B, KV, cap, D).

    `buf[l, 0]` / `buf[l, 1]` are layer l's keys / values with the strides a per-layer
    (B, KV, cap, D) buffer has, so attention reads the same layout. One buffer makes a row's
    KV one op to keep (`_row_kv`) and to place (`_build_cache`), and rows leaving the batch
    one op per run of rows (`keep_rows`) instead of a copy of each layer's whole buffer.
    """

    def __init__(self, buf: torch.Tensor, layers: int):
        self.buf = buf  # (L, 2, B, KV, cap, D)
        self.layers = layers

    def keep_rows(self, index: torch.Tensor, keep: list[int] | None, length: int) -> None:
        """Keep rows `index` (on the buffer's device; `keep`: the same on the host, or None).

        On the CPU, kept rows move in place, only their first `length` positions: no new
        buffer (fresh pages cost page faults on a CPU) and no copy of the spare room.
        With `keep` a fill of holes from the tail (`tail_fill`: row i keeps row i or a
        row >= len(keep)), only the rows that fill holes are copied; with `keep` ascending
        and distinct, rows move up in runs with the same shift (no copy of the rows before
        the first gap). Otherwise one `index_select`."""
        on_cpu = keep is not None and self.buf.device.type == "cpu"
        n = len(keep) if keep is not None else 0
        if on_cpu and all(k == i or k >= n for i, k in enumerate(keep)) and len(set(keep)) == n:
            buf = self.buf
            for i, k in enumerate(keep):
                if k != i:  # source rows >= n are never targets: no overlap
                    buf[:, :, i, :, :length].copy_(buf[:, :, k, :, :length])
            self.buf = buf[:, :, :n]
            return
        in_place = on_cpu and all(a < b for a, b in zip(keep, keep[1:]))
        if not in_place:
            self.buf = self.buf.index_select(2, index)
            return
        buf, i = self.buf, 0
        while i < n:
            d = keep[i] - i  # shift of the run starting at i
            j = i + 1
            while j < n and keep[j] - j == d:
                j += 1
            if d:  # rows keep[i..j) -> i..j, in pieces of d rows so source and target never overlap
                for s in range(i, j, d):
                    e = min(s + d, j)
                    buf[:, :, s:e, :, :length].copy_(buf[:, :, s + d:e + d, :, :length])
            i = j
        self.buf = buf[:, :, :n]


class _GrowingLayerMixin:
    """A full-attention cache layer that appends into preallocated room instead of `torch.cat`.

    `DynamicLayer.update` concatenates, copying the layer's whole cache every decode
    step; here the keys/values live in a `_KVBlock` with spare room (shared by all the
    cache's layers) and `keys`/`values` are views of its filled part. Falls back to a
    buffer of its own (doubled) when the room is used up.
    """

    def _attach(self, block: _KVBlock, index: int, length: int) -> None:
        buf = block.buf
        self.dtype, self.device, self.is_initialized = buf.dtype, buf.device, True
        self._block, self._index, self._length = block, index, length
        self._views()

    def _views(self) -> None:
        self._kbuf = self._block.buf[self._index, 0]  # (B, KV, cap, D)
        self._vbuf = self._block.buf[self._index, 1]
        self.keys = self._kbuf[:, :, : self._length]
        self.values = self._vbuf[:, :, : self._length]

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        n = key_states.shape[-2]
        if self._length + n > self._kbuf.shape[-2]:  # room used up: a block of its own, twice the size
            cap = self._kbuf.shape[-2] + max(n, self._kbuf.shape[-2])
            buf = _kv_buffer((1, 2, *self._kbuf.shape[:2], cap, self._kbuf.shape[-1]), self._kbuf.dtype,
                             self._kbuf.device)
            buf[0, 0, :, :, : self._length] = self.keys
            buf[0, 1, :, :, : self._length] = self.values
            self._block, self._index = _KVBlock(buf, 1), 0
            self._views()
        self._kbuf[:, :, self._length : self._length + n] = key_states
        self._vbuf[:, :, self._length : self._length + n] = value_states
        self._length += n
        self.keys = self._kbuf[:, :, : self._length]
        self.values = self._vbuf[:, :, : self._length]
        return self.keys, self.values

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        self._block.keep_rows(indices, None, self._length)
        self._views()

    def write_at(self, col: torch.Tensor, key_states: torch.Tensor, value_states: torch.Tensor
                 ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write one position's (B, KV, 1, D) keys/values at column `col` (a (1,) device
        tensor, so a CUDA graph can replay the write at the next column) and return the whole
        (B, KV, cap, D) buffers, room included; `advance` moves the filled length after."""
        self._kbuf.index_copy_(2, col, key_states)
        self._vbuf.index_copy_(2, col, value_states)
        return self._kbuf, self._vbuf

    def advance(self, n: int = 1) -> None:
        """`n` more positions are filled (written by `write_at`)."""
        self._length += n
        self.keys = self._kbuf[:, :, : self._length]
        self.values = self._vbuf[:, :, : self._length]

    def clear_room(self) -> None:
        """Zero the positions after the filled part: a read of the whole buffer (`write_at`'s
        callers mask them) must not meet NaN garbage (0 x NaN is NaN)."""
        self._kbuf[:, :, self._length:].zero_()
        self._vbuf[:, :, self._length:].zero_()


_growing_class: type | None = None


def _new_growing(block: _KVBlock, index: int, length: int) -> Any:
    global _growing_class
    if _growing_class is None:
        _growing_class = type("GrowingLayer", (_GrowingLayerMixin, _dynamic_layer_class()), {})
    new = _growing_class()
    new._attach(block, index, length)
    return new


def _grow_layers(layers: list[Any], room: int) -> list[Any]:
    """Plain layers' contents in growing layers with `room` spare positions: one `_KVBlock`
    for all of them when they share shape and dtype, else one each."""
    if len({(layer.keys.shape, layer.keys.dtype) for layer in layers}) > 1:
        return [_grow_layers([layer], room)[0] for layer in layers]
    B, KV, T, D = layers[0].keys.shape
    ref = layers[0].keys
    buf = _kv_buffer((len(layers), 2, B, KV, T + room, D), ref.dtype, ref.device)  # (L, 2, B, KV, T + room, D)
    for li, layer in enumerate(layers):
        buf[li, 0, :, :, :T] = layer.keys
        buf[li, 1, :, :, :T] = layer.values
    block = _KVBlock(buf, len(layers))
    return [_new_growing(block, li, T) for li in range(len(layers))]


def _GrowingLayer(layer: Any, room: int) -> Any:
    """`layer`'s contents in a `_GrowingLayerMixin` + DynamicLayer with `room` spare positions."""
    return _grow_layers([layer], room)[0]


def _is_growing(layer: Any) -> bool:
    return isinstance(layer, _GrowingLayerMixin)


def _blocks(cache: Any) -> list[_KVBlock] | None:
    """The distinct blocks under a cache of growing layers, in layer order; None otherwise."""
    layers = getattr(cache, "layers", None)
    if not layers or not all(_is_growing(layer) for layer in layers):
        return None
    out: dict[int, _KVBlock] = {}
    for layer in layers:
        out.setdefault(id(layer._block), layer._block)
    return list(out.values())


def _plain_layers(cache: Any) -> bool:
    """True when every cache layer is a plain full-attention DynamicLayer, or our growing
    version of one, with keys and values of one shape (safe to slice, stack and rebuild)."""
    from transformers.cache_utils import DynamicLayer

    layers = getattr(cache, "layers", None)
    return bool(layers) and all(_is_growing(layer) or (type(layer) is DynamicLayer and layer.is_initialized
                                                       and layer.keys.shape == layer.values.shape)
                                for layer in layers)


def _row_kv(cache: Any, j: int, positions: torch.Tensor) -> list[torch.Tensor]:
    """Row j's keys/values at cache `positions` (its real, non-padding ones, a (n,) index
    built on the host and uploaded without waiting): one (L_b, 2, KV, n, D) copy per block
    of a growing cache (per layer (1, 2, KV, n, D) for a plain one)."""
    blocks = _blocks(cache)
    if blocks is not None and sum(b.layers for b in blocks) == len(cache.layers):
        return [b.buf[:, :, j].index_select(3, positions) for b in blocks]
    return [torch.stack([layer.keys[j].index_select(1, positions), layer.values[j].index_select(1, positions)])[None]
            for layer in cache.layers]


def _build_cache(rows: list[list[torch.Tensor] | None], kept: list[int], C: int, room: int,
                 device: torch.device, into: torch.Tensor | None = None) -> Any:
    """A DynamicCache of growing layers, length C, holding each row's kept KV (`_row_kv`'s
    blocks) right-aligned, zeros before it, and `room` spare positions after it (for the
    prefill's new tokens and the decode steps: no copy of the cache until the turn ends).
    `into`: a (L, 2, U, KV, C + room, D) buffer (a view of a larger one) to place them in,
    when the rows' KV is one block; else a new buffer per block."""
    from transformers import DynamicCache

    ref = next(r for r in rows if r is not None)
    assert into is None or len(ref) == 1, "`into` holds one block"
    layers = []
    for bi, part in enumerate(ref):
        Lb, two, KV, _, D = part.shape
        # (L_b, 2, U, KV, C + room, D)
        buf = into if into is not None else _kv_buffer((Lb, two, len(rows), KV, C + room, D), part.dtype, device)
        for b, (r, n) in enumerate(zip(rows, kept)):
            buf[:, :, b, :, : C - n].zero_()  # padding: masked, but 0 * garbage could be NaN
            if r is not None and n:
                buf[:, :, b, :, C - n : C] = r[bi]
        block = _KVBlock(buf, Lb)
        layers += [_new_growing(block, li, C) for li in range(Lb)]
    cache = DynamicCache()
    cache.layers = layers
    return cache


def _select_rows(cache: Any, idx: torch.Tensor, keep: list[int] | None = None) -> Any:
    """Keep only rows `idx` of a KV cache (finished rows leave the batch, or unique rows are
    expanded); `keep`: `idx` on the host, which lets a growing cache on the CPU move its
    kept rows in place (`_KVBlock.keep_rows`)."""
    blocks = _blocks(cache)
    if blocks is not None:
        length = max(layer._length for layer in cache.layers)
        for block in blocks:
            block.keep_rows(idx, keep, length)
        for layer in cache.layers:
            layer._views()
        return cache
    if hasattr(cache, "batch_select_indices"):
        cache.batch_select_indices(idx)
        return cache
    if hasattr(cache, "layers"):
        for layer in cache.layers:
            layer.keys = layer.keys[idx]
            layer.values = layer.values[idx]
        return cache
    raise TypeError(f"cannot select rows of cache type {type(cache).__name__}")


def _tail_fill(live: list[bool]) -> list[int]:
    """Rows kept when the rows not `live` leave: the live rows among the first n (n: how many
    are live) stay where they are, and each hole among them takes a live row from past n,
    in order. Batch row i then holds row `keep[i]`: on the CPU only the rows that fill holes
    are copied (`_KVBlock.keep_rows`), not every row after the first hole."""
    n = sum(live)
    movers = iter(i for i in range(n, len(live)) if live[i])
    return [i if live[i] else next(movers) for i in range(n)]


def _prefill_groups(new: list[int], max_groups: int = 4) -> list[list[int]]:
    """Rows (indices into `new`, each row's tokens to prefill) in groups prefilled apart.

    A padded prefill costs rows x its longest row: the next turns of kept episodes (tens of
    new tokens) padded to a prompt the prefix cache lost (hundreds) cost many times their
    tokens. Groups are runs of rows sorted by new tokens, the split that minimises padded
    tokens plus, per group after the first, 1/16 of the unsplit prefill's (the groups'
    caches are then copied into one, and each forward has its own fixed cost); at most
    `max_groups`. One group (all rows, in order) when splitting saves less."""
    order = sorted(range(len(new)), key=lambda u: (new[u], u))
    vals = [new[u] for u in order]  # ascending
    n = len(vals)
    penalty = n * vals[-1] / 16
    # best[k][j]: least cost of the first j sorted rows in k groups (a group's cost: rows x its last value)
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(max_groups + 1)]
    cut = [[0] * (n + 1) for _ in range(max_groups + 1)]
    best[0][0] = 0.0
    for k in range(1, max_groups + 1):
        for j in range(1, n + 1):
            for i in range(k - 1, j):
                c = best[k - 1][i] + (j - i) * vals[j - 1]
                if c < best[k][j]:
                    best[k][j], cut[k][j] = c, i
    k = min(range(1, max_groups + 1), key=lambda k: best[k][n] + (k - 1) * penalty)
    if k == 1:
        return [list(range(n))]
    bounds, j = [], n
    for kk in range(k, 0, -1):
        bounds.append((cut[kk][j], j))
        j = cut[kk][j]
    return [sorted(order[i:j]) for i, j in reversed(bounds)]


def _assemble_groups(parts: list[tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]], groups: list[list[int]],
                     inverse: list[int], room: int) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Groups prefilled apart (`parts`: per group its cache, (U_g, V) logits, (U_g, 1) next
    positions, (U_g, w_g) host mask of real positions) as one growing cache of one row per
    prompt (`inverse`: prompt -> unique row), each row right-aligned to the widest group's
    width W, zeros before it, `room` spare positions after: (cache, (B, V) logits, (B, 1)
    next positions, (B, W) host mask)."""
    from transformers import DynamicCache

    where = {u: (g, r) for g, rows in enumerate(groups) for r, u in enumerate(rows)}
    B, W = len(inverse), max(mask.shape[1] for *_, mask in parts)
    dst = [[b for b in range(B) if where[inverse[b]][0] == g] for g in range(len(groups))]  # batch rows of group g
    src = [[where[inverse[b]][1] for b in rows] for rows in dst]  # their rows in the group's cache
    part_blocks = []
    for cache, *_ in parts:
        if not all(_is_growing(layer) for layer in cache.layers):
            cache.layers = _grow_layers(cache.layers, 0)
        part_blocks.append(_blocks(cache))
    device = parts[0][1].device
    layers = []
    for bi, ref in enumerate(part_blocks[0]):
        Lb, two, _, KV, _, D = ref.buf.shape
        buf = _kv_buffer((Lb, two, B, KV, W + room, D), ref.buf.dtype, device)  # (L, 2, B, KV, cap, D)
        for g, blocks in enumerate(part_blocks):
            if not dst[g]:
                continue
            w = parts[g][3].shape[1]
            d, s = torch.tensor(dst[g]).to(device), torch.tensor(src[g]).to(device)
            buf[:, :, :, :, : W - w].index_fill_(2, d, 0)  # padding: masked, but 0 * garbage could be NaN
            buf[:, :, :, :, W - w : W].index_copy_(2, d, blocks[bi].buf[:, :, :, :, :w].index_select(2, s))
        block = _KVBlock(buf, Lb)
        layers += [_new_growing(block, li, W) for li in range(Lb)]
    cache = DynamicCache()
    cache.layers = layers
    offsets = [0]
    for g in groups:
        offsets.append(offsets[-1] + len(g))
    pick = torch.tensor([offsets[where[u][0]] + where[u][1] for u in inverse])  # (B,) row in the stacked parts
    pick_dev = pick.to(device)
    logits = torch.cat([p[1] for p in parts])[pick_dev]  # (B, V)
    next_pos = torch.cat([p[2] for p in parts])[pick_dev]  # (B, 1)
    mask = torch.zeros((B, W), dtype=torch.long)  # (B, W)
    for g, (*_, part_mask) in enumerate(parts):
        if dst[g]:
            mask[torch.tensor(dst[g]), W - part_mask.shape[1]:] = part_mask[torch.tensor(src[g])]
    return cache, logits, next_pos, mask


#: Rows of one chunk on a CPU, and the bounds of the accelerator rule (`chunk_rows`).
CPU_CHUNK_ROWS, MIN_CHUNK_ROWS, MAX_CHUNK_ROWS = 64, 64, 1024


def kv_bytes_per_token(model: Any) -> int:
    """Bytes of keys and values one token keeps over all layers in the model's dtype."""
    config = model.config
    heads = getattr(config, "num_attention_heads", 1)
    kv = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    element = next(model.parameters()).element_size()
    return 2 * config.num_hidden_layers * kv * head_dim * element


def chunk_rows(model: Any, device: torch.device, longest: int, max_tokens: int) -> int:
    """Rows the hf engine samples together when `inference.max_batch_size` is None: 64 on a
    CPU; on CUDA as many as the KV of `longest` prompt tokens plus `max_tokens` per row fits
    in a quarter of the free device memory, within [64, 1024]; 256 on other accelerators."""
    if device.type == "cpu":
        return CPU_CHUNK_ROWS
    if device.type != "cuda":
        return 256
    free, _ = torch.cuda.mem_get_info(device)
    rows = free // 4 // max(kv_bytes_per_token(model) * (longest + max_tokens), 1)
    return int(min(max(rows, MIN_CHUNK_ROWS), MAX_CHUNK_ROWS))
