"""Asynchronous training in one process and on Ray: the batches of the next steps are
sampled on a thread while this step's batch trains (`training.max_staleness` = k >= 1).

Asynchrony is a stage arrangement, not a second trainer: `Trainer.train_step` runs the same
rollout, score, advantages and update stages; with `max_staleness=k`, `fit` keeps a
`RolloutAhead`: one rollout thread that runs a queue of jobs, one per step's batch. As soon
as step n's batch is scored (and filtered, with `training.dynamic_sampling`), `fill` queues
the rollouts of steps n+1 .. n+k that are not queued yet (RL steps of this `fit` only); the
thread samples them one after another while step n's advantages and update run. Step m then
takes its batch from the queue instead of sampling one.

    trainer.config.training.max_staleness = 2
    trainer.fit(steps=20)          # step n trains on episodes sampled with the weights of step n-2 or later

Weights and versions: a weight version is the trainer's `global_step` when the weights were
made (the weights after that many steps). Every episode records the version that sampled it
(`Episode.weight_version`; in the synchronous loop it equals the step). After each update
the trainer publishes a copy of its trained weights (`publish`, version n+1 after the update
of step n); the rollout thread loads the newest published copy into the engine when it
starts a job, never the trainer's module, which an update may be changing. A job for step
m is queued at step m-k, when the published version is m-k or newer, so its episodes are
trained at most k updates after the weights that sampled them; `take` checks this bound
again for every batch and raises RuntimeError if it is broken. With k=1 the batch of step
n+1 starts while step n trains, with the weights of step n: staleness 1. With k >= 2 a
batch's staleness is at most k, and less when its job started after an update had
finished (it gets those weights). The metrics say what happened (`async/staleness_mean`,
`async/staleness_max`); the first step of every `fit` samples its own batch (staleness 0).
In one process the engine samples from its own copy of the policy for the duration of
`fit` (one more copy of the model in memory, and one of the trained weights for the
published copy); the engine goes back to the trainer's module when `fit` returns.

The update corrects for the stale sampler with truncated importance weights against the
engine's recorded logprobs (`training.rollout_is`, "token" by default when
`max_staleness` >= 1; `workbench.algo.rollout_correction`).

The engine between steps: `evaluate`, `fork` and dynamic sampling's extra rounds use the
engine from the main thread. They call `settle`, which pauses the queue (no job starts),
waits for the job that is running (its batch is kept for its step), and loads the
trainer's current weights; the extra rounds' episodes carry the step's own version. The
queue runs again at the next `fill` or `take`.

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

For a notebook user: batches sampled ahead exist only inside `fit`, from the scoring of one
step to the step that takes them (`trainer.ahead.jobs` lists them in a callback). When
`fit` returns (steps done, time limit, an error, Ctrl-C) every queued job is dropped before
it starts, the one being sampled is waited for and dropped, and the engine holds the
trainer's current weights again; `trainer.rollout()` / `trainer.update()` cells then work
as in the synchronous loop. A checkpoint written inside `fit` holds the weights and the
step counter of the finished steps, never a batch in flight: a resumed run samples those
steps anew, so no step is lost or counted twice (`tests/test_async_kill.py` SIGKILLs a run
with a batch in flight and resumes it).

Ray (`ray.use_ray`): the thread's jobs run on the rollout workers (`RayStages.rollout`)
while the learners update; `RayStages.update` leaves the workers' weights alone while a
`RolloutAhead` exists, and the thread pushes the newest published weights to them when a
job starts (`RayStages.sync_rollout_weights`, with that copy's version). The learners apply
the correction (`rollout_logprobs` travels to them when it is on). When `fit` returns the
workers get the trainer's current weights.

Faults: an exception in a job is raised by `fit` at the step that takes that batch, with
the step named in a note; the jobs queued after it are dropped.
"""
from __future__ import annotations

import collections
import copy
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch

from workbench.trajectory import TrajectoryBatch


@dataclass
class _Job:
    """The rollout of one step's batch, queued on the rollout thread."""
    step: int
    state: str = "queued"  # "queued", "running", "done"
    version: int | None = None  # the weight version that samples it, set when it starts
    batch: TrajectoryBatch | None = None
    error: BaseException | None = None
    start: float = 0.0  # perf_counter span of its sampling
    end: float = 0.0
    done: threading.Event = field(default_factory=threading.Event)


