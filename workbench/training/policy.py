"""Models for learning: the policy (LoRA or full), its reference, and the critic.

* Policy: a causal LM; with `model.use_lora` only LoRA adapters train (peft).
* Reference: with LoRA, the same module with adapters disabled (no second copy);
  with full fine-tuning, a frozen copy made at start.
* Critic (PPO with GAE): a separate copy of the base model with its own LoRA and a
  linear value head on the last hidden state.

`forward_logprobs` gives per-token logprobs of one micro-batch, computing the LM head
only at trained positions and, for a GRPO group, packing the rows behind one copy of
their shared prompt (`packing.py`). `batch_logprobs` runs a whole batch in
micro-batches that keep a group together and sort by length. Position t holds
log p(token_t | tokens_<t); position 0 holds 0. A batch whose episodes hold several
sequences ("rendered" history) carries `position_ids`; every forward here takes them
(`positions_of`) and lets each token see its own sequence only (`sequence_attention`). A
sequence never starts with a trained token (its first token is prompt), so a trained token
t is still predicted by the logits at flat position t - 1.
"""
from __future__ import annotations

import contextlib
import copy
import warnings
from pathlib import Path
from typing import Any, Iterator

import torch
import torch.nn as nn

from workbench.engines.model_hooks import dense_head_input, gqa_attention
from workbench.config import ModelConfig
from workbench.models.loading import load_model_and_tokenizer
from workbench.training.constrained import AllowedTokens, mask_logits
from workbench.training.head_logprobs import fused_head_weight, head_as_input, head_logprobs
from workbench.training.fp32_products import Fp32BaseWeights, use_fp32_products, wants_fp32_products
from workbench.training.lora_linear import use_lean_lora
from workbench.training.packing import packed_attention, plan_packing, sequence_attention


def apply_lora(model: nn.Module, cfg: ModelConfig) -> nn.Module:
    """Wrap `model` with fresh LoRA adapters as configured (peft), its LoRA linears
    computed as one autograd node each where that is exact (`lora_linear.py`), their frozen
    base products in fp32 where `cfg.fp32_base_products` says so (`fp32_products.py`)."""
    from peft import LoraConfig, get_peft_model

    lora = LoraConfig(
        r=cfg.lora_rank, lora_alpha=cfg.lora_alpha, lora_dropout=cfg.lora_dropout,
        target_modules=cfg.lora_target_modules, bias="none", task_type="CAUSAL_LM",
    )
    model = get_peft_model(model, lora)
    use_lean_lora(model)
    fp32, _ = wants_fp32_products(cfg.fp32_base_products, model)
    if fp32:
        use_fp32_products(model, Fp32BaseWeights())
    return model


