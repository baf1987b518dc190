"""`Trainer` with `ray.use_ray=True`: which stages go to Ray workers, and how weights flow.

    config.ray.use_ray = True
    config.ray.num_actors = 2        # rollout workers (each with its engine and env copies)
    config.ray.num_learners = 2      # FSDP2 data-parallel learners (one torch.distributed group)
    trainer = Trainer(config, environment=env)
    batch = trainer.rollout()        # sampled by the rollout workers, merged in episode order
    batch = trainer.compute_advantages(trainer.score(batch))   # on the controller
    metrics = trainer.update(batch)  # the learners' update; weights come back and go out

The notebook kernel (or the CLI) stays the single controller: it scores the batch and
computes old/reference logprobs, values and advantages with its own copy of the policy,
exactly as in one process, so every stage returns the same objects and every widget
works on them. Only the two heavy stages move out:

  * rollout: `RolloutWorkerGroup.run` splits the groups across `ray.num_actors` workers;
  * update: `LearnerGroup.update` splits the batch by whole groups across
    `ray.num_learners` ranks and returns the same metrics one process computes;
  * with `reward.reward_model` set, the reward model scores on a reward-model worker
    (`workbench.distributed.reward_workers`, the seeds' `Role.RewardModel`).

Weights flow one way after each update: the learners' gathered trained weights are
loaded into the controller's policy (and critic), then pushed to the rollout workers
through Ray's object store, tagged with the new step as their version; every episode
records the version it was sampled with (`Episode.weight_version`). With
`training.max_staleness` >= 1 the update does not push: the rollout thread pushes the
newest published weights when it starts a batch (`workbench.training.async_fit`,
`sync_rollout_weights`).

Checkpoints hold what a single-process run's hold: before `Trainer.save_checkpoint`
writes, the learners' AdamW states are gathered into the controller's optimizers
(`pull_optimizers`); after a checkpoint loads, weights and optimizer states go back to
the learners (`push`). So a checkpoint saved with N learners resumes with 1 or M, Adam
moments included.

Simplified: the controller keeps a full copy of the policy (a 7B model would want the
old/ref logprob and value forwards on the learners too); `dataset=` items reach the
workers as they are, but no test covers that path with Ray yet.
"""
from __future__ import annotations

from typing import Any, Sequence

import torch

from workbench.distributed.learners import LearnerGroup, optimizer_pairs, trained_names
from workbench.distributed.placement import check_fits, reserve
from workbench.distributed.rollout_workers import RolloutWorkerGroup
from workbench.trajectory import TrajectoryBatch


