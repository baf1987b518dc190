"""`AsyncRollout`: every episode runs at its own pace; slow environments stall nobody.

    rollout = AsyncRollout(engine, envs, seeds=[0, 0, 1, 1], max_turns=5)
    batch = rollout.run()            # same constructor and result as `Rollout`

`Rollout.run` is lock-step: all live episodes generate, then all step their
environments, so one slow tool call or environment step holds up every episode's next
turn. Here each episode is its own loop -- generate its turn, step its
environment/tools, generate its next turn -- and the loops only meet in the engine:

* generation goes through `engine.submit(prompt, params)` (one request per turn); the
  engine merges requests from all episodes: vLLM adds them to its running batch as
  they arrive (continuous batching), the hf engine batches whatever is queued, server
  backends send them concurrently (see `workbench.engines.base`);
* environment and tool steps (`MultiTurnManager.step`) run in a thread pool; inside
  them every `env.step` runs under `step_timeout` as in `Rollout`, so a hung
  environment holds a pool thread for at most `step_timeout` (plus a short grace
  period to interrupt it) and then ends its own episode only.

Episodes whose environment had no room at reset (`EnvironmentBusy`) wait as in
`Rollout`; each is reset on the calling thread once an episode has ended, and then runs
at its own pace like the others.

Everything else -- token bookkeeping, deltas, truncation, failures, the alignment
check -- runs on the calling thread through the same `Rollout` methods
(`_apply_action`, `_truncate`, `_fail`, `_finish`), so episodes are built exactly as
in `Rollout`: a greedy run gives the same episodes token for token.

Sampling seeds: turn k of episode i (token budget b) is sampled with its own seed
`seed * 100_003 + k * 101 + b + i` (the seed `Rollout` gives the i-th prompt of its
turn-k call while every episode is live), so a seeded run does not depend on how
requests happened to be batched (exactly so with vLLM; on CPU batched float math can
still move a near-tie).

`timeline` records what happened when (submit / generated / env_start / env_end /
done, with `time.perf_counter()` stamps) for plots and tests. `step()` is the
inherited lock-step turn (e.g. for human actions); `run()` is the asynchronous one.
"""
from __future__ import annotations

import dataclasses
import queue
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from workbench.engines.base import EngineError, GenerationResult, SamplingParams
from workbench.rollout.rollout import Rollout
from workbench.trajectory import TrajectoryBatch
from workbench.utils.progress import EpisodeBar


@dataclass
class RolloutEvent:
    """One entry of `AsyncRollout.timeline`."""

    time: float
    """`time.perf_counter()` when it happened."""
    kind: str
    """"submit" (turn requested from the engine), "generated" (turn came back),
    "env_start" / "env_end" (environment + tools step, on a pool thread), "done"."""
    episode: int
    """Episode index."""
    turn: int
    """Turn index within the episode."""
    tokens: int = 0
    """Sampled tokens ("generated") or prompt tokens ("submit")."""


class _SteppedManager:
    """Stands in for an episode's `MultiTurnManager` once its step has run on a pool thread."""

    def __init__(self, manager: Any, text: str, result: Any, error: BaseException | None):
        self._manager, self._text, self._result, self._error = manager, text, result, error

    def step(self, model_output: str, state: str | None = None) -> Any:
        if model_output != self._text:  # _apply_action decodes the same ids the same way
            raise RuntimeError("AsyncRollout: the action text changed between the environment step and "
                               "the token bookkeeping")
        if self._error is not None:
            raise self._error
        return self._result

    def __getattr__(self, name: str) -> Any:
        return getattr(self._manager, name)


