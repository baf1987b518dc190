"""Run a call with a time limit and reclaim its thread when it overruns.

    value = call_with_timeout(lambda: env.step(action), 60.0, "GuessNumberEnv.step")

Used for every `environment.reset` / `environment.step` of a rollout
(`environment.step_timeout`) and for every tool call of a `ToolRegistry`.

How it works: the call runs on a fresh daemon thread and the caller waits up to
`timeout` seconds. When the call overruns, the caller raises `CallTimeout` (a
`TimeoutError`) and first tries to end the worker thread: Python cannot kill a
thread, but `ctypes.pythonapi.PyThreadState_SetAsyncExc` makes the thread raise an
exception (`_Interrupted`, a `BaseException`, so `except Exception` in the
environment does not swallow it) at its next Python bytecode. A Python-level hang --
a busy loop, a loop of short sleeps, a long chain of pure-Python work -- unwinds within
microseconds, and the thread ends before `call_with_timeout` returns. The
injection is repeated a few times during a short grace period (default 0.2 s) for
code that catches `BaseException` and carries on.

What it cannot do (and how that is reported): a thread blocked inside one C call
(`time.sleep(3600)`, a socket read without timeout, a long numpy/torch kernel) only
sees the exception when that call returns. Such a thread is left running as a daemon
thread (it cannot keep the interpreter alive at exit); the `CallTimeout` message says
so, a `RuntimeWarning` is issued, and `stuck_threads()` lists the ones still alive
(rollouts report the count as `rollout/stuck_threads`). Once the C call returns, the
pending exception ends the thread by itself.

Why threads rather than a subprocess per environment: environments are ordinary
Python objects that notebooks and tests inspect between steps (`env.secret`,
`env.step_count`) and that may hold unpicklable state (open files, models); a
subprocess would need every environment to be picklable and would copy its state
back and forth on every step. The thread keeps the object in this process; the price
is the C-call limit above. An environment that needs its calls on one fixed thread
(e.g. a `sqlite3` connection made in `reset`, Playwright's sync API) should run with
`step_timeout=None`, which calls it directly on the caller's thread.
"""
from __future__ import annotations

import ctypes
import threading
import time
import warnings
from typing import Any, Callable

__all__ = ["CallTimeout", "call_with_timeout", "stuck_threads", "THREAD_PREFIX"]

THREAD_PREFIX = "wb-timed-"
"""Name prefix of the worker threads started here (tests look for leftovers by it)."""

_stuck: list[threading.Thread] = []
_stuck_lock = threading.Lock()


class CallTimeout(TimeoutError):
    """A timed call did not return within its limit.

    Attributes:
        what: name of the call ("GuessNumberEnv.step").
        seconds: the limit that was exceeded.
        reclaimed: True when the worker thread was ended; False when it is still
            blocked (in C code) and left running as a daemon thread.
    """

    def __init__(self, what: str, seconds: float, reclaimed: bool):
        self.what, self.seconds, self.reclaimed = what, seconds, reclaimed
        msg = f"{what} did not return within {seconds:g} s"
        if reclaimed:
            msg += " (interrupted; its thread has ended)"
        else:
            msg += (" and could not be interrupted (it is blocked inside C code); its thread keeps "
                    "running as a daemon thread until that call returns")
        super().__init__(msg)


class _Interrupted(BaseException):
    """Raised inside a timed-out worker thread to unwind it (never seen by callers)."""


def _inject(thread: threading.Thread) -> bool:
    """Ask `thread` to raise `_Interrupted` at its next bytecode; False if it has no state."""
    ident = thread.ident
    if ident is None:
        return False
    n = ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), ctypes.py_object(_Interrupted))
    if n > 1:  # cannot happen for a valid id; undo as the C API documents
        ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(ident), None)
        return False
    return n == 1


def stuck_threads() -> list[threading.Thread]:
    """Timed-out worker threads that could not be interrupted and are still alive."""
    with _stuck_lock:
        _stuck[:] = [t for t in _stuck if t.is_alive()]
        return list(_stuck)


def call_with_timeout(fn: Callable[[], Any], timeout: float | None, what: str, grace: float = 0.2) -> Any:
    """Return `fn()`, or raise `CallTimeout` if it takes longer than `timeout` seconds.

    Args:
        fn: the call, without arguments.
        timeout: seconds; None (or <= 0) calls `fn` directly on this thread, with no limit.
        what: name used in the error and the worker thread's name.
        grace: seconds spent ending an overrunning call before giving up on its thread.

    Exceptions raised by `fn` are re-raised here unchanged.
    """
    if timeout is None or timeout <= 0:
        return fn()
    box: dict[str, Any] = {}
    lock = threading.Lock()
    running = [True]  # True while fn may still be executing (guarded by `lock`)

    def target() -> None:
        try:
            try:
                box["value"] = fn()
            finally:
                with lock:
                    running[0] = False
        except _Interrupted:
            box["interrupted"] = True
        except BaseException as exc:  # handed to the caller
            box["error"] = exc

    worker = threading.Thread(target=target, name=f"{THREAD_PREFIX}{what}", daemon=True)
    worker.start()
    worker.join(timeout)
    if worker.is_alive():
        deadline = time.monotonic() + grace
        while worker.is_alive():
            with lock:
                if running[0]:
                    _inject(worker)
            worker.join(min(0.05, max(0.0, deadline - time.monotonic())))
            if time.monotonic() >= deadline:
                break
        if worker.is_alive() or "interrupted" in box or "value" not in box and "error" not in box:
            reclaimed = not worker.is_alive()
            if not reclaimed:
                with _stuck_lock:
                    _stuck.append(worker)
                warnings.warn(f"{what} timed out after {timeout:g} s and its thread could not be interrupted "
                              "(blocked in C code); it is left running as a daemon thread", RuntimeWarning,
                              stacklevel=2)
            raise CallTimeout(what, timeout, reclaimed)
    if "error" in box:
        raise box["error"]
    return box["value"]
