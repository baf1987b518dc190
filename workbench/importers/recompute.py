"""Token views for runs recorded as text: tokenize through a model's chat template, then
teacher-force the tokens in batches (`--model`, `--ref-model` of `workbench import`).

    rc = Recompute("models/qwen", ref_model="models/qwen-base")
    batch = rc(batch)              # episodes recorded as text now have token ids, a loss mask and
    batch.recomputed_logprobs      # (B, T) the model's logprob of each token of the replies
    batch.recomputed_entropy       # (B, T) the entropy of its next-token distribution there
    batch.recomputed_kl            # (B, T) KL(model || ref model) of those distributions (exact, not sampled)

How the text becomes tokens: an episode with chat messages is rendered whole with the model's
chat template, and the tokens whose characters lie inside an assistant message's content are
the reply's (loss mask 1; a fast tokenizer's offsets say which); an episode recorded as one flat
string (verl's dump) is its prompt text followed by its response text, tokenized as plain text.
These are the workbench's reading of the text, not the ids the trainer sampled (decode and
encode do not always round-trip), which is why the values are named `recomputed_*` and the
token view says "recomputed, not sampled"; `rollout_logprobs` stay 0. Episodes that carry
recorded token ids are left as they are.

Simplified: one device (the models' own, CPU here), fp32 by default, batches of at most
`max_batch_tokens` padded tokens, sorted by length so padding stays small.
"""
from __future__ import annotations

from typing import Any

import torch

from workbench.trajectory import Episode, TrajectoryBatch

__all__ = ["Recompute", "tokenize_episode", "teacher_force", "RECOMPUTED_NOTE"]

#: What the views say of these values.
RECOMPUTED_NOTE = "recomputed by teacher forcing, not sampled"
_CHAT_ROLES = ("system", "user", "assistant", "tool")


def _spans(rendered: str, contents: list[str]) -> list[tuple[int, int]]:
    """The character span of each content in `rendered`, found in order."""
    out, at = [], 0
    for text in contents:
        i = rendered.find(text, at) if text else -1
        if i < 0:
            out.append((at, at))
            continue
        out.append((i, i + len(text)))
        at = i + len(text)
    return out


def tokenize_episode(ep: Episode, tokenizer: Any) -> Episode:
    """`ep` (recorded as text) with token ids, loss mask, turn index and each turn's token span
    filled in from its text (see the module docstring); episodes with token ids are unchanged."""
    if ep.token_ids or not ep.turns:
        return ep
    chat = ep.messages and all(m.get("role") in _CHAT_ROLES for m in ep.messages)
    replies = [t.action for t in ep.turns]
    if chat:
        rendered = tokenizer.apply_chat_template(ep.messages, tokenize=False)
    else:
        prompt = str(ep.messages[0].get("content", "")) if ep.messages else ""
        rendered = prompt + replies[0]
    spans = _spans(rendered, replies) if chat else [(len(rendered) - len(replies[0]), len(rendered))]
    enc = tokenizer(rendered, add_special_tokens=False, return_offsets_mapping=True)
    ids, offsets = enc["input_ids"], enc["offset_mapping"]
    ep.token_ids = list(ids)
    ep.loss_mask, ep.turn_index = [0] * len(ids), [-1] * len(ids)
    ep.rollout_logprobs = [0.0] * len(ids)
    for k, (turn, (s, e)) in enumerate(zip(ep.turns, spans)):
        inside = [i for i, (a, b) in enumerate(offsets) if a >= s and b <= e and b > a]
        for i in inside:
            ep.loss_mask[i], ep.turn_index[i] = 1, k
        turn.token_start, turn.token_end = (inside[0], inside[-1] + 1) if inside else (0, 0)
    first = next((i for i, m in enumerate(ep.loss_mask) if m), len(ids))
    ep.prompt_length = first
    return ep


