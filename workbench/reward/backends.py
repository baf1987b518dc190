"""Where a judge runs: chat messages in, the judge's reply text out, many at once.

    backend = make_backend("http://127.0.0.1:8000/v1", model=None, timeout=60, retries=2)
    backend = make_backend("hf:smollm2-135m-instruct", dtype="float32")
    backend = EngineBackend(engine)                    # an engine already running (hf, vLLM, server)
    backend = FunctionBackend(my_judge)                # fn(messages) -> reply text
    replies = backend.complete([messages, ...], max_tokens=128, temperature=0.0, timeout=60)

`ServerBackend` sends each request to an OpenAI-compatible `/v1/chat/completions` (vLLM's
server, the workbench's gateway, any endpoint) on a pool of `concurrency` threads, so a step's
judgments are in flight together and the server batches them. A connection error, a timeout
(`timeout` seconds per try) or an HTTP 5xx is tried again `retries` times with exponential
backoff; a 4xx is not (the server refused that request, and its message is the error).

`EngineBackend` renders each request with the judge model's chat template and samples all of
them in one `generate_ids` call of the engine (one batch), on a thread the caller waits on for
at most `timeout` seconds; past it every request of the batch fails (the engine finishes the
batch in the background before it takes the next one). A prompt that does not fit the model's
context with `max_tokens` fails alone.

`FunctionBackend` calls a Python function per request on a thread with the timeout
(`workbench.utils.timeouts.call_with_timeout`): a judge written as code, or a scripted one.
A `response_format` (OpenAI's JSON schema of the reply) goes in the server's request body,
becomes the grammar an engine samples under (`workbench.engines.constraints`), and is not
given to a function.

No backend raises for one request's failure: each `Completion` carries its text or its error,
so the caller fails only that judgment.
"""
from __future__ import annotations

import http.client
import json
import socket
import time
import urllib.error
import urllib.parse
import urllib.request
from concurrent.futures import ThreadPoolExecutor, TimeoutError as FutureTimeout
from dataclasses import dataclass
from typing import Any, Callable

Messages = list[dict[str, Any]]


@dataclass
class Completion:
    """One judge request's outcome."""

    text: str | None
    """The judge's reply, or None when the request failed."""
    error: str | None = None
    """Why it failed (a timeout, a refused request, a dead server), else None."""
    prompt_tokens: int = 0
    """Tokens of the prompt as the judge model read it (0 when unknown)."""
    completion_tokens: int = 0
    """Tokens of the reply (0 when unknown)."""
    seconds: float = 0.0
    """Wall time of the request (for a batch: of the whole batch)."""


class JudgeBackend:
    """Runs judge requests (see the module docstring); `name` is the judge model's name as recorded."""

    name: str = "judge"

    def complete(self, requests: list[Messages], max_tokens: int, temperature: float, timeout: float,
                 response_format: dict[str, Any] | None = None) -> list[Completion]:
        """One `Completion` per request; `response_format`: OpenAI's (a JSON schema the reply
        must follow) or None."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the backend holds (threads, an engine it started)."""

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.name!r})"


