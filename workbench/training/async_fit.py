"""Asynchronous training in one process: the next step's batch is sampled on a thread while
this step's batch trains (`training.max_staleness` = 1).

Asynchrony is a stage arrangement, not a second trainer: `Trainer.train_step` runs the same
rollout, score, advantages and update stages; with `max_staleness=1`, `fit` keeps a
`RolloutAhead` that starts the rollout of step n+1 on a thread as soon as step n's batch
is scored (and filtered, with `training.dynamic_sampling`), so that it runs while step n's
advantages and update run. Step n+1 then takes that batch instead of sampling one.

    trainer.config.training.max_staleness = 1
    trainer.fit(steps=20)          # step n trains on episodes sampled with step n-1's weights

Weights and versions: a weight version is the trainer's `global_step` when the engine got
those weights (the weights after that many steps). Every episode records the version that
sampled it (`Episode.weight_version`; in the synchronous loop it equals the step). The
engine's weights are synced when a batch is taken (the rollout thread is idle then), so
the batch of step n+1, started during step n, is sampled with version n and trained at
step n+1: staleness 1, never more (`async/staleness_mean`, `async/staleness_max` in the
metrics). The first step of every `fit` samples its own batch (staleness 0). An engine
that samples from the trainer's own module (the `hf` engine) gets its own copy of the
policy for the duration of `fit` (the update must not change weights under a running
rollout); the trainable weights are copied into it at each sync, and the engine goes back
to the trainer's module when `fit` returns.

The update corrects for the stale sampler with truncated importance weights against the
engine's recorded logprobs (`training.rollout_is`, "token" by default when
`max_staleness` >= 1; `workbench.algo.rollout_correction`).

Threads: the rollout thread starts with `training.async_rollout_threads` torch threads (1
by default); the update keeps the process's torch thread count (`torch.set_num_threads`
sets the calling thread's count and the default of threads started later, so this module
puts the process default back once the rollout thread has set its own, as
`workbench.engines.decode_threads` does). On the 2-core machines this project is measured
on, that is 1 thread for sampling and 2 for the update: they share the cores while both
compute, and the update has both while the rollout waits on an environment. Two engine
details: the `hf` engine times its decode steps and prefills on the calling thread's count
and on 1 thread and keeps the faster (`decode_threads.py`), so a rollout thread with 2
threads may still decode on 1; and with `inference.async_rollout` the engine's batches run
on its batcher thread, which has the process default.

For a notebook user: a prefetched batch exists only inside `fit`, between the scoring of
one step and the start of the next. When `fit` returns (steps done, time limit, an error,
Ctrl-C) the batch being sampled ahead is waited for and dropped, and the engine holds the
trainer's current weights again; `trainer.rollout()` / `trainer.update()` cells then work
as in the synchronous loop. A checkpoint written inside `fit` holds the weights and the
step counter of the finished steps, never the batch in flight: a resumed run samples
that step anew, so no step is lost or counted twice.

Ray (`ray.use_ray`): the thread's rollout runs on the rollout workers
(`RayStages.rollout`) while the learners update; `RayStages.update` leaves the workers'
weights alone while a `RolloutAhead` exists, and `sync` pushes the controller's weights to
them (`RayStages.sync_rollout_weights`, version = the step) when a batch is taken. The
learners apply the correction (`rollout_logprobs` travels to them when it is on).

Faults: an exception in the rollout thread is raised by `fit` at the step that takes
that batch, with the step named in a note.
"""
from __future__ import annotations

import copy
import threading
import time
from typing import Any

import torch

from workbench.trajectory import TrajectoryBatch


