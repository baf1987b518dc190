"""The update stage: PPO/GRPO actor epochs and the critic's value regression, as functions.

    plan = plan_update(batch, config.training, step)       # mini-batches as episode indices
    metrics = update_actor(policy.model, optimizer, batch, config.training, plan)
    metrics.update(update_critic(critic, critic_optimizer, batch, config.training, plan))

In one process this is exactly the loop `Trainer.update` ran (same randperm, same
micro-batches, same loss weights, same metric names), so the numbers are bit for bit
the same. The same functions run on each rank of a data-parallel learner group
(`workbench.distributed.learners`): the controller computes the plan once from the whole
batch, gives each rank whole GRPO groups (`split_groups`), and `shard_plan` restates the
plan in the rank's own rows. What keeps the distributed update equal to one process:

  * Loss weights use the GLOBAL counts of each mini-batch (trained tokens for
    `token-mean`, sequences for the `seq-mean-*` modes), so the sum over ranks of the
    rank gradients is the single-process gradient. The sharded model must therefore SUM
    gradients over ranks (FSDP2's default divides by the world size; the learners set
    the divide factor to 1).
  * Every rank runs the same number of forward/backward calls per optimizer step (the
    FSDP collectives pair up): a rank with fewer micro-batches runs zero-weight ones
    (`MiniBatch.micro_steps`), and the shared-prompt KV path (two forwards) is off.
  * Gradient clipping uses the global norm (FSDP2's `clip_grad_norm_` over DTensors);
    a non-finite loss or norm on any rank skips the step on every rank.
  * Metrics are weighted sums all-reduced over ranks: the numbers one process computes,
    to float rounding, for every metric that is a token or sequence mean. A token-fraction
    metric (`actor/pg_clipfrac`, `actor/pg_clipfrac_lower`, `actor/ppo_kl`) under a
    `seq-mean-*` mode is a sequence-weighted average of micro-batch token means, so it
    depends on how rows fall into micro-batches (in one process too, with another
    micro_batch_size) and differs between 1 and N ranks.

Simplified: in a group, a rank that meets a non-finite loss still runs its remaining
forward/backward calls (collectives must pair; the gradients are discarded with the
skipped step) without recording them, so that step's metrics cover what each rank ran
before; a non-finite critic loss in a group backpropagates zero (one process skips it).
Shapes: B batch, T tokens.
"""
from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field, replace
from typing import Any, Sequence

import torch
import torch.distributed as dist

from workbench import algo
from workbench.config import TrainingConfig
from workbench.training.constrained import allowed_tokens, has_constraints, model_vocab_size
from workbench.training.guards import all_finite, guarded_step
from workbench.training.policy import forward_logprobs, micro_batches, positions_of
from workbench.trajectory import TrajectoryBatch

Pairs = dict[str, list[tuple[float, float]]]


@dataclass
class MiniBatch:
    """One optimizer step of the actor."""

    rows: list[int]
    """Episode indices of this step in randperm order (this rank's rows after `shard_plan`)."""
    tokens: float
    """Trained tokens in the WHOLE mini-batch (at least 1): the token-mean denominator."""
    sequences: int
    """Episodes in the WHOLE mini-batch: the seq-mean denominator."""
    micro_steps: int = 0
    """Forward/backward calls every rank runs (zero-weight ones pad); 0: just this rank's own."""


@dataclass
class UpdatePlan:
    """The update of one batch, computed once from the whole batch."""

    mini_batches: list[MiniBatch]
    """Optimizer steps of all PPO epochs, in order."""
    seq_len: int
    """T of the whole batch (`seq-mean-token-sum-norm` divides by it)."""
    critic_epochs: int
    """Critic optimizer steps (one per PPO epoch, over the whole batch)."""
    critic_rows: list[int]
    """Rows the critic trains on (all rows, or this rank's)."""
    critic_tokens: float
    """Trained tokens of the whole batch (at least 1): the critic's token-mean denominator."""
    critic_micro_steps: int = 0
    """Critic forward/backward calls per epoch every rank runs; 0: this rank's own."""
    distributed: bool = field(default=False)
    """True on a rank of a learner group (collectives run; no shared-prompt KV path)."""


