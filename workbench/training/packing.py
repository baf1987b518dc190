"""Pack a padded micro-batch into one sequence for the training forward.

A GRPO micro-batch is a few rows that share a prompt and end at different lengths.
Run as a padded (b, T) batch, the prompt is computed b times and the padding after
short rows is computed too. Packed, the shared prompt appears once, then every row's
own tokens follow without padding:

    [ prompt | row 0 rest | row 1 rest | ... ]      (1, N) with N = P + sum(n_i - P)

A 4D attention mask keeps the rows apart: a token sees the prompt and the earlier
tokens of its own row, never another row, and position ids restart at P for every
row, so each row gets exactly the logits it would get alone (to float rounding).

Episodes that hold several token sequences (`Episode.segments`, "rendered" history) are not
packed: `sequence_attention` builds their (b, 1, T, T) mask from the collated `position_ids`,
each token seeing only its own sequence (the shared prefix of the one before, then its own
tokens), and the model runs them with those position ids.

`plan_packing` returns None when packing does not pay (see `_packed_is_cheaper`) or
cannot be used (left padding, attention implementations that ignore custom masks); the
caller then runs the padded batch.

Attention (`packed_attention`): an (N, N) mask leaves most pairs masked (row i never
sees row j), and torch's CPU attention kernels compute every pair of a custom mask. With
transformers' "sdpa" attention the packed forward instead runs, per layer, the prompt's
causal attention once and every row's own queries over [prompt keys | its own keys]:
one call per row up to `PER_ROW_MAX_ROWS` rows (sum of m_i x (P + m_i) pairs), else one
padded (rows, heads, L, P + L) batch (rows x L x (P + L) pairs), instead of N^2 (a GRPO
group of 8 x 64 tokens behind a 100-token prompt: ~3x fewer even padded). Measured on
SmolLM2 on this CPU: 0.62 s of a 2.9 s fp32 update was attention over the (N, N) mask.
"""
from __future__ import annotations

import contextvars
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any, Iterator

import torch

# Attention implementations that apply a custom 4D additive mask as given.
MASKED_ATTENTION = ("sdpa", "eager", "workbench_sdpa_gqa")


@dataclass
class PackedBatch:
    input_ids: torch.Tensor  # (1, N)
    position_ids: torch.Tensor  # (1, N)
    allowed: torch.Tensor  # (1, 1, N, N) bool: query (row) may attend to key (column)
    source: torch.Tensor  # (K,) packed position whose logits predict each trained token
    rows: torch.Tensor  # (K,) row of each trained token in the padded batch
    cols: torch.Tensor  # (K,) column (position) of each trained token in the padded batch
    targets: torch.Tensor  # (K,) token id of each trained token
    shared: int  # P, tokens of the prompt shared by every row (computed once)
    row_tokens: list[int] = field(default_factory=list)  # each row's own tokens after the prompt (m_i)

    def attention_mask(self, config: object | None, dtype: torch.dtype) -> torch.Tensor:
        """The mask as the model's attention wants it: bool for sdpa, additive for eager."""
        if getattr(config, "_attn_implementation", "sdpa") == "eager":
            return torch.zeros(self.allowed.shape, dtype=dtype, device=self.allowed.device).masked_fill_(
                ~self.allowed, torch.finfo(dtype).min)
        return self.allowed


def row_lengths(attention_mask: torch.Tensor) -> list[int] | None:
    """Lengths of right-padded rows; None if some row is not of the form 1...1 0...0."""
    n = attention_mask.sum(1)  # (b,)
    T = attention_mask.shape[1]
    expected = (torch.arange(T, device=attention_mask.device)[None, :] < n[:, None]).to(attention_mask.dtype)
    if not torch.equal(attention_mask, expected):
        return None
    return [int(v) for v in n.tolist()]


def _packed_is_cheaper(n_packed: int, b: int, T: int, n_params: int, hidden: int, layers: int,
                       pairs: int | None = None) -> bool:
    """FLOP estimate (forward) of packed vs padded: linear layers cost ~2 x params per
    token; attention ~4 x hidden x layers per (query, key) pair: `pairs` when packed
    (default all N^2: a custom mask cannot skip blocks) against b T^2 / 2 causal pairs padded."""
    per_pair = 4 * hidden * layers
    packed = 2 * n_params * n_packed + per_pair * (n_packed ** 2 if pairs is None else pairs)
    padded = 2 * n_params * b * T + per_pair * b * T * T / 2
    return packed < padded


