"""Data-parallel learners: Ray actors forming one torch.distributed group with FSDP2.

    group = LearnerGroup(config, num_learners=2)     # N actors, one process group
    group.load_state_dict(trainer_state)             # optional: start from given weights
    metrics = group.update(batch, step=trainer.global_step)
    weights = group.state_dict()["policy"]           # full trainable weights (rank 0 gathers)
    group.shutdown()

Each actor builds the policy (and the critic for `adv_estimator="gae"`) from the config
as `Trainer` does, joins the group (gloo on CPU, nccl on CUDA; rank 0 picks a free port
on 127.0.0.1 and the controller passes it to every rank through Ray), makes the trained
weights equal to rank 0's (one broadcast: LoRA adapters are randomly initialised), and
shards every decoder layer and then the whole model with `fully_shard` (FSDP2), peft
LoRA wrappers included (the frozen base weights are sharded too; only trained weights
get gradients). Gradients are SUMMED over ranks (`set_gradient_divide_factor(1.0)` with
`set_force_sum_reduction_for_comms(True)`, a plain SUM reduce-scatter that gloo supports):
the loss weights of `workbench.training.update` already divide by the global token or
sequence count, so the sum is the single-process gradient.

The controller (`LearnerGroup.update`) computes the update plan once from the whole
batch (`plan_update`: the trainer's randperm mini-batches), splits the batch by whole
GRPO groups (`split_groups`, balanced by tokens), and sends each rank only its rows
(full width T) and its share of the plan (`shard_plan`); it then puts the ranks'
new logprobs and entropies back into the whole batch.

Optimizer state travels apart from weights: `load_state_dict` starts fresh AdamW
moments, `optimizer_state()` / `load_optimizer_state()` gather and set the full states
keyed by parameter name (the controller does this around checkpoints).

Placement: each rank runs in its own bundle of a Ray placement group reserved before any
actor starts (`workbench.distributed.placement`); a rank that dies while starting or
fails while building its model is an `ActorStartError` naming the rank and the cause.

Simplified: learners hold no reference model (reference logprobs come from the
controller's `Trainer.compute_logprobs`); one learner per GPU, no tensor parallelism.
"""
from __future__ import annotations

import copy
import os
import socket
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
import torch.nn as nn

from workbench.config import ConfigError, ConfigStore, TrainingConfig
from workbench.distributed.placement import Placement, require_ray, reserve, start_error, wait_started
from workbench.training.models import build_models, build_optimizers
from workbench.training.constrained import allowed_tokens, model_vocab_size
from workbench.training.policy import Critic, Policy, forward_logprobs, forward_rows, micro_batches, positions_of
from workbench.training.update import (
    UpdatePlan, lengths_of, plan_update, rollout_is_level, rollout_logprob_diff, rows_of, set_actor_fields, shard_plan,
    split_groups,
    update_actor, update_critic, zero_weight_inputs,
)
from workbench.trajectory import TrajectoryBatch

#: Tensor fields a learner reads (the rest of the batch stays with the controller).
LEARNER_FIELDS = ("input_ids", "attention_mask", "position_ids", "loss_mask", "advantages", "old_logprobs", "ref_logprobs",
                  "values", "returns")
#: Names of the `nn.ModuleList`s holding a model's blocks (each block becomes one FSDP unit).
LAYER_LIST_NAMES = ("layers", "h", "blocks")


def shard_model(module: nn.Module, mesh: Any) -> nn.Module:
    """`fully_shard` each block (the ModuleLists named in `LAYER_LIST_NAMES`), then the
    whole module; gradients are summed over ranks, not averaged."""
    from torch.distributed.fsdp import FSDPModule, fully_shard

    for name, child in list(module.named_modules()):
        if isinstance(child, nn.ModuleList) and name.rsplit(".", 1)[-1] in LAYER_LIST_NAMES:
            for block in child:
                fully_shard(block, mesh=mesh)
    fully_shard(module, mesh=mesh)
    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.set_gradient_divide_factor(1.0)
            m.set_force_sum_reduction_for_comms(True)  # plain SUM (gloo has no PREMUL_SUM)
    return module


