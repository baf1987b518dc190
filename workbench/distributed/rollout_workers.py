"""Ray rollout workers: M actors, each with its own engine and environment copies.

    group = RolloutWorkerGroup(config, num_workers=2, environment=make_env("grid"))
    group.sync_weights(trainer.policy, version=0)    # ray.put once, every worker loads it
    batch = group.run(seeds=[5, 6, 7, 8], group_size=2, sampling_seed=0)
    batch.meta["weight_versions"]                     # one per episode
    batch.meta["retried_episodes"]                    # episodes re-run after a worker died
    group.shutdown()

Each worker (`RolloutWorker`, a Ray actor reserving `config.ray.num_gpus_per_actor`
GPUs) loads `config.model` itself (plus fresh LoRA adapters when `model.use_lora`, so
adapter names match the policy's), builds the engine `config.inference.backend` names
(`make_engine`), and runs a `Rollout` (an `AsyncRollout` when `inference.async_rollout`)
over its share of the episodes, built as `Trainer.make_rollout` builds them: one
environment per episode, from a factory or a deep copy of the prototype.

Splitting and merging: the G groups are cut into M contiguous runs of groups, one per
worker. Every worker streams each episode back as soon as it ends (a Ray streaming
generator), renumbered to its position in the whole batch; the merged batch lists the
episodes in that order, with the episode ids and group ids ("seed<seed>") of the
single-process batch. Greedy decoding gives the single-process episodes token for
token (logprobs up to batched float math). Sampling:

* `inference.async_rollout=True`: turn k of episode i is sampled with its own seed
  `sampling_seed * 100_003 + k * 101 + budget + i`, i the episode's index in the whole
  batch, exactly as a single-process `AsyncRollout` seeds it, so the sampled episodes
  do not depend on which worker ran them (up to CPU float near-ties).
* lock-step `Rollout`: one generator per batched engine call is shared by its rows, so
  samples depend on the batch's composition and no split reproduces the single-process
  sample. A worker whose share starts at episode i uses sampling seed
  `sampling_seed + i` (distinct streams per worker; one worker reproduces one process).

Weights: `sync_weights(state)` puts the trained weights (the LoRA adapters, or every
trainable weight) into the object store once; each worker loads that one object
(`load_state_dict`, unexpected names are an error) and hands its model to
`engine.sync_weights`. The version passed along is recorded for every episode sampled
afterwards (`batch.meta["weight_versions"]`, and `episode.weight_version` once
`Episode` has that field).

Faults: a worker that dies mid-run (`ray.kill`, a crash) is replaced by a fresh actor
loaded with the latest weights, which runs only the episodes the dead one had not
streamed back. `batch.meta["retried_episodes"]` names them, `batch.meta["worker_restarts"]`
counts replacements; at most `max_restarts` per run, then `WorkerLostError`.

Placement: each worker runs in its own bundle of a Ray placement group reserved before
any actor starts (`workbench.distributed.placement.reserve`: a cluster too small is a
`PlacementError` naming what was asked, not a silent wait); a replaced worker takes the
dead one's bundle. A worker that dies while starting (an import error, out of memory)
is an `ActorStartError` naming it and the cause. The environment's, tools' and parser's
modules that only the driver can import (a folder put on `sys.path`) are pickled by
value (`ship_modules`).

Simplified: weights go through the object store, not a collective (NCCL broadcast would
suit large models).
"""
from __future__ import annotations

import dataclasses
import queue
import threading
from typing import Any, Callable, Sequence

import torch

from workbench.distributed.placement import (  # noqa: F401 - require_ray, RAY_INSTALL_COMMAND: public here too
    RAY_INSTALL_COMMAND, Placement, reserve, ship_modules, wait_started, require_ray,
)
from workbench.environments.registry import make_environment
from workbench.trajectory import Episode, TrajectoryBatch

_HAS_VERSION_FIELD = "weight_version" in {f.name for f in dataclasses.fields(Episode)}

