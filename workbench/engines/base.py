"""The engine contract: token ids in, sampled token ids and their logprobs out.

Every backend (`hf`, `vllm`, `server`) implements `GenerationEngine.generate_ids`.
Engines never see text: the rollout renders chat turns to ids itself, and the ids
an engine returns are appended to the episode exactly as sampled (token-in/token-out).

Logprob convention: `logprobs[i]` is log p(token_i | prefix) under the model's raw
distribution (log_softmax of the unscaled logits, i.e. temperature 1), whatever
temperature/top_p was used to sample. That is what the trainer recomputes, so
rollout and training logprobs are directly comparable (vLLM's "raw_logprobs").
Under a constraint (`SamplingParams.constraint`) the logits' disallowed ids are -inf
first, so `logprobs[i]` is of that masked distribution (at temperature 1), as vLLM's
raw_logprobs are under structured outputs; the trainer masks alike
(`workbench.engines.constraints`).

Request-level API (continuous batching, used by `AsyncRollout`): `submit(prompt,
params)` queues one prompt and returns a `concurrent.futures.Future`, so episodes can
ask for their next turn whenever their environment step is done; `agenerate_ids` is
the same for asyncio code. How requests are merged is the backend's business: vLLM
feeds them to its scheduler as they arrive, the hf engine batches whatever is queued,
and the default here (server backends) sends each request on its own thread and lets
the server batch them.
"""
from __future__ import annotations

import asyncio
import dataclasses
import threading
from abc import ABC, abstractmethod
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal

if TYPE_CHECKING:
    from workbench.engines.constraints import Constraint

FinishReason = Literal["stop", "length", "error"]


@dataclass
class SamplingParams:
    """How to sample one model turn."""

    max_tokens: int = 64
    """Maximum new tokens."""
    temperature: float = 1.0
    """Sampling temperature; 0 means greedy."""
    top_p: float = 1.0
    """Nucleus probability mass, in (0, 1]."""
    top_k: int = -1
    """Top-k cut-off; -1 disables."""
    stop_token_ids: list[int] = field(default_factory=list)
    """Generation ends after any of these ids (the id is kept in the output)."""
    stop: list[str] = field(default_factory=list)
    """Stop strings, added to the engine's own (`GenerationEngine.stop`, from
    `inference.stop`); see `StopStrings` for where a reply ends."""
    seed: int | None = None
    """Seed for this call; None = engine's own random state."""
    keep_kv: bool = True
    """Whether a later call may extend these rows: the hf engine then keeps each row's KV
    in its prefix cache (a copy per row). False when none will (an episode's last possible
    turn); only a saving, the samples are the same either way."""
    constraint: "Constraint | None" = None
    """A grammar the reply must follow (`workbench.engines.constraints.Constraint`: JSON
    object or schema, regex, choice, tool calls); None: free text. Logprobs are then of the
    masked distribution (see the module docstring)."""

    def __post_init__(self) -> None:
        if self.max_tokens < 1:
            raise ValueError(f"max_tokens must be >= 1, got {self.max_tokens}")
        if self.temperature < 0:
            raise ValueError(f"temperature must be >= 0, got {self.temperature}")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be in (0, 1], got {self.top_p}")
        if isinstance(self.stop, str) or not all(isinstance(s, str) for s in self.stop):
            raise ValueError(f"stop must be a list of strings, got {self.stop!r}")


@dataclass
class GenerationResult:
    """One sampled continuation."""

    token_ids: list[int]
    """Sampled ids, including the stop id when generation stopped on one."""
    logprobs: list[float]
    """Raw-model log-probability of each sampled id (same length as token_ids); of the masked
    distribution when the call had a constraint."""
    finish_reason: FinishReason
    """"stop" (hit a stop id), "length" (max_tokens reached) or "error"."""
    error: str | None = None
    """What went wrong when finish_reason == "error"."""
    num_cached_tokens: int = 0
    """Prompt tokens served from a prefix cache (engines that have one)."""


class EngineError(RuntimeError):
    """A backend failed; the message names the backend and what to check."""


