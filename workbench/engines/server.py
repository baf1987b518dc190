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
  which is checked against the ids), `stop_token_ids`, `ignore_eos=true`, and stop
  strings as `stop` with `include_stop_str_in_output=true`. Logprobs
  are raw (temperature-1) as long as the server runs with its default
  `--logprobs-mode raw_logprobs`. A call's `SamplingParams.constraint` goes as
  `structured_outputs` (its structural tag, `workbench.engines.constraints`; the logprobs
  are then of the masked distribution). Start it with `--enable-prompt-tokens-details` to
  get prefix-cache hits back in `num_cached_tokens`.

SGLang (`kind="sglang"`, `python -m sglang.launch_server --model-path ... --port 30000`):
  POST {base_url}/generate with `input_ids`, `sampling_params` {max_new_tokens,
  temperature, top_p, top_k, stop_token_ids, ignore_eos, no_stop_trim, stop,
  sampling_seed}, `return_logprob=true`; ids and logprobs are read from
  `meta_info.output_token_logprobs` ([logprob, token_id, text] triples), the reason
  from `meta_info.finish_reason`, cache hits from `meta_info.cached_tokens`. SGLang
  returns logprobs of the temperature-scaled distribution unless the server is
  started with `SGLANG_RETURN_ORIGINAL_LOGPROB=1`; set it, or sample at
  temperature 1, to get the raw logprobs the trainer expects. A constrained call is refused
  (EngineError): this backend does not pass constraints to SGLang.

Failures: connection errors, timeouts and HTTP 5xx are retried `max_retries` times
with exponential backoff (`backoff * 2**attempt` seconds); then EngineError names the
backend, the URL and the cause. HTTP 4xx (e.g. a prompt longer than the server's
context) is not retried: that prompt gets `finish_reason="error"`, no tokens, and an
`error` naming the backend, the URL, the status and the server's message (the rollout
ends that episode with the error recorded; it never becomes an empty action).

Replies are not trusted. An answer is refused with EngineError (naming the backend,
the URL and what is wrong; never retried) when: a token id is not an integer in
`[0, vocab_size)` (`vocab_size` defaults to `len(tokenizer)`), it holds more than
`max_tokens` tokens, a logprob is not a finite number, or the body is larger than
`max_response_bytes` (read in chunks, so an oversized body is never held whole).
Only `http://` and `https://` base URLs are accepted, and redirects to any other
scheme are refused.