class WorkerLostError(RuntimeError):
    """Rollout workers kept dying: more replacements than `max_restarts` in one run."""


def group_ranges(num_groups: int, num_workers: int) -> list[range]:
    """Group indices cut into `num_workers` contiguous runs, sizes differing by at most 1
    (the first `num_groups % num_workers` runs get the extra group); empty runs dropped."""
    if num_workers < 1:
        raise ValueError(f"num_workers must be >= 1, got {num_workers}")
    size, extra = divmod(num_groups, num_workers)
    runs, start = [], 0
    for w in range(num_workers):
        n = size + (1 if w < extra else 0)
        if n:
            runs.append(range(start, start + n))
        start += n
    return runs


def trainable_weights(source: Any) -> dict[str, torch.Tensor]:
    """The weights a worker needs: a state dict as given, `source.trainable_state_dict()`
    (a `Policy`), or a module's parameters that require grad (CPU copies)."""
    if isinstance(source, dict):
        return source
    if hasattr(source, "trainable_state_dict"):
        return source.trainable_state_dict()
    if isinstance(source, torch.nn.Module):
        names = {n for n, p in source.named_parameters() if p.requires_grad}
        return {n: t.detach().cpu().clone() for n, t in source.state_dict().items() if n in names}
    raise TypeError(f"sync_weights takes a state dict, a Policy or a torch module, got {type(source).__name__}")


def _streaming(cls: type) -> type:
    """`cls` (Rollout or AsyncRollout) that puts every ended episode on `self.ended`
    and seeds episode i's turns as episode `global_index[i]` of the whole batch."""
    from workbench.engines.base import with_seed

    class Streaming(cls):  # type: ignore[misc, valid-type]
        ended: "queue.SimpleQueue[tuple[str, Any]]"
        global_index: list[int]

        def _finish(self, slot: Any) -> None:
            super()._finish(slot)
            self.ended.put(("episode", slot.episode))

        def _episode_params(self, index: int) -> Any:  # AsyncRollout's per-episode seed
            params = super()._episode_params(index)
            if params is None or params.seed is None:
                return params
            return with_seed(params, params.seed + self.global_index[index] - index)

    Streaming.__name__ = f"Streaming{cls.__name__}"
    return Streaming


