"""`DynamicBatcher`: single-prompt requests in, batched engine calls out.

Engines without a scheduler of their own (the hf engine) serve `submit` with one of
these: requests wait in a queue; one worker thread takes whatever is queued, groups it
by sampling settings (everything but the seed) and runs one batched call per group.
Requests that arrive while a batch is generating wait for the next batch -- so an
episode whose environment step is slow simply joins a later batch, and nobody waits
for it.

Gathering: when the worker finds the queue non-empty it waits until no new request
has arrived for a quiet gap (or a deadline has passed, or `max_batch_size` are queued),
so requests submitted in a burst (a rollout's first turn, environments that finish
together, each resubmitted after a few ms of token bookkeeping) share one batch. Gap
and deadline scale with the last batch's duration -- `gather_seconds` / `max_gather_seconds`
or 0.5% / 2% of it, whichever is larger -- so waiting never costs more than ~2% of
the generation time, and a request held up by a slow environment joins a later batch.
"""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future
from typing import Callable

from workbench.engines.base import GenerationResult, SamplingParams

RunBatch = Callable[[list[list[int]], list[SamplingParams]], list[GenerationResult]]


def _group_key(params: SamplingParams) -> tuple:
    return (params.max_tokens, params.temperature, params.top_p, params.top_k, tuple(params.stop_token_ids),
            tuple(params.stop))


class DynamicBatcher:
    """Serves `submit(prompt, params) -> Future` with batched `run_batch` calls on one thread.

    Args:
        run_batch: `fn(prompts, params_list) -> results`, params differing only in seed.
        max_batch_size: most requests taken into one batch.
        gather_seconds: quiet time (no new request) that closes a batch.
        max_gather_seconds: longest wait for stragglers once a request is queued.
        name: worker thread name.
    """

    def __init__(self, run_batch: RunBatch, max_batch_size: int = 256, gather_seconds: float = 0.005,
                 max_gather_seconds: float = 0.05, name: str = "wb-batcher"):
        self.run_batch = run_batch
        self.max_batch_size = max_batch_size
        self.gather_seconds = gather_seconds
        self.max_gather_seconds = max_gather_seconds
        self._queue: list[tuple[Future, list[int], SamplingParams]] = []
        self._cond = threading.Condition()
        self._closed = False
        self.batches = 0
        self.requests = 0
        self.batch_sizes: list[int] = []
        self._last_batch_seconds = 0.0
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, prompt: list[int], params: SamplingParams) -> "Future[GenerationResult]":
        fut: Future = Future()
        with self._cond:
            if self._closed:
                raise RuntimeError("the engine's batcher is closed")
            self._queue.append((fut, [int(t) for t in prompt], params))
            self._cond.notify_all()
        return fut

    def close(self, timeout: float | None = 60.0) -> None:
        """Serve what is queued, then stop the worker and wait for it (`timeout` seconds).

        Joining matters: a worker thread still unwinding (torch's per-thread OpenMP
        state) while the interpreter exits can abort the process.
        """
        with self._cond:
            self._closed = True
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def stats(self) -> dict[str, float]:
        sizes = self.batch_sizes
        return {"batches": float(self.batches), "requests": float(self.requests),
                "mean_batch_size": sum(sizes) / len(sizes) if sizes else 0.0,
                "max_batch_size": float(max(sizes, default=0))}

    # -- worker ---------------------------------------------------------------------------
    def _take(self) -> list[tuple[Future, list[int], SamplingParams]] | None:
        with self._cond:
            while not self._queue and not self._closed:
                self._cond.wait()
            if not self._queue:
                return None
            gap = max(self.gather_seconds, 0.005 * self._last_batch_seconds)
            deadline = time.monotonic() + max(self.max_gather_seconds, 0.02 * self._last_batch_seconds)
            seen = -1
            while not self._closed:
                n = len(self._queue)
                now = time.monotonic()
                if n >= self.max_batch_size or n == seen or now >= deadline:
                    break
                seen = n
                self._cond.wait(min(gap, deadline - now))
            taken, self._queue = self._queue[: self.max_batch_size], self._queue[self.max_batch_size:]
        return [item for item in taken if item[0].set_running_or_notify_cancel()]

    def _work(self) -> None:
        while True:
            taken = self._take()
            if taken is None:
                return
            groups: dict[tuple, list[tuple[Future, list[int], SamplingParams]]] = {}
            for item in taken:
                groups.setdefault(_group_key(item[2]), []).append(item)
            start = time.monotonic()
            for items in groups.values():
                self.batches += 1
                self.requests += len(items)
                self.batch_sizes.append(len(items))
                try:
                    results = self.run_batch([p for _, p, _ in items], [params for _, _, params in items])
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting callers
                    for fut, _, _ in items:
                        fut.set_exception(exc)
                    continue
                for (fut, _, _), res in zip(items, results):
                    fut.set_result(res)
            self._last_batch_seconds = time.monotonic() - start