def lengths_of(batch: TrajectoryBatch) -> list[int]:
    """Tokens of each episode (the unpadded row lengths)."""
    return [ep.num_tokens for ep in batch]


class NothingToTrainError(RuntimeError):
    """No episode of a batch has a sampled token (every one failed before its first turn)."""


def _errors_listed(episodes: Sequence[Any]) -> str:
    """'episodes [ids]: error; ...' for `episodes`, grouped by error text (at most 5 errors)."""
    errors: dict[str, list[Any]] = {}
    for ep in episodes:
        errors.setdefault(ep.error or "no error recorded (no turn was sampled)", []).append(ep.episode_id)
    return "; ".join(f"episodes {ids[:8]}{'...' if len(ids) > 8 else ''}: {err}" for err, ids in
                     list(errors.items())[:5])


def require_trained_tokens(batch: TrajectoryBatch) -> None:
    """Raise `NothingToTrainError` naming the episodes' errors when no episode of `batch`
    has a token to train on (e.g. every reset raised, every episode ended in an environment
    error), instead of a shape error deep inside a forward pass."""
    if len(batch.untrained_rows()) < len(batch):
        return
    judged = [ep for ep in batch.episodes if ep.reward_error and ep.response_length and not ep.environment_error]
    if judged:
        raise NothingToTrainError(f"no episode of this batch of {len(batch)} could be trained on: "
                                  f"{len(judged)} could not be scored (reward/judge_failed; first: "
                                  f"{judged[0].reward_error}), the others failed as the rollout recorded. Check "
                                  "the judge (reward.judge / group_judge / reward_model): its server, its replies "
                                  "and reward.judge_timeout_s")
    if any(ep.response_length for ep in batch.episodes):
        raise NothingToTrainError(f"all {len(batch)} episodes of this batch ended in an environment error, so there "
                                  f"is nothing to train on: {_errors_listed(batch.episodes)}. Fix the environment "
                                  "(try it with workbench.check_env or one Rollout in a notebook cell)")
    raise NothingToTrainError(f"all {len(batch)} episodes of this batch ended before the model took a turn, so "
                              f"there is nothing to train on: {_errors_listed(batch.episodes)}. Fix the "
                              "environment (try it with workbench.check_env or one Rollout in a notebook cell)")


def failed_episodes_line(batch: TrajectoryBatch) -> str:
    """One line per reason naming the episodes of `batch` the update leaves out
    (`TrajectoryBatch.untrained_rows`): those that failed before the model took a turn, those
    that ended in an environment error (their share and first error), and those whose judgment
    failed (`Episode.reward_error`); "" when none."""
    rows = batch.untrained_rows()
    if not rows:
        return ""
    step = batch.meta.get("step")
    where = f"step {step}: " if step is not None else ""
    before = [batch[i] for i in rows if not batch[i].response_length]
    env = [batch[i] for i in rows if batch[i].response_length and batch[i].environment_error]
    unscored = [batch[i] for i in rows if batch[i].response_length and not batch[i].environment_error]
    lines = []
    if before:
        lines.append(f"{where}{len(before)} of {len(batch)} episodes failed before the model took a turn and are "
                     f"left out of the update (counted in rollout/failed_episodes): {_errors_listed(before)}")
    if env:
        ids = [e.episode_id for e in env]
        lines.append(f"{where}{len(env)} of {len(batch)} episodes ({len(env) / len(batch):.0%}) ended in an "
                     f"environment error and are left out of the update, not trained as their reward "
                     f"(env/environment_error_rate, counted in rollout/failed_episodes); first error: {env[0].environment_error}; episodes "
                     f"{ids[:8]}{'...' if len(ids) > 8 else ''}")
    if unscored:  # a failed judgment (Episode.reward_error): no score, so no reward of 0 either
        ids = [e.episode_id for e in unscored]
        lines.append(f"{where}{len(unscored)} of {len(batch)} episodes could not be scored by their judge and are "
                     f"left out of the update (reward/judge_failed); first: {unscored[0].reward_error}; episodes "
                     f"{ids[:8]}{'...' if len(ids) > 8 else ''}")
    return "\n".join(lines)


