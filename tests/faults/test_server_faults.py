"""ServerEngine against misbehaving servers: one test per way a reply used to be trusted.

Each server here is a real `ThreadingHTTPServer` on 127.0.0.1 that answers with a
crafted vLLM-OpenAI or SGLang reply; the client under test is the real ServerEngine
(and, for the HTTP 400 case, the real Rollout over a real environment). The tiny
tokenizer fixes the vocabulary size.
"""
from __future__ import annotations

import json
import threading
import tracemalloc
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envs.guess_number import GuessNumberEnv
from workbench.engines.base import EngineError, SamplingParams
from workbench.engines.server import ServerEngine
from workbench.rollout.async_rollout import AsyncRollout
from workbench.rollout.rollout import Rollout

PROMPT = [1, 2, 3]


class CraftedServer:
    """A real HTTP server whose every POST is answered by `self.reply(path, body)`.

    `reply` returns (status, headers, body bytes); the default answers a valid
    one-token reply. `requests` counts the POSTs it received.
    """

    def __init__(self):
        self.reply = lambda path, body: (200, {}, b"{}")
        self.requests = 0
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._write(200, {}, b'{"data": [{"id": "tiny"}]}')

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                outer.requests += 1
                self._write(*outer.reply(self.path, body))

            def _write(self, code, headers, data):
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                if "Content-Length" not in headers and "no-length" not in headers:
                    self.send_header("Content-Length", str(len(data)))
                for k, v in headers.items():
                    if k != "no-length":
                        self.send_header(k, v)
                if "no-length" in headers:  # body runs until the connection closes
                    self.send_header("Connection", "close")
                    self.close_connection = True
                self.end_headers()
                try:
                    for i in range(0, len(data), 1 << 20):
                        self.wfile.write(data[i:i + (1 << 20)])
                except (BrokenPipeError, ConnectionResetError):
                    pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = CraftedServer()
    yield s
    s.close()


@pytest.fixture(scope="module")
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


def vllm_reply(ids, logprobs, finish="length"):
    """A vLLM /v1/completions answer (JSON text; NaN/Infinity written as Python's json does)."""
    return json.dumps({"choices": [{"text": "", "token_ids": ids, "finish_reason": finish, "logprobs": {
        "tokens": [f"token_id:{t}" for t in ids], "token_logprobs": logprobs}}],
        "usage": {"prompt_tokens": 3}}).encode()


def sglang_reply(ids, logprobs, finish="length"):
    """An SGLang /generate answer."""
    return json.dumps({"text": "", "output_ids": ids, "meta_info": {
        "finish_reason": {"type": finish}, "cached_tokens": 0,
        "output_token_logprobs": [[lp, t, None] for t, lp in zip(ids, logprobs)]}}).encode()


REPLIES = {"vllm": vllm_reply, "sglang": sglang_reply}


def engine_for(server, tok, kind, **kwargs):
    return ServerEngine(server.url, tok, kind=kind, model="tiny", max_retries=2, backoff=0.01, **kwargs)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_well_formed_reply_is_accepted(server, tok, kind):
    """The checks below must not refuse a valid reply (ids at both ends of the vocabulary)."""
    ids, lps = [0, 5, len(tok) - 1], [-0.5, 0.0, -12.25]
    server.reply = lambda path, body: (200, {}, REPLIES[kind](ids, lps))
    (r,) = engine_for(server, tok, kind).generate_ids([PROMPT], SamplingParams(max_tokens=3))
    assert (r.token_ids, r.logprobs, r.finish_reason, r.error) == (ids, lps, "length", None)


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("bad_id", [10**9, -1, "vocab"])
def test_token_id_outside_the_vocabulary_is_refused(server, tok, kind, bad_id):
    """Why: token id 1e9 was accepted and only failed later, in training, as an IndexError."""
    bad = bad_id if bad_id != "vocab" else len(tok)  # one past the last id
    server.reply = lambda path, body: (200, {}, REPLIES[kind]([7, bad], [-1.0, -2.0]))
    engine = engine_for(server, tok, kind)
    with pytest.raises(EngineError) as err:
        engine.generate_ids([PROMPT], SamplingParams(max_tokens=8))
    msg = str(err.value)
    assert f"server backend ({kind} at {server.url})" in msg, msg
    assert f"token id {bad} at position 1 is outside the vocabulary [0, {len(tok)})" in msg, msg
    assert server.requests == 1  # a wrong answer is not retried


