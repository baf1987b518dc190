"""`Gateway`: the current policy behind an OpenAI-compatible HTTP API on 127.0.0.1, recording every call.

    gateway = Gateway(engine).start()         # a thread serving http://127.0.0.1:PORT
    client = openai.OpenAI(base_url=gateway.episode_url("ep-0"), api_key="none")
    client.chat.completions.create(model="policy", messages=[...], tools=[...])
    gateway.calls("ep-0")                     # [CallRecord]: prompt ids, sampled ids, logprobs
    gateway.stop()

Routes: `POST /v1/chat/completions`, `POST /v1/completions` (a text prompt, or a list of
token ids), `GET /v1/models`; each also under `/e/{episode_id}/v1/...`, which is how an
agent that cannot set headers names its episode. Otherwise the episode id comes from the
`X-Episode-Id` header or the request's `user` field; a call without one is served and
not recorded. Generation goes through `engine.submit`, so concurrent requests share the
engine's batches (the hf engine's dynamic batcher, vLLM's scheduler).

Limits: an episode takes at most `max_turns` calls, counting the calls still being
generated (the next one gets a 400 with code `max_turns_reached` and the episode is marked
cut), so a burst of concurrent calls cannot pass it; `close_episode` makes every later call
of that episode a 400 (`episode_closed`); prompt + `max_tokens` must fit
`max_context_tokens` (`context_length_exceeded`: a prompt whose characters alone cannot fit
is refused before it is tokenised, and tokenising runs off the event loop, so one huge prompt
holds up no other request). Each call of an episode takes its call number when it is
admitted, before generating, and its sampling seed derives from that number, so concurrent
calls of one episode sample with distinct seeds. Malformed requests get OpenAI's error
shape, `{"error": {"message", "type", "param", "code"}}`, with status 400, naming the field
(`workbench.gateway.checks`); a 500 (`engine_error`) is the engine failing, nothing the
client sent. A client that disconnects before its body is read costs one warning line in
the server's log. The server only binds 127.0.0.1. `stream=true` gets the reply as
server-sent events once it is generated (`workbench.gateway.stream`; `stream_options.include_usage` adds the usage chunk). Not
supported (a 400 says so): `n` > 1, `top_logprobs` > 0 (the engines give the sampled
token's logprob only), non-text content.

Request fields: every field the gateway knows is in `workbench.gateway.fields` (supported,
accepted only at its neutral value, or refused); anything it cannot honour, or does not know,
is a 400 naming the field, never accepted and ignored. `response_format` (json_object,
json_schema), `tool_choice` ("required", a named function) and `parallel_tool_calls: false`
become a grammar the reply is sampled under (`workbench.engines.constraints`); the call
records it, and the trainer scores the reply under the same masks. Stop strings end the
returned text before the stop string, as OpenAI's API does; the recorded ids stay as sampled
(up to the token that completed the stop string).
"""
# No `from __future__ import annotations` here: FastAPI reads the route functions' annotations
# (`request: Request`) as objects, and `Request` is imported inside `_build_app`.
import asyncio
import logging
import socket
import threading
import time
import uuid
import zlib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from typing import Any

from workbench.engines.base import EngineError, GenerationEngine, SamplingParams
from workbench.gateway.checks import check_choices, check_seed, number, parse_body, user
from workbench.gateway.fields import (check_fields, constraint_field, max_tokens_of, request_constraint,
                                      structured_outputs)
from workbench.gateway.grammars import (COMPILE_THREADS, CONSTRAINT_TIMEOUT_S, MAX_CONSTRAINT_BYTES, CompileThreads,
                                        prepare_constraint)
from workbench.gateway.render import PromptBuilder, Reply, RequestError, check_messages, cut_at_stop, parse_tools
from workbench.gateway.stream import check_stream, response_chunks, sse_events
from workbench.rollout.chat import encode
from workbench.rollout.fork import first_difference

LOOPBACK = "127.0.0.1"

LENGTH_SLACK = 2
"""A prompt is refused unread when its characters exceed LENGTH_SLACK x the tokenizer's
longest token (in characters) x the context: no tokenisation can make it fit. The slack
covers normalisers that drop characters."""

_server_log = logging.getLogger("uvicorn.error")  # the server's own log (uvicorn writes it to stderr)