@torch.no_grad()
def teacher_force(model: Any, batch: TrajectoryBatch, rows: list[int], max_batch_tokens: int = 8192,
                  ref: Any = None) -> dict[str, torch.Tensor]:
    """{"recomputed_logprobs", "recomputed_entropy", "recomputed_kl" (with `ref`)}: (B, T) tensors,
    filled at the trained tokens of `rows` (position t from the logits at t - 1), 0 elsewhere."""
    ids_all, mask_all = batch.tensors["input_ids"], batch.tensors["loss_mask"]  # (B, T)
    B, T = ids_all.shape
    out = {name: torch.zeros((B, T), dtype=torch.float32) for name in
           ("recomputed_logprobs", "recomputed_entropy") + (("recomputed_kl",) if ref is not None else ())}
    lengths = {b: batch.episodes[b].num_tokens for b in rows}
    order = sorted(rows, key=lambda b: lengths[b])
    device = next(model.parameters()).device
    chunk: list[int] = []

    def run(chunk: list[int]) -> None:
        n = max(lengths[b] for b in chunk)
        ids = ids_all[chunk, :n].to(device)  # (b, n)
        attn = batch.tensors["attention_mask"][chunk, :n].to(device)  # (b, n)
        logp = torch.log_softmax(model(input_ids=ids, attention_mask=attn).logits.float(), dim=-1)  # (b, n, V)
        nxt = ids[:, 1:]  # (b, n-1): the token each position predicts
        lp = logp[:, :-1].gather(-1, nxt.unsqueeze(-1)).squeeze(-1)  # (b, n-1)
        ent = -(logp[:, :-1].exp() * logp[:, :-1]).sum(-1)  # (b, n-1)
        values = {"recomputed_logprobs": lp, "recomputed_entropy": ent}
        if ref is not None:
            ref_logp = torch.log_softmax(ref(input_ids=ids, attention_mask=attn).logits.float(), dim=-1)  # (b, n, V)
            values["recomputed_kl"] = (logp[:, :-1].exp() * (logp[:, :-1] - ref_logp[:, :-1])).sum(-1)  # (b, n-1)
        for j, b in enumerate(chunk):
            m = mask_all[b, 1:n].bool()  # (n-1,)
            for name, v in values.items():
                out[name][b, 1:n] = torch.where(m, v[j].cpu(), torch.zeros_like(v[j].cpu()))

    for b in order:
        if chunk and (len(chunk) + 1) * max(lengths[c] for c in chunk + [b]) > max_batch_tokens:
            run(chunk)
            chunk = []
        chunk.append(b)
    if chunk:
        run(chunk)
    return out


class Recompute:
    """Tokenize imported text with `model`'s tokenizer and chat template, and teacher-force it
    (and `ref_model`, for the KL); call it on a batch (see the module docstring)."""

    def __init__(self, model: str, ref_model: str | None = None, dtype: str = "float32", device: str = "cpu",
                 max_batch_tokens: int = 8192):
        from workbench.models.loading import load_model, load_tokenizer

        self.model_path, self.ref_path = str(model), str(ref_model) if ref_model else None
        self.tokenizer = load_tokenizer(self.model_path)
        self.model = load_model(self.model_path, dtype, device).eval()
        self.ref = load_model(self.ref_path, dtype, device).eval() if self.ref_path else None
        self.max_batch_tokens = max_batch_tokens

    def describe(self) -> dict[str, Any]:
        return {"model": self.model_path, "ref_model": self.ref_path, "note": RECOMPUTED_NOTE,
                "fields": ["recomputed_logprobs", "recomputed_entropy"] + (["recomputed_kl"] if self.ref else [])}

    def __call__(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        rows = [b for b, e in enumerate(batch.episodes) if e.recorded_as_text]
        for b in rows:
            tokenize_episode(batch.episodes[b], self.tokenizer)
        if not rows:
            return batch
        kept = {k: v for k, v in batch.tensors.items() if k not in ("input_ids", "attention_mask", "loss_mask",
                                                                   "rollout_logprobs", "position_ids")}
        batch.tensors = {}
        batch.collate()
        B, T = batch.tensors["input_ids"].shape
        for name, t in kept.items():  # recorded per-token fields of the other episodes, re-padded to T
            grown = torch.zeros((B, T), dtype=t.dtype)
            grown[:, :min(T, t.shape[1])] = t[:, :T]
            batch.tensors[name] = grown
        batch.tensors.update(teacher_force(self.model, batch, rows, self.max_batch_tokens, self.ref))
        batch.meta["recomputed"] = self.describe()
        return batch