def is_on_policy(t: TrainingConfig) -> bool:
    """One PPO epoch and one mini-batch: the single step is on the weights that sampled."""
    return t.ppo_epochs == 1 and (t.mini_batch_size is None or t.mini_batch_size >= t.batch_size)


def plan_update(batch: TrajectoryBatch, t: TrainingConfig, step: int) -> UpdatePlan:
    """Mini-batches of every epoch (the trainer's randperm, seeded by `t.seed` and `step`)."""
    B, T = batch.input_ids.shape  # (B, T)
    gen = torch.Generator().manual_seed(t.seed * 1_000_033 + step)
    mb = t.mini_batch_size or B
    untrained = set(batch.untrained_rows())  # failed episodes: in no mini-batch, no forward
    minis = []
    for _ in range(t.ppo_epochs):
        perm = torch.randperm(B, generator=gen).tolist()
        for s in range(0, B, mb):
            rows = [i for i in perm[s:s + mb] if i not in untrained]
            if rows:
                minis.append(MiniBatch(rows, float(batch.loss_mask[rows].sum().clamp(min=1)), len(rows)))
    trained = [i for i in range(B) if i not in untrained]
    return UpdatePlan(minis, T, t.ppo_epochs if trained else 0, trained,
                      float(batch.loss_mask[trained].sum().clamp(min=1)))


def split_groups(batch: TrajectoryBatch, n: int) -> list[list[int]]:
    """Rows of each of `n` ranks: whole groups (`batch.group_ids`), balanced by tokens
    (largest group first to the rank holding fewest tokens); each rank's rows ascending."""
    groups: dict[Any, list[int]] = {}
    for i, g in enumerate(batch.group_ids):
        groups.setdefault(g, []).append(i)
    if len(groups) < n:
        raise ValueError(f"{len(groups)} episode groups cannot be split over {n} learners; "
                         "raise training.batch_size / group_size or use fewer learners")
    lengths = lengths_of(batch)
    load = [0] * n
    shards: list[list[int]] = [[] for _ in range(n)]
    order = sorted(groups.values(), key=lambda rows: (-sum(lengths[i] for i in rows), rows[0]))
    for rows in order:
        r = min(range(n), key=lambda k: (load[k], k))
        shards[r].extend(rows)
        load[r] += sum(lengths[i] for i in rows)
    return [sorted(s) for s in shards]


def _micro(batch_lengths: list[int], groups: list[Any], rows: list[int], size: int,
           keep_groups: bool) -> list[list[int]]:
    """Micro-batches of `rows` (episode indices) as the update loops form them."""
    parts = micro_batches([batch_lengths[i] for i in rows], size,
                          [groups[i] for i in rows] if keep_groups else None)
    return [[rows[j] for j in part] for part in parts]


def shard_plan(plan: UpdatePlan, batch: TrajectoryBatch, shards: Sequence[Sequence[int]],
               t: TrainingConfig) -> list[UpdatePlan]:
    """Per rank: the plan restated in the rank's own rows (its sub-batch `batch.rows(shards[r])`
    numbers them 0..), global denominators kept, micro steps padded to the busiest rank."""
    lengths, groups = lengths_of(batch), batch.group_ids
    local = [{g: i for i, g in enumerate(s)} for s in shards]
    out = []
    for r, owned in enumerate(local):
        minis = [replace(m, rows=[owned[i] for i in m.rows if i in owned]) for m in plan.mini_batches]
        critic_rows = sorted(owned[i] for i in plan.critic_rows if i in owned)
        out.append(replace(plan, mini_batches=minis, critic_rows=critic_rows, distributed=True))
    for k, m in enumerate(plan.mini_batches):
        steps = max(len(_micro(lengths, groups, [i for i in m.rows if i in own], t.micro_batch_size, True))
                    for own in local)
        for p in out:
            p.mini_batches[k].micro_steps = steps
    critic_steps = max(len(_micro(lengths, groups, sorted(i for i in own if i in set(plan.critic_rows)),
                                  t.micro_batch_size, False)) for own in local)
    for p in out:
        p.critic_micro_steps = critic_steps
    return out