@dataclass
class CallRecord:
    """One served call of an episode."""

    index: int
    """0-based call number within the episode."""
    prompt_ids: list[int]
    """The prompt exactly as the engine got it."""
    reply: Reply
    """Sampled ids, their logprobs and the message returned."""
    finish_reason: str
    """The engine's finish reason: "stop" or "length"."""
    messages: list[dict[str, Any]] = field(default_factory=list)
    """The request's messages as the chat template got them (empty for /v1/completions)."""
    tools: list[dict[str, Any]] = field(default_factory=list)
    """The request's OpenAI tool definitions."""
    reused_replies: int = 0
    """Earlier replies put back into this prompt as their sampled ids."""
    route: str = "chat"
    """"chat" or "completions"."""
    seconds: float = 0.0
    """Time from request to reply."""
    source: str = "model"
    """"model" (sampled now), "replayed" (a recorded reply given again) or "edited" (typed text),
    the last two from a script (`Gateway.script`)."""
    constraint: dict[str, Any] | None = None
    """The grammar the reply was sampled under (`Constraint.to_dict()` plus `stop_token_ids`:
    from `response_format`, `tool_choice`, `parallel_tool_calls`), or None."""


@dataclass
class ScriptedReply:
    """A reply the gateway gives instead of sampling one: a recorded turn given again when an
    episode is replayed for a fork, or the text typed in place of a turn."""

    prompt_ids: list[int]
    """The prompt the call must send: anything else is a replay mismatch (a 400, code
    `replay_mismatch`, and `Gateway.replay_mismatch` says where)."""
    token_ids: list[int]
    """The reply's ids."""
    logprobs: list[float]
    """Their sampling logprobs (0.0 for typed text)."""
    finish_reason: str = "stop"
    """The finish reason to report."""
    source: str = "replayed"
    """"replayed" or "edited" (a typed turn: not trained on)."""


@dataclass
class _EpisodeLog:
    calls: list[CallRecord] = field(default_factory=list)
    closed: bool = False
    cut: str | None = None  # "max_turns" when a call was refused for the turn limit
    in_flight: set[int] = field(default_factory=set)  # call numbers admitted and still being served
    numbers: set[int] = field(default_factory=set)  # call numbers of the recorded calls
    script: list[ScriptedReply] = field(default_factory=list)  # replies for the first calls, in order
    seed_key: str | None = None  # what the calls' sampling seeds derive from, in place of the episode id
    # (call, token position, recorded text, sent text) when a scripted call's prompt was not the recorded one
    mismatch: tuple[int, int, str, str] | None = None


