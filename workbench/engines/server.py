"""Generation through a running inference server (vLLM or SGLang) over HTTP.

`ServerEngine` speaks token ids both ways -- prompts are sent as id lists and the
sampled ids come back as ids, never re-tokenised text -- so a server-backed rollout is
token-exact like the in-process engines. Prompts of one batch are sent concurrently
(one request per prompt, which also gives each prompt its own seed `seed + index`);
the server batches them itself. Standard library only (urllib).

vLLM (`kind="vllm"`, e.g. `vllm serve <model folder> --port 8001`):
  POST {base_url}/v1/completions with `prompt` = list of ids, `logprobs=0` (sampled
  token only), `return_token_ids=true` (ids in `choices[0].token_ids`) and
  `return_tokens_as_token_ids=true` (the logprob entries are labelled "token_id:<id>",
  which is checked against the ids), `stop_token_ids`, `ignore_eos=true`. Logprobs
  are raw (temperature-1) as long as the server runs with its default
  `--logprobs-mode raw_logprobs`. Start it with `--enable-prompt-tokens-details` to
  get prefix-cache hits back in `num_cached_tokens`.

SGLang (`kind="sglang"`, `python -m sglang.launch_server --model-path ... --port 30000`):
  POST {base_url}/generate with `input_ids`, `sampling_params` {max_new_tokens,
  temperature, top_p, top_k, stop_token_ids, ignore_eos, no_stop_trim,
  sampling_seed}, `return_logprob=true`; ids and logprobs are read from
  `meta_info.output_token_logprobs` ([logprob, token_id, text] triples), the reason
  from `meta_info.finish_reason`, cache hits from `meta_info.cached_tokens`. SGLang
  returns logprobs of the temperature-scaled distribution unless the server is
  started with `SGLANG_RETURN_ORIGINAL_LOGPROB=1`; set it, or sample at
  temperature 1, to get the raw logprobs the trainer expects.

Failures: connection errors, timeouts and HTTP 5xx are retried `max_retries` times
with exponential backoff (`backoff * 2**attempt` seconds); then EngineError names the
backend, the URL and the cause. HTTP 4xx (e.g. a prompt longer than the server's
context) is not retried: that prompt gets `finish_reason="error"`.

Weights: a server's weights belong to the server. `sync_weights` raises EngineError
by default (`on_sync="ignore"` makes it a no-op for evaluation with a fixed policy).
"""
from __future__ import annotations

import http.client
import json
import socket
import threading
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from workbench.engines.base import EngineError, GenerationEngine, GenerationResult, SamplingParams

_RETRY_STATUSES = range(500, 600)


class _Retryable(Exception):
    """A failure worth retrying (connection, timeout, 5xx)."""


class _RequestRejected(Exception):
    """HTTP 4xx: the server understood the request and refused it."""