class ServerBackend(JudgeBackend):
    """An OpenAI-compatible chat server by URL (`http://HOST:PORT/v1`, or without `/v1`).

    `model`: the name sent as the request's `model` (None: the first of `GET /v1/models`).
    `headers`: extra HTTP headers on every request (e.g. `X-Episode-Id`, under which the
    workbench's gateway records the calls). `max_response_bytes` caps one answer."""

    def __init__(self, url: str, model: str | None = None, retries: int = 2, concurrency: int = 16,
                 backoff: float = 0.25, headers: dict[str, str] | None = None,
                 max_response_bytes: int = 4 << 20):
        root = url.strip().rstrip("/")
        for tail in ("/chat/completions", "/v1"):
            root = root.removesuffix(tail)
        if urllib.parse.urlsplit(root).scheme.lower() not in ("http", "https"):
            raise ValueError(f"a judge server URL starts with http:// or https://, got {url!r}")
        self.url = root + "/v1"
        self.headers = dict(headers or {})
        self.model = model
        self.name = model or self.url
        self.retries, self.backoff = max(0, int(retries)), backoff
        self.concurrency = max(1, int(concurrency))
        self.max_response_bytes = int(max_response_bytes)
        self.requests = 0
        """HTTP requests sent, retries included."""
        self._pool: ThreadPoolExecutor | None = None

    def _http(self, path: str, body: dict[str, Any] | None, timeout: float) -> Any:
        """One exchange, tried again after a connection error, a timeout or a 5xx; raises
        RuntimeError saying what went wrong (a 4xx at once, with the server's message)."""
        data = None if body is None else json.dumps(body).encode()
        cause = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(self.backoff * 2 ** (attempt - 1))
            self.requests += 1
            req = urllib.request.Request(self.url + path, data=data, method="GET" if body is None else "POST",
                                         headers={"Content-Type": "application/json", **self.headers})
            try:
                with urllib.request.urlopen(req, timeout=timeout) as resp:
                    raw = resp.read(self.max_response_bytes + 1)
                if len(raw) > self.max_response_bytes:
                    raise RuntimeError(f"the answer is larger than {self.max_response_bytes} bytes")
                return json.loads(raw)
            except urllib.error.HTTPError as exc:
                detail = exc.read(500).decode(errors="replace")
                if exc.code < 500:
                    raise RuntimeError(f"HTTP {exc.code}: {detail}") from None
                cause = f"HTTP {exc.code}: {detail}"
            except (socket.timeout, TimeoutError):
                cause = f"no answer within reward.judge_timeout_s={timeout:g} s"
            except urllib.error.URLError as exc:
                reason = exc.reason
                cause = (f"no answer within reward.judge_timeout_s={timeout:g} s"
                         if isinstance(reason, (socket.timeout, TimeoutError)) else f"{reason}")
            except (ConnectionError, http.client.HTTPException, OSError, ValueError) as exc:
                cause = _short(exc)
        tries = f" (tried {self.retries + 1} times)" if self.retries else ""
        raise RuntimeError(f"{cause}{tries}")

    def served_model(self, timeout: float) -> str:
        """The model name to send: `model`, else the first id `GET /v1/models` lists."""
        if self.model is None:
            listing = self._http("/models", None, timeout)
            ids = [m.get("id") for m in (listing or {}).get("data", []) if isinstance(m, dict)]
            if not ids or not isinstance(ids[0], str):
                raise RuntimeError(f"{self.url}/models lists no model; set reward.judge_model")
            self.model = ids[0]
            self.name = self.model
        return self.model

    def _one(self, messages: Messages, max_tokens: int, temperature: float, timeout: float,
             response_format: dict[str, Any] | None) -> Completion:
        start = time.perf_counter()
        try:
            body = {"model": self.served_model(timeout), "messages": messages, "max_tokens": int(max_tokens),
                    "temperature": float(temperature)}
            if response_format is not None:
                body["response_format"] = response_format
            answer = self._http("/chat/completions", body, timeout)
        except Exception as exc:  # noqa: BLE001 - one request's failure is that judgment's, not the batch's
            return Completion(None, f"judge server {self.url}: {_short(exc)}", seconds=time.perf_counter() - start)
        seconds = time.perf_counter() - start
        try:
            text = answer["choices"][0]["message"]["content"]
            if not isinstance(text, str):
                raise TypeError(f"content is {type(text).__name__}")
        except (KeyError, IndexError, TypeError) as exc:
            return Completion(None, f"judge server {self.url} answered without a message ({_short(exc)}): "
                                    f"{json.dumps(answer)[:200]}", seconds=seconds)
        usage = answer.get("usage") or {}
        return Completion(text, None, int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0),
                          seconds)

    def complete(self, requests: list[Messages], max_tokens: int, temperature: float, timeout: float,
                 response_format: dict[str, Any] | None = None) -> list[Completion]:
        if not requests:
            return []
        if self._pool is None:
            self._pool = ThreadPoolExecutor(max_workers=self.concurrency, thread_name_prefix="wb-judge")
        futures = [self._pool.submit(self._one, m, max_tokens, temperature, timeout, response_format)
                   for m in requests]
        return [f.result() for f in futures]

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=False, cancel_futures=True)
            self._pool = None


