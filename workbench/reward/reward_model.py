"""A reward model as a reward source (`RewardModel`, the `reward.reward_model` setting): verl's
reward-model worker's job, on a local folder or hub id.

    rm = RewardModel.from_path("runs/rm", kind="auto", dtype="float32")
    rm = RewardModel.from_config(config.reward)
    judgments = rm.judge(batch.episodes)        # one Judgment per episode (source "reward_model")
    rm.score_texts(["..."])                     # [(score, None)] or [(None, why)]: what a Ray worker runs

Two kinds:

* "classifier": an `AutoModelForSequenceClassification` reads the episode's conversation
  (rendered with its tokenizer's chat template, else as `workbench.reward.judgments.transcript`)
  and its output is the score: the logit with one label, the probability of label 1 with two.
* "yes_token": a causal LM is asked `reward.judge_rubric` about the conversation and whether
  the assistant did well; the score is its probability (softmax over the whole vocabulary, at
  temperature 1) that the first token of its answer is the first token of `reward.reward_model_yes`.

Texts are scored `batch_size` at a time, right-padded, longest first; the score of a row is
read at its last real token, so it equals a forward of that text alone (the padding is never
attended to). A text longer than `max_tokens` fails its judgment; a non-finite score too.
`remote` (None here) is what scores when it is set: `workbench.distributed.reward_workers`
sets it to a Ray worker holding the same model (`ray.use_ray`).
"""
from __future__ import annotations

import math
import time
from typing import Any, Callable

import torch

from workbench.reward.judges import DEFAULT_RUBRIC
from workbench.reward.judgments import Judgment, transcript

KINDS = ("classifier", "yes_token")


def model_kind(path: str) -> str:
    """"classifier" when the folder's config.json names a `...ForSequenceClassification`
    architecture, else "yes_token"."""
    from transformers import AutoConfig

    from workbench.models.loading import resolve_model_path

    archs = getattr(AutoConfig.from_pretrained(resolve_model_path(path)), "architectures", None) or []
    return "classifier" if any(a.endswith("ForSequenceClassification") for a in archs) else "yes_token"