def test_float_token_id_is_refused(server, tok):
    """1e9 written as a JSON float is not silently int()-ed into an id."""
    server.reply = lambda path, body: (200, {}, vllm_reply([7, 1e9], [-1.0, -2.0]).replace(b'"token_id:1000000000.0"',
                                                                                          b'"token_id:7"'))
    with pytest.raises(EngineError, match=r"token id 1000000000\.0 is not an integer"):
        engine_for(server, tok, "vllm").generate_ids([PROMPT], SamplingParams(max_tokens=8))


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_more_tokens_than_max_tokens_is_refused(server, tok, kind):
    """Why: 5,000 tokens came back for max_tokens=8 and were appended to the episode."""
    server.reply = lambda path, body: (200, {}, REPLIES[kind]([5] * 5000, [-1.0] * 5000))
    with pytest.raises(EngineError) as err:
        engine_for(server, tok, kind).generate_ids([PROMPT], SamplingParams(max_tokens=8))
    msg = str(err.value)
    assert f"server backend ({kind} at {server.url})" in msg and "5000 tokens for max_tokens=8" in msg, msg


@pytest.mark.parametrize("kind", ["vllm", "sglang"])
@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_logprob_is_refused(server, tok, kind, bad):
    """Why: NaN/inf logprobs were stored and poisoned the PPO ratio."""
    server.reply = lambda path, body: (200, {}, REPLIES[kind]([5, 6, 7], [-1.0, bad, -1.0]))
    with pytest.raises(EngineError) as err:
        engine_for(server, tok, kind).generate_ids([PROMPT], SamplingParams(max_tokens=8))
    msg = str(err.value)
    assert f"server backend ({kind} at {server.url})" in msg, msg
    assert f"logprob {bad} at position 1 is not a finite number" in msg, msg