class Policy:
    """The trained language model plus its reference view.

    Precision: the base weights load in `cfg.resolved_dtype()`. With bfloat16 weights,
    peft keeps the LoRA adapters in float32 (`autocast_adapter_dtype`), so their AdamW
    state is float32 too; `forward_logprobs` casts logits to float32 before the
    log-softmax, as the engine does when it samples. Full fine-tuning keeps no fp32
    master copy: "auto" picks float32 on a CPU for it, and bf16/fp16 weights trained in
    full get a warning (on CUDA "auto" is bfloat16 as before).

    Args:
        cfg: the `model` config section.
        with_reference: keep a reference policy (for full fine-tuning a frozen copy of the
            base weights; with LoRA the adapters are simply disabled, which costs nothing).
            False for processes that only sample or only train (Ray workers and learners).
    """

    def __init__(self, cfg: ModelConfig, with_reference: bool = True):
        self.cfg = cfg
        dtype = cfg.resolved_dtype()
        if not cfg.use_lora and dtype != torch.float32:
            warnings.warn(f"full fine-tuning of {str(dtype).removeprefix('torch.')} weights: AdamW updates them "
                          "in that dtype, with no fp32 master copy, so steps smaller than ~1/256 of a weight are "
                          "lost; use model.dtype=float32 (what \"auto\" picks on a CPU) or LoRA", stacklevel=2)
        base, self.tokenizer = load_model_and_tokenizer(cfg.path, dtype, cfg.device, cfg.trust_remote_code)
        if cfg.gradient_checkpointing:
            base.gradient_checkpointing_enable()
        self.frozen_ref: nn.Module | None = None
        if cfg.use_lora:
            self.model = apply_lora(base, cfg)
        else:
            self.model = base
            if with_reference:
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

    def export_merged(self, path: str | Path) -> Path:
        """Write the policy as a plain Hugging Face model folder (LoRA merged into the
        weights, safetensors, with the tokenizer): what `from_pretrained`, vLLM or another
        trainer loads without peft. The trained model itself is not modified."""
        from transformers import AutoModelForCausalLM

        from workbench.engines.weights import hf_weight_items, is_peft_model

        path = Path(path)
        base = self.model.get_base_model() if is_peft_model(self.model) else self.model
        with torch.device("meta"):
            plain = AutoModelForCausalLM.from_config(base.config)
        weights = {name: t.detach().to("cpu") for name, t in hf_weight_items(self.model)}
        plain.load_state_dict(weights, strict=True, assign=True)
        if getattr(base.config, "tie_word_embeddings", False):
            plain.tie_weights()
        plain.save_pretrained(path, safe_serialization=True)
        self.tokenizer.save_pretrained(path)
        return path

    @contextlib.contextmanager
    def reference(self) -> Iterator[nn.Module]:
        """The reference policy: adapters disabled (LoRA) or the frozen copy."""
        if self.frozen_ref is not None:
            yield self.frozen_ref
        elif not self.cfg.use_lora:
            raise RuntimeError("this Policy was built with with_reference=False and trains all weights, so it "
                               "has no reference policy")
        else:
            with self.model.disable_adapter():
                yield self.model