class ServerEngine(GenerationEngine):
    """Client of a vLLM (OpenAI completions API) or SGLang (/generate) server."""

    name = "server"

    def __init__(
        self,
        base_url: str,
        tokenizer: Any,
        kind: Literal["vllm", "sglang"] = "vllm",
        model: str | None = None,
        timeout: float = 120,
        max_retries: int = 3,
        backoff: float = 0.5,
        max_concurrency: int = 64,
        on_sync: Literal["error", "ignore"] = "error",
    ):
        """`model` is the served model name for vLLM (None: the first of /v1/models)."""
        super().__init__(tokenizer)
        if kind not in ("vllm", "sglang"):
            raise ValueError(f"kind must be 'vllm' or 'sglang', got {kind!r}")
        if on_sync not in ("error", "ignore"):
            raise ValueError(f"on_sync must be 'error' or 'ignore', got {on_sync!r}")
        self.base_url = base_url.rstrip("/")
        self.kind = kind
        self.model = model
        self.timeout = timeout
        self.max_retries = max(0, int(max_retries))
        self.backoff = backoff
        self.max_concurrency = max(1, int(max_concurrency))
        self.on_sync = on_sync
        self._lock = threading.Lock()
        self._counters = {"requests": 0, "prompt_tokens": 0, "cached_prompt_tokens": 0, "generated_tokens": 0,
                          "retries": 0}

    # -- HTTP ---------------------------------------------------------------------------

    def _where(self) -> str:
        return f"server backend ({self.kind} at {self.base_url})"

    def _http(self, method: str, path: str, body: dict | None = None, timeout: float | None = None) -> Any:
        """One HTTP exchange; raises _Retryable or _RequestRejected."""
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            self.base_url + path, data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with urllib.request.urlopen(req, timeout=timeout or self.timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            detail = exc.read().decode(errors="replace")[:500]
            if exc.code in _RETRY_STATUSES:
                raise _Retryable(f"HTTP {exc.code}: {detail}") from exc
            raise _RequestRejected(f"HTTP {exc.code}: {detail}") from exc
        except urllib.error.URLError as exc:
            raise _Retryable(_describe(exc.reason)) from exc
        except (socket.timeout, TimeoutError) as exc:
            raise _Retryable(f"no answer within {timeout or self.timeout:g} s") from exc
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise _Retryable(_describe(exc)) from exc
        try:
            return json.loads(raw)
        except ValueError as exc:
            raise _Retryable(f"invalid JSON in the answer: {raw[:200]!r}") from exc

    def _call(self, method: str, path: str, body: dict | None = None) -> Any:
        """`_http` with retries and exponential backoff; EngineError when they run out."""
        cause = ""
        for attempt in range(self.max_retries + 1):
            if attempt:
                with self._lock:
                    self._counters["retries"] += 1
                time.sleep(self.backoff * 2 ** (attempt - 1))
            try:
                return self._http(method, path, body)
            except _Retryable as exc:
                cause = str(exc)
        hint = " — is the server running?" if "refused" in cause or "closed" in cause or "reset" in cause else ""
        raise EngineError(f"{self._where()}: {cause} after {self.max_retries} retries{hint}")

    def health(self, timeout: float = 5.0) -> bool:
        """True when the server answers its health endpoint (no retries)."""
        try:
            req = urllib.request.Request(self.base_url + "/health", method="GET")
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                return 200 <= resp.status < 300
        except Exception:
            return False

    def wait_until_ready(self, timeout: float = 300.0, interval: float = 1.0) -> None:
        """Block until `health()` is true; EngineError after `timeout` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.health():
                return
            time.sleep(interval)
        raise EngineError(f"{self._where()}: not healthy after {timeout:g} s — is the server running?")

    def _model_name(self) -> str:
        if self.model is None:
            try:
                listing = self._call("GET", "/v1/models")
            except _RequestRejected as exc:
                raise EngineError(f"{self._where()}: /v1/models refused: {exc}") from exc
            try:
                self.model = listing["data"][0]["id"]
            except (KeyError, IndexError, TypeError) as exc:
                raise EngineError(f"{self._where()}: /v1/models lists no model: {listing!r:.200}") from exc
        return self.model

    # -- generation ---------------------------------------------------------------------

    def generate_ids(self, prompts: list[list[int]], params: SamplingParams) -> list[GenerationResult]:
        if not prompts:
            return []
        if self.kind == "vllm":
            self._model_name()  # once, before the threads start
        jobs = [(i, [int(t) for t in p]) for i, p in enumerate(prompts)]
        if len(jobs) == 1:
            results = [self._one(jobs[0], params)]
        else:
            with ThreadPoolExecutor(max_workers=min(len(jobs), self.max_concurrency)) as pool:
                results = list(pool.map(lambda job: self._one(job, params), jobs))
        with self._lock:
            for (_, prompt), r in zip(jobs, results):
                if r.finish_reason == "error" and not r.token_ids:
                    continue
                self._counters["requests"] += 1
                self._counters["prompt_tokens"] += len(prompt)
                self._counters["cached_prompt_tokens"] += r.num_cached_tokens
                self._counters["generated_tokens"] += len(r.token_ids)
        return results

    def _one(self, job: tuple[int, list[int]], params: SamplingParams) -> GenerationResult:
        index, prompt = job
        if not prompt:
            return GenerationResult([], [], "error", error="empty prompt")
        seed = None if params.seed is None else params.seed + index
        if self.kind == "vllm":
            path, body = "/v1/completions", self._vllm_body(prompt, params, seed)
        else:
            path, body = "/generate", self._sglang_body(prompt, params, seed)
        try:
            answer = self._call("POST", path, body)
        except _RequestRejected as exc:
            return GenerationResult([], [], "error", error=f"{self._where()}: {exc}")
        try:
            return self._parse_vllm(answer) if self.kind == "vllm" else self._parse_sglang(answer)
        except (KeyError, IndexError, TypeError, ValueError) as exc:
            raise EngineError(f"{self._where()}: unexpected answer ({exc!r}): {json.dumps(answer)[:300]}") from exc

    def _vllm_body(self, prompt: list[int], params: SamplingParams, seed: int | None) -> dict:
        greedy = params.temperature == 0
        body = {
            "model": self.model,
            "prompt": prompt,
            "max_tokens": params.max_tokens,
            "temperature": 0.0 if greedy else params.temperature,
            "top_p": 1.0 if greedy else params.top_p,
            "top_k": -1 if greedy or params.top_k is None or params.top_k < 1 else params.top_k,
            "logprobs": 0,
            "return_token_ids": True,
            "return_tokens_as_token_ids": True,
            "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": True,
            "skip_special_tokens": False,
            "stream": False,
        }
        if seed is not None:
            body["seed"] = seed
        return body

    @staticmethod
    def _parse_vllm(answer: dict) -> GenerationResult:
        choice = answer["choices"][0]
        lp = choice.get("logprobs") or {}
        labels = lp.get("tokens") or []
        label_ids = [int(str(t).rsplit(":", 1)[-1]) for t in labels] if labels else None
        ids = choice.get("token_ids")
        if ids is None:
            if label_ids is None:
                raise ValueError("the answer has neither token_ids nor token-id logprob labels")
            ids = label_ids
        ids = [int(t) for t in ids]
        if label_ids is not None and label_ids != ids:
            raise ValueError(f"token_ids {ids} disagree with the logprob labels {label_ids}")
        logprobs = [float(x) for x in lp.get("token_logprobs") or []]
        if len(logprobs) != len(ids):
            raise ValueError(f"{len(ids)} tokens but {len(logprobs)} logprobs (send logprobs=0)")
        usage = answer.get("usage") or {}
        cached = int(((usage.get("prompt_tokens_details") or {}).get("cached_tokens")) or 0)
        reason = choice.get("finish_reason")
        if reason in ("stop", "length"):
            return GenerationResult(ids, logprobs, reason, num_cached_tokens=cached)
        return GenerationResult(ids, logprobs, "error", error=f"finish_reason={reason!r}", num_cached_tokens=cached)

    def _sglang_body(self, prompt: list[int], params: SamplingParams, seed: int | None) -> dict:
        greedy = params.temperature == 0
        sampling = {
            "max_new_tokens": params.max_tokens,
            "temperature": 0.0 if greedy else params.temperature,
            "top_p": 1.0 if greedy else params.top_p,
            "top_k": -1 if params.top_k is None or params.top_k < 1 else params.top_k,
            "stop_token_ids": list(params.stop_token_ids),
            "ignore_eos": True,
            "skip_special_tokens": False,
            "no_stop_trim": True,
        }
        if seed is not None:
            sampling["sampling_seed"] = seed
        return {"input_ids": prompt, "sampling_params": sampling, "return_logprob": True, "logprob_start_len": -1}

    @staticmethod
    def _parse_sglang(answer: Any) -> GenerationResult:
        if isinstance(answer, list):  # batch form answers a list
            answer = answer[0]
        meta = answer["meta_info"]
        triples = meta["output_token_logprobs"]
        ids = [int(t[1]) for t in triples]
        logprobs = [float(t[0]) for t in triples]
        out_ids = answer.get("output_ids")
        if out_ids is not None and [int(t) for t in out_ids][: len(ids)] != ids:
            raise ValueError(f"output_ids {out_ids} disagree with output_token_logprobs ids {ids}")
        finish = meta.get("finish_reason")
        kind = finish.get("type") if isinstance(finish, dict) else finish
        cached = int(meta.get("cached_tokens") or 0)
        if kind in ("stop", "length"):
            return GenerationResult(ids, logprobs, kind, num_cached_tokens=cached)
        return GenerationResult(ids, logprobs, "error", error=f"finish_reason={finish!r}", num_cached_tokens=cached)

    # -- the rest of the contract -------------------------------------------------------

    def sync_weights(self, model: Any) -> None:
        if self.on_sync == "ignore":
            return
        raise EngineError(
            f"{self._where()}: cannot push trainer weights to a separate server; use the 'vllm' backend "
            "(in-process, synced every step) for training, or ServerEngine(..., on_sync='ignore') to "
            "sample from a fixed policy"
        )

    def stats(self) -> dict[str, float]:
        with self._lock:
            c = dict(self._counters)
        out = {k: float(v) for k, v in c.items()}
        out["prefix_cache_hit_rate"] = c["cached_prompt_tokens"] / c["prompt_tokens"] if c["prompt_tokens"] else 0.0
        return out

    def __repr__(self) -> str:
        return f"ServerEngine(kind={self.kind!r}, base_url={self.base_url!r})"


def _describe(reason: Any) -> str:
    """Short human cause for a low-level network error."""
    if isinstance(reason, ConnectionRefusedError):
        return "connection refused"
    if isinstance(reason, http.client.RemoteDisconnected):
        return "connection closed by the server"
    if isinstance(reason, ConnectionResetError):
        return "connection reset by the server"
    if isinstance(reason, (socket.timeout, TimeoutError)):
        return "timed out"
    if isinstance(reason, socket.gaierror):
        return f"cannot resolve host ({reason})"
    text = str(reason)
    if "refused" in text.lower():
        return "connection refused"
    return text or type(reason).__name__