class Gateway:
    """Serves `engine` as an OpenAI-compatible API and records each call under its episode id.

    Args:
        engine: a `GenerationEngine` (hf, vllm, server); its `submit` batches concurrent calls.
        model_name: the name `/v1/models` lists (any `model` value is accepted).
        port: TCP port on 127.0.0.1; 0 picks a free one.
        max_tokens: tokens per reply when the request does not say.
        max_turns: calls one episode may make (None: no limit).
        max_context_tokens: prompt + reply budget per call.
        temperature: sampling temperature when the request does not say.
        seed: base sampling seed; each call of an episode gets its own seed derived from it,
            the episode's seed key (its id, unless `seed_key` named another) and the call
            number (None: fresh randomness). A request's `seed` wins.
        history, enable_thinking, tool_format: how the chat template is used, as in a rollout
            (`inference.history` ...; pass `**chat_settings(config)` from
            `workbench.rollout.configured`); see `workbench.gateway.render`.
        max_constraint_bytes: the largest grammar a request may ask for (`response_format`,
            `structured_outputs` or the tools' parameters under `tool_choice`), as the JSON of its
            constraint; a larger one is a 400 naming this setting (default 64 KiB, about 1,700
            optional string properties: a schema's compile time grows with the square of its
            optional properties; 500 took 4.8 s for SmolLM2's 49k-token vocabulary on 2 cores).
        constraint_timeout: seconds a request's grammar may take to compile (on the gateway's
            compile thread, while other requests are served); a longer one is a 400 naming
            this setting. The compile goes on and lands in the cache, so the same request sent
            again is served.
    """

    def __init__(self, engine: GenerationEngine, model_name: str = "policy", port: int = 0, max_tokens: int = 64,
                 max_turns: int | None = None, max_context_tokens: int = 2048, temperature: float = 1.0,
                 seed: int | None = 0, history: str = "auto", enable_thinking: bool | None = None,
                 tool_format: str = "auto", max_constraint_bytes: int = MAX_CONSTRAINT_BYTES,
                 constraint_timeout: float = CONSTRAINT_TIMEOUT_S):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.builder = PromptBuilder(self.tokenizer, history, enable_thinking, tool_format)
        self.model_name = model_name
        self.port = port
        self.max_tokens, self.max_turns, self.max_context_tokens = max_tokens, max_turns, max_context_tokens
        self.temperature, self.seed = temperature, seed
        if not (isinstance(max_constraint_bytes, int) and max_constraint_bytes > 0 and constraint_timeout > 0):
            raise ValueError(f"max_constraint_bytes must be an int > 0 and constraint_timeout > 0, got "
                             f"{max_constraint_bytes!r} and {constraint_timeout!r}")
        self.max_constraint_bytes, self.constraint_timeout = max_constraint_bytes, float(constraint_timeout)
        self._compiles = CompileThreads(COMPILE_THREADS)  # grammars compile here, off the serving path
        self._episodes: dict[str, _EpisodeLog] = {}
        self._lock = threading.Lock()
        self._server: Any = None
        self._thread: threading.Thread | None = None
        self.unrecorded_calls = 0
        self._tokenize_pool: ThreadPoolExecutor | None = None  # one thread: prompts are tokenised off the loop
        self.app = self._build_app()

    # -- lifecycle -----------------------------------------------------------------------
    @property
    def base_url(self) -> str:
        """`http://127.0.0.1:PORT/v1` (the OpenAI client's base_url)."""
        return f"http://{LOOPBACK}:{self.port}/v1"

    def episode_url(self, episode_id: str) -> str:
        """A base_url whose calls are recorded under `episode_id` (no header needed)."""
        return f"http://{LOOPBACK}:{self.port}/e/{episode_id}/v1"

    def start(self, timeout: float = 30.0) -> "Gateway":
        """Serve on a daemon thread; returns once the port accepts connections."""
        import uvicorn

        if self._thread is not None:
            return self
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((LOOPBACK, self.port))
        self.port = sock.getsockname()[1]
        config = uvicorn.Config(self.app, log_level="warning", access_log=False, lifespan="off")
        self._server = uvicorn.Server(config)
        self._thread = threading.Thread(target=self._server.run, kwargs={"sockets": [sock]},
                                        name="wb-gateway", daemon=True)
        self._thread.start()
        deadline = time.monotonic() + timeout
        while not self._server.started:
            if time.monotonic() > deadline or not self._thread.is_alive():
                raise RuntimeError(f"the gateway did not start on {LOOPBACK}:{self.port}")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Stop serving (waits for the server thread)."""
        if self._server is not None:
            self._server.should_exit = True
        if self._thread is not None:
            self._thread.join(10)
        self._server, self._thread = None, None
        if self._tokenize_pool is not None:
            self._tokenize_pool.shutdown(wait=False, cancel_futures=True)
            self._tokenize_pool = None

    def __enter__(self) -> "Gateway":
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- records ---------------------------------------------------------------------------
    def calls(self, episode_id: str) -> list[CallRecord]:
        """The recorded calls of an episode, in order."""
        with self._lock:
            log = self._episodes.get(episode_id)
            return list(log.calls) if log else []

    def cut_reason(self, episode_id: str) -> str | None:
        """"max_turns" when the episode asked for a call past `max_turns`, else None."""
        with self._lock:
            log = self._episodes.get(episode_id)
            return log.cut if log else None

    def close_episode(self, episode_id: str) -> None:
        """Refuse every later call of this episode (a 400 with code `episode_closed`)."""
        with self._lock:
            self._episodes.setdefault(episode_id, _EpisodeLog()).closed = True

    def script(self, episode_id: str, replies: list[ScriptedReply]) -> None:
        """Answer the episode's first calls with `replies`, in order, instead of sampling; each
        call's prompt must be the reply's `prompt_ids`. Later calls are sampled as usual."""
        with self._lock:
            self._episodes.setdefault(episode_id, _EpisodeLog()).script = list(replies)

    def seed_key(self, episode_id: str, key: str) -> None:
        """Derive the episode's sampling seeds from `key` instead of its id, so an episode
        whose id must be unique (a uuid) still samples the same on every run."""
        with self._lock:
            self._episodes.setdefault(episode_id, _EpisodeLog()).seed_key = key

    def replay_mismatch(self, episode_id: str) -> tuple[int, int, str, str] | None:
        """(call, token position, recorded text, sent text) where a scripted call's prompt
        differed from the recorded one, or None."""
        with self._lock:
            log = self._episodes.get(episode_id)
            return log.mismatch if log else None

    def _scripted(self, episode_id: str | None, k: int | None, prompt: list[int]) -> ScriptedReply | None:
        """The scripted reply of call number `k`, or None; a prompt that is not the recorded one raises."""
        if episode_id is None or k is None:
            return None
        with self._lock:
            log = self._episodes.get(episode_id)
            if log is None or k >= len(log.script):
                return None
            want = log.script[k]
            if prompt != want.prompt_ids:
                at = first_difference(prompt, want.prompt_ids)
                log.mismatch = (k, at, self.tokenizer.decode(want.prompt_ids[at:at + 12]),
                                self.tokenizer.decode(prompt[at:at + 12]))
                raise RequestError(f"replay of episode {episode_id!r} diverged at call {k}: its prompt differs from "
                                   f"the recorded one at token {at} (recorded {log.mismatch[2]!r}, sent "
                                   f"{log.mismatch[3]!r}); the agent did not send what it sent when the episode "
                                   "was recorded", "messages", "replay_mismatch")
            return want

    def forget(self, episode_id: str) -> None:
        """Drop an episode's records."""
        with self._lock:
            self._episodes.pop(episode_id, None)

    def _admissible(self, episode_id: str, log: _EpisodeLog) -> None:
        """Raise when the episode takes no more calls (call with the lock held)."""
        if log.closed:
            raise RequestError(f"episode {episode_id!r} is closed (its time limit passed or it was cut); "
                               "start a new episode", None, "episode_closed")
        if self.max_turns is not None and len(log.calls) + len(log.in_flight) >= self.max_turns:
            log.cut = "max_turns"
            busy = f" ({len(log.in_flight)} still being answered)" if log.in_flight else ""
            raise RequestError(f"episode {episode_id!r} has reached its turn limit: it made max_turns="
                               f"{self.max_turns} calls{busy}; the gateway cut it here", None, "max_turns_reached")

    def _check_open(self, episode_id: str | None) -> list[Reply]:
        """The episode's earlier replies; a RequestError when it is closed or at its turn limit."""
        if episode_id is None:
            return []
        with self._lock:
            log = self._episodes.setdefault(episode_id, _EpisodeLog())
            self._admissible(episode_id, log)
            return [c.reply for c in log.calls]

    def _admit(self, episode_id: str | None) -> int | None:
        """Take this call's number (the smallest one no recorded or in-flight call of the episode
        holds) before it is generated, checking the turn limit in the same step, so concurrent
        calls can neither pass the limit nor share a number (their seeds derive from it).
        `_release` gives it back; None for a call of no episode."""
        if episode_id is None:
            return None
        with self._lock:
            log = self._episodes.setdefault(episode_id, _EpisodeLog())
            self._admissible(episode_id, log)
            k = len(log.calls)
            while k in log.numbers or k in log.in_flight:
                k += 1
            log.in_flight.add(k)
            return k

    def _release(self, episode_id: str | None, k: int | None) -> None:
        if episode_id is None or k is None:
            return
        with self._lock:
            log = self._episodes.get(episode_id)
            if log is not None:
                log.in_flight.discard(k)

    def _record(self, episode_id: str | None, k: int | None, record: CallRecord) -> None:
        if episode_id is None:
            self.unrecorded_calls += 1
            return
        with self._lock:
            log = self._episodes.setdefault(episode_id, _EpisodeLog())
            log.in_flight.discard(k)
            if not log.closed:  # a call that finishes after its episode was closed is not part of it
                record.index = len(log.calls)
                log.calls.append(record)
                log.numbers.add(k)

    # -- serving ---------------------------------------------------------------------------
    def _sampling(self, body: dict[str, Any], prompt_len: int, field_name: str = "messages") -> SamplingParams:
        """The request's sampling parameters; its seed only when it sent one (see `_seeded`)."""
        max_tokens, name = max_tokens_of(body)
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
            raise RequestError(f"{name} must be a positive integer, got {max_tokens!r}", name)
        room = self.max_context_tokens - prompt_len
        if room < 1:
            raise RequestError(f"the prompt is {prompt_len} tokens; this gateway's context is "
                               f"{self.max_context_tokens} tokens", field_name, "context_length_exceeded")
        stop = body.get("stop") or []
        stop = [stop] if isinstance(stop, str) else stop
        if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
            raise RequestError("stop must be a string or a list of strings", "stop")
        top_k = body.get("top_k")
        if top_k is not None and (not isinstance(top_k, int) or isinstance(top_k, bool) or (top_k < 1 and top_k != -1)):
            raise RequestError(f"top_k must be -1 (off) or an integer >= 1, got {top_k!r}", "top_k")
        try:
            return SamplingParams(max_tokens=min(max_tokens, room),
                                  temperature=number(body, "temperature", self.temperature, 0.0, 2.0),
                                  top_p=number(body, "top_p", 1.0, 0.0, 1.0, low_open=True),
                                  top_k=-1 if top_k is None else top_k,
                                  stop=[s for s in stop if s], stop_token_ids=list(self.builder.stop_ids),
                                  seed=check_seed(body))
        except ValueError as exc:
            if isinstance(exc, RequestError):
                raise
            raise RequestError(str(exc), None) from None

    def _stops(self, params: SamplingParams) -> list[str]:
        """The stop strings of a call (the engine's and the request's)."""
        stops = self.engine.stop_strings(params)
        return stops.stops if stops is not None else []

    def _seeded(self, params: SamplingParams, episode_id: str | None, k: int | None) -> SamplingParams:
        """`params` with the seed of call number `k` of the episode, when the request sent none."""
        if params.seed is not None or self.seed is None or episode_id is None or k is None:
            return params
        with self._lock:
            log = self._episodes.get(episode_id)
            key = log.seed_key if log is not None and log.seed_key is not None else episode_id
        return replace(params, seed=zlib.crc32(f"{self.seed}:{key}:{k}".encode()))

    def _check_length(self, chars: int, param: str) -> None:
        """Refuse, before tokenising, a prompt whose characters cannot fit the context (LENGTH_SLACK)."""
        longest = self.builder.max_token_chars
        if chars > LENGTH_SLACK * longest * self.max_context_tokens:
            raise RequestError(f"the prompt is {chars:,} characters long, far more than this gateway's context of "
                               f"{self.max_context_tokens} tokens holds (no token of this tokenizer is longer than "
                               f"{longest} characters); shorten it", param, "context_length_exceeded")

    async def _off_loop(self, fn: Any, *args: Any) -> Any:
        """Run `fn(*args)` on the gateway's tokenising thread, so the event loop keeps serving."""
        if self._tokenize_pool is None:
            self._tokenize_pool = ThreadPoolExecutor(1, thread_name_prefix="wb-gateway-tokenize")
        return await asyncio.get_running_loop().run_in_executor(self._tokenize_pool, fn, *args)

    async def _prepared(self, constraint: Any, field: str) -> Any:
        """`constraint` built and compiled off the serving path (`workbench.gateway.grammars`)."""
        return await prepare_constraint(self.engine, constraint, field, self.max_constraint_bytes,
                                        self.constraint_timeout, self._compiles)

    async def _generate(self, prompt: list[int], params: SamplingParams) -> Any:
        try:
            result = await asyncio.wrap_future(self.engine.submit(prompt, params))
        except EngineError:
            raise
        except Exception as exc:  # noqa: BLE001 - whatever the engine raised is its failure, named
            raise EngineError(f"{self.engine.name} engine: {type(exc).__name__}: {exc}") from exc
        if result.finish_reason == "error":
            raise EngineError(f"{self.engine.name} engine: {result.error or 'generation failed'}")
        return result

    async def _reply_ids(self, episode_id: str | None, k: int | None, prompt: list[int],
                         params: SamplingParams) -> tuple[list[int], list[float], str, str]:
        """(ids, logprobs, finish reason, source) of call `k`: its scripted reply, else sampled."""
        scripted = self._scripted(episode_id, k, prompt)
        if scripted is not None:
            return list(scripted.token_ids), list(scripted.logprobs), scripted.finish_reason, scripted.source
        result = await self._generate(prompt, self._seeded(params, episode_id, k))
        return list(result.token_ids), list(result.logprobs), result.finish_reason, "model"

    async def chat(self, body: dict[str, Any], episode_id: str | None) -> dict[str, Any]:
        """Serve one `/v1/chat/completions` request body (raises RequestError for a 400)."""
        start = time.monotonic()
        check_fields(body, "chat")  # a field the gateway would ignore is a 400 (fields.py)
        check_stream(body)  # before generating: a malformed stream_options is a 400, not a wasted reply
        want_logprobs = check_choices(body)
        messages = check_messages(body.get("messages"))
        tools = parse_tools(body.get("tools"))
        # response_format, tool_choice, parallel_tool_calls; calls written as the model's parser reads them
        constraint = request_constraint(body, tools, self.builder.parser.name, check=False,
                                        marker_token=self.builder.marker_id)
        if body.get("tool_choice") == "none":
            tools = []
        episode_id = episode_id or user(body)
        replies = self._check_open(episode_id)
        self._check_length(sum(len(m["content"]) for m in messages), "messages")
        prompt, msgs, reused = await self._off_loop(self.builder.prompt_ids, messages, tools, replies)
        params = replace(self._sampling(body, len(prompt)), constraint=await self._prepared(constraint,
                                                                                          constraint_field(body)))
        k = self._admit(episode_id)
        try:
            ids, logprobs, finish, source = await self._reply_ids(episode_id, k, prompt, params)
            reply = self.builder.reply(ids, logprobs, parse_tools=bool(tools), stop=self._stops(params))
            self._record(episode_id, k, CallRecord(0, prompt, reply, finish, msgs, tools, reused, "chat",
                                                   time.monotonic() - start, source, _recorded(params)))
        finally:
            self._release(episode_id, k)
        finish = "tool_calls" if reply.tool_calls else finish
        message: dict[str, Any] = {"role": "assistant", "content": reply.content}
        if reply.reasoning is not None:
            message["reasoning_content"] = reply.reasoning
        if reply.tool_calls:
            message["tool_calls"] = reply.tool_calls
        choice: dict[str, Any] = {"index": 0, "message": message, "finish_reason": finish, "logprobs": None}
        if want_logprobs:
            choice["logprobs"] = {"content": [
                {"token": self.tokenizer.decode([t]), "logprob": lp, "bytes": None, "top_logprobs": []}
                for t, lp in zip(reply.token_ids, reply.logprobs)]}
        return {"id": f"chatcmpl-{uuid.uuid4().hex[:24]}", "object": "chat.completion", "created": int(time.time()),
                "model": self.model_name, "choices": [choice], "usage": _usage(prompt, reply)}

    async def completions(self, body: dict[str, Any], episode_id: str | None) -> dict[str, Any]:
        """Serve one `/v1/completions` request body: a text prompt (tokenised as sent) or token ids."""
        start = time.monotonic()
        check_fields(body, "completions")
        check_stream(body)
        check_choices(body, chat=False)
        prompt = body.get("prompt")
        if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
            prompt = prompt[0]
        if isinstance(prompt, str) and prompt:
            self._check_length(len(prompt), "prompt")
            ids = await self._off_loop(encode, self.tokenizer, prompt)
        elif (isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)):
            vocab = len(self.tokenizer)
            if any(t < 0 or t >= vocab for t in prompt):
                raise RequestError(f"prompt token ids must be in [0, {vocab})", "prompt")
            ids = list(prompt)
        else:
            raise RequestError("prompt must be a non-empty string or a non-empty list of token ids (one prompt)",
                               "prompt")
        episode_id = episode_id or user(body)
        params = replace(self._sampling(body, len(ids), "prompt"),
                         constraint=await self._prepared(structured_outputs(body, check=False), "structured_outputs"))
        k = self._admit(episode_id)
        try:
            out, logprobs, finish, source = await self._reply_ids(episode_id, k, ids, params)
            full = self.tokenizer.decode(out, skip_special_tokens=True)
            text = cut_at_stop(full, self._stops(params))  # OpenAI's text ends before the stop string
            reply = Reply(list(out), list(logprobs), full, text)
            self._record(episode_id, k, CallRecord(0, ids, reply, finish, [], [], 0, "completions",
                                                   time.monotonic() - start, source, _recorded(params)))
        finally:
            self._release(episode_id, k)
        return {"id": f"cmpl-{uuid.uuid4().hex[:24]}", "object": "text_completion", "created": int(time.time()),
                "model": self.model_name, "usage": _usage(ids, reply),
                "choices": [{"index": 0, "text": text, "finish_reason": finish, "logprobs": None}]}

    def _build_app(self) -> Any:
        from fastapi import FastAPI, Request
        from fastapi.responses import JSONResponse, Response, StreamingResponse
        from starlette.requests import ClientDisconnect

        app = FastAPI(title="workbench gateway", docs_url=None, redoc_url=None, openapi_url=None)

        def error(status: int, message: str, kind: str, param: str | None = None, code: str | None = None):
            return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}},
                                status_code=status)

        async def handle(request: Request, fn: Any, episode_id: str | None) -> Any:
            try:
                raw = await request.body()
            except ClientDisconnect:  # nobody to answer: one line in the log, no traceback
                _server_log.warning("gateway: a client disconnected before sending its whole request body (%s %s); "
                            "nothing was served", request.method, request.url.path)
                return Response(status_code=400)
            try:
                body = parse_body(raw)
                response = await fn(body, episode_id or request.headers.get("x-episode-id"))
                stream, include_usage = check_stream(body)
                if stream:  # the finished reply as OpenAI's chunks (workbench.gateway.stream)
                    return StreamingResponse(sse_events(response_chunks(response, include_usage)),
                                             media_type="text/event-stream")
                return JSONResponse(response)
            except RequestError as exc:
                return error(400, exc.message, "invalid_request_error", exc.param, exc.code)
            except EngineError as exc:  # the engine failed: a server error, named
                return error(500, str(exc), "server_error", None, "engine_error")
            except Exception as exc:  # noqa: BLE001 - a fault of the gateway itself, named; it keeps serving
                return error(500, f"{type(exc).__name__}: {exc}", "server_error", None, "internal_error")

        @app.post("/v1/chat/completions")
        async def chat(request: Request):
            return await handle(request, self.chat, None)

        @app.post("/e/{episode_id}/v1/chat/completions")
        async def chat_episode(episode_id: str, request: Request):
            return await handle(request, self.chat, episode_id)

        @app.post("/v1/completions")
        async def completions(request: Request):
            return await handle(request, self.completions, None)

        @app.post("/e/{episode_id}/v1/completions")
        async def completions_episode(episode_id: str, request: Request):
            return await handle(request, self.completions, episode_id)

        @app.get("/v1/models")
        @app.get("/e/{episode_id}/v1/models")
        async def models(episode_id: str | None = None):
            return {"object": "list", "data": [{"id": self.model_name, "object": "model", "owned_by": "workbench"}]}

        @app.exception_handler(404)
        async def not_found(request: Request, exc: Exception):
            return error(404, f"no route {request.method} {request.url.path}", "invalid_request_error", None,
                         "not_found")

        @app.exception_handler(405)
        async def not_allowed(request: Request, exc: Exception):
            return error(405, f"{request.method} is not allowed on {request.url.path}", "invalid_request_error",
                         None, "method_not_allowed")

        return app

    def __repr__(self) -> str:
        state = f"serving {self.base_url}" if self._thread is not None else "stopped"
        return f"Gateway({self.engine!r}, {state}, episodes={len(self._episodes)})"


def _recorded(params: SamplingParams) -> dict[str, Any] | None:
    """What a call record keeps of its constraint (the trainer replays it: training/constrained.py)."""
    if params.constraint is None:
        return None
    return {**params.constraint.to_dict(), "stop_token_ids": list(params.stop_token_ids)}


def _usage(prompt: list[int], reply: Reply) -> dict[str, int]:
    return {"prompt_tokens": len(prompt), "completion_tokens": len(reply.token_ids),
            "total_tokens": len(prompt) + len(reply.token_ids)}
