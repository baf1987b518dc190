"""`hf` backend: batched sampling with a transformers model (the CPU default).

One call samples every prompt together: prompts are left-padded into one (B, T)
batch, prefilled once, then decoded token by token with the KV cache. Rows that
hit a stop id, or complete a stop string (`SamplingParams.stop`, the engine's `stop`
from `inference.stop`; see `base.StopStrings`: the ids are kept as sampled up to and
including the token that completes it), leave the batch (on the CPU at once, where every
row costs compute: each hole is filled in place by a live row from the batch's tail, one
copy per moved row for all layers together, so batch rows are no longer in prompt order;
on an accelerator once they are `compact_fraction` of the batch, the rows after them move
up), so short answers don't pay for long ones. The loop is ours rather than `model.generate` so that the
raw-model logprob of each sampled id comes out of the same forward that sampled it,
without storing (B, V) logits per step.

Written for GPUs, where every read of a device value by the host waits for the queued
kernels: a decode step reads the device once (the sampled ids with their stop-id flags,
one (2, B) copy; top-p adds whether the top candidates hold the nucleus), and uploads
only without waiting (`non_blocking=True`). Logprobs stay on the device until the turn
ends; rows are tracked with host tensors, not a Python loop (stop strings excepted:
they decode each live row's tail on the host). `tests/test_engine_host_reads.py` counts
this on the CPU. Sampling (`sampling.py`) draws its uniforms from CPU generators.

Constrained decoding: a call's `SamplingParams.constraint` (per request through `submit`,
so the rows of one batch may each have their own or none) masks each constrained row's
logits with its grammar before the step samples (`constraints.py`, `decode_state.py`): the
host fills the masks from ids it already read, uploads them without waiting, and the
recorded logprobs are of the masked distribution.

The engine holds a reference to the policy module, so after an optimizer step it
already samples from the new weights; `sync_weights(model)` just swaps the module.
A LoRA policy is sampled through a merged copy (`merged.py`) that re-merges itself
whenever the policy's weights changed.

Prefix cache (multi-turn): when a row finishes, its KV (prompt + sampled ids) is kept,
keyed by those ids (unless the call's `SamplingParams.keep_kv` says no later call
extends it: the Rollout's calls on every row's last possible turn). A later prompt that
extends a kept sequence -- the same episode's
next turn: its previous context, the sampled turn, the observation delta -- prefills
only the new tokens on top of the kept KV, instead of the whole conversation again.
Entries are LRU-bounded (`prefix_cache_mb`), a row's newer entry replaces the one it
extended (only that one: a group member whose reply happens to be a prefix of another's
keeps its entry), and the cache is dropped whenever the weights change (optimizer step,
`load_state_dict`, `sync_weights`, adapters switched off or on: checked with
`merged.weights_state_key`), so
a sample never sees KV from other weights. A call of more prompts than one chunk holds
groups them by the tokens each still has to prefill, so the ones the cache could not keep
(a full cache evicts the oldest entries) share chunks instead of making every chunk
prefill in full (measured, fp32 SmolLM2, 128 episodes x 4 turns with the cache full at the
last turn: that turn 90.8 -> 56.3 s). Inside a chunk, rows whose new-token counts differ a
lot prefill in groups, each padded to its own longest (`kv_cache._prefill_groups`), each
written straight into its rows of one cache for decoding (a padded prefill costs rows x
its longest row; `_prefill_into_one`). Only
models whose cache layers are plain full-attention `DynamicLayer`s use it
(sliding-window models fall back to full prefill).

Decoding appends each step's keys/values into preallocated room (`_GrowingLayerMixin`)
instead of `DynamicLayer`'s `torch.cat`, which copied every layer's whole cache per step.
All layers' keys and values live in one `kv_cache._KVBlock`; kept KV is placed into it with
room for the prefill's new tokens and the decode steps, so a later turn's cache is written
once (before: zeros, a copy, the prefill's `torch.cat`, a copy into room). The decode
step's attention reads the cache in its own dtype (bf16 as the model's sdpa does), so
nothing is widened or copied per turn or step.
For Llama-family models the decode steps (not the prefill) run `decode_step.DecodeStep`,
the same math as plain tensor code over the model's parameters (`fast_decode=False`: the
model's forward), in a mode timed over the first steps of each row bucket (live rows
rounded up to a power of two; `decode_threads.py`): all threads (only the products and
attention then run on them, the small ops on one), one, or one with the step's matmuls
split over a second thread (a compiled helper that spins while the step runs, where the
CPU kernels build). On a CPU every mode multiplies through copies of the weights packed
once for the CPU's kernels (`packed_decode`, from `inference.packed_decode`): oneDNN's for
bf16 (`onednn_weights.py`), MKL's for fp32 from 4 rows up (`packed_matmul.py`), packed
again only when a weight changed; and runs its attention, RMSNorms and SiLU through kernels
compiled for the machine (`cpu_kernels.py`, from `inference.cpu_kernels`), which also multiply
steps of few rows (and larger ones where timed faster) through a copy of the weights laid out
in panels of 16 outputs, in front of those packers (`skinny_weights.py`).

Grouped-query attention: during the engine's forwards a model using transformers'
"sdpa" attention runs `model_hooks._sdpa_gqa_forward` instead -- the same math, but torch's
`enable_gqa` rather than `repeat_kv` when a padding mask is present (transformers only
skips the copy without a mask, for CUDA kernels' sake). On CPU that copy of the whole
KV cache, per layer and step, cost more than the matmuls (SmolLM2: 20 ms vs 2.7 ms per
layer at 32 rows x 300 tokens).

Where a later turn's time goes (profiled 2026-11-26 on a 2-core Intel Xeon with
avx2/avx512f/avx512_bf16/amx_bf16, shared with other jobs (load 0.7-2.7), SmolLM2-135M,
2 threads, benchmarks/engines.py's episodes (guess_number, 8 per group, 32 tokens per
turn), 64 episodes x 4 turns, manual timers around the engine's parts; one chunk of 64
rows per turn). fp32, before these changes: turn 0 (context 86, one prompt per group)
8.2 s for 1538 tokens: decode steps 6.3 (attention 0.6), sampling 1.0, rows leaving 0.5,
prefill 0.2. Turn 1 (context 134) 15.5 s for 1401 tokens: decode steps 9.1 (attention
2.2), prefill 3.6 (two groups, 46 rows x 23 and 18 x 46 new tokens: 1886 padded for 1567
real), the groups' caches copied into one 0.5, kept KV placed 0.15, rows leaving 0.8
(every row after the first hole moved), sampling 1.0, prefix-cache lookups < 0.01.
After (rows leaving fill holes from the tail, groups written into one buffer, one timed
thread choice for all large prefills): turn 0 6.2 s (decode steps 4.9, sampling 0.9,
rows leaving 0.1); turn 1 11.4 s: decode steps 7.3 (attention 1.7), prefill 3.0, rows
leaving 0.06, kept KV placed 0.1; turn 3 (context 225) 11.4 s: decode steps 7.4
(attention 3.1), prefill 2.7. bf16, after: turn 0 4.1 s for 1662 tokens (decode steps
2.8, attention 0.5); turn 1 7.4 s (decode steps 4.8, attention 1.9, prefill 1.0, the cache
widened to fp32 0.2); turn 3 11.8 s (decode steps 7.9, attention 4.4, prefill 1.6,
widened 0.5, rows kept 0.9).
What is left is mostly arithmetic: a later turn prefills each row's observation (~24
tokens: more than the ~22 it generates) besides decoding its reply, while turn 0
prefilled one prompt per group; and each row's attention reads its own grown KV (at 64
rows x 230 positions, 0.7 GB in fp32 per decode step, memory-bound) where turn 0's rows
read their group's shared prompt once. In fp32 a later turn costs 1.8-2x turn 0's time
per generated token in this profile: the prefill ~0.5x, attention ~0.2-0.5x.
Later, with packed fp32 products, SDPA attention and the shared-prompt read off on the CPU
(torch.profiler, same episodes, 2026-11-26, load ~1, the machine slower than above that
day; two runs): fp32 turn 0 6.8-8.8 s, of which the packed decode products 2.5-2.9 s;
turn 2 (context 182) 10.9-11.2 s: packed products 2.6-2.7 s, attention (decode and
prefill) 2.1 s, the observation's prefill matmuls 1.6 s (at the matmul peak: ~1500 real
tokens for 64 rows). The prefill and the attention over the grown context are what a later turn adds;
reading a prompt all rows share once (the first turn's, or the system prompt's in later
turns, tried with the kept KV laid out from position 0) measured no faster on this CPU.
`benchmarks/floors.py` sums the matmul and attention kernels' self time per turn (same
machine and episodes, 128 x 4, 2026-11-26, load ~1): fp32 turn 0 11.4 s = matmuls 5.1 +
attention 1.4 + everything else 4.8; turn 3 (context 230) 18.1 s = 7.0 + 3.9 + 7.2. Were a
later turn's other work per token no more than turn 0's, its kernels alone would leave it at
1.29 / 1.33 / 1.41x turn 0's time per token (bf16: 1.27 / 1.37 / 1.40x): the observation's
prefill's products and the attention over the grown context are what stays. Counting all
its time as decode reads of the KV, torch's sdpa read the fp32 KV at ~9 GB/s in turn 3, about
40% of the ~24 GB/s stream bandwidth of 2 threads here: 1.3x needs an attention at full
bandwidth as well as a later turn's other work no more than turn 0's per token.

`submit(prompt, params)` (the request API of `AsyncRollout`) goes through a
`DynamicBatcher`: one worker thread runs a batched generate over whatever requests are
queued. There every request samples from its own generator seeded with its
`params.seed`, so a seeded request gets the same tokens whichever batch it lands in
(`generate_ids` keeps one generator per call, seeded with `params.seed`).
"""
from __future__ import annotations

