"""`hf` backend: batched sampling with a transformers model (the CPU default).

One call samples every prompt together: prompts are left-padded into one (B, T)
batch, prefilled once, then decoded token by token with the KV cache. Rows that
hit a stop id leave the batch (the cache is compacted), so short answers don't pay
for long ones. The loop is ours rather than `model.generate` so that the raw-model
logprob of each sampled id comes out of the same forward that sampled it, without
storing (B, V) logits per step.

The engine holds a reference to the policy module, so after an optimizer step it
already samples from the new weights; `sync_weights(model)` just swaps the module.
"""
from __future__ import annotations

from typing import Any

import torch

from workbench.engines.base import GenerationEngine, GenerationResult, SamplingParams


class HFEngine(GenerationEngine):
    """Batched sampler over a Hugging Face causal LM (plain or peft-wrapped)."""

    name = "hf"

    def __init__(self, model: Any, tokenizer: Any, max_batch_size: int = 64):
        super().__init__(tokenizer)
        self.model = model
        self.max_batch_size = max_batch_size
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self._generated = 0
        self._prompt_tokens = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def sync_weights(self, model: Any) -> None:
        self.model = model

    def stats(self) -> dict[str, float]:
        return {"prompt_tokens": self._prompt_tokens, "generated_tokens": self._generated}

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        if not prompts:
            return []
        for i, p in enumerate(prompts):
            if not p:
                raise ValueError(f"prompt {i} is empty; every prompt needs at least one token")
        gen = torch.Generator(device="cpu")
        if params.seed is not None:
            gen.manual_seed(params.seed)
        else:
            gen.seed()
        results: list[GenerationResult] = []
        # Sort by length so each chunk pads little; restore the order afterwards.
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        by_index: dict[int, GenerationResult] = {}
        for start in range(0, len(order), self.max_batch_size):
            chunk = order[start : start + self.max_batch_size]
            for i, res in zip(chunk, self._generate_chunk([prompts[i] for i in chunk], params, gen)):
                by_index[i] = res
        results = [by_index[i] for i in range(len(prompts))]
        return results

    @torch.no_grad()
    def _generate_chunk(self, prompts: list[list[int]], params: SamplingParams,
                        gen: torch.Generator) -> list[GenerationResult]:
        device = self.device
        B = len(prompts)
        T = max(len(p) for p in prompts)
        input_ids = torch.full((B, T), self.pad_id, dtype=torch.long)  # (B, T) left-padded
        attention = torch.zeros((B, T), dtype=torch.long)  # (B, T)
        for b, p in enumerate(prompts):
            input_ids[b, T - len(p):] = torch.tensor(p, dtype=torch.long)
            attention[b, T - len(p):] = 1
        input_ids, attention = input_ids.to(device), attention.to(device)
        positions = (attention.cumsum(-1) - 1).clamp(min=0)  # (B, T)
        self._prompt_tokens += sum(len(p) for p in prompts)

        stop = torch.tensor(sorted(set(params.stop_token_ids)), dtype=torch.long, device=device)
        out_ids: list[list[int]] = [[] for _ in range(B)]
        out_lp: list[list[float]] = [[] for _ in range(B)]
        finish: list[str] = ["length"] * B
        alive = torch.arange(B, device=device)  # rows of the original chunk still decoding

        # logits_to_keep=1: only the last position's logits are needed (skips a (B, T, V) LM head).
        out = self.model(input_ids=input_ids, attention_mask=attention, position_ids=positions, use_cache=True,
                         logits_to_keep=1)
        cache = out.past_key_values
        logits = out.logits[:, -1, :].float()  # (B, V)
        next_pos = positions[:, -1:] + 1  # (B, 1)
        for step in range(params.max_tokens):
            logprobs = torch.log_softmax(logits, dim=-1)  # (B, V) raw model distribution
            tokens = _sample(logits, params, gen)  # (B,)
            chosen_lp = logprobs.gather(-1, tokens[:, None]).squeeze(-1)  # (B,)
            tok_list, lp_list = tokens.tolist(), chosen_lp.tolist()
            done_mask = torch.isin(tokens, stop) if stop.numel() else torch.zeros_like(tokens, dtype=torch.bool)
            for j, row in enumerate(alive.tolist()):
                out_ids[row].append(tok_list[j])
                out_lp[row].append(lp_list[j])
                if done_mask[j]:
                    finish[row] = "stop"
            self._generated += len(tok_list)
            keep = ~done_mask
            if not keep.any() or step == params.max_tokens - 1:
                break
            if not keep.all():
                idx = keep.nonzero().squeeze(-1)
                alive, tokens, next_pos, attention = alive[idx], tokens[idx], next_pos[idx], attention[idx]
                cache = _select_rows(cache, idx)
            attention = torch.cat([attention, torch.ones_like(attention[:, :1])], dim=-1)  # (B', T+1)
            out = self.model(
                input_ids=tokens[:, None], attention_mask=attention, position_ids=next_pos,
                past_key_values=cache, use_cache=True,
            )
            cache = out.past_key_values
            logits = out.logits[:, -1, :].float()
            next_pos = next_pos + 1
        return [GenerationResult(token_ids=out_ids[b], logprobs=out_lp[b], finish_reason=finish[b])  # type: ignore[arg-type]
                for b in range(B)]


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


def _sample(logits: torch.Tensor, params: SamplingParams, gen: torch.Generator) -> torch.Tensor:
    """Sample one id per row from (B, V) logits with temperature / top-k / top-p."""
    if params.temperature == 0:
        return logits.argmax(dim=-1)
    scaled = logits / params.temperature  # (B, V)
    if params.top_k > 0:
        kth = torch.topk(scaled, min(params.top_k, scaled.shape[-1]), dim=-1).values[:, -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_idx = torch.sort(scaled, descending=True, dim=-1)
        cum = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Drop tokens once the mass before them already reaches top_p (keep at least one).
        drop_sorted = (cum - torch.softmax(sorted_logits, dim=-1)) >= params.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, sorted_idx, drop_sorted)
        scaled = scaled.masked_fill(drop, float("-inf"))
    probs = torch.softmax(scaled, dim=-1)  # (B, V)
    return torch.multinomial(probs.cpu(), 1, generator=gen).squeeze(-1).to(logits.device)