Stop strings (the engine's `stop`, from `inference.stop`, plus `SamplingParams.stop`)
are sent to the server, and the answer is then cut by `base.StopStrings` too: the
reply ends at the token that completes the first stop string, ids and logprobs kept
as sampled up to it, the stop text included -- the same place as with the hf engine,
even if a server ignores or trims stop strings.

Weights: a server's weights belong to the server. `sync_weights` raises EngineError
by default (`on_sync="ignore"` makes it a no-op for evaluation with a fixed policy).
"""
from __future__ import annotations

import http.client
import json
import socket
import math
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Literal

from workbench.engines.base import EngineError, GenerationEngine, GenerationResult, SamplingParams

_RETRY_STATUSES = range(500, 600)
_SCHEMES = ("http", "https")
_CHUNK = 1 << 16


def _set_read_timeout(resp: Any, seconds: float) -> None:
    """Set the socket timeout under an `http.client.HTTPResponse` (best effort: a response
    object without a socket keeps the timeout it was opened with)."""
    sock = getattr(getattr(getattr(resp, "fp", None), "raw", None), "_sock", None)
    if sock is not None:
        try:
            sock.settimeout(max(seconds, 0.001))
        except OSError:
            pass
DEFAULT_MAX_RESPONSE_BYTES = 16 << 20


class _Retryable(Exception):
    """A failure worth retrying (connection, timeout, 5xx)."""


class _RequestRejected(Exception):
    """HTTP 4xx: the server understood the request and refused it."""


class _Fatal(Exception):
    """A failure that retrying cannot fix (oversized body, redirect off http/https)."""


class _BadAnswer(ValueError):
    """A well-formed reply whose content cannot be right (ids, length, logprobs)."""


def _check_url(url: str) -> None:
    """ValueError unless `url` is an http:// or https:// URL with a host."""
    parts = urllib.parse.urlsplit(url)
    if parts.scheme.lower() not in _SCHEMES or not parts.netloc:
        raise ValueError(
            f"server URL must start with http:// or https:// and name a host (e.g. http://127.0.0.1:8000), "
            f"got {url!r}"
        )


class _HttpOnlyRedirects(urllib.request.HTTPRedirectHandler):
    """Follow redirects only to http/https URLs (urllib would follow ftp:// too)."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # noqa: D102 (urllib hook)
        if urllib.parse.urlsplit(newurl).scheme.lower() not in _SCHEMES:
            raise _Fatal(f"HTTP {code} redirect to {newurl!r} refused: only http:// and https:// are followed")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


_OPENER = urllib.request.build_opener(_HttpOnlyRedirects)


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
        vocab_size: int | None = None,
        max_response_bytes: int = DEFAULT_MAX_RESPONSE_BYTES,
    ):
        """`model` is the served model name for vLLM (None: the first of /v1/models).

        `vocab_size` bounds the token ids a reply may hold (None: `len(tokenizer)`; no
        upper bound when there is no tokenizer either). `max_response_bytes` caps the
        size of one HTTP answer.
        """
        super().__init__(tokenizer)
        if kind not in ("vllm", "sglang"):
            raise ValueError(f"kind must be 'vllm' or 'sglang', got {kind!r}")
        if on_sync not in ("error", "ignore"):
            raise ValueError(f"on_sync must be 'error' or 'ignore', got {on_sync!r}")
        _check_url(str(base_url))
        if int(max_response_bytes) < 1:
            raise ValueError(f"max_response_bytes must be >= 1, got {max_response_bytes}")
        if vocab_size is None and tokenizer is not None:
            vocab_size = len(tokenizer) if hasattr(tokenizer, "__len__") else getattr(tokenizer, "vocab_size", None)
        if vocab_size is not None and int(vocab_size) < 1:
            raise ValueError(f"vocab_size must be >= 1, got {vocab_size}")
        self.vocab_size = None if vocab_size is None else int(vocab_size)
        self.max_response_bytes = int(max_response_bytes)
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
        """One HTTP exchange; raises _Retryable, _RequestRejected or _Fatal."""
        url = self.base_url + path
        _check_url(url)
        data = None if body is None else json.dumps(body).encode()
        req = urllib.request.Request(
            url, data=data, method=method,
            headers={"Content-Type": "application/json", "Accept": "application/json"},
        )
        try:
            with _OPENER.open(req, timeout=timeout or self.timeout) as resp:
                raw = self._read_capped(resp, url, timeout or self.timeout)
        except urllib.error.HTTPError as exc:
            try:
                detail = exc.read(2000).decode(errors="replace")[:500]
            except Exception:  # the error body is only for the message
                detail = ""
            if exc.code in _RETRY_STATUSES:
                raise _Retryable(f"HTTP {exc.code} from {method} {url}: {detail}") from exc
            raise _RequestRejected(f"{method} {url} answered HTTP {exc.code}: {detail}") from exc
        except _Fatal:
            raise
        except urllib.error.URLError as exc:
            raise _Retryable(_describe(exc.reason)) from exc
        except (socket.timeout, TimeoutError) as exc:
            raise _Retryable(f"no answer within {timeout or self.timeout:g} s") from exc
        except (ConnectionError, http.client.HTTPException, OSError) as exc:
            raise _Retryable(_describe(exc)) from exc
        try:
            return json.loads(raw)
        except (ValueError, RecursionError) as exc:
            raise _Retryable(f"invalid JSON in the answer: {raw[:200]!r}") from exc

    def _read_capped(self, resp: Any, url: str, timeout: float) -> bytes:
        """The body, read in chunks; _Fatal as soon as it exceeds `max_response_bytes`,
        _Retryable when it is still incomplete `timeout` seconds after the headers came."""
        cap, deadline = self.max_response_bytes, time.monotonic() + timeout
        too_big = (f"the answer from {url} is larger than max_response_bytes={cap} bytes; a reply for "
                   "max_tokens tokens should be far smaller (check the server), or raise max_response_bytes")
        declared = resp.headers.get("Content-Length")
        if declared is not None and declared.strip().isdigit() and int(declared) > cap:
            raise _Fatal(f"{too_big} (Content-Length: {int(declared)})")
        late = f"the answer from {url} was still incomplete after {timeout:g} s"
        chunks, size = [], 0
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise _Retryable(f"{late} ({size} bytes)")
            _set_read_timeout(resp, left)  # a silent server: one recv waits at most until the deadline
            # read1: whatever one recv brings, so a reply that trickles in byte by byte still
            # comes back here (and meets the deadline) after every few bytes.
            try:
                chunk = resp.read1(min(_CHUNK, cap + 1 - size))
            except (socket.timeout, TimeoutError) as exc:
                raise _Retryable(f"{late} ({size} bytes)") from exc
            if not chunk:
                return b"".join(chunks)
            size += len(chunk)
            if size > cap:
                raise _Fatal(too_big)
            chunks.append(chunk)

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
            except _Fatal as exc:
                raise EngineError(f"{self._where()}: {exc}") from exc
        hint = " — is the server running?" if "refused" in cause or "closed" in cause or "reset" in cause else ""
        raise EngineError(f"{self._where()}: {cause} after {self.max_retries} retries{hint}")

    def health(self, timeout: float = 5.0) -> bool:
        """True when the server answers its health endpoint (no retries)."""
        try:
            _check_url(self.base_url)
            req = urllib.request.Request(self.base_url + "/health", method="GET")
            with _OPENER.open(req, timeout=timeout) as resp:
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
        if params.constraint is not None and self.kind != "vllm":
            raise EngineError(f"{self._where()}: constrained decoding (SamplingParams.constraint) is not passed to "
                              "SGLang servers by this backend; use a vLLM server, or the hf or vllm backend")
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
            result = self._parse_vllm(answer) if self.kind == "vllm" else self._parse_sglang(answer)
            self._check_result(result, params)
            stops = self.stop_strings(params)
            if stops is not None:  # the reply ends at its first stop string, whatever the server did
                result = stops.cut(result)
        except _BadAnswer as exc:
            raise EngineError(f"{self._where()}: refused the answer to {path}: {exc}") from exc
        except (KeyError, IndexError, TypeError, ValueError, AttributeError) as exc:
            raise EngineError(f"{self._where()}: unexpected answer ({exc!r}): {_preview(answer)}") from exc
        return result

    def _check_result(self, result: GenerationResult, params: SamplingParams) -> None:
        """_BadAnswer unless ids are in the vocabulary, at most max_tokens, logprobs finite."""
        ids, logprobs = result.token_ids, result.logprobs
        if len(ids) > params.max_tokens:
            raise _BadAnswer(f"{len(ids)} tokens for max_tokens={params.max_tokens}; the server ignored the "
                             "token limit (check that it honours max_tokens / max_new_tokens)")
        top = self.vocab_size
        for pos, t in enumerate(ids):
            if t < 0 or (top is not None and t >= top):
                bound = f"[0, {top})" if top is not None else ">= 0"
                raise _BadAnswer(f"token id {t} at position {pos} is outside the vocabulary {bound}; does the "
                                 "server serve the model this tokenizer belongs to? (or pass vocab_size=)")
        for pos, lp in enumerate(logprobs):
            if not math.isfinite(lp):
                raise _BadAnswer(f"logprob {lp} at position {pos} is not a finite number; the server's numerics "
                                 "broke (check its dtype and --logprobs-mode raw_logprobs)")

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
        stops = self.stop_strings(params)
        if stops is not None:
            body["stop"] = stops.stops
            body["include_stop_str_in_output"] = True
        if seed is not None:
            body["seed"] = seed
        if params.constraint is not None:
            body["structured_outputs"] = params.constraint.vllm_params()
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
        ids = [_token_id(t) for t in ids]
        if label_ids is not None and label_ids != ids:
            raise ValueError(f"token_ids {ids[:20]} disagree with the logprob labels {label_ids[:20]}")
        logprobs = [_logprob(x) for x in lp.get("token_logprobs") or []]
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
        stops = self.stop_strings(params)
        if stops is not None:
            sampling["stop"] = stops.stops  # no_stop_trim keeps the stop text, as vLLM's include_stop_str_in_output
        if seed is not None:
            sampling["sampling_seed"] = seed
        return {"input_ids": prompt, "sampling_params": sampling, "return_logprob": True, "logprob_start_len": -1}

    @staticmethod
    def _parse_sglang(answer: Any) -> GenerationResult:
        if isinstance(answer, list):  # batch form answers a list
            answer = answer[0]
        meta = answer["meta_info"]
        triples = meta["output_token_logprobs"]
        ids = [_token_id(t[1]) for t in triples]
        logprobs = [_logprob(t[0]) for t in triples]
        out_ids = answer.get("output_ids")
        if out_ids is not None and [_token_id(t) for t in out_ids[: len(ids)]] != ids:
            raise ValueError(f"output_ids {out_ids[:20]} disagree with output_token_logprobs ids {ids[:20]}")
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


def _token_id(value: Any) -> int:
    """A token id from JSON: an int (not a bool, not a float such as 1e9)."""
    if isinstance(value, bool) or not isinstance(value, int):
        raise _BadAnswer(f"token id {value!r} is not an integer")
    return value


def _logprob(value: Any) -> float:
    """A logprob from JSON: a number (not a string or bool); finiteness is checked later."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise _BadAnswer(f"logprob {value!r} is not a number")
    return float(value)


def _preview(answer: Any) -> str:
    try:
        return json.dumps(answer)[:300]
    except (TypeError, ValueError, RecursionError):
        return repr(answer)[:300]


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