class RolloutWorker:
    """One rollout worker (wrapped as a Ray actor by `RolloutWorkerGroup`): a model, its
    engine and the environment prototype or factory."""

    def __init__(self, config: Any, environment: Any, tools: Sequence[Any] = (), parser: Any = None,
                 torch_threads: int = 1):
        from workbench.engines import make_engine
        from workbench.training.policy import Policy

        torch.set_num_threads(torch_threads)
        torch.manual_seed(config.training.seed)  # as `build_models` does for the Trainer's policy
        policy = Policy(config.model, with_reference=False)  # fresh LoRA adapters name-match the policy's
        self.model, self.tokenizer = policy.model.eval(), policy.tokenizer
        self.engine = make_engine(config, self.model, self.tokenizer)
        self.config, self.environment = config, environment
        self.tools, self.parser = list(tools), parser
        self.version: int | None = None

    def load_weights(self, state: dict[str, torch.Tensor], version: int) -> int:
        """Load trained weights (a Ray object resolved by Ray) and tag later episodes with `version`."""
        result = self.model.load_state_dict(state, strict=False)
        if result.unexpected_keys:
            raise KeyError(f"{len(result.unexpected_keys)} weights this worker's model does not have, e.g. "
                           f"{result.unexpected_keys[:3]} (is model.use_lora the same as the learner's?)")
        self.model.eval()
        self.engine.sync_weights(self.model)
        self.version = version
        return len(state)

    def make_rollout(self, indices: list[int], seeds: list[Any], temperature: float | None,
                     sampling_seed: int | None) -> Any:
        """The streaming rollout of episodes `indices` of the batch (env seeds `seeds`),
        built with the run's settings by `workbench.rollout.make_rollout`."""
        from workbench.data import episode_inputs
        from workbench.rollout import AsyncRollout, Rollout, make_rollout

        inf = self.config.inference
        seed = sampling_seed
        if seed is not None and not inf.async_rollout:
            seed = sampling_seed + indices[0]  # see the module docstring
        # int seeds, or `dataset=` items (workbench.data.EpisodeSpec: seed, prompt, params per episode)
        envs, seeds, group_ids = episode_inputs(lambda: make_environment(self.environment), list(seeds))
        rollout = make_rollout(self.config, self.engine, envs, seeds, group_ids, parser=self.parser,
                               tools=self.tools, temperature=temperature, sampling_seed=seed,
                               rollout_class=_streaming(AsyncRollout if inf.async_rollout else Rollout))
        rollout.ended, rollout.global_index = queue.SimpleQueue(), list(indices)
        return rollout

    def run(self, indices: list[int], seeds: list[int], temperature: float | None, sampling_seed: int | None):
        """Roll out episodes `indices` of the batch (env seeds `seeds`); yields
        ("episode", index, Episode) as each ends, then ("meta", batch meta)."""
        rollout = self.make_rollout(indices, seeds, temperature, sampling_seed)

        def work() -> None:
            try:
                with torch.no_grad():
                    rollout.ended.put(("meta", dict(rollout.run().meta)))
            except BaseException as exc:  # handed to the generator, which raises it
                rollout.ended.put(("error", exc))

        threading.Thread(target=work, name="wb-rollout", daemon=True).start()
        while True:
            kind, payload = rollout.ended.get()
            if kind == "error":
                raise payload
            if kind == "meta":
                yield ("meta", None, payload)
                return
            ep: Episode = payload
            index = indices[ep.episode_id]
            ep.episode_id = index
            if _HAS_VERSION_FIELD:
                ep.weight_version = self.version  # type: ignore[attr-defined]
            yield ("episode", index, (ep, self.version))