class RecordingGuessEnv(GuessNumberEnv):
    """Guess-the-number that records every action it is stepped with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.actions: list[str] = []

    def step(self, action):
        self.actions.append(action)
        return super().step(action)


@pytest.mark.parametrize("rollout_cls", [Rollout, AsyncRollout])
@pytest.mark.parametrize("kind", ["vllm", "sglang"])
def test_http_400_is_an_episode_error_not_an_empty_action(server, tok, kind, rollout_cls):
    """Why: an HTTP 400 became an empty action sent to env.step."""
    path = "/v1/completions" if kind == "vllm" else "/generate"
    server.reply = lambda p, body: (400, {}, b'{"error": "prompt is longer than the maximum context length"}')
    engine = engine_for(server, tok, kind)
    (r,) = engine.generate_ids([PROMPT], SamplingParams(max_tokens=8))
    assert (r.token_ids, r.logprobs, r.finish_reason) == ([], [], "error")
    assert r.error.startswith(f"server backend ({kind} at {server.url}): POST {server.url}{path} answered HTTP 400")
    assert "maximum context length" in r.error
    assert server.requests == 1  # 4xx: not retried

    env = RecordingGuessEnv()
    rollout = rollout_cls(engine, [env], seeds=[0], max_turns=3, max_tokens=8)
    batch = rollout.run()
    ep = batch.episodes[0]
    assert env.actions == []  # the environment never saw an (empty) action
    assert ep.done and ep.turns == [] and ep.error is not None
    assert f"server backend ({kind} at {server.url})" in ep.error and "HTTP 400" in ep.error, ep.error
    assert server.requests == 2  # one turn asked, then the episode ended


@pytest.mark.parametrize("with_length", [True, False], ids=["content-length", "until-close"])
def test_oversized_body_is_refused_without_reading_it_whole(server, tok, with_length):
    """Why: a 30 MB body was read into memory whole (and then accepted)."""
    padding = "x" * (30 << 20)
    data = json.dumps({"choices": [{"text": padding, "token_ids": [5], "finish_reason": "length",
                                    "logprobs": {"token_logprobs": [-1.0]}}]}).encode()
    server.reply = lambda path, body: (200, {} if with_length else {"no-length": "1"}, data)
    engine = engine_for(server, tok, "vllm")
    tracemalloc.start()
    try:
        tracemalloc.reset_peak()
        base = tracemalloc.get_traced_memory()[0]
        with pytest.raises(EngineError) as err:
            engine.generate_ids([PROMPT], SamplingParams(max_tokens=8))
        peak = tracemalloc.get_traced_memory()[1] - base
    finally:
        tracemalloc.stop()
    msg = str(err.value)
    assert f"server backend (vllm at {server.url})" in msg, msg
    assert f"larger than max_response_bytes={16 << 20} bytes" in msg, msg
    assert peak < 24 << 20, f"client held {peak / 2**20:.1f} MiB of a {len(data) / 2**20:.0f} MiB body"
    assert server.requests == 1  # not retried


@pytest.mark.parametrize("url", ["file:///etc/passwd", "ftp://127.0.0.1/x", "data:,hello", "127.0.0.1:8000",
                                 "http://", "gopher://127.0.0.1:70/"])
def test_only_http_and_https_urls_are_accepted(tok, url):
    """Why: file:// URLs were opened (urllib serves every scheme it knows)."""
    with pytest.raises(ValueError, match=r"server URL must start with http:// or https://"):
        ServerEngine(url, tok)


def test_redirect_off_http_is_refused(server, tok):
    """A server cannot bounce the client to another scheme (urllib follows ftp:// redirects)."""
    server.reply = lambda path, body: (303, {"Location": "ftp://127.0.0.1:1/secret"}, b"")
    engine = engine_for(server, tok, "vllm")
    with pytest.raises(EngineError) as err:
        engine.generate_ids([PROMPT], SamplingParams(max_tokens=8))
    msg = str(err.value)
    assert f"server backend (vllm at {server.url})" in msg and "redirect to 'ftp://127.0.0.1:1/secret' refused" in msg
    assert engine.stats()["retries"] == 0


def test_a_reply_dripped_byte_by_byte_ends_at_the_request_timeout(tok):
    """Why: the deadline was checked only after each 64 KiB read, and a read of a body
    that trickles in (one byte every 20 ms, each well within the socket timeout) never
    returned, so `request_timeout` did not bound the request."""
    import time

    body = vllm_reply([7, 8], [-1.0, -2.0]) + b" " * 20_000  # ~400 s at the drip rate
    stop = threading.Event()

    class Drip(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            try:
                for i in range(len(body)):
                    if stop.is_set():
                        return
                    self.wfile.write(body[i:i + 1])
                    self.wfile.flush()
                    time.sleep(0.02)
            except (BrokenPipeError, ConnectionResetError):
                pass

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Drip)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    engine = ServerEngine(f"http://127.0.0.1:{httpd.server_address[1]}", tok, kind="vllm", model="tiny",
                          max_retries=0, timeout=1.0)
    result: dict = {}

    def call():
        start = time.monotonic()
        try:
            engine.generate_ids([PROMPT], SamplingParams(max_tokens=2))
        except EngineError as exc:
            result["error"] = str(exc)
        result["seconds"] = time.monotonic() - start

    runner = threading.Thread(target=call, daemon=True)
    runner.start()
    runner.join(timeout=20)
    stop.set()
    httpd.shutdown()
    httpd.server_close()
    assert not runner.is_alive(), "the request was still running 20 s after a 1 s request_timeout"
    assert result["seconds"] < 4, result
    assert "still incomplete after 1 s" in result["error"], result