def rows_of(batch: TrajectoryBatch, rows: Sequence[int]) -> TrajectoryBatch:
    """A sub-batch of `rows` keeping the full width T (unlike `TrajectoryBatch.select`)."""
    idx = torch.tensor(list(rows), dtype=torch.long)
    sub = TrajectoryBatch([batch[i] for i in rows], {k: v.index_select(0, idx) for k, v in batch.tensors.items()})
    sub.meta = dict(batch.meta)
    return sub


def kl_estimator(t: TrainingConfig) -> str:
    """The KL estimator behind the batch's `kl` view: the one the run trains with (the KL
    loss's `kl_loss_type` when only the KL loss is on, else the reward penalty's `kl_penalty`)."""
    return t.kl_loss_type if t.use_kl_loss and not t.use_kl_in_reward else t.kl_penalty


def set_kl(batch: TrajectoryBatch, t: TrainingConfig) -> None:
    """`kl` (B, T) = per-token KL(old policy || reference) on trained tokens, by `kl_estimator(t)`,
    recorded in `batch.meta["kl_estimator"]` so views can say which estimate they show."""
    name = kl_estimator(t)
    batch.set("kl", algo.kl_penalty(batch.old_logprobs, batch.ref_logprobs, name) * batch.loss_mask)
    batch.meta["kl_estimator"] = name


def set_actor_fields(batch: TrajectoryBatch, new_lp: torch.Tensor, ent: torch.Tensor, old_from_update: bool,
                     t: TrainingConfig) -> None:
    """new_logprobs, ratio, entropy (and old_logprobs / kl when the update supplied them)."""
    mask = batch.loss_mask  # (B, T)
    if old_from_update:
        batch.set("old_logprobs", new_lp * mask)
        if batch.has("ref_logprobs"):
            set_kl(batch, t)
    batch.set("new_logprobs", new_lp * mask)
    batch.set("ratio", torch.exp(new_lp - batch.old_logprobs) * mask)
    batch.set("entropy", ent * mask)


def rollout_is_level(t: TrainingConfig) -> str | None:
    """The off-policy correction the update applies (`training.rollout_is`, "auto" resolved:
    "token" when `training.max_staleness` >= 1, else None): "token", "sequence" or None."""
    if t.rollout_is == "auto":
        return "token" if t.max_staleness >= 1 else None
    return t.rollout_is


def rollout_logprob_diff(batch: TrajectoryBatch) -> tuple[float, float] | None:
    """(mean |old logprob - engine logprob|, token count) over the trained tokens the
    engine returned a logprob for (`rollout_logprobs`, 0 where it gave none); None when
    there are none. The trainer's old logprobs and the sampling engine's should agree:
    to ~1e-6 in fp32, to bf16 rounding (a few hundredths) in bf16. A larger gap means the
    engine sampled from other weights than the trainer holds, or computed them another
    way, and the PPO ratio's "old" policy is not the one that sampled."""
    gap = batch.engine_logprob_gap()
    if gap is None:
        return None
    diff, mask = gap  # (B, T) each
    n = int(mask.sum())
    if n == 0:
        return None
    return float(diff.sum() / n), float(n)


def weighted_mean(pairs: list[tuple[float, float]]) -> float:
    total = sum(w for _, w in pairs)
    if not pairs or total == 0:
        return float("nan") if not pairs else sum(v for v, _ in pairs) / len(pairs)
    return sum(v * w for v, w in pairs) / total


