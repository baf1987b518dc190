"""One hf decode chunk's state (`HFEngine._decode_chunk`): what each row sampled, when it
stopped, its logprobs, and the rows' grammar matchers when the call is constrained.

Per step the host reads back the sampled ids and the stop-id flags once (one (2, B')
copy); the sampling logprobs gather in a (T, B) device tensor read once when the turn
ends. Rows are tracked with host tensors (no Python loop over rows per step, except to
decode the tails of live rows when stop strings are set, and to step the grammar
matchers of constrained rows: both need host values the step already read). A
constraint's mask goes up without waiting and is applied on the device before the step
samples (`constraints.DecodeMasks`), so the recorded logprob of a constrained row is of
the masked distribution (`workbench.engines.constraints`).
"""
from __future__ import annotations

from typing import Any

import torch

from workbench.engines.base import GenerationResult, SamplingParams
from workbench.engines.constraints import Constraint, DecodeMasks, grammars_for
from workbench.engines.kv_cache import _row_kv, _tail_fill
from workbench.engines.sampling import sample_with_logprobs

#: On an accelerator, finished rows leave the batch (one copy of every layer's cache) once
#: they are at least this fraction of its rows; until then they decode along, their ids
#: unused (a launch-bound step costs about the same with them). On the CPU each row costs
#: compute, so rows leave as soon as they finish (measured: 0.25 was ~10% slower there).
_COMPACT_FRACTION = 0.25