class RayStages:
    """The rollout workers and learners of one `Trainer` (built by the trainer itself), with
    the methods of `workbench.training.stages.Stages`."""

    @staticmethod
    def check_config(config: Any) -> None:
        """Groups the cluster (or this machine) cannot hold raise `PlacementError` now,
        before the trainer loads any model (`workbench.distributed.placement.check_fits`)."""
        check_fits(config)

    def __init__(self, trainer: Any):
        cfg = trainer.config
        # One placement group for both (or PlacementError now, never a silent wait).
        self.placement = reserve(cfg)
        try:
            self.rollout_workers = RolloutWorkerGroup(cfg, cfg.ray.num_actors, trainer.environment,
                                                      trainer.tools, trainer.parser, placement=self.placement)
            self.learners = LearnerGroup(cfg, cfg.ray.num_learners, placement=self.placement)
            if cfg.reward.reward_model is not None:  # Role.RewardModel: the reward model on a worker of its own
                from workbench.distributed.reward_workers import ray_model_rewards

                trainer.model_rewards = ray_model_rewards(cfg.reward)
        except BaseException:
            self.close()
            raise
        self.push(trainer)

    def _state(self, trainer: Any) -> dict[str, dict[str, torch.Tensor]]:
        state = {"policy": trainer.policy.trainable_state_dict()}
        if trainer.critic is not None:
            state["critic"] = trainer.critic.trainable_state_dict()
        return state

    def after_load(self, trainer: Any) -> None:
        """A checkpoint was loaded into the controller: send its weights and optimizer states out."""
        self.push(trainer)

    def before_save(self, trainer: Any) -> None:
        """A checkpoint is about to be written: gather the learners' optimizer states first."""
        self.pull_optimizers(trainer)

    def push(self, trainer: Any) -> None:
        """Load the controller's weights and optimizer states into the learners and its
        weights into the rollout workers (version = the trainer's step): at start and after
        a checkpoint load."""
        state = self._state(trainer)
        self.learners.load_state_dict(state)
        optim = {name: optimizer_state_by_name(opt.state_dict(), trained_names(module))
                 for name, module, opt in optimizer_pairs(trainer)}
        if any(s["state"] for s in optim.values()):  # a fresh trainer has none yet
            self.learners.load_optimizer_state(optim)
        self.rollout_workers.sync_weights(state["policy"], trainer.global_step)

    def pull_optimizers(self, trainer: Any) -> None:
        """The learners' AdamW states into the controller's optimizers (before a checkpoint)."""
        states = self.learners.optimizer_state()
        for name, module, opt in optimizer_pairs(trainer):
            opt.load_state_dict(optimizer_state_by_index(states[name], trained_names(module)))

    def rollout(self, trainer: Any, seeds: Sequence[int], group_size: int, temperature: float | None,
                sampling_seed: int | None) -> TrajectoryBatch:
        """Episodes from the rollout workers, laid out as `Trainer.make_rollout(...).run()` would."""
        return self.rollout_workers.run(seeds, group_size, temperature=temperature, sampling_seed=sampling_seed)

    def update(self, trainer: Any, batch: TrajectoryBatch) -> dict[str, float]:
        """The learners' update of `batch`; then the new weights go to the controller's
        policy (and critic) and to the rollout workers as version `global_step + 1`."""
        metrics = self.learners.update(batch, trainer.global_step)
        state = self.learners.state_dict()
        trainer.policy.load_trainable_state_dict(state["policy"])
        if trainer.critic is not None and "critic" in state:
            trainer.critic.load_state_dict(state["critic"], strict=False)
        if getattr(trainer, "ahead", None) is None:  # async (training.max_staleness): when a batch starts
            self.rollout_workers.sync_weights(state["policy"], trainer.global_step + 1)
        return metrics

    def sync_rollout_weights(self, trainer: Any, weights: dict[str, torch.Tensor] | None = None,
                             version: int | None = None) -> None:
        """Weights to the rollout workers: the controller's policy weights as version
        `global_step`, or `weights` as `version` (`workbench.training.async_fit`: the
        rollout thread pushes the newest published copy when it starts a batch)."""
        if weights is None:
            weights, version = trainer.policy.trainable_state_dict(), trainer.global_step
        self.rollout_workers.sync_weights(weights, version)

    def close(self) -> None:
        """End the workers and learners (the Ray cluster itself keeps running)."""
        for name in ("rollout_workers", "learners"):
            group = getattr(self, name, None)
            try:
                if group is not None:
                    group.shutdown()
            except Exception:  # noqa: BLE001 - best effort at teardown
                pass
        self.placement.remove()


def optimizer_state_by_name(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """`torch.optim.Optimizer.state_dict()` (parameters numbered 0..n-1 in `names` order)
    -> the name-keyed form of `torch.distributed.checkpoint.state_dict`."""
    groups = [{**g, "params": [names[i] for i in g["params"]]} for g in state["param_groups"]]
    return {"state": {names[i]: v for i, v in state["state"].items()}, "param_groups": groups}


def optimizer_state_by_index(state: dict[str, Any], names: list[str]) -> dict[str, Any]:
    """The name-keyed form -> `Optimizer.load_state_dict`'s numbered form (inverse of
    `optimizer_state_by_name`); a name the optimizer does not hold is an error."""
    index = {n: i for i, n in enumerate(names)}
    unknown = [n for g in state["param_groups"] for n in g["params"] if n not in index]
    if unknown:
        raise ValueError(f"optimizer state names {len(unknown)} parameters this model does not train, "
                         f"e.g. {unknown[:3]}")
    groups = [{**g, "params": [index[n] for n in g["params"]]} for g in state["param_groups"]]
    return {"state": {index[n]: v for n, v in state["state"].items()}, "param_groups": groups}