def plan_packing(input_ids: torch.Tensor, attention_mask: torch.Tensor, loss_mask: torch.Tensor,
                 shared: int, config: object | None = None, n_params: int | None = None) -> PackedBatch | None:
    """The packed layout of a right-padded (b, T) micro-batch, or None (see the module doc).

    `shared` (P) prompt tokens are identical in every row and no trained token needs logits
    from positions < P (`shared_prefix_length`). Trained tokens are those with `loss_mask`
    1 at t >= 1; their logits come from position t - 1 of their row.
    """
    if config is not None and getattr(config, "_attn_implementation", "sdpa") not in MASKED_ATTENTION:
        return None
    lengths = row_lengths(attention_mask)
    if lengths is None:
        return None
    b, T = input_ids.shape
    P = shared
    own = [max(n - P, 0) for n in lengths]  # each row's tokens after the shared prompt
    N = P + sum(own)
    if config is not None and n_params:
        hidden = int(getattr(config, "hidden_size", 0) or 0)
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        L = max(own)
        rows = [m for m in own if m]
        pairs = P * P + (sum(m * (P + m) for m in rows) if len(rows) <= PER_ROW_MAX_ROWS
                         else len(rows) * L * (P + L))  # segmented attention (module docstring)
        if hidden and layers and not _packed_is_cheaper(N, b, T, n_params, hidden, layers, pairs):
            return None
    device = input_ids.device
    ids, pos, seg, offsets = [input_ids[0, :P]], [torch.arange(P, device=device)], [torch.full((P,), -1)], []
    start = P
    for i, m in enumerate(own):
        offsets.append(start - P)  # packed index of (row i, position s >= P) = s + offset
        ids.append(input_ids[i, P:P + m])
        pos.append(torch.arange(P, P + m, device=device))
        seg.append(torch.full((m,), i))
        start += m
    packed_ids = torch.cat(ids)[None]  # (1, N)
    position_ids = torch.cat(pos)[None]  # (1, N)
    seg_t = torch.cat(seg).to(device)  # (N,) -1 = shared prompt, i = row i
    idx = torch.arange(N, device=device)
    allowed = (idx[None, :] <= idx[:, None]) & ((seg_t[None, :] == -1) | (seg_t[None, :] == seg_t[:, None]))  # (N, N)
    trained = loss_mask.bool() & attention_mask.bool()  # (b, T)
    trained[:, 0] = False
    rows, cols = trained.nonzero(as_tuple=True)  # (K,), (K,) row-major
    if rows.numel() and int((cols - 1).min()) < P:
        raise ValueError(f"a trained token needs logits from inside the shared prefix (P={P}); "
                         "pass shared=shared_prefix_length(...)")
    off = torch.tensor(offsets, dtype=torch.long, device=device)
    source = (cols - 1) + off[rows]  # (K,)
    order = torch.argsort(source)  # logits_to_keep wants increasing positions
    rows, cols, source = rows[order], cols[order], source[order]
    return PackedBatch(input_ids=packed_ids, position_ids=position_ids, allowed=allowed[None, None],
                       source=source, rows=rows, cols=cols, targets=input_ids[rows, cols], shared=P,
                       row_tokens=own)