class RewardModel:
    """A reward model (see the module docstring).

    Args:
        model: a sequence classifier ("classifier") or a causal LM ("yes_token"), eval mode.
        tokenizer: its tokenizer.
        kind: "classifier" or "yes_token".
        rubric: yes_token: what the model is asked about the conversation.
        yes: yes_token: the answer whose first token's probability is the score.
        batch_size: texts per forward pass.
        max_tokens: longest text (tokens) it scores.
        weight: the source's weight in the episode's score (recorded on each judgment).
        name: the model's name as recorded (default: its folder).
    """

    source = "reward_model"

    def __init__(self, model: Any, tokenizer: Any, kind: str = "classifier", rubric: str = DEFAULT_RUBRIC,
                 yes: str = "Yes", batch_size: int = 8, max_tokens: int = 4096, weight: float = 1.0,
                 name: str | None = None):
        if kind not in KINDS:
            raise ValueError(f"kind must be one of {KINDS}, got {kind!r}")
        self.model, self.tokenizer, self.kind = model.eval(), tokenizer, kind
        self.rubric, self.yes = rubric, yes
        self.batch_size, self.max_tokens, self.weight = int(batch_size), int(max_tokens), float(weight)
        self.name = name or getattr(model.config, "_name_or_path", "") or type(model).__name__
        pad = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.pad_id = int(pad if pad is not None else 0)
        if kind == "classifier":
            labels = int(getattr(model.config, "num_labels", 1))
            if labels not in (1, 2):
                raise ValueError(f"a reward model gives one score: num_labels 1 (the logit) or 2 (the probability "
                                 f"of label 1), {self.name} has {labels}")
            if model.config.pad_token_id is None:  # the classifier reads the last token that is not padding
                model.config.pad_token_id = self.pad_id
            self.pad_id = int(model.config.pad_token_id)
            self.yes_id = None
        else:
            ids = tokenizer(yes, add_special_tokens=False)["input_ids"]
            if not ids:
                raise ValueError(f"reward.reward_model_yes {yes!r} is no token of {self.name}'s tokenizer")
            self.yes_id = int(ids[0])
        self.remote: Callable[[list[str]], list[tuple[float | None, str | None]]] | None = None

    @classmethod
    def from_path(cls, path: str, kind: str = "auto", dtype: str = "auto", device: str = "auto",
                  **kwargs: Any) -> "RewardModel":
        """Load a folder or hub id (`kind` "auto": `model_kind(path)`)."""
        from transformers import AutoModelForSequenceClassification

        from workbench.config import resolve_device, resolve_dtype
        from workbench.models.loading import load_model, load_tokenizer, resolve_model_path

        kind = model_kind(path) if kind == "auto" else kind
        if kind == "classifier":
            from transformers import AutoTokenizer

            target = resolve_device(device)
            model = AutoModelForSequenceClassification.from_pretrained(
                resolve_model_path(path), dtype=resolve_dtype(dtype, target)).to(target)
            tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(path))
        else:
            model, tokenizer = load_model(path, dtype, device), load_tokenizer(path)
        return cls(model, tokenizer, kind=kind, name=path, **kwargs)

    @classmethod
    def from_config(cls, reward: Any, device: str = "auto") -> "RewardModel":
        """The reward model of a `reward` section (`reward.reward_model` and its settings)."""
        if reward.reward_model is None:
            raise ValueError("reward.reward_model is not set: name a reward model folder or hub id")
        return cls.from_path(reward.reward_model, kind=reward.reward_model_kind, dtype=reward.judge_dtype,
                             device=device, rubric=reward.judge_rubric, yes=reward.reward_model_yes,
                             batch_size=reward.reward_model_batch_size, max_tokens=reward.reward_model_max_tokens,
                             weight=reward.reward_model_weight)

    # -- what it reads -------------------------------------------------------------------
    def text(self, episode: Any) -> str:
        """The exact text the model reads for `episode`."""
        tok = self.tokenizer
        if self.kind == "classifier":
            if getattr(tok, "chat_template", None):
                return tok.apply_chat_template(list(episode.messages), tokenize=False)
            return transcript(episode.messages)
        question = (f"{self.rubric}\n\nThe conversation:\n\n{transcript(episode.messages)}\n\n"
                    f"Did the assistant do the task well? Answer {self.yes} or no.")
        messages = [{"role": "user", "content": question}]
        if getattr(tok, "chat_template", None):
            return tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return question + "\n"

    def _ids(self, text: str) -> list[int]:
        templated = bool(getattr(self.tokenizer, "chat_template", None))
        return list(self.tokenizer(text, add_special_tokens=not templated)["input_ids"])

    # -- scoring -------------------------------------------------------------------------
    @torch.no_grad()
    def score_texts(self, texts: list[str]) -> list[tuple[float | None, str | None]]:
        """(score, None) or (None, why) per text, `batch_size` texts per forward pass."""
        ids = [self._ids(t) for t in texts]
        out: list[tuple[float | None, str | None]] = [(None, "not scored")] * len(texts)
        rows = []
        for i, x in enumerate(ids):
            if not x:
                out[i] = (None, "the reward model was given an empty text")
            elif len(x) > self.max_tokens:
                out[i] = (None, f"the episode is {len(x)} tokens for the reward model, more than "
                                f"reward.reward_model_max_tokens={self.max_tokens}")
            else:
                rows.append(i)
        rows.sort(key=lambda i: -len(ids[i]))
        device = next(self.model.parameters()).device
        for s in range(0, len(rows), self.batch_size):
            chunk = rows[s:s + self.batch_size]
            T = max(len(ids[i]) for i in chunk)
            input_ids = torch.full((len(chunk), T), self.pad_id, dtype=torch.long)  # (B, T)
            mask = torch.zeros((len(chunk), T), dtype=torch.long)  # (B, T)
            for b, i in enumerate(chunk):
                input_ids[b, :len(ids[i])] = torch.tensor(ids[i])
                mask[b, :len(ids[i])] = 1
            scores = self._forward(input_ids.to(device), mask.to(device), [len(ids[i]) for i in chunk])  # (B,)
            for i, v in zip(chunk, scores.tolist()):
                out[i] = (v, None) if math.isfinite(v) else (None, f"the reward model gave {v}")
        return out

    def _forward(self, input_ids: torch.Tensor, mask: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Scores (B,) float of right-padded rows."""
        logits = self.model(input_ids=input_ids, attention_mask=mask).logits.float()
        if self.kind == "classifier":  # (B, L): pooled at each row's last token that is not padding
            return logits[:, 0] if logits.shape[-1] == 1 else torch.softmax(logits, dim=-1)[:, 1]
        last = torch.tensor(lengths, device=logits.device) - 1  # (B,)
        step = logits[torch.arange(len(lengths), device=logits.device), last]  # (B, V)
        return torch.softmax(step, dim=-1)[:, self.yes_id]

    def judge(self, episodes: list[Any]) -> list[Judgment]:
        """One `Judgment` per episode, in order."""
        texts = [self.text(ep) for ep in episodes]
        start = time.perf_counter()
        try:
            scored = (self.remote or self.score_texts)(texts)
        except Exception as exc:  # noqa: BLE001 - a failed forward (or worker) fails these judgments
            scored = [(None, f"the reward model failed: {exc}")] * len(texts)
        seconds = time.perf_counter() - start
        out = []
        for text, (score, error) in zip(texts, scored):
            out.append(Judgment(source=self.source, model=self.name, score=score, raw_score=score, prompt=text,
                                error=error, seconds=seconds, prompt_tokens=len(self._ids(text)),
                                weight=self.weight))
        return out

    def close(self) -> None:
        """Drop the model (and a Ray worker's handle)."""
        self.remote = None

    def __repr__(self) -> str:
        return f"RewardModel({self.name!r}, kind={self.kind!r}, weight={self.weight:g})"


__all__ = ["KINDS", "RewardModel", "model_kind"]