class EngineBackend(JudgeBackend):
    """A generation engine in this process (hf, vLLM; or a `ServerEngine`) with the judge
    model's tokenizer; `owns_engine`: `close` closes the engine too."""

    def __init__(self, engine: Any, name: str | None = None, owns_engine: bool = False,
                 context_tokens: int | None = None):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.name = name or getattr(getattr(getattr(engine, "model", None), "config", None), "_name_or_path",
                                    None) or type(engine).__name__
        self.owns_engine = owns_engine
        model_config = getattr(getattr(engine, "model", None), "config", None)
        self.context_tokens = context_tokens or getattr(model_config, "max_position_embeddings", None)
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="wb-judge-engine")

    def prompt_ids(self, messages: Messages) -> list[int]:
        """The judge model's chat template over `messages`, with the assistant's turn opened."""
        from workbench.rollout.chat import encode

        text = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        return encode(self.tokenizer, text)

    def complete(self, requests: list[Messages], max_tokens: int, temperature: float, timeout: float,
                 response_format: dict[str, Any] | None = None) -> list[Completion]:
        from workbench.engines.base import SamplingParams
        from workbench.rollout.chat import stop_token_ids

        out: list[Completion | None] = [None] * len(requests)
        prompts: list[tuple[int, list[int]]] = []
        for i, messages in enumerate(requests):
            try:
                ids = self.prompt_ids(messages)
            except Exception as exc:  # noqa: BLE001 - a template that cannot render this request
                out[i] = Completion(None, f"judge {self.name}: its chat template failed: {_short(exc)}")
                continue
            if self.context_tokens is not None and len(ids) + max_tokens > self.context_tokens:
                out[i] = Completion(None, f"judge {self.name}: the prompt ({len(ids)} tokens) and {max_tokens} reply "
                                          f"tokens do not fit its context of {self.context_tokens}",
                                    prompt_tokens=len(ids))
                continue
            prompts.append((i, ids))
        if prompts:
            params = SamplingParams(max_tokens=max_tokens, temperature=temperature,
                                    stop_token_ids=stop_token_ids(self.tokenizer), seed=0, keep_kv=False,
                                    constraint=_constraint(response_format))
            start = time.perf_counter()
            future = self._pool.submit(self.engine.generate_ids, [ids for _, ids in prompts], params)
            try:
                results = future.result(timeout=timeout)
                error = None
            except FutureTimeout:
                results, error = None, f"judge {self.name}: no verdict within reward.judge_timeout_s={timeout:g} s"
            except Exception as exc:  # noqa: BLE001 - the engine failed this batch
                results, error = None, f"judge {self.name}: the engine failed: {_short(exc)}"
            seconds = time.perf_counter() - start
            for k, (i, ids) in enumerate(prompts):
                if results is None:
                    out[i] = Completion(None, error, len(ids), 0, seconds)
                    continue
                r = results[k]
                if r.finish_reason == "error":
                    out[i] = Completion(None, f"judge {self.name}: {r.error}", len(ids), 0, seconds)
                    continue
                text = self.tokenizer.decode(r.token_ids, skip_special_tokens=True)
                out[i] = Completion(text, None, len(ids), len(r.token_ids), seconds)
        return [c if c is not None else Completion(None, "not run") for c in out]

    def close(self) -> None:
        self._pool.shutdown(wait=False, cancel_futures=True)
        if self.owns_engine:
            self.engine.close()