def sequence_attention(position_ids: torch.Tensor, attention_mask: torch.Tensor, config: object | None,
                       dtype: torch.dtype) -> torch.Tensor:
    """(b, 1, T, T) mask of rows that hold several sequences, from their position ids (b, T).

    Where a token's position is not its predecessor's + 1, a new sequence starts: it follows
    the first `position` tokens of the sequence before (`Episode.segments`), so its tokens
    see those and the earlier tokens of their own sequence, nothing else. A row whose
    positions are 0, 1, 2, ... gets the plain causal mask. Padding sees only itself.
    bool for sdpa, additive (0 / dtype min) for eager attention.
    """
    b, T = position_ids.shape
    allowed = torch.zeros(b, T, T, dtype=torch.bool)  # (b, T, T)
    lengths = attention_mask.sum(1).tolist()
    for r in range(b):
        n = int(lengths[r])
        pos = position_ids[r, :n].tolist()
        starts = [0] + [i for i in range(1, n) if pos[i] != pos[i - 1] + 1]
        chain: list[int] = []  # flat positions of the sequence before
        for s, a in enumerate(starts):
            e = starts[s + 1] if s + 1 < len(starts) else n
            prefix = chain[:pos[a]]
            if len(prefix) != pos[a]:
                raise ValueError(f"row {r}: the sequence starting at {a} follows {pos[a]} tokens of the one before, "
                                 f"which has {len(chain)}")
            if prefix:
                allowed[r, a:e, prefix] = True
            allowed[r, a:e, a:e] = torch.ones(e - a, e - a, dtype=torch.bool).tril()
            chain = prefix + list(range(a, e))
        idx = torch.arange(n, T)
        allowed[r, idx, idx] = True  # padding: itself only (no empty softmax row)
    allowed = allowed[:, None].to(position_ids.device)  # (b, 1, T, T)
    if getattr(config, "_attn_implementation", "sdpa") == "eager":
        return torch.zeros(allowed.shape, dtype=dtype, device=allowed.device).masked_fill_(
            ~allowed, torch.finfo(dtype).min)
    return allowed


# -- segmented attention over a packed sequence ------------------------------------------
_PACKED = "workbench_packed"
#: The plan of the packed forward running now, with its `_Segments` per device (made on first use).
_current_plan: contextvars.ContextVar[tuple[PackedBatch, dict[torch.device, "_Segments"]] | None] = (
    contextvars.ContextVar("packed_plan", default=None))


#: Up to this many rows, each row's attention runs as its own call over [prompt | own
#: keys] (no padding, no index ops: the q/k/v are split, not gathered); above it the
#: rows run as one padded batch. Measured per SmolLM2 layer, forward + backward, 8 rows
#: of 20-81 tokens behind a 73-token prompt: 4.6 ms per row vs 9.9 ms padded.
PER_ROW_MAX_ROWS = 16


class _Segments:
    """A plan's rows for the attention: their lengths and masks (one call per row), or
    which packed positions each padded row slot reads (one padded call)."""

    def __init__(self, plan: PackedBatch, device: torch.device):
        P, own = plan.shared, [m for m in plan.row_tokens if m]
        self.P, self.R, self.L = P, len(own), max(own, default=0)
        self.own = own  # (R,) tokens of each row after the prompt, in packed order
        self.per_row = self.R <= PER_ROW_MAX_ROWS
        if self.per_row:
            # (m, P + m) per row: every prompt key, then its own keys up to the query's position
            self.row_masks = [torch.cat([torch.ones(m, P, dtype=torch.bool), torch.ones(m, m, dtype=torch.bool).tril()],
                                        dim=-1).to(device) for m in own]
            return
        starts = torch.tensor([0, *own[:-1]]).cumsum(0) + P  # (R,) packed start of each row's own tokens
        slot = torch.arange(self.L)  # (L,)
        valid = slot[None, :] < torch.tensor(own)[:, None]  # (R, L)
        # (R * L,) packed index each padded slot reads (padding slots read the prompt's last token)
        self.gather = torch.where(valid, starts[:, None] + slot[None, :], P).flatten().to(device)
        self.keep = valid.flatten().nonzero().squeeze(-1).to(device)  # (N - P,) slots holding real tokens
        causal = slot[None, :] <= slot[:, None]  # (L, L) own keys: earlier or same position
        own_keys = causal[None] & valid[:, None, :]  # (R, L, L)
        prefix = torch.ones(self.R, self.L, P, dtype=torch.bool)
        self.mask = torch.cat([prefix, own_keys], dim=-1)[:, None].to(device)  # (R, 1, L, P + L)