def reduce_metrics(acc: Pairs, distributed: bool) -> dict[str, float]:
    """`weighted_mean` per key; in a group over the pairs of every rank (one all_reduce)."""
    if not distributed:
        return {k: weighted_mean(v) for k, v in acc.items()}
    keys: list[list[str]] = [[] for _ in range(dist.get_world_size())]
    dist.all_gather_object(keys, sorted(acc))
    names = sorted({k for ks in keys for k in ks})
    # Per key: sum v*w, sum w, sum v, count (the last two for weightless keys).
    sums = torch.tensor([[sum(v * w for v, w in acc.get(k, [])), sum(w for _, w in acc.get(k, [])),
                          sum(v for v, _ in acc.get(k, [])), float(len(acc.get(k, [])))] for k in names],
                        dtype=torch.float64).reshape(len(names), 4)  # (K, 4)
    sums = sums.to(_comm_device())
    dist.all_reduce(sums)
    out = {}
    for k, (vw, w, v, n) in zip(names, sums.tolist()):
        out[k] = float("nan") if n == 0 else (v / n if w == 0 else vw / w)
    return out


def _comm_device() -> torch.device:
    """Where the group's collectives take tensors (NCCL: the current GPU; gloo: CPU)."""
    return torch.device("cuda", torch.cuda.current_device()) if dist.get_backend() == "nccl" else torch.device("cpu")


def _all_ranks(flag: bool, distributed: bool) -> bool:
    """True when `flag` holds on every rank."""
    if not distributed:
        return flag
    t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=_comm_device())
    dist.all_reduce(t, op=dist.ReduceOp.MIN)
    return bool(t.item())


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t


def _full(t: torch.Tensor) -> torch.Tensor:
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _guarded_step(optimizer: torch.optim.Optimizer, params: list[torch.Tensor], distributed: bool) -> bool:
    """`guarded_step`; in a group each rank checks its shards and all agree to keep or undo."""
    if not distributed:
        return guarded_step(optimizer, params)
    return guarded_step(optimizer, params, finite=lambda ps: _all_ranks(all_finite([_local(p) for p in ps]), True))