class FunctionBackend(JudgeBackend):
    """A Python function `fn(messages) -> reply text` as the judge."""

    def __init__(self, fn: Callable[[Messages], str], name: str | None = None):
        self.fn = fn
        self.name = name or f"{getattr(fn, '__module__', '?')}:{getattr(fn, '__qualname__', repr(fn))}"

    def complete(self, requests: list[Messages], max_tokens: int, temperature: float, timeout: float,
                 response_format: dict[str, Any] | None = None) -> list[Completion]:
        from workbench.utils.timeouts import call_with_timeout

        out = []
        for messages in requests:
            start = time.perf_counter()
            try:
                text = call_with_timeout(lambda m=messages: self.fn(m), timeout, f"judge {self.name}")
                if not isinstance(text, str):
                    raise TypeError(f"the judge function returned {type(text).__name__}, not the reply text")
                out.append(Completion(text, None, seconds=time.perf_counter() - start))
            except Exception as exc:  # noqa: BLE001 - that judgment fails, the batch goes on
                out.append(Completion(None, f"judge {self.name}: {_short(exc)}", seconds=time.perf_counter() - start))
        return out


def make_backend(spec: Any, model: str | None = None, retries: int = 2, concurrency: int = 16,
                 dtype: str = "auto", headers: dict[str, str] | None = None) -> JudgeBackend:
    """The backend a judge location names (`workbench.config.reward_checks.judge_location`:
    a URL, `hf:MODEL`, `vllm:MODEL`, `module:function`), or one given as an object: a
    `JudgeBackend`, a `GenerationEngine`, or a function from messages to the reply."""
    if isinstance(spec, JudgeBackend):
        return spec
    if not isinstance(spec, str):
        if hasattr(spec, "generate_ids") and hasattr(spec, "tokenizer"):
            return EngineBackend(spec)
        if callable(spec):
            return FunctionBackend(spec)
        raise TypeError(f"a judge runs on a URL, hf:MODEL, vllm:MODEL, module:function, an engine or a function; "
                        f"got {type(spec).__name__}")
    from workbench.config.reward_checks import judge_location

    kind, target = judge_location(spec)
    if kind == "server":
        return ServerBackend(target, model=model, retries=retries, concurrency=concurrency, headers=headers)
    if kind == "function":
        from workbench.utils.imports import import_object

        return FunctionBackend(import_object(target), name=target)
    from workbench.models.loading import load_model_and_tokenizer, load_tokenizer, resolve_model_path

    if kind == "hf":
        from workbench.engines.hf import HFEngine

        judge_model, tokenizer = load_model_and_tokenizer(target, dtype=dtype, device="auto")
        # A judge's prompts differ from call to call: no KV is kept between them (prefix_cache=False).
        return EngineBackend(HFEngine(judge_model, tokenizer, prefix_cache=False), name=target, owns_engine=True)
    from workbench.engines.vllm_engine import VLLMEngine

    tokenizer = load_tokenizer(target)
    engine = VLLMEngine(resolve_model_path(target), tokenizer, dtype="float32" if dtype == "auto" else dtype)
    return EngineBackend(engine, name=target, owns_engine=True)


def _constraint(response_format: dict[str, Any] | None) -> Any:
    """The grammar of an OpenAI `response_format` (json_schema or json_object), None for none."""
    if response_format is None:
        return None
    from workbench.engines.constraints import Constraint

    if response_format.get("type") == "json_object":
        return Constraint.json_object()
    return Constraint.json_schema(response_format["json_schema"]["schema"])


def _short(exc: BaseException, limit: int = 300) -> str:
    text = str(exc) or type(exc).__name__
    return text if len(text) <= limit else text[:limit] + "..."


__all__ = ["Completion", "EngineBackend", "FunctionBackend", "JudgeBackend", "Messages", "ServerBackend",
           "make_backend"]
