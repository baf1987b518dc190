"""Pack a padded micro-batch into one sequence for the training forward.

A GRPO micro-batch is a few rows that share a prompt and end at different lengths.
Run as a padded (b, T) batch, the prompt is computed b times and the padding after
short rows is computed too. Packed, the shared prompt appears once, then every row's
own tokens follow without padding:

    [ prompt | row 0 rest | row 1 rest | ... ]      (1, N) with N = P + sum(n_i - P)

A 4D attention mask keeps the rows apart: a token sees the prompt and the earlier
tokens of its own row, never another row, and position ids restart at P for every
row, so each row gets exactly the logits it would get alone (to float rounding).

`plan_packing` returns None when packing does not pay (see `_packed_is_cheaper`: the
packed attention is quadratic in N) or cannot be used (left padding, attention
implementations that ignore custom masks); the caller then runs the padded batch.
"""
from __future__ import annotations

from dataclasses import dataclass

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


def _packed_is_cheaper(n_packed: int, b: int, T: int, n_params: int, hidden: int, layers: int) -> bool:
    """FLOP estimate (forward) of packed vs padded: linear layers cost ~2 x params per
    token; attention ~4 x hidden x layers per (query, key) pair, all N^2 pairs when
    packed (a custom mask cannot skip blocks) against b T^2 / 2 causal pairs padded."""
    per_pair = 4 * hidden * layers
    packed = 2 * n_params * n_packed + per_pair * n_packed ** 2
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
    N = P + sum(max(n - P, 0) for n in lengths)
    if config is not None and n_params:
        hidden = int(getattr(config, "hidden_size", 0) or 0)
        layers = int(getattr(config, "num_hidden_layers", 0) or 0)
        if hidden and layers and not _packed_is_cheaper(N, b, T, n_params, hidden, layers):
            return None
    device = input_ids.device
    ids, pos, seg, offsets = [input_ids[0, :P]], [torch.arange(P, device=device)], [torch.full((P,), -1)], []
    start = P
    for i, n in enumerate(lengths):
        m = max(n - P, 0)
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
                       source=source, rows=rows, cols=cols, targets=input_ids[rows, cols], shared=P)