class GenerationEngine(ABC):
    """Base class of generation backends."""

    #: Backend name as used in `config.inference.backend`.
    name: str = "base"

    #: Stop strings every call of this engine honours (`make_engine` sets them from
    #: `inference.stop`); a call's `SamplingParams.stop` adds to them.
    stop: list[str] = []

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer

    def stop_strings(self, params: SamplingParams) -> "StopStrings | None":
        """The stop strings of one call (the engine's and `params.stop`), None when there are none."""
        stops = [s for s in dict.fromkeys([*self.stop, *params.stop]) if s]  # "" would stop at once: ignored
        return StopStrings(self.tokenizer, stops) if stops else None

    @abstractmethod
    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        """Sample one continuation per prompt (a list of token ids), batched."""

    #: Requests the default `submit` runs at once (threads calling `generate_ids`);
    #: an engine's own `max_concurrency` (server backend) takes precedence.
    max_concurrent_requests: int = 64

    def submit(self, prompt: list[int], params: SamplingParams) -> "Future[GenerationResult]":
        """Queue one prompt; the Future resolves to its `GenerationResult`.

        `params.seed` is that request's own seed (no index is added). Thread-safe; the
        engine merges requests from many callers (see the module docstring). Default:
        `generate_ids([prompt], params)` on a pool of threads, which suits engines that
        batch concurrent requests themselves (HTTP servers).
        """
        prompt = [int(t) for t in prompt]
        pool = self.__dict__.get("_submit_pool")
        if pool is None:
            with _POOL_LOCK:
                pool = self.__dict__.get("_submit_pool")
                if pool is None:
                    workers = getattr(self, "max_concurrency", None) or self.max_concurrent_requests
                    pool = ThreadPoolExecutor(max_workers=workers,
                                              thread_name_prefix=f"wb-{self.name}-submit")
                    self.__dict__["_submit_pool"] = pool
        return pool.submit(lambda: self.generate_ids([prompt], params)[0])

    async def agenerate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        """`generate_ids` for asyncio code: awaits without blocking the event loop.

        Each prompt is submitted as its own request (prompt i with seed `params.seed + i`),
        so prompts awaited by concurrent coroutines are batched together by the engine.
        """
        futures = [self.submit(p, with_seed(params, None if params.seed is None else params.seed + i))
                   for i, p in enumerate(prompts)]
        return list(await asyncio.gather(*(asyncio.wrap_future(f) for f in futures)))

    def _shutdown_submit(self) -> None:
        """Stop the default `submit` threads (called by `close`)."""
        pool = self.__dict__.pop("_submit_pool", None)
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)

    def prepare_constraint(self, constraint: Any) -> None:
        """Compile `constraint` (`workbench.engines.constraints.Constraint`) ahead of the calls
        sampled under it: its grammar is cached for them, so a slow compile runs where the caller
        chose (the gateway: on a worker thread with a deadline) and not inside a batch that other
        requests share. ConstraintError when it cannot compile. Default: nothing (vLLM and the
        servers compile on their side, without holding up other requests)."""

    def sync_weights(self, model: Any) -> None:
        """Load the trainer's current policy weights (no-op for engines that share them)."""

    def stats(self) -> dict[str, float]:
        """Engine counters (e.g. prefix cache hits); empty when there are none."""
        return {}

    def close(self) -> None:
        """Release the engine's resources."""
        self._shutdown_submit()

    def __repr__(self) -> str:
        return f"{type(self).__name__}(backend={self.name!r})"


_POOL_LOCK = threading.Lock()


class StopStrings:
    """Where a reply ends on a stop string, decided on token ids as sampled.

    A reply ends at the first sampled token that completes one of `stops` in the
    decoded reply text (special tokens skipped, as vLLM does). The ids are kept as
    sampled up to and including that token and nothing after it, so the stop text is
    included in the output (vLLM's `include_stop_str_in_output=True`): the kept ids
    are never cut inside a token nor decoded and re-encoded, and the reply's text may
    even go on past the stop string to the end of that last token (e.g. stop "e" and a
    last token "es"). The finish reason is "stop". Stop *ids* (end of turn) are
    separate: `SamplingParams.stop_token_ids`.
    """

    def __init__(self, tokenizer: Any, stops: list[str]):
        if isinstance(stops, str) or not all(isinstance(s, str) and s for s in stops):
            raise ValueError(f"stop strings must be a list of non-empty strings, got {stops!r}")
        self.tokenizer = tokenizer
        self.stops = list(stops)
        # A stop of L characters is at most 4L bytes, so it lies within the last 4L
        # byte-level tokens (each token holds at least one byte); +2 for safety.
        self.window = 4 * max(len(s) for s in self.stops) + 2

    def completes(self, ids: list[int]) -> bool:
        """True when the last `window` ids of the reply hold a stop string.

        Meant to be asked after every sampled token, from the first on: the first time it
        is True, the last token is the one that completed the stop string. Only the last
        `window` ids are decoded, so the check costs the same at any reply length."""
        if not ids:
            return False
        tail = self.tokenizer.decode(ids[-self.window:], skip_special_tokens=True)
        return any(s in tail for s in self.stops)

    def end(self, ids: list[int]) -> int | None:
        """Number of ids to keep: one past the first token that completes a stop string
        (None when the reply holds none). Scans the reply token by token."""
        for n in range(1, len(ids) + 1):
            if self.completes(ids[:n]):
                return n
        return None

    def cut(self, result: "GenerationResult") -> "GenerationResult":
        """`result` ending at its first stop string (ids and logprobs cut alike, finish
        reason "stop"); unchanged when it holds none (or is an error)."""
        if result.finish_reason == "error":
            return result
        n = self.end(result.token_ids)
        if n is None:
            return result
        return dataclasses.replace(result, token_ids=result.token_ids[:n], logprobs=result.logprobs[:n],
                                   finish_reason="stop")


def with_seed(params: SamplingParams, seed: int | None) -> SamplingParams:
    """A copy of `params` with another seed."""
    return dataclasses.replace(params, seed=seed, stop_token_ids=list(params.stop_token_ids), stop=list(params.stop))
