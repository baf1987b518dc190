"""A request's grammar, built and compiled off the path that serves other requests.

    constraint = await prepare_constraint(engine, constraint, "response_format", max_bytes, timeout, threads)

A grammar can take long to compile (a JSON schema's compile time grows with the square of its
optional properties: 1,000 took ~4 s for a 600-token vocabulary, 500 took 4.8 s for SmolLM2's
49k-token one, on 2 cores), and xgrammar's compile cannot be interrupted. The gateway used to
compile inside the engine's batch, so every other request waited for it (a 10,000-property
schema held a 4-token chat 26-55 s). Now, before a request joins the engine's batches, its
grammar is checked against a size limit (`max_constraint_bytes`, a 400 naming it), then built
and compiled into the engine's grammar cache (`GenerationEngine.prepare_constraint`) on a
compile thread (`CompileThreads`), under a deadline (`constraint_timeout`, a 400 naming it).
The event loop and the engine's batches go on meanwhile. A compile past its deadline runs to
its end on its thread (its grammar lands in the cache, so the same request sent again is
served); at most `COMPILE_THREADS` compile at once, later ones wait their turn within their
own deadline. A grammar the library cannot compile is a 400 naming the field, in the library's
words without its log prefix (`workbench.engines.constraints.library_reason`).
"""
from __future__ import annotations

import asyncio
import json
import threading
from concurrent.futures import Future
from typing import Any

from workbench.engines.constraints import ConstraintError
from workbench.gateway.render import RequestError

#: Default `max_constraint_bytes`: the JSON of a request's grammar (schema, tools) past which it is a 400.
MAX_CONSTRAINT_BYTES = 64 * 1024
#: Default `constraint_timeout`: seconds a request's grammar may take to compile.
CONSTRAINT_TIMEOUT_S = 30.0
#: Grammars compiling at once (each on a thread of its own; more wait for one to finish).
COMPILE_THREADS = 2


class CompileThreads:
    """Runs grammar compiles on daemon threads, at most `n` at once, each returning a
    `concurrent.futures.Future`. A compile cannot be interrupted (xgrammar's C++ code); one
    past its request's deadline runs to its end on its thread and its grammar lands in the
    cache. Daemon threads, so a compile still running never holds up the process's exit (a
    `ThreadPoolExecutor`'s workers are joined at exit)."""

    def __init__(self, n: int):
        self._slots = threading.BoundedSemaphore(n)

    def submit(self, fn: Any) -> Future:
        future: Future = Future()

        def run() -> None:
            with self._slots:
                if not future.set_running_or_notify_cancel():
                    return
                try:
                    future.set_result(fn())
                except BaseException as exc:  # noqa: BLE001 - handed to the waiting request
                    future.set_exception(exc)

        threading.Thread(target=run, name="wb-gateway-compile", daemon=True).start()
        return future


async def prepare_constraint(engine: Any, constraint: Any, field: str, max_bytes: int, timeout: float,
                             threads: CompileThreads) -> Any:
    """`constraint` built and compiled for `engine` (`Constraint.check`, then
    `engine.prepare_constraint`) on one of `threads`, after the size check; a RequestError
    naming `field` when it is over `max_bytes`, takes longer than `timeout` seconds to compile,
    or cannot compile. None stays None."""
    if constraint is None:
        return None
    size = len(json.dumps(constraint.to_dict()))
    if size > max_bytes:
        raise RequestError(f"{field}: the grammar it asks for is {size:,} bytes of JSON, more than this gateway's "
                           f"max_constraint_bytes ({max_bytes:,}); send a smaller schema, or start the gateway with "
                           "a larger max_constraint_bytes", field, "constraint_too_large")

    def build() -> Any:
        constraint.check()
        engine.prepare_constraint(constraint)
        return constraint

    future = threads.submit(build)
    try:
        return await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(future)), timeout)
    except asyncio.TimeoutError:
        raise RequestError(f"{field}: its grammar did not compile within this gateway's constraint_timeout "
                           f"({timeout:g} s); send a simpler schema, or start the gateway with a longer "
                           "constraint_timeout (the compile goes on: the same request sent again later is served)",
                           field, "constraint_timeout") from None
    except ConstraintError as exc:
        raise RequestError(f"{field}: {exc}", field) from None