class AsyncRollout(Rollout):
    """`Rollout` whose `run()` lets every episode advance as soon as its own step is done.

    Same arguments as `Rollout`, plus:

    Args:
        env_workers: threads for environment/tool steps (default: one per episode, at
            most 64).
    """

    def __init__(self, *args: Any, env_workers: int | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.env_workers = env_workers
        self.timeline: list[RolloutEvent] = []  # appended from pool threads too (list.append is atomic)
        self._engine_error: BaseException | None = None

    def reset(self) -> "AsyncRollout":
        super().reset()
        self.timeline = []
        return self

    # -- the asynchronous run --------------------------------------------------------------
    def run(self, max_steps: int | None = None) -> TrajectoryBatch:
        """Run every live episode to its end (or `max_steps` more turns each); return the batch."""
        if not self.slots:
            self.reset()
        live = self.live
        if not live and not self.waiting:
            batch = self.batch
            batch.meta.update({k: v for k, v in self.fault_metrics().items() if v})
            return batch
        events: queue.SimpleQueue = queue.SimpleQueue()
        turns_left = {i: max_steps for i in live + self.waiting}
        workers = self.env_workers or min(64, len(live) + len(self.waiting))
        pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wb-env")
        self._engine_error = None
        in_flight = 0
        clean = False
        bar = EpisodeBar(self.slots, self.progress, self.progress_desc, self.progress_leave)
        try:
            for i in live:
                in_flight += self._request_turn(i, events, turns_left)
            while True:
                if self.waiting and self._engine_error is None:  # episodes waiting for room (module docstring)
                    for i in self.admit_waiting():  # waits only when no episode of this rollout is live
                        in_flight += self._request_turn(i, events, turns_left)
                    bar.refresh()
                if not in_flight:
                    if self.waiting and not self.live and self._engine_error is None:
                        continue  # all that were waiting ended or are still waiting: try again
                    break
                kind, i, payload = events.get()
                in_flight -= 1
                if kind == "generated":
                    in_flight += self._on_generated(i, payload, pool, events)
                else:
                    self._on_stepped(i, payload)
                    bar.refresh()
                    if not self.slots[i].episode.done and self._engine_error is None:
                        in_flight += self._request_turn(i, events, turns_left)
            clean = True
        finally:
            bar.__exit__(None, None, None)
            pool.shutdown(wait=clean, cancel_futures=not clean)
            self.turn_counter = max((len(s.episode.turns) for s in self.slots), default=0)
        if self._engine_error is not None:
            exc = self._engine_error
            raise EngineError(
                f"{self.engine.name} backend failed during an asynchronous rollout: {exc}. "
                f"{sum(s.episode.done and s.episode.error is None for s in self.slots)} finished episodes "
                "are kept in rollout.batch"
            ) from exc
        batch = self.batch
        batch.meta.update({k: v for k, v in self.fault_metrics().items() if v})
        return batch

    # -- internals ---------------------------------------------------------------------------
    def _event(self, kind: str, episode: int, turn: int, tokens: int = 0) -> None:
        self.timeline.append(RolloutEvent(time.perf_counter(), kind, episode, turn, tokens))

    def _episode_params(self, index: int) -> SamplingParams | None:
        """Sampling settings of episode `index`'s next turn; None (and truncated) when out of room.

        The same budget rule as `Rollout` (`_turn_budget`), and the seed `Rollout` gives
        the episode's prompt when every episode is live, offset by the episode index.
        """
        slot = self.slots[index]
        budget = self._turn_budget(slot)
        if budget is None:
            self._event("done", index, len(slot.episode.turns))
            return None
        turn = len(slot.episode.turns)
        base = None if self.seed is None else self.seed * 100_003 + turn * 101 + index
        try:
            constraint = self._constraint_of(slot)
        except Exception as exc:  # a failing action_constraint ends this episode only, as in Rollout
            self._fail(slot, f"{type(slot.env).__name__}.action_constraint raised {type(exc).__name__}: {exc}")
            self._event("done", index, len(slot.episode.turns))
            return None
        return self._turn_params(budget, base, constraint)

    def _request_turn(self, index: int, events: queue.SimpleQueue, turns_left: dict[int, int | None]) -> int:
        """Submit episode `index`'s next turn to the engine; returns 1 if a request is in flight."""
        left = turns_left[index]
        if left is not None:
            if left <= 0:
                return 0
            turns_left[index] = left - 1
        params = self._episode_params(index)
        if params is None:
            return 0
        ep = self.slots[index].episode
        self._event("submit", index, len(ep.turns), ep.context_length)
        try:
            fut = self.engine.submit(list(ep.context_ids()), params)
        except Exception as exc:  # e.g. a closed engine
            fut = Future()
            fut.set_exception(exc)
        fut.add_done_callback(lambda f: events.put(("generated", index, f)))
        return 1

    def _on_generated(self, index: int, fut: Future, pool: ThreadPoolExecutor, events: queue.SimpleQueue) -> int:
        """A turn came back: start its environment step on the pool (returns 1 if started)."""
        slot = self.slots[index]
        turn = len(slot.episode.turns)
        try:
            result: GenerationResult = fut.result()
        except Exception as exc:
            self._fail(slot, f"{self.engine.name} engine failed: {type(exc).__name__}: {exc}")
            self._event("done", index, turn)
            if self._engine_error is None:
                self._engine_error = exc
            return 0
        self._event("generated", index, turn, len(result.token_ids))
        if result.finish_reason == "error":  # as in Rollout.step: the episode ends, no empty action
            self._fail(slot, f"{self.engine.name} engine: {result.error or 'generation failed'}")
            self._event("done", index, turn)
            return 0
        text = slot.renderer.action_text(result.token_ids)
        manager = slot.manager

        def env_step() -> tuple[Any, BaseException | None]:
            self._event("env_start", index, turn)
            try:
                return manager.step(text), None
            except Exception as exc:  # handled by _apply_action, as in Rollout
                return None, exc
            finally:
                self._event("env_end", index, turn)

        step = pool.submit(env_step)
        step.add_done_callback(lambda f: events.put(("stepped", index, (result, text, f))))
        return 1

    def _on_stepped(self, index: int, payload: tuple[GenerationResult, str, Future]) -> None:
        """An environment step finished: do the turn's token bookkeeping (calling thread)."""
        result, text, fut = payload
        tr, error = fut.result()
        slot = self.slots[index]
        stepped = dataclasses.replace(slot, manager=_SteppedManager(slot.manager, text, tr, error))
        self._apply_action(stepped, result.token_ids, result.logprobs, result.finish_reason)
        if slot.episode.done:
            self._event("done", index, len(slot.episode.turns) - 1)

