"""Models for learning: the policy (LoRA or full), its reference, and the critic.

* Policy: a causal LM; with `model.use_lora` only LoRA adapters train (peft).
* Reference: with LoRA, the same module with adapters disabled (no second copy);
  with full fine-tuning, a frozen copy made at start.
* Critic (PPO with GAE): a separate copy of the base model with its own LoRA and a
  linear value head on the last hidden state.

`token_logprobs` recomputes per-token logprobs for a batch in micro-batches sorted
by length and cut to each micro-batch's longest episode, so little compute goes to
padding. Position t holds log p(token_t | tokens_<t); position 0 holds 0.
"""
from __future__ import annotations

import contextlib
import copy
from typing import Any, Iterator

import torch
import torch.nn as nn

from workbench.algo import entropy_from_logits
from workbench.config import ModelConfig
from workbench.models.loading import load_model_and_tokenizer


def apply_lora(model: nn.Module, cfg: ModelConfig) -> nn.Module:
    """Wrap `model` with fresh LoRA adapters as configured."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=cfg.lora_target_modules, bias="none", task_type="CAUSAL_LM",
    )
    return get_peft_model(model, lora)


class Policy:
    """The trained language model plus its reference view."""

    def __init__(self, cfg: ModelConfig):
        self.cfg = cfg
        base, self.tokenizer = load_model_and_tokenizer(cfg.path, cfg.dtype, cfg.device, cfg.trust_remote_code)
        if cfg.gradient_checkpointing:
            base.gradient_checkpointing_enable()
        self.frozen_ref: nn.Module | None = None
        if cfg.use_lora:
            self.model = apply_lora(base, cfg)
        else:
            self.model = base
            self.frozen_ref = copy.deepcopy(base).eval().requires_grad_(False)
        self.model.train()

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def trainable_parameters(self) -> list[nn.Parameter]:
        return [p for p in self.model.parameters() if p.requires_grad]

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        """Only the trained weights (LoRA adapters, or everything for full fine-tuning)."""
        names = {n for n, p in self.model.named_parameters() if p.requires_grad}
        return {n: t.detach().cpu().clone() for n, t in self.model.state_dict().items() if n in names}

    def load_trainable_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        missing = [n for n, p in self.model.named_parameters() if p.requires_grad and n not in state]
        if missing:
            raise ValueError(f"checkpoint lacks {len(missing)} trained weights, e.g. {missing[:3]}")
        self.model.load_state_dict(state, strict=False)

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The reference policy: adapters disabled (LoRA) or the frozen copy."""
        if self.frozen_ref is not None:
            yield self.frozen_ref
        else:
            with self.model.disable_adapter():
                yield self.model


class Critic(nn.Module):
    """Value model: base LM body (+ LoRA) and a linear head, one value per token."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        base, _ = load_model_and_tokenizer(cfg.path, cfg.dtype, cfg.device, cfg.trust_remote_code)
        self.body = apply_lora(base, cfg) if cfg.use_lora else base
        hidden = base.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, device=cfg.device)
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        # logits_to_keep=1: the value head reads the hidden states; a full (B, T, V) LM-head
        # output would only cost time and memory.
        out = self.body(input_ids=input_ids, attention_mask=attention_mask, output_hidden_states=True,
                        logits_to_keep=1)
        h = out.hidden_states[-1]  # (B, T, H)
        return self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1)  # (B, T)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        names = {n for n, p in self.named_parameters() if p.requires_grad}
        return {n: t.detach().cpu().clone() for n, t in self.state_dict().items() if n in names}


def micro_batches(lengths: list[int], size: int) -> list[list[int]]:
    """Episode indices grouped `size` at a time, longest first, so padding stays small."""
    order = sorted(range(len(lengths)), key=lambda i: -lengths[i])
    return [order[i:i + size] for i in range(0, len(order), size)]


def forward_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     with_entropy: bool = False, autocast: bool = False,
                     loss_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs (and entropies) of `input_ids` under `model`.

    With `loss_mask` (B, T), the LM head and softmax run only at the sequence
    positions where some row has a trained token (prompts and observations are
    skipped, which is most of a multi-turn episode); other positions hold 0.

    Returns (logprobs (B, T), entropy (B, T) or None); position 0 is 0.
    """
    device_type = input_ids.device.type
    ctx = torch.autocast(device_type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    B, T = input_ids.shape
    if loss_mask is not None:
        # Token t is predicted by the logits at position t-1.
        targets = loss_mask[:, 1:].bool().any(0).nonzero().squeeze(-1) + 1  # (K,) positions in 1..T-1
        with ctx:
            logits = model(input_ids=input_ids, attention_mask=attention_mask,
                           logits_to_keep=targets - 1).logits  # (B, K, V)
        logits = logits.float()
        logp_k = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, targets, None]).squeeze(-1)  # (B, K)
        logp = torch.zeros(B, T, dtype=logp_k.dtype, device=logp_k.device).index_copy(1, targets, logp_k)
        ent = None
        if with_entropy:
            e = entropy_from_logits(logits)  # (B, K)
            ent = torch.zeros(B, T, dtype=e.dtype, device=e.device).index_copy(1, targets, e)
        return logp, ent
    with ctx:
        logits = model(input_ids=input_ids, attention_mask=attention_mask).logits  # (B, T, V)
    logits = logits[:, :-1].float()  # (B, T-1, V) predicts tokens 1..T-1
    logp = torch.log_softmax(logits, dim=-1).gather(-1, input_ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    logp = torch.cat([torch.zeros_like(logp[:, :1]), logp], dim=1)  # (B, T)
    ent = None
    if with_entropy:
        e = entropy_from_logits(logits)  # (B, T-1)
        ent = torch.cat([torch.zeros_like(e[:, :1]), e], dim=1)  # (B, T)
    return logp, ent


@torch.no_grad()
def batch_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   lengths: list[int], micro_batch_size: int, autocast: bool = False,
                   loss_mask: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) logprobs for a whole batch, computed in length-sorted micro-batches.

    With `loss_mask`, only positions of trained tokens are computed (others are 0).
    """
    device = next(model.parameters()).device
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    for idx in micro_batches(lengths, micro_batch_size):
        T = max(lengths[i] for i in idx)
        ids = input_ids[idx, :T].to(device)  # (b, T)
        mask = attention_mask[idx, :T].to(device)
        lm = loss_mask[idx, :T].to(device) if loss_mask is not None else None
        lp, _ = forward_logprobs(model, ids, mask, autocast=autocast, loss_mask=lm)
        out[idx, :T] = lp.float().cpu()
    return out


@torch.no_grad()
def batch_values(critic: Critic, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 lengths: list[int], micro_batch_size: int) -> torch.Tensor:
    """(B, T) critic values in length-sorted micro-batches."""
    device = next(critic.parameters()).device
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    for idx in micro_batches(lengths, micro_batch_size):
        T = max(lengths[i] for i in idx)
        v = critic(input_ids[idx, :T].to(device), attention_mask[idx, :T].to(device))
        out[idx, :T] = v.float().cpu()
    return out


def collect_params(*modules: Any) -> list[nn.Parameter]:
    return [p for m in modules for p in m.parameters() if p.requires_grad]