import threading
import warnings
import weakref
from contextlib import contextmanager
from concurrent.futures import Future
from typing import Any

import torch

from workbench.engines import cpu_kernels
from workbench.engines.base import GenerationEngine, GenerationResult, SamplingParams
from workbench.engines.batching import DynamicBatcher
from workbench.engines.decode_state import _COMPACT_FRACTION, _DecodeState  # noqa: F401 (_COMPACT_FRACTION: tests)
from workbench.engines.decode_step import DecodeStep
from workbench.engines.decode_threads import (LARGE_PREFILL, SPLIT, DecodeModes, DecodeThreads, MatmulHelper,
                                              SpinHelper)
from workbench.engines.onednn_weights import OneDNNWeights, available as onednn_available
from workbench.engines.packed_matmul import Fp32Products, PackedWeights, available as packed_available
from workbench.engines.skinny_weights import MAX_WEIGHT_BYTES as SKINNY_MAX_BYTES, SkinnyWeights
from workbench.engines.kv_cache import (CPU_CHUNK_ROWS, chunk_rows, _build_cache, _GrowingLayer,  # noqa: F401
                                        _grow_layers, _is_growing, _plain_layers, _PrefixCache,
                                        _prefill_groups, _assemble_groups, _select_rows,
                                        _KVBlock, _kv_buffer, _new_growing)
