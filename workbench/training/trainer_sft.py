"""The `Trainer`'s supervised warm-up methods: the expert's demonstrations and SFT steps.

`Trainer` inherits them (`class Trainer(CheckpointMethods, SFTMethods)`); the step itself is
`workbench.training.sft.sft_step` (the NLL of the expert's turns through the RL update's path).
"""
from __future__ import annotations

import time
from typing import Any

from workbench.training.sft import expert_demonstrations, sft_step
from workbench.trajectory import Episode, TrajectoryBatch


class SFTMethods:
    """Mixed into `Trainer` (see the module docstring)."""

    def demonstrations(self, episodes: int | None = None) -> TrajectoryBatch:
        """The expert's demonstration episodes SFT learns from (`workbench.training.sft`):
        `sft.episodes` of them played once by the environment's scripted expert and kept."""
        n = self.config.sft.episodes if episodes is None else episodes
        cached = getattr(self, "_demonstrations", None)
        if cached is None or getattr(self, "_demonstrations_n", None) != n:  # (episodes the expert failed are left out)
            self._demonstrations, self._demonstrations_n = expert_demonstrations(self, n), n
        return self._demonstrations

    def sft_step(self, data: Any = None) -> dict[str, float]:
        """One SFT step on `data` (a TrajectoryBatch or a list of Episodes; default the
        expert's `demonstrations()`): one optimizer step on the NLL of its trained tokens,
        at `sft.learning_rate` (else `training.learning_rate`). It counts as a training
        step: `global_step` moves on and its metrics (`sft/nll`, `sft/tokens`, ...) go to
        the history; the engine gets the new weights. With `ray.use_ray` the step runs in this
        process too: the learners' Adam moments come in first, and the new weights and moments
        go out to the learners and rollout workers after it."""
        self.checked_config()
        start = time.perf_counter()
        batch = self.demonstrations() if data is None else _as_batch(data)
        if self.optimizer.state or any("sft/nll" not in m for m in self.metrics_history):
            # Ray: the learners' optimizer state, as one process holds it. Not before the learners
            # ever stepped: torch fills a fresh optimizer's state with a zero step that counts one.
            self.stages.before_save(self)
        lr = self.config.sft.learning_rate or self.config.training.learning_rate
        saved = [g["lr"] for g in self.optimizer.param_groups]
        for g in self.optimizer.param_groups:
            g["lr"] = lr
        try:
            self._updating = True
            step_metrics = sft_step(self.policy.model, self.optimizer, batch, self.config.training)
        finally:
            for g, value in zip(self.optimizer.param_groups, saved):
                g["lr"] = value
        self.engine.sync_weights(self.policy.model)
        metrics: dict[str, Any] = {"step": self.global_step, **step_metrics, "sft/learning_rate": lr,
                                   "perf/step_seconds": time.perf_counter() - start}
        self.last_batch = batch
        self.global_step += 1
        self._updating = False
        self.stages.after_load(self)  # Ray: the new weights and moments out to learners and workers
        self.metrics_history.append(metrics)
        return metrics

    def sft(self, data: Any = None, steps: int = 1) -> list[dict[str, float]]:
        """`steps` SFT steps (`sft_step`) on `data` (default: the expert's demonstrations);
        returns their metrics. For the run's own warm-up set `sft.steps`, and `fit` runs
        those steps first, with its logging and checkpoints."""
        if not isinstance(steps, int) or steps < 0:
            raise ValueError(f"sft(steps=...) must be an integer >= 0, got {steps!r}")
        batch = None if data is None else _as_batch(data)
        return [self.sft_step(batch) for _ in range(steps)]


def _as_batch(data: Any) -> TrajectoryBatch:
    """A TrajectoryBatch, or a list of Episodes as one."""
    if isinstance(data, TrajectoryBatch):
        return data
    episodes = list(data)
    if not episodes or not all(isinstance(e, Episode) for e in episodes):
        raise TypeError("sft data must be a TrajectoryBatch or a non-empty list of Episodes "
                        f"(e.g. trainer.demonstrations()), got {type(data).__name__}")
    return TrajectoryBatch(episodes)
