"""How many CPU threads a decode step runs with: timed on the first steps, not guessed.

A decode step of a small model is a few hundred small ops. With OpenMP's passive wait
policy (what `python -m workbench`, the notebooks and the tests set: spinning threads
made torch many times slower on a busy machine) every op that runs on two threads first
wakes the sleeping one. Measured on this 2-core EPYC (SmolLM2-135M, 8 rows, LoRA r=16):
bf16 decodes at 64 ms per step on 2 threads and 38 ms on 1; fp32 at 64 ms on 2 and 74 ms
on 1; with `OMP_WAIT_POLICY=ACTIVE` bf16 takes 27 ms on 2. No fixed rule gets all three
right, so the engine times them: `DecodeThreads` alternates the candidates (all threads,
one thread) over the first decode steps on a CPU, keeps the one with the lower median
step time, and holds that choice for the engine's life (`HFEngine.stats()` reports it).

The engine's prefills are chosen the same way, one `DecodeThreads` per size (new
tokens fed, rounded up to a power of two; one timed call per candidate, no warm-up
call): a small prefill is many small ops too (SmolLM2, bf16, LoRA, one 74-token row:
93 ms on 1 thread, 219 ms on 2), a large one is not (8 rows of 74 tokens: 543 ms on 1,
443 ms on 2).

Only decode steps and prefills change the thread count (`torch.set_num_threads`,
restored afterwards); the trainer runs on every thread.
"""
from __future__ import annotations

import statistics
import time
from contextlib import contextmanager
from typing import Iterator

import torch


class DecodeThreads:
    """Picks the decode steps' thread count by timing (module docstring)."""

    def __init__(self, device: torch.device, trial_steps: int = 4, warm_up: bool = True):
        """`trial_steps`: timed steps per candidate before choosing; `warm_up`: the first
        step at each candidate is not timed (it pays for the switch)."""
        self.trial_steps = trial_steps
        self.warm_up = warm_up
        full = torch.get_num_threads()
        self.candidates = [full, 1] if device.type == "cpu" and full > 1 else [full]
        self.times: dict[int, list[float]] = {n: [] for n in self.candidates}
        self._warm: set[int] = set()
        self.chosen: int | None = self.candidates[0] if len(self.candidates) == 1 else None
        self._next = 0

    def next_threads(self) -> int:
        """The thread count for the next decode step."""
        if self.chosen is not None:
            return self.chosen
        n = self.candidates[self._next % len(self.candidates)]
        self._next += 1
        return n

    def record(self, threads: int, seconds: float) -> None:
        """One decode step's wall time at `threads`; chooses once every candidate has enough."""
        if self.chosen is not None:
            return
        if self.warm_up and threads not in self._warm:  # the first step at a count pays for the switch
            self._warm.add(threads)
            return
        self.times[threads].append(seconds)
        if all(len(t) >= self.trial_steps for t in self.times.values()):
            self.chosen = min(self.candidates, key=lambda n: statistics.median(self.times[n]))

    def stats(self) -> dict[str, float]:
        out: dict[str, float] = {"decode_threads": float(self.chosen or 0)}
        for n, t in self.times.items():
            if t:
                out[f"decode_step_ms_{n}_threads"] = 1000 * statistics.median(t)
        return out

    @contextmanager
    def stepping(self) -> Iterator["_Stepper"]:
        """Run a turn's decode steps: each `with stepper.step():` sets and times one step;
        the original thread count is back afterwards."""
        original = torch.get_num_threads()
        stepper = _Stepper(self, original)
        try:
            yield stepper
        finally:
            if torch.get_num_threads() != original:
                torch.set_num_threads(original)


class _Stepper:
    def __init__(self, owner: DecodeThreads, current: int):
        self.owner, self.current = owner, current

    @contextmanager
    def step(self) -> Iterator[None]:
        n = self.owner.next_threads()
        if n != self.current:
            torch.set_num_threads(n)
            self.current = n
        start = time.perf_counter()
        yield
        self.owner.record(n, time.perf_counter() - start)