def _segmented(query: torch.Tensor, key: torch.Tensor, value: torch.Tensor, seg: _Segments,
               scaling: float | None) -> torch.Tensor:
    """query (1, H, N, D), key/value (1, KV, N, D) -> (1, H, N, D): the packed mask's
    attention computed as prompt + rows (module docstring)."""
    F = torch.nn.functional
    gqa = query.shape[1] != key.shape[1]
    P = seg.P
    head = F.scaled_dot_product_attention(query[:, :, :P], key[:, :, :P], value[:, :, :P], is_causal=True,
                                          scale=scaling, enable_gqa=gqa)  # (1, H, P, D)
    if seg.R == 0:
        return head
    if seg.per_row:
        sizes = [P, *seg.own]
        qs, ks, vs = (torch.split(x, sizes, dim=2) for x in (query, key, value))  # views; backward: one cat
        outs = [head]
        for r, mask in enumerate(seg.row_masks):
            k = torch.cat([ks[0], ks[r + 1]], dim=2)  # (1, KV, P + m, D)
            v = torch.cat([vs[0], vs[r + 1]], dim=2)
            outs.append(F.scaled_dot_product_attention(qs[r + 1], k, v, attn_mask=mask, scale=scaling,
                                                       enable_gqa=gqa))  # (1, H, m, D)
        return torch.cat(outs, dim=2)  # (1, H, N, D)

    def rows(x: torch.Tensor) -> torch.Tensor:  # (1, h, N, D) -> (R, h, L, D)
        # index_select, not x[0][:, gather]: its backward is an index_add, where advanced
        # indexing's is an accumulating index_put (measured on this CPU: 2x slower fwd + bwd)
        h, D = x.shape[1], x.shape[3]
        return x[0].index_select(1, seg.gather).view(h, seg.R, seg.L, D).transpose(0, 1)

    k = torch.cat([key[:, :, :P].expand(seg.R, -1, -1, -1), rows(key)], dim=2)  # (R, KV, P + L, D)
    v = torch.cat([value[:, :, :P].expand(seg.R, -1, -1, -1), rows(value)], dim=2)
    out = F.scaled_dot_product_attention(rows(query), k, v, attn_mask=seg.mask, scale=scaling,
                                         enable_gqa=gqa)  # (R, H, L, D)
    H, D = out.shape[1], out.shape[3]
    tail = out.transpose(0, 1).reshape(H, seg.R * seg.L, D).index_select(1, seg.keep)  # (H, N - P, D), packed order
    return torch.cat([head, tail[None]], dim=2)  # (1, H, N, D)


def _packed_forward(module: Any, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                    attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                    **kwargs: Any) -> tuple[torch.Tensor, None]:
    """transformers attention function: segmented when the query is the active plan's
    packed sequence, else the engine's sdpa (with grouped KV heads)."""
    state = _current_plan.get()
    n = query.shape[2]
    if state is None or dropout or query.shape[0] != 1 or n != state[0].input_ids.shape[1] or n != key.shape[2]:
        from workbench.engines.model_hooks import _sdpa_gqa_forward

        return _sdpa_gqa_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                 **kwargs)
    plan, segs = state
    if segs.get(query.device) is None:
        segs[query.device] = _Segments(plan, query.device)
    if query.device.type == "cpu" and query.dtype in (torch.bfloat16, torch.float16):
        # torch's CPU flash kernels are slower in 16-bit than in fp32 here (fwd+bwd per
        # SmolLM2 layer: 13.3 vs 10.9 ms), and fp32 is what the engine's decode step uses.
        out = _segmented(query.float(), key.float(), value.float(), segs[query.device], scaling).to(query.dtype)
    else:
        out = _segmented(query, key, value, segs[query.device], scaling)  # (1, H, N, D)
    return out.transpose(1, 2).contiguous(), None


@contextmanager
def packed_attention(model: Any, plan: PackedBatch) -> Iterator[None]:
    """Run `model` (on transformers' "sdpa" attention) with segmented attention over
    `plan`'s packed sequence while inside; other attention implementations run as they are."""
    from workbench.engines.model_hooks import register_attention, sdpa_replaced

    register_attention(_PACKED, _packed_forward)
    token = _current_plan.set((plan, {}))
    try:
        with sdpa_replaced(model, _PACKED):
            yield
    finally:
        _current_plan.reset(token)
