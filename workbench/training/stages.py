"""Where the two heavy stages run: in this process (`LocalStages`) or on Ray workers
(`workbench.distributed.controller.RayStages`), behind the same methods.

    stages = make_stages(trainer)     # LocalStages, or RayStages when config.ray.use_ray
    batch = stages.rollout(trainer, seeds, group_size, temperature=None, sampling_seed=7)
    metrics = stages.update(trainer, batch)
    stages.before_save(trainer); stages.after_load(trainer); stages.close()

The `Trainer` talks only to this interface, so it has no `if ray` of its own. Scoring and
advantages stay with the trainer (the controller) on every path.

The Ray implementation lives in a higher layer (`workbench.distributed`, which imports
training); `make_stages` finds it by name in `STAGE_BACKENDS`, the way entry points name
plugins, so training never imports upward.
"""
from __future__ import annotations

import importlib
from typing import Any, Protocol, Sequence

from workbench.data import episode_inputs
from workbench.rollout.configured import make_rollout
from workbench.training.update import plan_update, update_actor, update_critic
from workbench.trajectory import TrajectoryBatch


class Stages(Protocol):
    """What the trainer needs from a place that runs rollouts and updates."""

    def rollout(self, trainer: Any, seeds: Sequence[Any], group_size: int, temperature: float | None,
                sampling_seed: int | None) -> TrajectoryBatch:
        """`group_size` episodes per seed, laid out in seed order."""

    def update(self, trainer: Any, batch: TrajectoryBatch) -> dict[str, float]:
        """One PPO/GRPO update of the trainer's models on `batch`; the trainer's policy
        (and critic) hold the new weights afterwards."""

    def before_save(self, trainer: Any) -> None:
        """Bring state held elsewhere (optimizer moments) into the trainer before a checkpoint."""

    def after_load(self, trainer: Any) -> None:
        """Send the trainer's state (weights, optimizer moments) out after a checkpoint loads."""

    def close(self) -> None:
        """Release workers (nothing for the local stages)."""


class LocalStages:
    """Rollouts with the trainer's own engine, updates on the trainer's own models."""

    def make_rollout(self, trainer: Any, seeds: Sequence[Any], group_size: int, temperature: float | None = None,
                     sampling_seed: int | None = None) -> Any:
        """The `Rollout` (or `AsyncRollout`) of `group_size` episodes per seed, with the
        run's settings (`workbench.rollout.make_rollout`)."""
        envs, all_seeds, group_ids = episode_inputs(trainer.make_environment,
                                                    [s for s in seeds for _ in range(group_size)])
        return make_rollout(trainer.config, trainer.engine, envs, all_seeds, group_ids, parser=trainer.parser,
                            tools=trainer.tools, temperature=temperature, sampling_seed=sampling_seed)

    def rollout(self, trainer: Any, seeds: Sequence[Any], group_size: int, temperature: float | None,
                sampling_seed: int | None) -> TrajectoryBatch:
        rollout = self.make_rollout(trainer, seeds, group_size, temperature, sampling_seed)
        rollout.progress_leave = not getattr(trainer, "_fitting", False)  # fit's own bar stays, step bars go
        return rollout.run()

    def update(self, trainer: Any, batch: TrajectoryBatch) -> dict[str, float]:
        t = trainer.config.training
        plan = plan_update(batch, t, trainer.global_step)
        metrics = update_actor(trainer.policy.model, trainer.optimizer, batch, t, plan, trainer.tokenizer)
        if trainer.critic is not None:
            metrics.update(update_critic(trainer.critic, trainer.critic_optimizer, batch, t, plan))
        return metrics

    def before_save(self, trainer: Any) -> None:
        pass

    def after_load(self, trainer: Any) -> None:
        pass

    def close(self) -> None:
        pass


#: `ray.use_ray` -> "module:class" of the stages (imported when chosen).
STAGE_BACKENDS = {False: "workbench.training.stages:LocalStages",
                  True: "workbench.distributed.controller:RayStages"}


def _backend(config: Any) -> type:
    module, _, name = STAGE_BACKENDS[bool(config.ray.use_ray)].partition(":")
    return getattr(importlib.import_module(module), name)


def check_stages(config: Any) -> None:
    """Fail early, before any model loads, when the stages `config` asks for cannot run
    (the backend's `check_config`: for Ray, groups the cluster cannot hold)."""
    check = getattr(_backend(config), "check_config", None)
    if check is not None:
        check(config)


def make_stages(trainer: Any) -> Stages:
    """The stages `trainer.config.ray.use_ray` asks for, built for `trainer`."""
    cls = _backend(trainer.config)
    return cls() if cls is LocalStages else cls(trainer)


__all__ = ["LocalStages", "STAGE_BACKENDS", "Stages", "check_stages", "make_stages"]