def reshard(module: nn.Module) -> None:
    """Put every FSDP unit back to its shard. The root unit stays gathered after a forward
    (FSDP2 expects the backward to need it), so a no-grad forward leaves it gathered."""
    from torch.distributed.fsdp import FSDPModule

    for m in module.modules():
        if isinstance(m, FSDPModule):
            m.reshard()


def trained_names(module: nn.Module) -> list[str]:
    """Names of the trained parameters, in the order the trainer's optimizer holds them."""
    return [n for n, p in module.named_parameters() if p.requires_grad]


def optimizer_pairs(owner: Any) -> list[tuple[str, nn.Module, torch.optim.Optimizer]]:
    """(checkpoint name, module, its optimizer) for the policy and, if there is one, the
    critic of a `Trainer` or `LearnerWorker` (both hold policy, critic and their optimizers)."""
    pairs = [("optimizer", owner.policy.model, owner.optimizer)]
    if owner.critic is not None:
        pairs.append(("critic_optimizer", owner.critic, owner.critic_optimizer))
    return pairs


class LearnerWorker:
    """One rank of the group (run as a Ray actor by `LearnerGroup`)."""

    def __init__(self, config: ConfigStore, rank: int, world_size: int, num_threads: int | None = None):
        if num_threads:
            torch.set_num_threads(num_threads)
        # The critic returns values.squeeze(-1), a view; nothing modifies it in place.
        warnings.filterwarnings("ignore", message="FSDP2-wrapped module .*Critic.* returned a view tensor")
        self.config, self.rank, self.world_size = config, rank, world_size
        self.policy: Policy | None = None
        self.critic: Critic | None = None

    def free_address(self) -> tuple[str, int]:
        """127.0.0.1 and a free port (rank 0's rendezvous)."""
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            return "127.0.0.1", s.getsockname()[1]

    def setup(self, host: str, port: int) -> str:
        """Join the group, build and shard the models, build the optimizers."""
        from torch.distributed.device_mesh import init_device_mesh

        cfg = self.config
        device = cfg.model.resolved_device()
        backend = "nccl" if device.type == "cuda" else "gloo"
        if device.type == "cuda":  # "cuda" names no index: the actor's own GPU (Ray sets CUDA_VISIBLE_DEVICES)
            torch.cuda.set_device(device if device.index is not None else torch.device("cuda", 0))
        dist.init_process_group(backend, init_method=f"tcp://{host}:{port}", rank=self.rank,
                                world_size=self.world_size)
        # Reference logprobs come from the controller; optimizers are built after sharding.
        models = build_models(cfg, with_reference=False, with_optimizers=False)
        self.policy, self.critic = models.policy, models.critic
        mesh = init_device_mesh(device.type, (self.world_size,))
        for module in self._modules():
            with torch.no_grad():
                for p in module.parameters():
                    if p.requires_grad:
                        dist.broadcast(p.data, src=0)
            shard_model(module, mesh)
        self._build_optimizers()
        return backend

    def _modules(self) -> list[nn.Module]:
        assert self.policy is not None
        return [self.policy.model] + ([self.critic] if self.critic is not None else [])

    def _build_optimizers(self) -> None:
        self.optimizer, self.critic_optimizer = build_optimizers(self.config, self.policy.model, self.critic)

    def update(self, batch: TrajectoryBatch, plan: UpdatePlan, t: TrainingConfig
               ) -> tuple[dict[str, float], dict[str, torch.Tensor]]:
        """This rank's share of the update: metrics (equal on every rank) and its rows'
        new_logprobs and entropy."""
        model = self.policy.model
        metrics = update_actor(model, self.optimizer, batch, t, plan, self.policy.tokenizer)
        if self.critic is not None and t.adv_estimator == "gae":
            metrics.update(update_critic(self.critic, self.critic_optimizer, batch, t, plan))
        model.eval()
        return metrics, {k: batch.tensors[k] for k in ("new_logprobs", "entropy", "rollout_is_weights")
                         if k in batch.tensors}

    @torch.no_grad()
    def log_probs(self, batch: TrajectoryBatch, micro_steps: int) -> torch.Tensor:
        """(b, T) logprobs of this rank's rows (trained positions only, others 0)."""
        t = self.config.training
        model = self.policy.model
        model.eval()
        device = next(model.parameters()).device
        lengths = lengths_of(batch)
        allowed = allowed_tokens(batch, self.policy.tokenizer, model_vocab_size(model))  # constrained turns' masks
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # (b, T)
        parts = micro_batches(lengths, t.micro_batch_size, batch.group_ids, forward_rows(lengths, batch.loss_mask))
        for idx in parts + [[]] * (micro_steps - len(parts)):
            if not idx:  # padding: a forward whose result is dropped (FSDP collectives pair up)
                ids, attn, mask = zero_weight_inputs(batch, lengths, device)  # (1, T) each
                forward_logprobs(model, ids, attn, autocast=t.autocast_bf16, loss_mask=mask, share_prefix=False)
                continue
            T = max(lengths[i] for i in idx)
            mask = batch.loss_mask[idx, :T].to(device)  # (b, T)
            lp, _ = forward_logprobs(model, batch.input_ids[idx, :T].to(device),
                                     batch.attention_mask[idx, :T].to(device), autocast=t.autocast_bf16,
                                     loss_mask=mask, share_prefix=False,
                                     allowed=allowed.select(idx, T) if allowed is not None else None,
                                     position_ids=positions_of(batch, idx, T, device))
            out[idx, :T] = (lp * mask).float().cpu()  # the forward fills positions trained in any row: mask them
        reshard(model)
        return out

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]] | None:
        """Full trained weights per model (gathered on rank 0; None on other ranks)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

        out = {}
        for name, module in zip(("policy", "critic"), self._modules()):
            reshard(module)
            # frozen weights (a LoRA policy's base) are left out before the gather, not after it
            full = get_model_state_dict(module, options=StateDictOptions(full_state_dict=True, cpu_offload=True,
                                                                         ignore_frozen_params=True))
            keep = set(trained_names(module))
            out[name] = {k: v for k, v in full.items() if k in keep}
        return out if self.rank == 0 else None

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Load full trained weights into the shards; Adam moments start fresh."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_model_state_dict

        for name, module in zip(("policy", "critic"), self._modules()):
            if name not in state:
                continue
            reshard(module)
            missing = set(trained_names(module)) - set(state[name])
            if missing:
                raise ValueError(f"{name} state lacks {len(missing)} trained weights, e.g. {sorted(missing)[:3]}")
            set_model_state_dict(module, state[name], options=StateDictOptions(full_state_dict=True, strict=False))
        self._build_optimizers()

    def optimizer_state(self) -> dict[str, dict[str, Any]] | None:
        """Full optimizer states, keyed by parameter name (torch.distributed.checkpoint's
        full form; gathered on rank 0, None on other ranks)."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, get_optimizer_state_dict

        out = {}
        for name, module, opt in optimizer_pairs(self):
            reshard(module)
            out[name] = get_optimizer_state_dict(
                module, opt, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return out if self.rank == 0 else None

    def load_optimizer_state(self, states: dict[str, dict[str, Any]]) -> None:
        """Load full, name-keyed optimizer states (as `optimizer_state` returns) into the shards."""
        from torch.distributed.checkpoint.state_dict import StateDictOptions, set_optimizer_state_dict

        for name, module, opt in optimizer_pairs(self):
            if states.get(name, {}).get("state"):
                reshard(module)
                # torch builds the empty state it loads into with a zero-gradient step,
                # which it skips while old gradients are still attached.
                module.zero_grad(set_to_none=True)
                set_optimizer_state_dict(module, opt, optim_state_dict=states[name],
                                         options=StateDictOptions(full_state_dict=True))

    def shutdown(self) -> None:
        if dist.is_initialized():
            dist.destroy_process_group()


class LearnerLostError(RuntimeError):
    """A learner died; the group was ended (the last checkpoint is intact: resume from it)."""


class LearnerGroup:
    """`num_learners` Ray actors training one sharded policy (and critic) together.

    Args:
        config: the run's ConfigStore (model, training; `ray.address` if Ray is not started).
        num_learners: ranks of the group (defaults to `config.ray.num_learners`).
        num_gpus_per_learner: GPUs per actor; None: `config.ray.num_gpus_per_learner`, whose
            None is 1 when CUDA is available, else 0 (ignored when `placement` is given:
            its bundles decide).
        num_threads: torch threads per actor (None: torch's default).
        placement: the `Placement` whose "learner" bundles the ranks run in (`RayStages`
            reserves one for workers and learners together); None reserves one for this
            group alone, or raises `PlacementError` if the cluster cannot hold it.

    A rank that dies while starting raises `ActorStartError` naming it and the cause.
    """

    def __init__(self, config: ConfigStore, num_learners: int | None = None,
                 num_gpus_per_learner: float | None = None, num_threads: int | None = 1,
                 placement: Placement | None = None):
        ray = require_ray("Ray learners (ray.num_learners)")
        self.config = config.validate()
        n = num_learners if num_learners is not None else config.ray.num_learners
        if n < 1:
            raise ConfigError(f"num_learners must be >= 1, got {n}")
        if placement is None and num_gpus_per_learner is not None:
            config = copy.deepcopy(config)
            config.ray.num_gpus_per_learner = num_gpus_per_learner
        self._own_placement = placement is None
        self.placement = placement or reserve(config, num_actors=0, num_learners=n)
        actor = ray.remote(LearnerWorker)
        env = {"OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE")}
        self.num_learners = n
        self.workers = [actor.options(runtime_env={"env_vars": env}, **self.placement.options("learner", r))
                        .remote(self.config, r, n, num_threads) for r in range(n)]
        try:
            wait_started((f"learner rank {r}", w) for r, w in enumerate(self.workers))
            host, port = ray.get(self.workers[0].free_address.remote())
            refs = [w.setup.remote(host, port) for w in self.workers]
            for r, ref in enumerate(refs):  # building the models: a failure names its rank
                try:
                    ray.get(ref)
                except ray.exceptions.RayError as exc:
                    raise start_error(f"learner rank {r}", exc, "failed while building its model") from exc
            self.backend = ray.get(refs[0])
        except BaseException:
            self.shutdown(timeout=0)
            raise

    def _ray(self):
        return require_ray("Ray learners (ray.num_learners)")

    def _gather(self, refs: list[Any], what: str) -> list[Any]:
        """Results of one call on every rank. If a rank dies, the others would wait in a
        collective for it forever: end the whole group and raise `LearnerLostError` naming
        the rank (nothing has been written, so the last checkpoint is intact)."""
        ray = self._ray()
        pending = list(refs)
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(ready[0])
            except ray.exceptions.RayActorError as exc:
                rank = refs.index(ready[0])
                for w in self.workers:
                    ray.kill(w)
                raise LearnerLostError(
                    f"learner rank {rank} of {self.num_learners} died during {what} ({type(exc).__name__}); the "
                    "learner group is shut down. The last checkpoint in checkpoint.output_dir is intact: start "
                    "a new Trainer and call resume() (fit() resumes by itself)") from exc
        return ray.get(refs)

    def update(self, batch: TrajectoryBatch, step: int = 0) -> dict[str, float]:
        """One update (all PPO epochs) of the batch, split by whole groups over the ranks.

        Same contract as `Trainer.update`'s loop: sets new_logprobs, ratio, entropy (and
        old_logprobs / kl when the update supplies them) on `batch`; returns the metrics.
        `step` seeds the mini-batch permutation as the trainer's global step does. The loss
        settings are read from `self.config.training` at each call (the optimizers' learning
        rates stay as built); the critic trains when `adv_estimator` is "gae".
        """
        t = self.config.training
        start = time.perf_counter()
        old_from_update = not batch.has("old_logprobs")
        plan = plan_update(batch, t, step)
        shards = split_groups(batch, self.num_learners)
        plans = shard_plan(plan, batch, shards, t)
        extra = ("rollout_logprobs",) if rollout_is_level(t) else ()  # the off-policy correction's behaviour policy
        refs = [w.update.remote(self._part(batch, rows, extra), p, t)
                for w, rows, p in zip(self.workers, shards, plans)]
        results = self._gather(refs, "update")
        B, T = batch.input_ids.shape  # (B, T)
        new_lp, ent = torch.zeros(B, T), torch.zeros(B, T)
        is_w = torch.zeros(B, T) if extra else None  # (B, T) rollout_is_weights
        for rows, (_, fields) in zip(shards, results):
            new_lp[rows] = fields["new_logprobs"]
            ent[rows] = fields["entropy"]
            if is_w is not None:
                is_w[rows] = fields["rollout_is_weights"]
        set_actor_fields(batch, new_lp, ent, old_from_update, t)
        if is_w is not None:
            batch.set("rollout_is_weights", is_w)
        metrics = dict(results[0][0])
        diff = rollout_logprob_diff(batch)  # the ranks' shards carry no engine logprobs: measured here
        if diff is not None:
            metrics["actor/rollout_logprob_diff"] = diff[0]
        metrics["perf/update_seconds"] = time.perf_counter() - start
        return metrics

    def compute_log_probs(self, batch: TrajectoryBatch) -> torch.Tensor:
        """(B, T) logprobs of the batch under the group's policy (trained positions only)."""
        t = self.config.training
        shards = split_groups(batch, self.num_learners)
        lengths, groups = lengths_of(batch), batch.group_ids
        needed = set(forward_rows(lengths, batch.loss_mask))  # failed episodes: in no forward
        steps = max(len(micro_batches(lengths, t.micro_batch_size, groups, [i for i in rows if i in needed]))
                    for rows in shards)
        parts = self._gather([w.log_probs.remote(self._part(batch, rows), steps)
                              for w, rows in zip(self.workers, shards)], "compute_log_probs")
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)  # (B, T)
        for rows, lp in zip(shards, parts):
            out[rows] = lp
        return out

    @staticmethod
    def _part(batch: TrajectoryBatch, rows: list[int], extra: tuple[str, ...] = ()) -> TrajectoryBatch:
        sub = rows_of(batch, rows)
        sub.tensors = {k: v for k, v in sub.tensors.items() if k in LEARNER_FIELDS or k in extra}
        sub.meta = {}
        return sub

    def state_dict(self) -> dict[str, dict[str, torch.Tensor]]:
        """{"policy": ..., "critic": ...}: full trained weights (what checkpoints and weight
        sync need), named as in `Policy.trainable_state_dict` / `Critic.trainable_state_dict`."""
        return self._gather([w.state_dict.remote() for w in self.workers], "state_dict")[0]

    def load_state_dict(self, state: dict[str, dict[str, torch.Tensor]]) -> None:
        """Load full trained weights on every rank (optimizer moments start fresh; see
        `load_optimizer_state`)."""
        ray = self._ray()
        ref = ray.put(state)
        self._gather([w.load_state_dict.remote(ref) for w in self.workers], "load_state_dict")

    def optimizer_state(self) -> dict[str, dict[str, Any]]:
        """{"optimizer": ..., "critic_optimizer": ...}: full AdamW states keyed by parameter
        name (`workbench.distributed.controller.optimizer_state_by_index` turns them into the
        single-process `Trainer`'s form)."""
        return self._gather([w.optimizer_state.remote() for w in self.workers], "optimizer_state")[0]

    def load_optimizer_state(self, states: dict[str, dict[str, Any]]) -> None:
        """Load name-keyed optimizer states (after `load_state_dict`, which starts fresh ones)."""
        ref = self._ray().put(states)
        self._gather([w.load_optimizer_state.remote(ref) for w in self.workers], "load_optimizer_state")

    def shutdown(self, timeout: float = 60) -> None:
        """Leave the process group and end the actors (waiting up to `timeout` s for them
        to leave it; 0: end them at once)."""
        ray = self._ray()
        try:
            if timeout:
                ray.get([w.shutdown.remote() for w in self.workers], timeout=timeout)
        finally:
            for w in self.workers:
                ray.kill(w)
            self.workers = []
            if self._own_placement:
                self.placement.remove()

    def __repr__(self) -> str:
        return f"LearnerGroup({self.num_learners} learners, backend={getattr(self, 'backend', '?')})"