class _DecodeState:
    """One chunk's decoding state, on the host except the logprobs (see the module docstring)."""

    def __init__(self, engine: Any, prompts: list[list[int]], params: SamplingParams,
                 gen: torch.Generator | list[torch.Generator], attn_host: torch.Tensor, device: torch.device,
                 cached: list[int], rows: torch.Tensor | None = None,
                 constraints: list[Constraint | None] | None = None, vocab_size: int = 0):
        """`constraints`: each chunk row's grammar (None: free), or None for none at all;
        `vocab_size`: the logits' width (the grammars' bitmask covers it)."""
        B, T = len(prompts), params.max_tokens
        self.cached = cached  # (B,) prompt tokens each row reused from the prefix cache
        self.engine, self.prompts, self.params, self.gen, self.device = engine, prompts, params, gen, device
        self.stop = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long).to(device)  # (K,)
        self.stop_strings = engine.stop_strings(params)  # checked on the host after every sampled token
        self.attn_host = attn_host  # (B', C + S) prefill positions of each batch row: 1 = real
        self.prefill_len = attn_host.shape[1]
        self.rows = torch.arange(B) if rows is None else rows  # (B',) the chunk row each batch row holds
        self.rows_dev = self.rows.to(device, non_blocking=True)  # (B',)
        self.live = torch.ones(B, dtype=torch.bool)  # (B',) still decoding (finished rows stay until compacted)
        self.ids = torch.full((B, T), engine.pad_id, dtype=torch.long)  # (B, T) sampled ids
        self.length = torch.full((B,), T, dtype=torch.long)  # (B,) ids each row keeps
        self.stopped = torch.zeros(B, dtype=torch.bool)  # (B,) finish reason "stop"
        self.logprobs = torch.zeros((T, B), dtype=torch.float32, device=device)  # (T, B) read when the turn ends
        # One generator per row: each row's uniforms for the whole turn, drawn now (a
        # generator's n draws at once equal its n single draws, so rows keep their streams).
        self.uniforms = None
        if isinstance(gen, list) and params.temperature != 0:
            self.uniforms = torch.stack([torch.rand(T, generator=g, dtype=torch.float64) for g in gen])  # (B, T)
        self._scratch: torch.Tensor | None = None  # (B, V) fp32 scratch of the draw (sampling.sample_with_logprobs)
        self.masks = None  # the constrained rows' grammar matchers (constraints.py)
        if constraints is not None and any(c is not None for c in constraints):
            self.masks = DecodeMasks(grammars_for(engine.tokenizer, vocab_size), constraints,
                                     list(params.stop_token_ids), device)

    def step(self, step: int, logits: torch.Tensor, cache: Any) -> torch.Tensor:
        """Sample from (B', V) logits, record ids and logprobs, mark rows that finished."""
        params, live = self.params, self.live
        if self.masks is not None:  # disallowed ids of constrained rows -> -inf (an upload, no read)
            self.masks.apply(logits, self.rows, live)
        u = None
        if params.temperature != 0:
            if self.uniforms is not None:
                u_host = self.uniforms[self.rows, step]  # (B',)
            else:  # one shared generator: live rows draw in chunk-row order (whatever their batch order)
                draw = live.nonzero().flatten()  # (B'',)
                draw = draw[torch.argsort(self.rows[draw])]
                u_host = torch.zeros(len(live), dtype=torch.float64)
                u_host[draw] = torch.rand(len(draw), generator=self.gen, dtype=torch.float64)
            u = u_host.to(self.device, non_blocking=True)
        scratch = self._scratch
        if scratch is None or scratch.shape[0] < logits.shape[0] or scratch.shape[1:] != logits.shape[1:]:
            self._scratch = torch.empty_like(logits)  # (B', V) the draw's weights, reused every step
        # the ids and their logprobs under the distribution sampled from (masked or raw)
        tokens, token_logprobs = sample_with_logprobs(logits, params, u, self._scratch)  # (B',) each
        self.logprobs[step].index_copy_(0, self.rows_dev, token_logprobs)
        done = torch.isin(tokens, self.stop) if self.stop.numel() else torch.zeros_like(tokens, dtype=torch.bool)
        host = torch.stack([tokens, done.long()]).cpu()  # (2, B'): the step's one read
        self.ids[self.rows, step] = host[0]
        done = host[1].bool() & live  # (B',)
        if self.masks is not None:
            self.masks.accept(self.rows, host[0], live)
        if self.stop_strings is not None:
            for j in (live & ~done).nonzero().flatten().tolist():
                if self.stop_strings.completes(self.ids[self.rows[j], : step + 1].tolist()):
                    done[j] = True  # this token completed a stop string: the reply ends with it
        finished = self.rows[done]
        self.stopped[finished] = True
        self.length[finished] = step + 1
        live &= ~done
        return tokens

    def compact(self, cache: Any) -> tuple[torch.Tensor, list[int]] | None:
        """Drop finished rows once they are `compact_fraction` of the batch: the kept rows'
        index on the device and on the host (their KV stored in the prefix cache first), else None."""
        n = len(self.live)
        dead = n - int(self.live.sum())
        fraction = self.engine.compact_fraction
        if fraction is None:
            fraction = 0.0 if self.device.type == "cpu" else _COMPACT_FRACTION
        if dead == 0 or dead < fraction * n:
            return None
        self._store(cache, (~self.live).nonzero().flatten())
        if self.device.type == "cpu":  # holes filled from the tail: only those rows' KV moves
            keep = torch.tensor(_tail_fill(self.live.tolist()), dtype=torch.long)  # (B'',)
        else:
            keep = self.live.nonzero().flatten()  # (B'',)
        keep_dev = keep.to(self.device, non_blocking=True)
        self.rows, self.rows_dev, self.live = self.rows[keep], self.rows_dev[keep_dev], self.live[keep]
        self.attn_host = self.attn_host[keep]
        return keep_dev, keep.tolist()

    def _store(self, cache: Any, batch_rows: torch.Tensor) -> None:
        """Keep rows' KV (prompt + every sampled id but the last, not fed) in the prefix cache
        (not when the call said no later call extends them: `SamplingParams.keep_kv`)."""
        prefix = self.engine.prefix_cache
        if prefix is None or not self.params.keep_kv:
            return
        for j in batch_rows.tolist():
            r, n = int(self.rows[j]), int(self.length[self.rows[j]])
            where = torch.cat([self.attn_host[j].nonzero().flatten(),
                               torch.arange(self.prefill_len, self.prefill_len + n - 1)])  # (n_real,)
            kv = _row_kv(cache, j, where.to(self.device, non_blocking=True))
            prefix.store(tuple(self.prompts[r]) + tuple(self.ids[r, : n - 1].tolist()), kv, extends=self.cached[r])

    def finish(self, cache: Any) -> list[GenerationResult]:
        """The turn ended: keep the remaining rows' KV, read the logprobs once, build results."""
        self._store(cache, torch.arange(len(self.rows)))
        logprobs = self.logprobs.cpu()  # (T, B)
        self.engine._generated += int(self.length.sum())
        return [GenerationResult(token_ids=self.ids[b, :n].tolist(), logprobs=logprobs[:n, b].tolist(),
                                 finish_reason="stop" if self.stopped[b] else "length",  # type: ignore[arg-type]
                                 num_cached_tokens=self.cached[b])
                for b, n in enumerate(self.length.tolist())]