class Critic(nn.Module):
    """Value model: base LM body (+ LoRA) and a linear head, one value per token."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        base, _ = load_model_and_tokenizer(cfg.path, cfg.resolved_dtype(), cfg.device, cfg.trust_remote_code)
        self.body = apply_lora(base, cfg) if cfg.use_lora else base
        hidden = base.config.hidden_size
        self.value_head = nn.Linear(hidden, 1, device=next(base.parameters()).device)  # fp32 head
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                position_ids: torch.Tensor | None = None) -> torch.Tensor:
        # logits_to_keep=1: the value head reads the hidden states; a full (B, T, V) LM-head
        # output would only cost time and memory.
        out = self.body(input_ids=input_ids, output_hidden_states=True, logits_to_keep=1,
                        **_sequence_inputs(self.body, attention_mask, position_ids))
        h = out.hidden_states[-1]  # (B, T, H)
        return self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1)  # (B, T)

    def trainable_state_dict(self) -> dict[str, torch.Tensor]:
        names = {n for n, p in self.named_parameters() if p.requires_grad}
        return {n: t.detach().cpu().clone() for n, t in self.state_dict().items() if n in names}


def micro_batches(lengths: list[int], size: int, groups: list[Any] | None = None,
                  rows: list[int] | None = None) -> list[list[int]]:
    """Episode indices grouped `size` at a time, longest first, so padding stays small.

    With `groups` (a GRPO group id per episode), episodes of one group stay together
    (groups longest first, then episodes longest first), so a micro-batch's rows share
    their prompt and `forward_logprobs` runs it once. With `rows`, only those indices
    are placed (the others belong to no micro-batch).
    """
    rows = list(range(len(lengths))) if rows is None else rows
    if groups is None:
        order = sorted(rows, key=lambda i: -lengths[i])
    else:
        first: dict[Any, int] = {}  # group -> index of first appearance (ids may be any hashable)
        longest: dict[Any, int] = {}
        for i in rows:
            first.setdefault(groups[i], i)
            longest[groups[i]] = max(longest.get(groups[i], 0), lengths[i])
        order = sorted(rows, key=lambda i: (-longest[groups[i]], first[groups[i]], -lengths[i]))
    return [order[i:i + size] for i in range(0, len(order), size)]


def forward_rows(lengths: list[int], loss_mask: torch.Tensor | None = None) -> list[int]:
    """The rows a forward pass needs: those with a token, and with `loss_mask` (B, T) only
    those with a trained token (an episode that failed before its first turn has none)."""
    keep = [i for i, n in enumerate(lengths) if n > 0]
    if loss_mask is not None:
        trained = loss_mask.bool().any(1).tolist()  # (B,)
        keep = [i for i in keep if trained[i]]
    return keep


def shared_prefix_length(input_ids: torch.Tensor, attention_mask: torch.Tensor,
                         loss_mask: torch.Tensor | None) -> int:
    """Length P of the prefix every row shares that no trained token's logits need.

    All rows hold the same ids at positions [0, P) (a GRPO group's prompt), and every
    trained token t sits at t >= P + 1, so the logits predicting it come from positions
    >= P. 0 when there is a single row or nothing is shared.
    """
    B, T = input_ids.shape  # (B, T)
    if B < 2 or loss_mask is None:
        return 0
    same = (input_ids == input_ids[:1]).all(0) & attention_mask.bool().all(0)  # (T,)
    common = int(same.long().cumprod(0).sum())
    trained = loss_mask.bool().any(0).nonzero()
    first = int(trained[0]) if trained.numel() else T
    return max(0, min(common, first - 1))


def positions_of(batch: Any, rows: list[int], T: int, device: torch.device) -> torch.Tensor | None:
    """`batch.position_ids[rows, :T]` on `device` when the batch has them (some episode holds
    several sequences), else None: what every forward over those rows passes on."""
    pos = batch.tensors.get("position_ids")
    return None if pos is None else pos[rows, :T].to(device)


def _sequence_inputs(model: nn.Module, attention_mask: torch.Tensor,
                     position_ids: torch.Tensor | None) -> dict[str, torch.Tensor]:
    """The attention mask (and position ids) a forward passes: the 2D mask as it is, or for
    rows holding several sequences the (b, 1, T, T) mask of `sequence_attention`."""
    if position_ids is None:
        return {"attention_mask": attention_mask}
    dtype = next(model.parameters()).dtype
    return {"attention_mask": sequence_attention(position_ids, attention_mask, getattr(model, "config", None), dtype),
            "position_ids": position_ids}


def _check_sources(position_ids: torch.Tensor | None, loss_mask: torch.Tensor | None) -> None:
    """A trained token must follow the token before it in its own sequence (see the module doc)."""
    if position_ids is None or loss_mask is None:
        return
    starts = position_ids[:, 1:] != position_ids[:, :-1] + 1  # (b, T-1): a sequence starts there
    if bool((starts & loss_mask[:, 1:].bool()).any()):
        raise ValueError("a trained token starts a new sequence (position_ids); a sequence must begin with "
                         "at least one prompt token")


def _model_logits(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                  keep: torch.Tensor, prefix: int, position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """Logits at positions `keep` (K,), in (B, K, V); a shared prefix of `prefix` tokens
    runs once (batch 1) and its KV is repeated for every row, gradients included. With
    `position_ids` (rows holding several sequences) the rows run whole with their mask."""
    if position_ids is not None:
        return model(input_ids=input_ids, logits_to_keep=keep,
                     **_sequence_inputs(model, attention_mask, position_ids)).logits
    if prefix == 0:
        return model(input_ids=input_ids, attention_mask=attention_mask, logits_to_keep=keep).logits
    B = input_ids.shape[0]
    with dense_head_input(model):
        head = model(input_ids=input_ids[:1, :prefix], attention_mask=attention_mask[:1, :prefix], use_cache=True,
                     logits_to_keep=1)
    cache = head.past_key_values
    cache.batch_repeat_interleave(B)  # (1, heads, P, d) -> (B, heads, P, d) per layer; backward sums rows
    return model(input_ids=input_ids[:, prefix:], attention_mask=attention_mask, past_key_values=cache,
                 use_cache=True, logits_to_keep=keep - prefix).logits


def _logprobs_and_entropy(logits: torch.Tensor, targets: torch.Tensor, with_entropy: bool,
                          entropy_grad: bool) -> tuple[torch.Tensor, torch.Tensor | None]:
    """logits (..., V) float, targets (...) -> logprob of each target (...) and entropy (...)."""
    logp_all = torch.log_softmax(logits, dim=-1)  # (..., V)
    logp = logp_all.gather(-1, targets[..., None]).squeeze(-1)
    if not with_entropy:
        return logp, None
    with contextlib.nullcontext() if entropy_grad else torch.no_grad():
        ent = -(logp_all.exp() * logp_all).sum(-1)  # -sum p log p, from the same log_softmax
    return logp, ent


def _n_params(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())


def forward_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                     with_entropy: bool = False, autocast: bool = False,
                     loss_mask: torch.Tensor | None = None, share_prefix: bool = True,
                     pack: bool = True, entropy_grad: bool = True,
                     allowed: AllowedTokens | None = None,
                     position_ids: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
    """Per-token logprobs (and entropies) of `input_ids` under `model`.

    `position_ids` (b, T): for rows that hold several sequences (`positions_of`); such a
    micro-batch runs padded with the `sequence_attention` mask (no packing, no shared prefix).

    With `loss_mask` (B, T), the LM head and softmax run only where tokens are trained
    (prompts and observations are skipped, which is most of a multi-turn episode);
    other positions hold 0. With `loss_mask`, two savings apply, each giving the same
    logprobs and gradients to float rounding:
      * `pack`: the rows run as one packed sequence without padding (`packing.py`),
        the shared prompt once, when that costs fewer FLOPs than the padded batch;
      * `share_prefix`: otherwise, the prefix all rows share (`shared_prefix_length`,
        a GRPO group's prompt) runs once and its KV is repeated for every row.
    `entropy_grad=False` computes the entropy without a gradient (a metric only).
    `allowed` (the rows' `AllowedTokens.select`): at constrained positions the logprobs and
    entropy are of the masked distribution the engine sampled from (`constrained.py`).
    On plain-head architectures (a bias-free linear head that is not a LoRA layer) without
    autocast, the logprobs come from the head's input a chunk of rows at a time
    (`head_logprobs.py`), never holding a float32 (K, V) tensor.

    Returns (logprobs (B, T), entropy (B, T) or None); position 0 is 0.
    """
    device_type = input_ids.device.type
    ctx = torch.autocast(device_type, dtype=torch.bfloat16) if autocast else contextlib.nullcontext()
    B, T = input_ids.shape
    _check_sources(position_ids, loss_mask)
    if position_ids is not None:
        share_prefix = pack = False  # the packing plans assume one sequence per row
    if loss_mask is not None:
        # (V, E): the model returns head inputs (not under masks: they need the logits)
        head_weight = None if autocast or allowed is not None else fused_head_weight(model)
        head_ctx = head_as_input(model) if head_weight is not None else contextlib.nullcontext()
        prefix = shared_prefix_length(input_ids, attention_mask, loss_mask) if share_prefix else 0
        config = getattr(model, "config", None)
        plan = (plan_packing(input_ids, attention_mask, loss_mask, prefix, config, _n_params(model))
                if pack else None)
        if plan is not None:
            dtype = next(model.parameters()).dtype
            with ctx, packed_attention(model, plan), head_ctx:
                logits = model(input_ids=plan.input_ids, position_ids=plan.position_ids,
                               attention_mask=plan.attention_mask(config, dtype),
                               logits_to_keep=plan.source).logits[0]  # (K, V), or (K, E) head inputs
            targets = plan.targets  # (K,)
            where = allowed.index.to(plan.rows.device)[plan.rows, plan.cols] if allowed is not None else None  # (K,)

            def place(v: torch.Tensor) -> torch.Tensor:  # (K,) -> (B, T)
                return torch.zeros(B, T, dtype=v.dtype, device=v.device).index_put((plan.rows, plan.cols), v)
        else:
            if getattr(model, "is_gradient_checkpointing", False) and torch.is_grad_enabled():
                prefix = 0  # checkpointed layers do not return a KV cache
            # Token t is predicted by the logits at position t-1.
            cols = loss_mask[:, 1:].bool().any(0).nonzero().squeeze(-1) + 1  # (K,) positions in 1..T-1
            with ctx, gqa_attention(model), head_ctx:
                logits = _model_logits(model, input_ids, attention_mask, cols - 1, prefix,
                                       position_ids)  # (B, K, V) or (B, K, E)
            targets = input_ids[:, cols]  # (B, K)
            where = allowed.index.to(cols.device)[:, cols] if allowed is not None else None  # (B, K)

            def place(v: torch.Tensor) -> torch.Tensor:  # (B, K) -> (B, T)
                return torch.zeros(B, T, dtype=v.dtype, device=v.device).index_copy(1, cols, v)
        if head_weight is not None:
            lp, e = head_logprobs(logits, head_weight, targets, with_entropy, entropy_grad)
        else:
            logits = logits.float()
            if where is not None:
                logits = mask_logits(logits, where, allowed.masks)
            lp, e = _logprobs_and_entropy(logits, targets, with_entropy, entropy_grad)
        return place(lp), (place(e) if e is not None else None)
    with ctx:
        logits = model(input_ids=input_ids, **_sequence_inputs(model, attention_mask, position_ids)).logits  # (B, T, V)
    logits = logits[:, :-1].float()  # (B, T-1, V): position t predicts token t+1
    if allowed is not None:
        logits = mask_logits(logits, allowed.index[:, 1:], allowed.masks)
    lp, e = _logprobs_and_entropy(logits, input_ids[:, 1:], with_entropy, entropy_grad)  # (B, T-1)
    logp = torch.cat([torch.zeros_like(lp[:, :1]), lp], dim=1)  # (B, T)
    ent = torch.cat([torch.zeros_like(e[:, :1]), e], dim=1) if e is not None else None  # (B, T)
    return logp, ent


@torch.no_grad()
def batch_logprobs(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                   lengths: list[int], micro_batch_size: int, autocast: bool = False,
                   loss_mask: torch.Tensor | None = None, groups: list[Any] | None = None,
                   allowed: AllowedTokens | None = None,
                   position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) logprobs for a whole batch, computed in length-sorted micro-batches
    (kept within `groups`, see `micro_batches`); masked at constrained positions with
    `allowed` (the batch's `constrained.allowed_tokens`); `position_ids` (B, T) for a batch
    whose episodes hold several sequences.

    With `loss_mask`, only positions of trained tokens are computed (others are 0), and
    rows without a trained token (a failed episode) are left out of every forward.
    """
    device = next(model.parameters()).device
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    for idx in micro_batches(lengths, micro_batch_size, groups, forward_rows(lengths, loss_mask)):
        T = max(lengths[i] for i in idx)
        ids = input_ids[idx, :T].to(device)  # (b, T)
        mask = attention_mask[idx, :T].to(device)
        lm = loss_mask[idx, :T].to(device) if loss_mask is not None else None
        sub = allowed.select(idx, T) if allowed is not None else None
        pos = position_ids[idx, :T].to(device) if position_ids is not None else None
        lp, _ = forward_logprobs(model, ids, mask, autocast=autocast, loss_mask=lm, allowed=sub,
                                 position_ids=pos)  # (b, T)
        if lm is not None:  # the forward fills every position trained in any row of the micro-batch
            lp = lp * lm
        out[idx, :T] = lp.float().cpu()
    return out


@torch.no_grad()
def batch_values(critic: Critic, input_ids: torch.Tensor, attention_mask: torch.Tensor,
                 lengths: list[int], micro_batch_size: int, loss_mask: torch.Tensor | None = None,
                 position_ids: torch.Tensor | None = None) -> torch.Tensor:
    """(B, T) critic values in length-sorted micro-batches; 0 on right padding (whatever
    micro-batch an episode fell in), as every other per-token field of a batch. Rows
    without a token (or, with `loss_mask`, without a trained token) stay 0 and are left
    out of every forward."""
    device = next(critic.parameters()).device
    out = torch.zeros(input_ids.shape, dtype=torch.float32)
    for idx in micro_batches(lengths, micro_batch_size, None, forward_rows(lengths, loss_mask)):
        T = max(lengths[i] for i in idx)
        pos = position_ids[idx, :T].to(device) if position_ids is not None else None
        v = critic(input_ids[idx, :T].to(device), attention_mask[idx, :T].to(device), pos)
        out[idx, :T] = v.float().cpu() * attention_mask[idx, :T]  # (b, T): padding of shorter episodes -> 0
    return out


def collect_params(*modules: Any) -> list[nn.Parameter]:
    return [p for m in modules for p in m.parameters() if p.requires_grad]
