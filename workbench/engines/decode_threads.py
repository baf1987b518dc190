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
tokens fed, rounded up to a power of two up to `LARGE_PREFILL` tokens, one for all
larger ones, compared per token; one timed call per candidate, no warm-up call): a
small prefill is many small ops too (SmolLM2, bf16, LoRA, one 74-token row:
93 ms on 1 thread, 219 ms on 2), a large one is not (8 rows of 74 tokens: 543 ms on 1,
443 ms on 2).

Only decode steps and prefills change the thread count (`torch.set_num_threads`,
restored afterwards); the trainer runs on every thread.

A third decode candidate (`DecodeThreads(split=True)`, the engine's): one thread, with
the step's large matmuls cut in two halves of their outputs, one run by the calling
thread and one by a `MatmulHelper` thread, each on one OpenMP thread. Where the CPU
kernels build (`cpu_kernels.py`) the helper is a `SpinHelper`: a compiled thread that
spins while a decode step is open and sleeps otherwise, so the halves meet with no
wake-up, and every projection of 256 KB and more is split (`decode_step.COMPILED_SPLIT_MIN_BYTES`;
the Python helper's queue and event cost about what an OpenMP wake-up does). On a 2-core
EPYC (bf16, SmolLM2, 8 rows, 2026-12-03) the engine then kept this mode: 28.6 ms per step,
against 33.1 on one thread and 40.1 on two. Two threads that
each stream half of a weight read memory faster than one thread, and faster than two
OpenMP threads woken per op. Measured on this CPU, the matmuls of one SmolLM2 decode
step at 8 rows alone (weights of 2 MB and more split): bf16 20.0 -> 17.2 ms, fp32 56.1 ->
35.5 ms (two OpenMP threads: 47 ms); whole decode steps in the engine: fp32 67-69 ->
47-50 ms (two OpenMP threads: 60-63), bf16 33-34 -> 30-33 ms (about the noise: the
timing decides).

Every candidate multiplies through packed copies of the weights when the engine has them
(`inference.packed_decode`, on by default): oneDNN's for bf16 (`onednn_weights.py`), MKL's
for fp32 (`packed_matmul.py`). On the 2-core Xeon (avx512, amx_bf16; 2026-11-26), SmolLM2
fp32, 8 rows of 64 tokens, ms per step: 2 threads 91, 1 thread 116, split 87-94 with plain
products; all threads with packed products 71-75, split with packed halves 73 (one run each).

The best mode depends on the live rows: a step of few rows is a few hundred small ops and
a read of the weights (one thread, or the helper, often wins under passive waits), a step
of many rows is matmul-bound (all threads). `DecodeModes` keeps one `DecodeThreads` per
row bucket (the live rows rounded up to a power of two), each timed on its own first steps.
A bf16 step of `FP32_MIN_BUCKET` rows and more also times its products in fp32 (`FP32` on
all threads, `FP32_1` on one; `packed_matmul.Fp32Products`): on a CPU without amx, fp32
kernels outrun bf16 ones once a step is matmul-bound.
"""
from __future__ import annotations

import queue
import statistics
import threading
import time
from contextlib import AbstractContextManager, contextmanager
from typing import Any, Callable, Iterator

import torch


#: Prefills of more new tokens than this share one thread-count choice, timed per token
#: (matmul-bound: the choice no longer changes with size, and every size bucket's trial
#: calls at the slower count cost the engine's first later turns seconds).
LARGE_PREFILL = 256
#: The decode candidate "one thread plus a `MatmulHelper`" (module docstring).
SPLIT = "1+helper"
#: The bf16 decode candidates "products in fp32" (`packed_matmul.Fp32Products`), on all threads / on one.
FP32, FP32_1 = "fp32 products", "fp32 products/1"
#: Row buckets from which a bf16 step also times `FP32` and `FP32_1` (matmul-bound steps).
FP32_MIN_BUCKET = 64


class MatmulHelper:
    """A thread that runs one half of a split matmul while the caller runs the other
    (`run(mine, theirs)`), on one OpenMP thread and without autograd. Made once per
    engine; `close()` ends it."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Callable[[], Any] | None] = queue.SimpleQueue()
        self._done = threading.Event()
        self._error: BaseException | None = None
        ready = threading.Event()
        caller_threads = torch.get_num_threads()
        self._thread = threading.Thread(target=self._serve, args=(ready,), name="wb-matmul-helper", daemon=True)
        self._thread.start()
        ready.wait()
        # torch.set_num_threads(1) on the helper also set the count new threads start with: put it back
        torch.set_num_threads(caller_threads)

    def _serve(self, ready: threading.Event) -> None:
        torch.get_num_threads()  # ATen sets a thread's count on its first use, from the process default:
        torch.set_num_threads(1)  # use it first, so this 1 is not replaced by that later
        ready.set()
        while True:
            job = self._jobs.get()
            if job is None:
                return
            try:
                with torch.no_grad():  # grad mode is per thread; the decode step runs without autograd
                    job()
            except BaseException as exc:  # handed to the caller by `run`
                self._error = exc
            finally:
                self._done.set()

    def run(self, mine: Callable[[], Any], theirs: Callable[[], Any]) -> None:
        """Run `theirs` on the helper and `mine` here; return when both ended (an error
        of either is raised here)."""
        self._done.clear()
        self._jobs.put(theirs)
        try:
            mine()
        finally:
            self._done.wait()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """End the helper thread (and wait for it, unless called from it)."""
        if not self._thread.is_alive():
            return
        self._jobs.put(None)
        if self._thread is not threading.current_thread():
            self._thread.join()


class SpinHelper(MatmulHelper):
    """`MatmulHelper` whose packed products run through `cpu_kernels.linear_halves`: the second
    half on a compiled helper thread that spins while a decode step is open (`begin()` /
    `end()`) and sleeps otherwise, so a product's two halves meet with no thread wake-up in
    between (the Python helper's queue and event cost one per product). `run` (plain products,
    Python callables) is `MatmulHelper`'s. Needs `cpu_kernels.available()`."""

    compiled = True

    def __init__(self) -> None:
        from workbench.engines import cpu_kernels

        super().__init__()
        self._kernels = cpu_kernels
        cpu_kernels.helper_begin()  # starts the helper thread now, not in the first timed step
        cpu_kernels.helper_end()

    def begin(self) -> None:
        self._kernels.helper_begin()

    def end(self) -> None:
        self._kernels.helper_end()

    def linear_halves(self, *args: Any) -> torch.Tensor:
        """`cpu_kernels.linear_halves(kind, x, w0, w1, o0, o1, b0, b1, batch)`."""
        return self._kernels.linear_halves(*args)


class DecodeThreads:
    """Picks the decode steps' thread count by timing (module docstring)."""

    def __init__(self, device: torch.device, trial_steps: int = 4, warm_up: bool = True, split: bool = False,
                 fp32: bool = False):
        """`trial_steps`: timed steps per candidate before choosing; `warm_up`: the first
        step at each candidate is not timed (it pays for the switch, and for packing the
        weights of a new row bucket); `split`: also time `SPLIT` (one thread and a
        `MatmulHelper`; the caller runs the helper); `fp32`: also time `FP32` and `FP32_1`
        (the caller runs the products through `Fp32Products`)."""
        self.trial_steps = trial_steps
        self.warm_up = warm_up
        full = torch.get_num_threads()
        self.candidates: list[int | str] = [full, 1] if device.type == "cpu" and full > 1 else [full]
        if split and len(self.candidates) > 1:
            self.candidates.append(SPLIT)
        if fp32 and device.type == "cpu":
            self.candidates += [FP32, FP32_1] if full > 1 else [FP32]
        self.times: dict[int | str, list[float]] = {n: [] for n in self.candidates}
        self._warm: set[int | str] = set()
        self.chosen: int | str | None = self.candidates[0] if len(self.candidates) == 1 else None
        self._next = 0
        self.steps = 0  # steps stepped through this chooser (trial and chosen)

    def next_threads(self) -> int | str:
        """The thread count for the next decode step (or `SPLIT`)."""
        self.steps += 1
        if self.chosen is not None:
            return self.chosen
        n = self.candidates[self._next % len(self.candidates)]
        self._next += 1
        return n

    def record(self, threads: int | str, seconds: float) -> None:
        """One decode step's wall time at `threads`; chooses once every candidate has enough."""
        if self.chosen is not None:
            return
        if self.warm_up and threads not in self._warm:  # the first step at a count pays for the switch
            self._warm.add(threads)
            return
        self.times[threads].append(seconds)
        if all(len(t) >= self.trial_steps for t in self.times.values()):
            self.chosen = min(self.candidates, key=lambda n: statistics.median(self.times[n]))

    def threads(self, mode: int | str) -> int:
        """The OpenMP thread count a step in `mode` runs with."""
        return 1 if mode in (SPLIT, FP32_1) else self.candidates[0] if mode == FP32 else int(mode)

    def stats(self) -> dict[str, float]:
        """`decode_threads`: the chosen mode's OpenMP thread count (0 before choosing; 1 for
        `SPLIT`), `decode_split_matmuls` / `decode_fp32_products`: 1 when `SPLIT` / `FP32` or
        `FP32_1` was chosen, and the median step time of each candidate."""
        chosen = self.chosen
        out: dict[str, float] = {"decode_threads": float(self.threads(chosen) if chosen is not None else 0)}
        if SPLIT in self.candidates:
            out["decode_split_matmuls"] = float(chosen == SPLIT)
        if FP32 in self.candidates:
            out["decode_fp32_products"] = float(chosen in (FP32, FP32_1))
        names = {SPLIT: "decode_step_ms_1_thread_split", FP32: "decode_step_ms_fp32_products",
                 FP32_1: "decode_step_ms_fp32_products_1_thread"}
        for n, t in self.times.items():
            if t:
                out[names.get(n, f"decode_step_ms_{n}_threads")] = 1000 * statistics.median(t)
        return out

    def stepping(self) -> AbstractContextManager["_Stepper"]:
        """Run a turn's decode steps: each `with stepper.step():` sets and times one step;
        the original thread count is back afterwards."""
        return _stepping(self)


def row_bucket(rows: int) -> int:
    """The bucket of a decode step of `rows` live rows: the next power of two."""
    return 1 << max(rows - 1, 0).bit_length()


class DecodeModes:
    """The decode steps' mode per row bucket: one `DecodeThreads` each (module docstring).

    `force(mode)` sets every bucket's mode, now and later (tests; a mode chosen elsewhere).
    """

    def __init__(self, device: torch.device, trial_steps: int = 4, split: bool = False, fp32: bool = False):
        """`split`, `fp32`: as `DecodeThreads`' (`fp32` from `FP32_MIN_BUCKET` rows on)."""
        self.device, self.trial_steps, self.split, self.fp32 = device, trial_steps, split, fp32
        self.candidates = DecodeThreads(device, split=split, fp32=fp32).candidates  # of the largest buckets
        self.buckets: dict[int, DecodeThreads] = {}
        self.forced: int | str | None = None

    def chooser(self, rows: int) -> DecodeThreads:
        """The `DecodeThreads` of `rows` live rows' bucket (made on first use)."""
        b = row_bucket(rows)
        chooser = self.buckets.get(b)
        if chooser is None:
            chooser = self.buckets[b] = DecodeThreads(self.device, self.trial_steps, split=self.split,
                                                      fp32=self.fp32 and b >= FP32_MIN_BUCKET)
            if self.forced is not None:
                chooser.chosen = self.forced
        return chooser

    def force(self, mode: int | str) -> None:
        self.forced = mode
        for chooser in self.buckets.values():
            chooser.chosen = mode

    def stats(self) -> dict[str, float]:
        """The busiest bucket's `DecodeThreads.stats()` (the mode most steps ran), and
        `decode_threads_rows_<bucket>` per bucket: its chosen mode's thread count (0 before
        choosing), with `decode_split_rows_<bucket>` / `decode_fp32_rows_<bucket>` 1 where
        `SPLIT` / `FP32` or `FP32_1` was chosen."""
        if not self.buckets:
            return {}
        busiest = max(self.buckets.values(), key=lambda c: c.steps)
        out = busiest.stats()
        for b in sorted(self.buckets):
            chooser = self.buckets[b]
            chosen = chooser.chosen
            out[f"decode_threads_rows_{b}"] = float(chooser.threads(chosen) if chosen is not None else 0)
            if SPLIT in chooser.candidates:
                out[f"decode_split_rows_{b}"] = float(chosen == SPLIT)
            if FP32 in chooser.candidates:
                out[f"decode_fp32_rows_{b}"] = float(chosen in (FP32, FP32_1))
        return out

    def stepping(self) -> AbstractContextManager["_Stepper"]:
        """Run a turn's decode steps: each `with stepper.step(rows=B):` sets and times one
        step in the mode of B rows' bucket; the original thread count is back afterwards."""
        return _stepping(self)


@contextmanager
def _stepping(owner: "DecodeThreads | DecodeModes") -> Iterator["_Stepper"]:
    """`stepping` of either owner: a `_Stepper` over it, the thread count restored at the end."""
    original = torch.get_num_threads()
    try:
        yield _Stepper(owner, original)
    finally:
        if torch.get_num_threads() != original:
            torch.set_num_threads(original)


class _Stepper:
    def __init__(self, owner: "DecodeThreads | DecodeModes", current: int):
        self.owner, self.current = owner, current
        self.split = False  # this step runs `SPLIT`: the caller hands its MatmulHelper to the step
        self.fp32 = False  # this step runs `FP32` / `FP32_1`: the caller hands its `Fp32Products` to the step

    @contextmanager
    def step(self, work: float = 1.0, rows: int | None = None) -> Iterator[None]:
        """Set the thread count for one step and time it; `work`: what the time is divided
        by before the candidates are compared (a prefill's tokens, when sizes differ);
        `rows`: the step's live rows (with `DecodeModes`: whose bucket's mode runs)."""
        owner = self.owner.chooser(rows or 1) if isinstance(self.owner, DecodeModes) else self.owner
        n = owner.next_threads()
        self.split, self.fp32 = n == SPLIT, n in (FP32, FP32_1)
        threads = owner.threads(n)
        if threads != self.current:
            torch.set_num_threads(threads)
            self.current = threads
        start = time.perf_counter()
        yield
        owner.record(n, (time.perf_counter() - start) / work)