def zero_weight_inputs(batch: TrajectoryBatch, lengths: list[int],
                device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(ids, attention, loss mask), each (1, T): the input of zero-weight micro-batches, the
    shortest row with a trained token. A rank whose rows all failed (no trained token, maybe
    no token at all) forwards two tokens of id 0 instead, the second one marked trained so
    the forward runs the same modules; its loss is multiplied by 0 like any padding."""
    trained = batch.loss_mask[:, 1:].sum(1) > 0 if len(batch) else torch.zeros(0, dtype=torch.bool)  # (B,)
    rows = [i for i in range(len(lengths)) if trained[i]]
    if not rows:
        ids = torch.zeros(1, 2, dtype=torch.long, device=device)  # (1, 2)
        return ids, torch.ones_like(ids), torch.tensor([[0, 1]], device=device)
    row = min(rows, key=lambda i: (lengths[i], i))
    T = lengths[row]
    return (batch.input_ids[[row], :T].to(device), batch.attention_mask[[row], :T].to(device),
            batch.loss_mask[[row], :T].to(device))


def update_actor(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrajectoryBatch,
                 t: TrainingConfig, plan: UpdatePlan, tokenizer: Any = None) -> dict[str, float]:
    """PPO epochs over the plan's mini-batches (gradient accumulation over micro-batches).

    Turns sampled under a constraint are scored under its masks (`constrained.py`), which
    needs the policy's `tokenizer` (a ValueError without it when the batch has such turns).

    Sets `new_logprobs`, `ratio`, `entropy` on `batch` (and `old_logprobs`/`kl` when the batch
    had no old logprobs and the update is on-policy) and returns the `actor/...` metrics.
    """
    batch.require("advantages")
    # No old_logprobs yet (train_step with reuse_update_logprobs): this forward's own
    # logprobs, detached, are the old ones (ratio 1 at the single optimizer step).
    old_from_update = not batch.has("old_logprobs")
    if old_from_update and not is_on_policy(t):
        batch.require("old_logprobs")
    if t.use_kl_loss:
        batch.require("ref_logprobs")
    allowed = None
    if has_constraints(batch):
        if tokenizer is None:
            raise ValueError("update_actor: the batch has turns sampled under a constraint; pass the policy's "
                             "tokenizer so their logprobs are of the same masked distribution")
        allowed = allowed_tokens(batch, tokenizer, model_vocab_size(model))
    model.train()
    lengths = lengths_of(batch)
    groups = batch.group_ids  # micro-batches keep a group (and its shared prompt) together
    B, T_full = batch.input_ids.shape  # (B, T)
    T_plan = plan.seq_len
    shared = not plan.distributed  # two forwards per micro-batch would unpair FSDP collectives
    loss_fn = algo.get_policy_loss_fn(t.policy_loss)
    acc: Pairs = defaultdict(list)
    new_lp = torch.zeros(B, T_full)
    ent_store = torch.zeros(B, T_full)
    is_level = rollout_is_level(t) if batch.has("rollout_logprobs") else None
    is_store = torch.zeros(B, T_full) if is_level else None  # (B, T) rollout_is_weights
    skipped = restored = 0
    params = [p for p in model.parameters() if p.requires_grad]
    device = next(model.parameters()).device
    for mini in plan.mini_batches:
        optimizer.zero_grad(set_to_none=True)
        finite = True
        parts = _micro(lengths, groups, mini.rows, t.micro_batch_size, True)
        parts += [[]] * max(0, mini.micro_steps - len(parts))  # zero-weight padding
        for idx in parts:
            if not idx:  # zero-weight padding: the forward/backward pairs the group's collectives
                ids, attn, mask = zero_weight_inputs(batch, lengths, device)  # (1, T) each
                logp, _ = forward_logprobs(model, ids, attn, with_entropy=True, autocast=t.autocast_bf16,
                                           loss_mask=mask, entropy_grad=bool(t.entropy_coeff), share_prefix=shared)
                (logp.sum() * 0.0).backward()
                continue
            # seq-mean-token-sum-norm divides by T, so keep the full T there.
            T = T_plan if t.loss_agg_mode == "seq-mean-token-sum-norm" else max(lengths[i] for i in idx)
            ids = batch.input_ids[idx, :T].to(device)  # (b, T)
            attn = batch.attention_mask[idx, :T].to(device)
            mask = batch.loss_mask[idx, :T].to(device)
            logp, ent = forward_logprobs(model, ids, attn, with_entropy=True, autocast=t.autocast_bf16,
                                         loss_mask=mask, entropy_grad=bool(t.entropy_coeff), share_prefix=shared,
                                         allowed=allowed.select(idx, T) if allowed is not None else None,
                                         position_ids=positions_of(batch, idx, T, device))
            old = logp.detach() if old_from_update else batch.old_logprobs[idx, :T].to(device)
            advantages = batch.advantages[idx, :T].to(device)  # (b, T)
            is_m: dict[str, float] = {}
            if is_level:  # truncated IS against the engine's logprobs: the policy losses are positively
                # homogeneous in the advantage, so weighting each token's loss is weighting its advantage
                w, is_m = algo.rollout_is_weights(old.float().cpu(), batch.rollout_logprobs[idx, :T], mask.cpu(),
                                                  is_level, t.rollout_is_threshold)  # (b, T)
                advantages = advantages * w.to(device=device, dtype=advantages.dtype)
                is_store[idx, :T] = w
            loss, m = loss_fn(
                old_log_probs=old, log_probs=logp,
                advantages=advantages, response_mask=mask,
                clip_ratio=t.clip_ratio, clip_ratio_low=t.clip_ratio_low, clip_ratio_high=t.clip_ratio_high,
                clip_ratio_c=t.clip_ratio_c, loss_agg_mode=t.loss_agg_mode)
            entropy = algo.agg_loss(ent, mask, t.loss_agg_mode)
            if t.entropy_coeff:
                loss = loss - t.entropy_coeff * entropy
            if t.use_kl_loss:
                kl = algo.kl_penalty(logp, batch.ref_logprobs[idx, :T].to(device), t.kl_loss_type)
                kl_loss = algo.agg_loss(kl, mask, t.loss_agg_mode)
                loss = loss + t.kl_loss_coef * kl_loss
                m["actor/kl_loss"] = float(kl_loss.detach())
            # Weight so the accumulated gradient (summed over ranks) equals the mini-batch loss's gradient.
            weight = (float(mask.sum()) / mini.tokens if t.loss_agg_mode == "token-mean"
                      else len(idx) / mini.sequences)
            if not torch.isfinite(loss):
                finite = False
                if not plan.distributed:
                    break
            (loss * weight).backward()
            if not finite:
                continue
            m["actor/entropy"] = float(entropy.detach())
            for k, v in m.items():
                acc[k].append((v, weight))
            tokens = is_m.pop("rollout_corr/tokens", 0.0)
            for k, v in is_m.items():  # token shares and means: weighted by the tokens they cover
                acc[k].append((v, tokens))
            new_lp[idx, :T] = logp.detach().float().cpu()
            ent_store[idx, :T] = ent.detach().float().cpu()
        finite = _all_ranks(finite, plan.distributed)
        grad_norm = _full(torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm)) if finite \
            else torch.tensor(float("nan"))
        if not finite or not torch.isfinite(grad_norm):
            optimizer.zero_grad(set_to_none=True)  # weights untouched
            skipped += 1
            continue
        if not _guarded_step(optimizer, params, plan.distributed):
            restored += 1  # the step made weights non-finite: put back, skip
            skipped += 1
            optimizer.zero_grad(set_to_none=True)
            continue
        acc["actor/grad_norm"].append((float(grad_norm), 1.0))
    set_actor_fields(batch, new_lp, ent_store, old_from_update, t)
    if is_store is not None:
        batch.set("rollout_is_weights", is_store)
    diff = rollout_logprob_diff(batch)
    if diff is not None:
        acc["actor/rollout_logprob_diff"].append(diff)
    metrics = reduce_metrics(acc, plan.distributed)
    metrics["actor/skipped_updates"] = float(skipped)
    metrics["actor/nonfinite_weight_restores"] = float(restored)
    if skipped:
        metrics["actor/skipped_reason"] = (  # type: ignore[assignment]
            "non-finite weights after the optimizer step (restored)" if restored == skipped
            else "non-finite loss or gradient")
    return metrics


def update_critic(critic: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrajectoryBatch,
                  t: TrainingConfig, plan: UpdatePlan) -> dict[str, float]:
    """One optimizer step per PPO epoch on the clipped value loss (token-mean over the batch)."""
    batch.require("values", "returns")
    critic.train()
    device = next(critic.parameters()).device
    lengths = lengths_of(batch)
    acc: Pairs = defaultdict(list)
    params = [p for p in critic.parameters() if p.requires_grad]
    for _ in range(plan.critic_epochs):
        optimizer.zero_grad(set_to_none=True)
        parts = _micro(lengths, batch.group_ids, plan.critic_rows, t.micro_batch_size, False)
        parts += [[]] * max(0, plan.critic_micro_steps - len(parts))  # zero-weight padding
        for idx in parts:
            if not idx:  # zero-weight padding (see update_actor)
                ids, attn, _ = zero_weight_inputs(batch, lengths, device)  # (1, T) each
                (critic(ids, attn).sum() * 0.0).backward()
                continue
            T = max(lengths[i] for i in idx)
            mask = batch.loss_mask[idx, :T].to(device)  # (b, T)
            v = critic(batch.input_ids[idx, :T].to(device), batch.attention_mask[idx, :T].to(device),
                       positions_of(batch, idx, T, device))
            loss, m = algo.compute_value_loss(
                vpreds=v, returns=batch.returns[idx, :T].to(device), old_values=batch.values[idx, :T].to(device),
                response_mask=mask, cliprange_value=t.cliprange_value, loss_agg_mode="token-mean")
            weight = float(mask.sum()) / plan.critic_tokens
            if torch.isfinite(loss):
                (loss * weight).backward()
            elif plan.distributed:
                (v.sum() * 0.0).backward()  # keep the collectives paired; no gradient
            for k, val in m.items():
                acc[k].append((val, weight))
        norm = _full(torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm))
        if torch.isfinite(norm) and not _guarded_step(optimizer, params, plan.distributed):
            acc["critic/nonfinite_weight_restores"].append((1.0, 1.0))
        optimizer.zero_grad(set_to_none=True)
    critic.eval()
    return reduce_metrics(acc, plan.distributed)