class RolloutWorkerGroup:
    """M rollout workers as Ray actors (see the module docstring).

    Args:
        config: the run's ConfigStore (`model`, `inference`, `training.seed`,
            `ray.num_gpus_per_actor`).
        num_workers: actors to start (default `config.ray.num_actors`).
        environment: a prototype environment (deep-copied per episode) or a
            zero-argument factory; pickled to every worker.
        tools, parser: as for `Trainer`.
        max_restarts: worker replacements allowed in one `run`.
        torch_threads: torch threads per worker.
        placement: the `Placement` whose "rollout worker" bundles the workers run in
            (`RayStages` reserves one for workers and learners together); None reserves
            one for these workers alone (`config.ray`'s CPU and GPU shares).
    """

    def __init__(self, config: Any, num_workers: int | None = None, environment: Any = None,
                 tools: Sequence[Any] = (), parser: Any = None, max_restarts: int = 3, torch_threads: int = 1,
                 placement: Placement | None = None):
        self.ray = require_ray()
        if environment is None:
            raise ValueError("RolloutWorkerGroup needs an environment (a prototype or a factory)")
        self.config = config
        self.num_workers = num_workers or config.ray.num_actors
        self._own_placement = placement is None
        self.placement = placement or reserve(config, num_actors=self.num_workers, num_learners=0)
        self.max_restarts = max_restarts
        ship_modules([environment, parser, *tools])
        self._args = (config, environment, list(tools), parser, torch_threads)
        self._actor_cls = self.ray.remote(RolloutWorker)
        self._weights: Any = None  # ObjectRef of the last synced weights
        self.version: int | None = None
        self.workers: list[Any] = []
        self.restarts = 0
        try:
            self.workers = [self._start(w) for w in range(self.num_workers)]
            wait_started((f"rollout worker {w}", a) for w, a in enumerate(self.workers))
        except BaseException:
            self.shutdown()
            raise

    def _start(self, index: int) -> Any:
        """A fresh actor in bundle `index`, loaded with the last synced weights (if any)."""
        actor = self._actor_cls.options(**self.placement.options("rollout worker", index)).remote(*self._args)
        if self._weights is not None:
            wait_started([(f"rollout worker {index} (replacement)", actor)])
            self.ray.get(actor.load_weights.remote(self._weights, self.version))
        return actor

    def sync_weights(self, weights: Any, version: int) -> None:
        """Push `weights` (a state dict, a `Policy` or a module: see `trainable_weights`) to
        every worker through the object store, once; later episodes record `version`."""
        self._weights = self.ray.put(trainable_weights(weights))
        self.version = version
        self.ray.get([w.load_weights.remote(self._weights, version) for w in self.workers])

    def run(self, seeds: Sequence[int], group_size: int, temperature: float | None = None,
            sampling_seed: int | None = None,
            on_episode: Callable[[int, int], None] | None = None) -> TrajectoryBatch:
        """`group_size` episodes per seed, groups split across workers; the merged batch.

        `on_episode(worker, index)` is called here as each episode arrives (progress, tests).
        """
        ray = self.ray
        all_seeds = [s for s in seeds for _ in range(group_size)]
        shares = [[i for g in run for i in range(g * group_size, (g + 1) * group_size)]
                  for run in group_ranges(len(seeds), len(self.workers))]
        episodes: dict[int, tuple[Episode, int | None]] = {}
        metas: list[dict[str, Any]] = []
        retried: set[int] = set()
        restarts = 0

        def submit(w: int, indices: list[int]) -> Any:
            return self.workers[w].run.options(num_returns="streaming").remote(
                indices, [all_seeds[i] for i in indices], temperature, sampling_seed)

        streams = {submit(w, share): (w, share) for w, share in enumerate(shares)}
        while streams:
            ready, _ = ray.wait(list(streams), num_returns=1)
            stream = ready[0]
            w, share = streams[stream]
            try:
                kind, index, payload = ray.get(next(stream))
            except StopIteration:
                del streams[stream]
                continue
            except (ray.exceptions.RayActorError, ray.exceptions.ObjectLostError) as exc:
                del streams[stream]
                restarts += 1
                if restarts > self.max_restarts:
                    raise WorkerLostError(f"rollout workers died {restarts} times in one run "
                                          f"(max_restarts={self.max_restarts}); last: {exc}") from exc
                ray.kill(self.workers[w])  # no-op when dead; frees a hung one
                self.workers[w] = self._start(w)
                left = [i for i in share if i not in episodes]
                retried.update(left)
                streams[submit(w, left)] = (w, left)
                continue
            if kind == "meta":
                metas.append(payload)
                continue
            episodes[index] = payload
            if on_episode is not None:
                on_episode(w, index)
        missing = [i for i in range(len(all_seeds)) if i not in episodes]
        if missing:  # a worker stream ended without them: a bug, never a silent gap
            raise RuntimeError(f"rollout workers returned no episode for indices {missing}")
        self.restarts += restarts
        batch = TrajectoryBatch([episodes[i][0] for i in range(len(all_seeds))])
        for meta in metas:  # `Rollout.fault_metrics` counters: per worker process, so they add up
            for key, value in meta.items():
                batch.meta[key] = batch.meta.get(key, 0.0) + value
        batch.meta["weight_versions"] = [episodes[i][1] for i in range(len(all_seeds))]
        batch.meta["retried_episodes"] = sorted(retried)
        batch.meta["worker_restarts"] = restarts
        return batch

    def shutdown(self) -> None:
        """Kill every worker (the Ray cluster itself is left running)."""
        for w in self.workers:
            self.ray.kill(w)
        self.workers = []
        if self._own_placement:
            self.placement.remove()

    def __repr__(self) -> str:
        return f"RolloutWorkerGroup(workers={len(self.workers)}, version={self.version}, restarts={self.restarts})"


__all__ = ["RAY_INSTALL_COMMAND", "RolloutWorker", "RolloutWorkerGroup", "WorkerLostError", "make_environment",
           "group_ranges", "require_ray", "trainable_weights"]