class RolloutAhead:
    """The rollout of the next step, on a thread (see the module docstring)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        self.threads = trainer.config.training.async_rollout_threads
        #: The weight version the engine holds (the trainer's step when it got them).
        self.engine_version = trainer.global_step
        self._snapshot: torch.nn.Module | None = None  # the engine's own copy of the policy, when needed
        self._job: dict[str, Any] | None = None  # step, thread, batch / error, start, end
        self._update_span: tuple[float, float] | None = None  # the last update's (start, end), perf_counter

    # -- weights ----------------------------------------------------------------------------
    def sync(self) -> None:
        """Load the trainer's current weights into the engine (the rollout thread is idle)."""
        tr = self.trainer
        policy = tr.policy.model
        remote = getattr(tr.stages, "sync_rollout_weights", None)
        if remote is not None:  # Ray: the rollout workers sample; this process's engine only evaluates
            remote(tr)
            tr.engine.sync_weights(policy)
            self.engine_version = tr.global_step
            return
        if self._snapshot is None and getattr(tr.engine, "model", None) is policy:
            self._snapshot = copy.deepcopy(policy).eval().requires_grad_(False)
        if self._snapshot is not None:
            mine = dict(self._snapshot.named_parameters())
            with torch.no_grad():
                for name, p in policy.named_parameters():
                    if p.requires_grad:
                        mine[name].copy_(p)
            tr.engine.sync_weights(self._snapshot)
        else:
            tr.engine.sync_weights(policy)
        self.engine_version = tr.global_step

    # -- the thread -------------------------------------------------------------------------
    def start(self, step: int) -> None:
        """Start sampling the batch of `step` with the engine's weights (version
        `engine_version`) on a thread."""
        if self._job is not None:
            raise RuntimeError(f"a batch (step {self._job['step']}) is already being sampled ahead")
        if (getattr(self.trainer.engine, "model", None) is self.trainer.policy.model
                and not hasattr(self.trainer.stages, "sync_rollout_weights")):
            self.sync()  # the engine samples from the trainer's module: give it its own copy first
        job: dict[str, Any] = {"step": step, "version": self.engine_version}
        ready = threading.Event()
        caller_threads = torch.get_num_threads()

        def run() -> None:
            torch.get_num_threads()  # ATen sets a thread's count on first use: use it, then set ours
            torch.set_num_threads(self.threads)
            ready.set()
            job["start"] = time.perf_counter()
            try:
                with torch.no_grad():
                    job["batch"] = self.trainer._sample(step, job["version"])
            except BaseException as exc:  # raised in the main thread by `take`
                job["error"] = exc
            finally:
                job["end"] = time.perf_counter()

        job["thread"] = threading.Thread(target=run, name=f"wb-rollout-ahead-{step}", daemon=True)
        job["thread"].start()
        ready.wait()
        torch.set_num_threads(caller_threads)  # the thread's set_num_threads also set the process default
        self._job = job

    @staticmethod
    def _join(job: dict[str, Any]) -> dict[str, Any]:
        thread = job["thread"]
        while thread.is_alive():  # join in slices: Ctrl-C stays deliverable
            thread.join(0.1)
        return job

    def settle(self) -> None:
        """Let the batch in flight finish (it is kept for its step) and give the engine the
        trainer's current weights: for engine calls between steps (`evaluate`, `fork`)."""
        if self._job is not None:
            self._join(self._job)
        if self.engine_version != self.trainer.global_step:
            self.sync()

    def take(self, step: int) -> TrajectoryBatch | None:
        """The batch sampled ahead for `step` (None if there is none), after which the engine
        gets the trainer's current weights. Raises what the rollout thread raised."""
        job = self._job
        if job is not None:
            self._join(job)  # kept in self._job until it ended: a Ctrl-C here leaves it for close()
            self._job = None
            if job["step"] != step:
                job = None  # sampled for another step (the trainer's step was changed): dropped
        if self.engine_version != self.trainer.global_step:
            self.sync()
        if job is None:
            return None
        if "error" in job:
            exc = job["error"]
            exc.add_note(f"(raised in the rollout of step {step}, sampled ahead on a thread)")
            raise exc
        batch = job["batch"]
        batch.meta["async/overlap_seconds"] = self._overlap(job["start"], job["end"])
        return batch

    def drop(self) -> None:
        """Wait for the batch being sampled ahead, if any, and discard it."""
        if self._job is not None:
            self._join(self._job)
            self._job = None

    def close(self) -> None:
        """Drop the batch in flight and give the engine the trainer's own module again."""
        try:
            self.drop()
        finally:
            tr = self.trainer
            if tr.engine is not None and tr.policy is not None:
                tr.engine.sync_weights(tr.policy.model)
            self._snapshot = None

    # -- timing -----------------------------------------------------------------------------
    def mark_update(self, start: float, end: float) -> None:
        """The span (perf_counter) of a step's advantages and update, for the overlap metric."""
        self._update_span = (start, end)

    def _overlap(self, start: float, end: float) -> float:
        if self._update_span is None:
            return 0.0
        a, b = self._update_span
        return max(0.0, min(b, end) - max(a, start))

    @property
    def in_flight(self) -> int | None:
        """The step whose batch is being sampled ahead, or None."""
        return None if self._job is None else self._job["step"]

    @property
    def running(self) -> bool:
        """True while the rollout thread is sampling (the batch in flight is not ready yet)."""
        return self._job is not None and self._job["thread"].is_alive()


def stamp_versions(batch: TrajectoryBatch, version: int) -> None:
    """Record `version` on the episodes of `batch` that have no weight version yet."""
    for ep in batch:
        if ep.weight_version is None:
            ep.weight_version = version


def staleness_metrics(batch: TrajectoryBatch, step: int) -> dict[str, float]:
    """`async/staleness_mean` / `_max`: updates between the weights that sampled each
    episode and those that train on it (step `step`), over the episodes with a version."""
    gaps = [step - ep.weight_version for ep in batch if ep.weight_version is not None]
    if not gaps:
        return {}
    out = {"async/staleness_mean": sum(gaps) / len(gaps), "async/staleness_max": float(max(gaps))}
    if "async/overlap_seconds" in batch.meta:
        out["async/overlap_seconds"] = float(batch.meta["async/overlap_seconds"])
    return out


__all__ = ["RolloutAhead", "stamp_versions", "staleness_metrics"]