class RolloutAhead:
    """The rollouts of the next `training.max_staleness` steps, on a thread (see the
    module docstring)."""

    def __init__(self, trainer: Any):
        self.trainer = trainer
        t = trainer.config.training
        self.max_staleness = t.max_staleness
        self.threads = t.async_rollout_threads
        #: The weight version the engine (or the Ray rollout workers) holds.
        self.engine_version = trainer.global_step
        # What the engine holds: ("live", step) = the trainer's weights at that step, loaded by the
        # main thread; ("published", serial) = a published copy, loaded by the rollout thread.
        self._engine_weights: tuple[str, int] = ("live", trainer.global_step)
        self._snapshot: torch.nn.Module | None = None  # the engine's own copy of the policy (one process)
        self._published: tuple[int, int, dict[str, torch.Tensor]] | None = None  # (serial, version, weights)
        self._serial = 0
        self._jobs: list[_Job] = []  # queued, running or done, not taken yet; by step
        self._running: _Job | None = None
        self._paused = False  # settle(): no job starts until the next fill() or take()
        self._closed = False
        self._cv = threading.Condition()
        self._thread: threading.Thread | None = None
        self._update_spans: collections.deque = collections.deque(maxlen=self.max_staleness + 1)

    @property
    def _remote(self) -> Any:
        """Ray's `sync_rollout_weights` when the rollout workers sample, else None."""
        return getattr(self.trainer.stages, "sync_rollout_weights", None)

    # -- weights ----------------------------------------------------------------------------
    def publish(self, version: int) -> None:
        """Keep a copy of the trainer's trained weights as weight version `version`: the
        rollout thread loads the newest copy when it starts a job (main thread, after an
        update, while no update runs)."""
        policy = self.trainer.policy
        if self._remote is not None:
            weights = policy.trainable_state_dict()  # what the Ray workers load
        else:
            weights = {n: p.detach().clone() for n, p in policy.model.named_parameters() if p.requires_grad}
        with self._cv:
            self._serial += 1
            self._published = (self._serial, version, weights)

    def _load_published(self) -> int:
        """On the rollout thread, at the start of a job: give the engine (or the Ray
        workers) the newest published weights, unless it holds them; returns their version."""
        with self._cv:
            serial, version, weights = self._published
        if self._engine_weights != ("published", serial):
            remote = self._remote
            if remote is not None:
                remote(self.trainer, weights, version)
            else:
                mine = dict(self._snapshot.named_parameters())
                with torch.no_grad():
                    for name, w in weights.items():
                        mine[name].copy_(w)
                self.trainer.engine.sync_weights(self._snapshot)
            self._engine_weights, self.engine_version = ("published", serial), version
        return version

    def _load_live(self) -> None:
        """Give the engine the trainer's current weights (version `global_step`), unless
        it holds them; main thread, with no job running."""
        tr = self.trainer
        if self._engine_weights == ("live", tr.global_step):
            return
        policy = tr.policy.model
        remote = self._remote
        if remote is not None:  # Ray: the rollout workers sample; this process's engine only evaluates
            remote(tr)
            tr.engine.sync_weights(policy)
        elif self._snapshot is not None:
            mine = dict(self._snapshot.named_parameters())
            with torch.no_grad():
                for name, p in policy.named_parameters():
                    if p.requires_grad:
                        mine[name].copy_(p)
            tr.engine.sync_weights(self._snapshot)
        else:
            tr.engine.sync_weights(policy)
        self._engine_weights, self.engine_version = ("live", tr.global_step), tr.global_step

    # -- the queue --------------------------------------------------------------------------
    def fill(self, step: int) -> None:
        """After step `step` is scored: queue the rollouts of steps `step`+1 ..
        `step`+`max_staleness` that are not queued yet (RL steps of this `fit` only), and
        let the queue run. From here on the published weights are of version `step` or
        newer, so a job queued now samples step m <= `step`+`max_staleness` with weights at
        most `max_staleness` updates older than step m's."""
        tr = self.trainer
        last = min(step + self.max_staleness, tr._fit_total - 1)
        with self._cv:
            queued = {job.step for job in self._jobs}
        new = [m for m in range(step + 1, last + 1) if m >= tr.config.sft.steps and m not in queued]
        if new:
            if self._snapshot is None and self._remote is None:  # the engine samples from a copy of the policy
                self._snapshot = copy.deepcopy(tr.policy.model).eval().requires_grad_(False)
            if self._published is None or self._published[1] != tr.global_step:
                self.publish(tr.global_step)
            self._start_thread()
        with self._cv:
            self._jobs.extend(_Job(m) for m in new)
            self._paused = False
            self._cv.notify_all()

    def _start_thread(self) -> None:
        if self._thread is not None:
            return
        ready = threading.Event()
        caller_threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._work, args=(ready,), name="wb-rollout-ahead", daemon=True)
        self._thread.start()
        ready.wait()
        torch.set_num_threads(caller_threads)  # the thread's set_num_threads also set the process default

    def _work(self, ready: threading.Event) -> None:
        torch.get_num_threads()  # ATen sets a thread's count on first use: use it, then set ours
        torch.set_num_threads(self.threads)
        ready.set()
        while True:
            with self._cv:
                while not self._closed and (self._paused or not any(j.state == "queued" for j in self._jobs)):
                    self._cv.wait()
                if self._closed:
                    return
                job = next(j for j in self._jobs if j.state == "queued")
                job.state, self._running = "running", job
            threading.current_thread().name = f"wb-rollout-ahead-{job.step}"
            try:
                with torch.no_grad():
                    job.version = self._load_published()
                    job.start = time.perf_counter()
                    job.batch = self.trainer._sample(job.step, job.version)
            except BaseException as exc:  # raised in the main thread by `take`
                job.error = exc
            finally:
                job.end = time.perf_counter()
                with self._cv:
                    job.state, self._running = "done", None
                    if job.error is not None:  # the run ends at this step: sample nothing after it
                        self._jobs = [j for j in self._jobs if j.state != "queued"]
                    self._cv.notify_all()
                job.done.set()

    @staticmethod
    def _wait(job: _Job) -> None:
        while not job.done.wait(0.1):  # in slices: Ctrl-C stays deliverable
            pass

    def _wait_idle(self) -> None:
        """Wait until no job runs (main thread; the caller has paused the queue or emptied it)."""
        while True:
            with self._cv:
                running = self._running
            if running is None:
                return
            self._wait(running)

    def settle(self) -> None:
        """Pause the queue, let the job that runs finish (its batch is kept for its step)
        and give the engine the trainer's current weights: for engine calls between
        steps (`evaluate`, `fork`, dynamic sampling's extra rounds). The queue runs again
        at the next `fill` or `take`."""
        with self._cv:
            self._paused = True
        self._wait_idle()
        self._load_live()

    def take(self, step: int) -> TrajectoryBatch | None:
        """The batch sampled ahead for `step`, or None if there is none (then nothing is
        queued, and the engine holds the trainer's current weights). Raises what the
        rollout thread raised, and RuntimeError if the batch's weights are more than
        `max_staleness` updates older than `step`'s."""
        with self._cv:
            self._paused = False
            self._cv.notify_all()
            job = self._jobs[0] if self._jobs else None
        if job is None or job.step != step:
            if job is not None:  # sampled for other steps (the trainer's step was changed): dropped
                self.drop()
            self._load_live()
            return None
        self._wait(job)  # kept in the queue until it ended: a Ctrl-C here leaves it for close()
        with self._cv:
            self._jobs.remove(job)
        if job.error is not None:
            exc = job.error
            exc.add_note(f"(raised in the rollout of step {step}, sampled ahead on a thread)")
            raise exc
        if not 0 <= step - job.version <= self.max_staleness:
            raise RuntimeError(f"the batch of step {step} was sampled with weight version {job.version}, "
                               f"{step - job.version} updates old, past training.max_staleness="
                               f"{self.max_staleness} (a bug in workbench.training.async_fit)")
        batch = job.batch
        batch.meta["async/overlap_seconds"] = self._overlap(job.start, job.end)
        return batch

    def drop(self) -> None:
        """Drop every batch queued or sampled ahead: the queued ones never start, the one
        being sampled is waited for, and all are discarded."""
        with self._cv:
            self._jobs = [j for j in self._jobs if j.state != "queued"]
        self._wait_idle()
        with self._cv:
            self._jobs = []

    def close(self) -> None:
        """Drop the batches queued and in flight, end the thread, and give the engine the
        trainer's own module (and the Ray rollout workers its current weights) again."""
        try:
            self.drop()
        finally:
            with self._cv:
                self._closed = True
                self._cv.notify_all()
            thread = self._thread
            while thread is not None and thread.is_alive():
                thread.join(0.1)
            tr = self.trainer
            if tr.engine is not None and tr.policy is not None:
                remote = self._remote
                if remote is not None and self._engine_weights != ("live", tr.global_step):
                    remote(tr)  # stepwise cells after fit sample with the trainer's weights
                tr.engine.sync_weights(tr.policy.model)
            self._snapshot = None
            self._published = None

    # -- timing -----------------------------------------------------------------------------
    def mark_update(self, start: float, end: float) -> None:
        """The span (perf_counter) of a step's advantages and update, for the overlap metric."""
        self._update_spans.append((start, end))

    def _overlap(self, start: float, end: float) -> float:
        """Seconds of [start, end] during which an update ran (the last max_staleness + 1 updates)."""
        return sum(max(0.0, min(b, end) - max(a, start)) for a, b in self._update_spans)

    @property
    def in_flight(self) -> int | None:
        """The first step whose batch is queued or sampled ahead, or None."""
        with self._cv:
            return self._jobs[0].step if self._jobs else None

    @property
    def running(self) -> bool:
        """True while the rollout thread is sampling a batch."""
        return self._running is not None

    @property
    def jobs(self) -> list[dict[str, Any]]:
        """The batches queued or sampled ahead, by step: {"step", "state" ("queued",
        "running", "done"), "version" (the weight version sampling it, None while queued)}."""
        with self._cv:
            return [{"step": j.step, "state": j.state, "version": j.version} for j in self._jobs]


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