from workbench.engines.merged import merged_copy, weights_state_key
from workbench.engines.model_hooks import dense_head_input, gqa_attention
from workbench.engines.decode_state import _DecodeState
from workbench.engines.graphed import GraphedDecode, usable as graph_usable
from workbench.engines.sampling import _multinomial, _sample  # noqa: F401 (_multinomial: tests)


class HFEngine(GenerationEngine):
    """Batched sampler over a Hugging Face causal LM (plain or peft-wrapped)."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int | None = None, prefix_cache: bool = True,
                 prefix_cache_mb: float = 2048.0, merge_lora: bool = True, compact_fraction: float | None = None,
                 fast_decode: bool = True, cuda_graphs: bool = False, packed_decode: bool = True,
                 cpu_kernels: bool = True):
        """`max_batch_size`: rows sampled together (a call with more runs in chunks); None:
        `kv_cache.chunk_rows` (64 on a CPU, by free memory on an accelerator).
        `compact_fraction`: finished rows leave the batch once they are this fraction of
        it (None: 0 on the CPU, `_COMPACT_FRACTION` on an accelerator). `fast_decode`:
        decode steps of Llama-family models run `decode_step.DecodeStep` instead of the
        model's forward (False: always the model's forward). `cuda_graphs`: on CUDA those
        steps replay a CUDA graph per chunk (`graphed.py`; False, the default until a GPU
        run has checked it: launched from Python). `packed_decode`: on a CPU those steps
        multiply through copies of the weights packed once for the CPU's kernels (bf16:
        oneDNN's, `onednn_weights.py`; fp32: MKL's, `packed_matmul.py`), made again only when
        a weight changed (False: plain products). `cpu_kernels`: on a CPU those steps' attention,
        RMSNorms and SiLU run the kernels `cpu_kernels.py` compiles for the machine, where they
        build (False, or no compiler: torch's ops)."""
        super().__init__(tokenizer)
        self.model = model
        self.merge_lora = merge_lora
        self.fast_decode = fast_decode
        self.cuda_graphs = cuda_graphs
        self.packed_decode = packed_decode
        self.cpu_kernels = cpu_kernels
        self._warned_kernels = False  # said once that the CPU kernels did not build
        self.graph_error: str | None = None  # why a decode step could not be recorded (graphs then stay off)
        self.decode_steps = {"fast": 0, "model": 0, "graphed": 0}  # decode steps by path ("graphed": of "fast")
        # A prompt every row of a call shares is read once by the decode step's attention
        # (True), or from each row (False); None: on accelerators only. On the CPU the one read
        # costs more ops than it saves bytes (SmolLM2, one decode step, 2-core Xeon avx512,
        # 2026-11-26: 8 rows 76 vs 71 ms in fp32, 68 vs 62 in bf16; 64 rows 168 vs 171 ms).
        self.share_prompt_reads: bool | None = None
        self._decode_step: DecodeStep | None = None  # the last one built: keeps its fused weight copies
        self.decode_threads: DecodeModes | None = None  # the decode mode per row bucket; made on the first call
        self._helper: MatmulHelper | None = None  # the second thread of split decode matmuls (decode_threads.py)
        # the decode steps' packed weights by dtype (`packed_decode`): OneDNNWeights (bf16), PackedWeights (fp32)
        self._packers: dict[torch.dtype | str, PackedWeights | OneDNNWeights] = {}  # "fp32 products": Fp32Products
        # prefill size (new tokens, a power of two; 0: over LARGE_PREFILL) -> its choice
        self._prefills: dict[int, DecodeThreads] = {}
        self._prefill_warmed = False  # the first prefill ran (untimed: it warms the model)
        self._plain_prefill = False  # a prefill gave plain full-attention cache layers (groups can meet)
        self.compact_fraction = compact_fraction
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
               "lora_merges": self._merged.merges if self._merged is not None else 0,
               "fast_decode_steps": self.decode_steps["fast"], "model_decode_steps": self.decode_steps["model"],
               "graphed_decode_steps": self.decode_steps["graphed"]}
        if self.prefix_cache is not None:
            out.update(self.prefix_cache.stats())
        if self.decode_threads is not None:
            out.update(self.decode_threads.stats())
        for packer in self._packers.values():
            out.update(packer.stats())
        for size, chooser in self._prefills.items():
            if chooser.chosen is not None:
                key = f"upto_{size}" if size else f"over_{LARGE_PREFILL}"
                out[f"prefill_threads_{key}_tokens"] = float(chooser.chosen)
        if self._batcher is not None:
            out.update({f"batcher_{k}": v for k, v in self._batcher.stats().items()})
        return out

    def prepare_constraint(self, constraint: Any) -> None:
        """Compile `constraint` into the grammar cache the decode loop reads (`grammars_for` of
        this tokenizer at the LM head's width), so the batch that samples under it does not
        compile it; ConstraintError when it cannot compile."""
        from workbench.engines.constraints import grammars_for

        head = self.model.get_output_embeddings()
        width = int(head.weight.shape[0]) if head is not None else int(self.model.config.vocab_size)
        grammars_for(self.tokenizer, width).compiled(constraint)

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        # A CPU generator on purpose, whatever the model's device: the uniforms `_sample`
        # inverts come from it, so one seed draws the same uniforms on any device.
        gen = torch.Generator(device="cpu")
        if params.seed is not None:
            gen.manual_seed(params.seed)
        else:
            gen.seed()
        if params.constraint is None:
            return self._generate(prompts, params, gen)
        return self._generate(prompts, params, gen, [params.constraint] * len(prompts))

    def submit(self, prompt: list[int], params: SamplingParams) -> "Future[GenerationResult]":
        """Queue one prompt for the dynamic batcher (see the module docstring)."""
        if self._batcher is None:
            with self._batcher_lock:
                if self._batcher is None:
                    rows = self.max_batch_size or CPU_CHUNK_ROWS
                    self._batcher = DynamicBatcher(self._run_batch, max_batch_size=4 * rows,
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
        constraints = [p.constraint for p in params_list]
        if all(c is None for c in constraints):
            return self._generate(prompts, params_list[0], gens)
        return self._generate(prompts, params_list[0], gens, constraints)

    def close(self) -> None:
        batcher, self._batcher = self._batcher, None
        if batcher is not None:
            batcher.close()
        helper, self._helper = self._helper, None
        if helper is not None:
            helper.close()
        for packer in self._packers.values():
            packer.clear()
        super().close()

    def _generate(self, prompts: list[list[int]], params: SamplingParams, gen: torch.Generator | list[torch.Generator],
                  constraints: list[Any] | None = None) -> list[GenerationResult]:
        """`constraints`: each prompt's grammar (`constraints.Constraint`, None: free), or None."""
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        key = weights_state_key(self.model)  # changes with the weights or the adapters' on/off state
        if key != self._weights_key:
            if self.prefix_cache is not None:  # new weights: kept KV is stale
                self.prefix_cache.clear()
            for packer in self._packers.values():  # packed copies are stale: buckets may be shared (packed_matmul.py)
                packer.weights_changed()
        self._weights_key = key
        model = self._merged.refresh(key) if self._merged is not None else self.model  # (merged copy: merged.py)
        # Chunks by the tokens each prompt has to prefill (its length less what the prefix
        # cache keeps), so prompts that missed the cache share chunks: a chunk prefills every
        # row to its longest new suffix. Inside a chunk, rows go by length as always (the
        # order rows draw from a shared generator); results come back in prompt order.
        rows = self.max_batch_size or chunk_rows(self.model, self.device, max(map(len, prompts)), params.max_tokens)
        if len(prompts) > rows and self.prefix_cache is not None:
            new = [len(p) - self.prefix_cache.cached_length(p) for p in prompts]
        else:
            new = [len(p) for p in prompts]
        order = sorted(range(len(prompts)), key=lambda i: (new[i], len(prompts[i])))
        by_index: dict[int, GenerationResult] = {}
        for start in range(0, len(order), rows):
            chunk = sorted(order[start : start + rows], key=lambda i: (len(prompts[i]), i))
            chunk_gen = [gen[i] for i in chunk] if isinstance(gen, list) else gen
            grammar = [constraints[i] for i in chunk] if constraints is not None else None
            for i, res in zip(chunk, self._generate_chunk(model, [prompts[i] for i in chunk], params, chunk_gen,
                                                          grammar)):
                by_index[i] = res
        return [by_index[i] for i in range(len(prompts))]

    @contextmanager
    def _prefill_threads(self, tokens: int):
        """Run one prefill of `tokens` new tokens on the thread count timed for its size
        (decode_threads.py); the engine's first prefill runs untimed (it warms the model)."""
        if not self._prefill_warmed:
            self._prefill_warmed = True
            yield
            return
        size = 1 << max(tokens - 1, 0).bit_length()  # tokens rounded up to a power of two
        large = size > LARGE_PREFILL  # one choice for all large prefills, timed per token
        chooser = self._prefills.setdefault(0 if large else size,
                                            DecodeThreads(self.device, trial_steps=1, warm_up=False))
        with chooser.stepping() as stepper, stepper.step(work=tokens if large else 1.0):
            yield

    @torch.no_grad()
    def _generate_chunk(self, model: Any, prompts: list[list[int]], params: SamplingParams,
                        gen: torch.Generator | list[torch.Generator],
                        constraints: list[Any] | None = None) -> list[GenerationResult]:
        """`gen`: one generator for the chunk, or one per row (rows keep theirs as others finish)."""
        with gqa_attention(model), dense_head_input(model):
            return self._decode_chunk(model, prompts, params, gen, constraints)

    def _prefill(self, model: Any, uprompts: list[list[int]], hits: list[tuple[int, Any]],
                 room: int, into: torch.Tensor | None = None) -> tuple[Any, torch.Tensor, torch.Tensor, torch.Tensor]:
        """One padded prefill of `uprompts` over their kept KV (`hits`): the cache (kept KV
        right-aligned at C, then the (U, S) new tokens, left-padded, then `room`), the (U, V)
        fp32 logits of each last position, the (U, 1) next positions on the device, and the
        (U, C + S) host mask of real cache positions. `into`: a (L, 2, U, KV, C + S + room, D)
        view of a larger buffer (`_prefill_into_one`) that the cache is written into."""
        device = self.device
        U = len(uprompts)
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
        attn_host = attention  # (U, C + S) on the host: which cache positions of a row are real
        input_ids, attention, positions = input_ids.to(device), attention.to(device), positions.to(device)
        past = None
        if C > 0:  # kept KV in place, with room for the S new tokens (and `room`)
            past = _build_cache([kv for _, kv in hits], kept, C, S + room, device, into)
        # logits_to_keep=1: only the last position's logits are needed (skips a (B, T, V) LM head).
        with self._prefill_threads(input_ids.numel()):
            out = model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                        past_key_values=past, logits_to_keep=1)
        cache = out.past_key_values
        if into is not None and past is None:  # no kept KV: the prefill made plain layers; copy them in
            for li, layer in enumerate(cache.layers):
                into[li, 0, :, :, :S] = layer.keys
                into[li, 1, :, :, :S] = layer.values
        return cache, out.logits[:, -1, :].float(), positions[:, -1:] + 1, attn_host

    def _prefill_into_one(self, model: Any, uprompts: list[list[int]], hits: list[tuple[int, Any]],
                          groups: list[list[int]], room: int) -> tuple[Any, torch.Tensor, torch.Tensor,
                                                                       torch.Tensor, list[int]] | None:
        """Groups of rows (`_prefill_groups`) prefilled apart, each straight into its rows of
        one buffer: group g's rows are contiguous, its kept KV + new tokens (width w_g)
        right-aligned to the widest group's width W, zeros before, `room` after. No copy of
        the groups' caches into one afterwards (`_assemble_groups`), except for a group
        without kept KV (a plain prefill, copied in). Returns (cache, (U, V) logits, (U, 1)
        next positions, (U, W) host mask, the unique row each batch row holds), or None when
        no row has kept KV of one block to size the buffer by."""
        ref = next((kv for _, kv in hits if kv is not None), None)
        if ref is None or len(ref) != 1:
            return None
        Lb, two, KV, _, D = ref[0].shape
        kept = [n for n, _ in hits]
        width = [max(kept[u] for u in g) + max(len(uprompts[u]) - kept[u] for u in g) for g in groups]
        W = max(width)
        buf = _kv_buffer((Lb, two, len(uprompts), KV, W + room, D), ref[0].dtype, self.device)
        logits, next_pos, masks, r0 = [], [], [], 0
        for g, w in zip(groups, width):
            rows = slice(r0, r0 + len(g))
            buf[:, :, rows, :, : W - w].zero_()  # padding: masked, but 0 * garbage could be NaN
            _, lg, pos, mask = self._prefill(model, [uprompts[u] for u in g], [hits[u] for u in g], room,
                                             into=buf[:, :, rows, :, W - w:])
            logits.append(lg)
            next_pos.append(pos)
            masks.append(torch.nn.functional.pad(mask, (W - w, 0)))  # (U_g, W)
            r0 += len(g)
        from transformers import DynamicCache

        block = _KVBlock(buf, Lb)
        cache = DynamicCache()
        cache.layers = [_new_growing(block, li, W) for li in range(Lb)]
        order = [u for g in groups for u in g]
        return cache, torch.cat(logits), torch.cat(next_pos), torch.cat(masks), order

    def _decode_chunk(self, model: Any, prompts: list[list[int]], params: SamplingParams,
                      gen: torch.Generator | list[torch.Generator],
                      constraints: list[Any] | None = None) -> list[GenerationResult]:
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
        self._prompt_tokens += sum(len(p) for p in prompts)
        room = max(params.max_tokens - 1, 0)  # decode steps' positions after the prompt
        # Rows whose new-token counts differ a lot (the next turns of kept episodes and
        # prompts the cache lost) prefill in groups, each padded to its own longest
        # (`_prefill_groups`), then meet in one cache; once the cache layers are known plain.
        rows = None  # the chunk row each batch row holds (None: in prompt order)
        groups = [list(range(U))]
        if self._plain_prefill and U > 1:
            groups = _prefill_groups([len(p) - n for p, n in zip(uprompts, kept)])
        if len(groups) == 1:
            cache, logits, next_pos, attn_host = self._prefill(model, uprompts, hits, room)
            plain = _plain_layers(cache)
            self._plain_prefill = plain
            if self.prefix_cache is not None and not plain:
                self.prefix_cache = None  # e.g. sliding-window layers: keep nothing
            if plain and params.max_tokens > 1 and not _is_growing(cache.layers[0]):  # room: no torch.cat per step
                cache.layers = _grow_layers(cache.layers, room)
            if U < B:  # expand the unique rows back to one row per prompt
                inv = torch.tensor(inverse, dtype=torch.long)  # (B,)
                inv_dev = inv.to(device, non_blocking=True)
                cache = _select_rows(cache, inv_dev)
                logits, next_pos = logits[inv_dev], next_pos[inv_dev]  # (B, ...)
                attn_host = attn_host[inv]
        else:
            plain = True
            one = self._prefill_into_one(model, uprompts, hits, groups, room)
            if one is None:
                parts = [self._prefill(model, [uprompts[u] for u in g], [hits[u] for u in g], 0) for g in groups]
                cache, logits, next_pos, attn_host = _assemble_groups(parts, groups, inverse, room)
            else:
                cache, logits, next_pos, attn_host, order = one
                if U == B:  # batch row j holds the prompt of unique row order[j]: no copy
                    chunk_row = {u: b for b, u in enumerate(inverse)}
                    rows = torch.tensor([chunk_row[u] for u in order], dtype=torch.long)  # (B,)
                else:  # duplicates: one row per prompt, in prompt order (a copy)
                    at = {u: j for j, u in enumerate(order)}
                    pick = torch.tensor([at[u] for u in inverse], dtype=torch.long)  # (B,)
                    pick_dev = pick.to(device, non_blocking=True)
                    cache = _select_rows(cache, pick_dev)
                    logits, next_pos, attn_host = logits[pick_dev], next_pos[pick_dev], attn_host[pick]
        attention = attn_host.to(device, non_blocking=True)  # (B, T) 1 at real cache positions
        cached = [kept[inverse[b]] for b in range(B)]  # (B,) tokens each row reused from the prefix cache
        state = _DecodeState(self, prompts, params, gen, attn_host, device, cached, rows, constraints,
                             logits.shape[-1])
        # Built per call (references to the parameters, ~1 ms): sees swapped modules and
        # adapters switched off; None: the model's forward decodes.
        fast = None
        if self.fast_decode and plain and params.max_tokens > 1:
            fast = self._decode_step = DecodeStep.build(model, self._decode_step)
            if fast is not None:
                fast.kernels = self._kernels(device)
        path = "fast" if fast is not None else "model"
        # One prompt for every row (a GRPO group's first turn): its prefilled positions hold
        # the same keys in every row, and the decode step can read them once (decode_step.py;
        # `share_prompt_reads`).
        share = self.share_prompt_reads if self.share_prompt_reads is not None else device.type != "cpu"
        shared = attn_host.shape[1] if share and U == 1 and B > 1 else 0
        graphed = None  # the chunk's steps from a CUDA graph (graphed.py): fixed rows, no shared-prompt read
        if self.cuda_graphs and self.graph_error is None and graph_usable(fast, device) and _is_growing(cache.layers[0]):
            graphed, shared = GraphedDecode(fast, cache, attention), 0
        packed = self._packer(fast) if fast is not None and graphed is None else None
        if self.decode_threads is None:
            # bf16 products in fp32 are a candidate of large row buckets (packed_matmul.Fp32Products)
            fp32 = isinstance(packed, OneDNNWeights) and packed_available(2 * fast.packed_bytes())
            self.decode_threads = DecodeModes(device, split=fast is not None, fp32=fp32)
            if SPLIT in self.decode_threads.candidates:
                # compiled where the CPU kernels are (no wake-up per product), else the Python one
                self._helper = SpinHelper() if fast.kernels is not None else MatmulHelper()
                # An engine dropped without close() (a Trainer garbage-collected) still ends its thread.
                weakref.finalize(self, self._helper.close)
        # the decode steps' fp32 logits of a 16-bit model go into one buffer (DecodeStep: `logits_out`)
        logits_buf = torch.empty((B, logits.shape[-1]), dtype=torch.float32, device=device) if fast is not None \
            and device.type == "cpu" and graphed is None else None
        with self.decode_threads.stepping() as stepper:  # mode timed per row bucket, then chosen (decode_threads.py)
            for step in range(params.max_tokens):
                tokens = state.step(step, logits, cache)  # (B',) on the device
                if not state.live.any() or step == params.max_tokens - 1:
                    break
                if graphed is None:
                    kept_rows = state.compact(cache)  # rows kept (device, host); None: no compaction this step
                    if kept_rows is not None:
                        keep, keep_host = kept_rows  # (B'',) each
                        cache = _select_rows(cache, keep, keep_host)
                        tokens, next_pos, attention = tokens[keep], next_pos[keep], attention[keep]
                    attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)  # (B', T+1)
                with stepper.step(rows=len(tokens)):
                    if graphed is not None:
                        replays = graphed.replays
                        logits = graphed(tokens, next_pos)  # (B, V), the cache written in place
                        self.decode_steps["graphed"] += graphed.replays - replays
                        if graphed.capture_error is not None and self.graph_error is None:
                            self.graph_error = graphed.capture_error
                            warnings.warn(f"hf engine: this model's decode step cannot be recorded in a CUDA graph "
                                          f"({self.graph_error}); its steps are launched from Python from now on "
                                          "(inference.cuda_graphs=false skips the attempt)", stacklevel=2)
                    elif fast is not None:
                        split = self._helper if stepper.split else None  # large matmuls in halves on two threads
                        # products through packed weights (split halves packed apart; bf16 ones in fp32 in `FP32`)
                        step_packed = self._fp32_packer() if stepper.fp32 and packed is not None else packed
                        if step_packed is not None:
                            step_packed.begin_step(len(tokens))
                        out = logits_buf[: len(tokens)] if logits_buf is not None else None
                        # on several threads only the products and attention run wide (DecodeStep: product_threads)
                        logits = fast(tokens, attention, next_pos, cache, shared, split, step_packed,
                                      logits_out=out, product_threads=stepper.current)  # (B', V), the cache grown
                    else:
                        out = model(input_ids=tokens[:, None], attention_mask=attention, position_ids=next_pos,
                                    past_key_values=cache, use_cache=True)
                        cache = out.past_key_values
                        logits = out.logits[:, -1, :].float()  # (B', V)
                self.decode_steps[path] += 1
                next_pos = next_pos + 1
        return state.finish(cache)

    def _kernels(self, device: torch.device) -> Any | None:
        """The `cpu_kernels` module for a CPU decode step (`cpu_kernels`), where its library builds
        (a warning, once per engine, where it does not); None otherwise."""
        if not self.cpu_kernels or device.type != "cpu":
            return None
        if cpu_kernels.available():
            return cpu_kernels
        if not self._warned_kernels:
            self._warned_kernels = True
            warnings.warn(f"hf engine: the CPU decode kernels could not be built ({cpu_kernels.why_unavailable()}); "
                          "decode steps use torch's attention (inference.cpu_kernels=false skips the attempt)",
                          stacklevel=3)
        return None

    def _packer(self, fast: DecodeStep) -> PackedWeights | OneDNNWeights | SkinnyWeights | None:
        """The packed weights `fast`'s products run through (`packed_decode`, on a CPU): oneDNN's
        for bf16, MKL's for fp32, where this torch has them, and in front of either, where the
        CPU kernels loaded (`fast.kernels`), the skinny kernel's panels for steps of few rows
        (`skinny_weights.py`); None otherwise."""
        if not self.packed_decode:
            return None
        dtype = fast.dtype
        if dtype not in self._packers:
            nbytes = fast.packed_bytes()
            if nbytes and dtype == torch.bfloat16 and onednn_available(dtype, nbytes):
                packer: Any = OneDNNWeights()
            elif nbytes and dtype == torch.float32 and packed_available(nbytes):
                packer = PackedWeights()
            else:
                return None
            if fast.kernels is not None and nbytes <= SKINNY_MAX_BYTES:
                packer = SkinnyWeights(packer, fast.kernels)
            self._packers[dtype] = packer
        return self._packers[dtype]

    def _fp32_packer(self) -> Fp32Products:
        """The packed fp32 copies of bf16 weights that `FP32` decode steps multiply through."""
        if "fp32 products" not in self._packers:
            self._packers["fp32 products"] = Fp32Products()
        return self._packers["fp32 products"]
