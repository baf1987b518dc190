"""The token masks constrained turns were sampled under, for the trainer's logprobs.

A turn sampled under a constraint (`Turn.constraint`: JSON, regex, choice, tool calls;
`workbench.engines.constraints`) recorded the logprobs of the *masked* distribution q: the
logits with the grammar's disallowed ids at -inf, at temperature 1 (what sampled it; vLLM's
raw logprobs under structured outputs are the same). The update's ratio q_new/q_old, its KL
to the reference and the `rollout_is` weights must compare that distribution with itself,
so the trainer computes its logprobs of those tokens under the same masks:

    allowed = allowed_tokens(batch, tokenizer, vocab_size)     # None: no constrained turn
    forward_logprobs(model, ids, attn, loss_mask=mask, allowed=allowed.select(rows, T))

`allowed_tokens` replays each constrained turn's grammar over its sampled ids (the compiled
grammar and stop ids the engine used), so position t of a constrained turn knows the ids
that were allowed when token t was sampled; `mask_logits` puts every other id's logit at the
lowest float before the log-softmax (entropy is then of the masked distribution too). A
token the replayed grammar refuses (the turn's ids do not follow its constraint: edited by
hand, or a tokenizer other than the engine's) ends the masking of that turn there, and the
episode gets a warning saying so.

Masks are kept packed (int32 words, 32 ids each) and deduplicated: the positions of a JSON
string share one mask, so a batch holds a few dozen distinct ones, not one per token.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.engines.constraints import Constraint, grammars_for, replay, unpack
from workbench.rollout.chat import stop_token_ids
from workbench.trajectory import TrajectoryBatch


@dataclass
class AllowedTokens:
    """Which ids were allowed at each constrained position of a batch."""

    index: torch.Tensor
    """(B, T) long: the row of `masks` that held when token t was sampled; -1 where free."""
    masks: torch.Tensor
    """(M, W) int32: distinct packed masks (bit i of word w allows id 32w + i)."""
    vocab_size: int
    """V, the logits' width."""

    def select(self, rows: list[int], T: int) -> "AllowedTokens | None":
        """The masks of batch rows `rows`, first `T` positions; None when none is constrained."""
        index = self.index[rows, :T]  # (b, T)
        if not bool((index >= 0).any()):
            return None
        return AllowedTokens(index, self.masks, self.vocab_size)


def model_vocab_size(model: Any) -> int:
    """The width of `model`'s logits (its output embedding rows, else config.vocab_size)."""
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    weight = getattr(head, "weight", None)
    if weight is not None and weight.dim() == 2 and type(weight) is torch.nn.Parameter:
        return int(weight.shape[0])
    return int(model.config.vocab_size)


def has_constraints(batch: TrajectoryBatch) -> bool:
    """Whether a model turn of the batch was sampled under a constraint."""
    return any(t.constraint for ep in batch for t in ep.turns if t.source == "model")


def allowed_tokens(batch: TrajectoryBatch, tokenizer: Any, vocab_size: int) -> AllowedTokens | None:
    """The batch's constrained positions and their masks (None when no turn was constrained);
    computed once per batch object and vocabulary size."""
    cached = batch.__dict__.get("_allowed_tokens")
    if cached is not None and cached[0] == vocab_size:
        return cached[1]
    out = _build(batch, tokenizer, vocab_size) if has_constraints(batch) else None
    batch.__dict__["_allowed_tokens"] = (vocab_size, out)
    return out


def _build(batch: TrajectoryBatch, tokenizer: Any, vocab_size: int) -> AllowedTokens:
    grammars = grammars_for(tokenizer, vocab_size)
    default_stops = stop_token_ids(tokenizer)
    B, T = batch.input_ids.shape
    index = torch.full((B, T), -1, dtype=torch.long)  # (B, T)
    rows: dict[bytes, int] = {}
    table: list[torch.Tensor] = []
    for b, ep in enumerate(batch):
        for turn in ep.turns:
            if not turn.constraint or turn.source != "model" or turn.token_end <= turn.token_start:
                continue
            spec = dict(turn.constraint)
            stops = spec.pop("stop_token_ids", None)
            constraint = Constraint.from_dict(spec)
            ids = ep.token_ids[turn.token_start:turn.token_end]
            packed, refused = replay(grammars, constraint, ids, default_stops if stops is None else stops)
            if refused is not None:
                ep.warnings.append(f"constraint: turn {turn.index}'s token {refused} ({ids[refused]}) does not "
                                   f"follow its {constraint.kind} constraint; its logprobs from there on are of "
                                   "the unmasked distribution, unlike the engine's")
            for i in range(packed.shape[0]):
                key = packed[i].numpy().tobytes()
                if key not in rows:
                    rows[key] = len(table)
                    table.append(packed[i])
                index[b, turn.token_start + i] = rows[key]
    masks = torch.stack(table) if table else torch.zeros((0, grammars.words), dtype=torch.int32)  # (M, W)
    return AllowedTokens(index, masks, vocab_size)


def mask_logits(logits: torch.Tensor, index: torch.Tensor, masks: torch.Tensor) -> torch.Tensor:
    """`logits` (..., V) float with the disallowed ids of each constrained position (`index`
    (...) >= 0, a row of `masks` (M, W)) at the lowest float: a new tensor, gradients flow
    to the allowed ids. A finite floor, not -inf, so that p log p stays 0 for them."""
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)  # (N, V)
    where = index.reshape(-1).to(flat.device)  # (N,)
    rows = (where >= 0).nonzero().squeeze(-1)  # (n,)
    if rows.numel() == 0:
        return logits
    allowed = unpack(masks.to(flat.device)[where[rows]], V)  # (n, V)
    picked = flat.index_select(0, rows).masked_fill(~allowed, torch.finfo(flat.dtype).min)  # (n, V)
    return flat.index_copy(0, rows, picked).reshape(logits.shape)


__all__ = ["AllowedTokens", "allowed_tokens", "has_constraints", "mask_logits", "model_vocab_size"]
