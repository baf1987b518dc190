"""The gateway under bad input and load (issue 33, item 4): each test drives a real `Gateway`
on 127.0.0.1 over the tiny model with real HTTP clients (httpx, raw sockets), asserts what the
client gets back, and then that the server still serves the next valid request.

- concurrent calls of one episode hold its turn limit and sample with distinct seeds;
- a huge prompt is refused at once by its length, and other requests are not held up;
- client errors (bad seed, lone surrogate, malformed tool schema, deep JSON, non-finite
  temperature, bool n, top_logprobs) are 400s naming the field, never 500 `engine_error`;
- a client that disconnects mid-body costs one log line, not a traceback.
"""
from __future__ import annotations

import json
import re
import socket
import threading
import time
import zlib
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from workbench.engines.hf import HFEngine
from workbench.gateway import Gateway

HI = [{"role": "user", "content": "hi"}]


class SeedRecordingEngine(HFEngine):
    """The hf engine, keeping the seed of every request it served (the test's own record)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seeds: list[int | None] = []

    def _run_batch(self, prompts, params_list):
        self.seeds += [p.seed for p in params_list]
        return super()._run_batch(prompts, params_list)


@pytest.fixture(scope="module")
def seed_engine(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    engine = SeedRecordingEngine(model, tok)
    yield engine
    engine.close()


def _still_serves(gateway: Gateway, episode: str = "ep-after") -> None:
    """The next valid request is served (200, one recorded call)."""
    r = httpx.post(f"{gateway.episode_url(episode)}/chat/completions", json={"messages": HI, "max_tokens": 2},
                   timeout=60)
    assert r.status_code == 200, r.text
    assert r.json()["choices"][0]["message"]["role"] == "assistant"
    assert len(gateway.calls(episode)) == 1
    gateway.forget(episode)


def _post_all(url: str, body: dict, n: int) -> list[httpx.Response]:
    barrier = threading.Barrier(n)

    def post(_):
        barrier.wait()
        return httpx.post(url, json=body, timeout=120)

    with ThreadPoolExecutor(n) as pool:
        return list(pool.map(post, range(n)))


# -- 1. concurrent calls of one episode ----------------------------------------------------
def test_concurrent_calls_of_one_episode_hold_the_turn_limit(tiny_engine):
    with Gateway(tiny_engine, max_turns=2, max_tokens=4) as gateway:
        url = f"{gateway.episode_url('ep-burst')}/chat/completions"
        responses = _post_all(url, {"messages": HI, "temperature": 1.0}, 32)
        ok = [r for r in responses if r.status_code == 200]
        refused = [r for r in responses if r.status_code != 200]
        assert len(ok) == 2, [r.status_code for r in responses]
        assert len(gateway.calls("ep-burst")) == 2
        assert [c.index for c in gateway.calls("ep-burst")] == [0, 1]
        for r in refused:
            assert r.status_code == 400
            err = r.json()["error"]
            assert err["code"] == "max_turns_reached" and "max_turns=2" in err["message"], err
        assert gateway.cut_reason("ep-burst") == "max_turns"
        _still_serves(gateway)


def test_concurrent_calls_of_one_episode_get_distinct_seeds(seed_engine):
    with Gateway(seed_engine, max_tokens=6, seed=7) as gateway:
        seed_engine.seeds.clear()
        url = f"{gateway.episode_url('ep-par')}/chat/completions"
        responses = _post_all(url, {"messages": HI, "temperature": 1.0}, 8)
        assert all(r.status_code == 200 for r in responses), [r.text for r in responses]
        calls = gateway.calls("ep-par")
        assert len(calls) == 8
        # each call sampled with its own seed: the seeds of call numbers 0..7 of the episode
        want = {zlib.crc32(f"7:ep-par:{k}".encode()) for k in range(8)}
        assert sorted(seed_engine.seeds) == sorted(want)
        replies = {tuple(c.reply.token_ids) for c in calls}
        assert len(replies) > 1  # not 8 copies of one sample
        # sequential calls after the burst go on from call 8
        seed_engine.seeds.clear()
        r = httpx.post(url, json={"messages": HI, "temperature": 1.0}, timeout=60)
        assert r.status_code == 200 and seed_engine.seeds == [zlib.crc32(b"7:ep-par:8")]
        _still_serves(gateway)


def test_a_call_that_fails_gives_its_turn_back(tiny_engine):
    """A reserved call refused later (a replay mismatch here) does not use up a turn."""
    from workbench.gateway.server import ScriptedReply

    with Gateway(tiny_engine, max_turns=1, max_tokens=2) as gateway:
        gateway.script("ep-s", [ScriptedReply([1, 2, 3], [5], [0.0])])
        url = f"{gateway.episode_url('ep-s')}/chat/completions"
        r = httpx.post(url, json={"messages": HI}, timeout=60)
        assert r.status_code == 400 and r.json()["error"]["code"] == "replay_mismatch"
        gateway.script("ep-s", [])
        r = httpx.post(url, json={"messages": HI}, timeout=60)
        assert r.status_code == 200, r.text
        assert len(gateway.calls("ep-s")) == 1


# -- 2. one huge prompt --------------------------------------------------------------------
@pytest.mark.parametrize("route", ["chat", "completions"])
def test_a_huge_prompt_is_refused_at_once_and_holds_up_nothing(tiny_engine, route):
    text = "word " * 2_000_000
    body = {"messages": [{"role": "user", "content": text}]} if route == "chat" else {"prompt": text}
    path = "/chat/completions" if route == "chat" else "/completions"
    with Gateway(tiny_engine, max_tokens=4, max_context_tokens=512) as gateway:
        out: dict = {}

        def send():
            start = time.monotonic()
            out["response"] = httpx.post(f"{gateway.base_url}{path}", json=body, timeout=300)
            out["seconds"] = time.monotonic() - start

        sender = threading.Thread(target=send)
        sender.start()
        waits = []
        while sender.is_alive():
            start = time.monotonic()
            r = httpx.get(f"{gateway.base_url}/models", timeout=300)
            waits.append(time.monotonic() - start)
            assert r.status_code == 200
            time.sleep(0.05)
        sender.join()
        assert max(waits, default=0.0) < 3.0, waits
        r = out["response"]
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["code"] == "context_length_exceeded" and "512" in err["message"], err
        assert out["seconds"] < 10.0, out["seconds"]
        _still_serves(gateway)


def test_a_long_prompt_is_tokenised_off_the_event_loop(tiny_engine):
    """A prompt within the character bound is tokenised on the gateway's own thread: the
    event loop answers other requests meanwhile."""
    body = {"messages": [{"role": "user", "content": "word " * 200_000}]}
    with Gateway(tiny_engine, max_tokens=2, max_context_tokens=200_000) as gateway:
        longest = max(len(t) for t in tiny_engine.tokenizer.get_vocab())
        assert 5 * 200_000 < 2 * longest * 200_000  # under the length bound: it is tokenised
        out: dict = {}

        def send():
            out["response"] = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=300)

        sender = threading.Thread(target=send)
        sender.start()
        waits = []
        while sender.is_alive():
            start = time.monotonic()
            assert httpx.get(f"{gateway.base_url}/models", timeout=300).status_code == 200
            waits.append(time.monotonic() - start)
            time.sleep(0.05)
        sender.join()
        r = out["response"]
        assert r.status_code == 400 and r.json()["error"]["code"] == "context_length_exceeded", r.text
        tokens = int(re.search(r"the prompt is (\d+) tokens", r.json()["error"]["message"]).group(1))
        assert tokens > 200_000  # it was tokenised: the count is given
        assert len(waits) >= 3 and max(waits) < 2.0, waits
        _still_serves(gateway)


# -- 3. client errors are 400s naming the field ----------------------------------------------
def _raw(obj_text: str) -> bytes:
    return obj_text.encode()


DEEP = b'{"messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
HI_JSON = json.dumps(HI)

CLIENT_ERRORS = {
    "seed 2**64": ({"messages": HI, "seed": 2 ** 64}, "seed"),
    "seed -2**63-1": ({"messages": HI, "seed": -2 ** 63 - 1}, "seed"),
    "lone surrogate": (_raw('{"messages": [{"role": "user", "content": "a\\ud800b"}]}'), "messages[0].content"),
    "lone surrogate in a tool": (_raw('{"messages": ' + HI_JSON + ', "tools": [{"type": "function", "function": '
                                      '{"name": "f", "description": "\\udfff"}}]}'),
                                 "tools[0].function.description"),
    "properties a string": ({"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"type": "object", "properties": "x"}}}]},
                            "tools[0].function.parameters.properties"),
    "a property not an object": ({"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"properties": {"x": 3}}}}]}, "tools[0].function.parameters.properties.x"),
    "required not a list": ({"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": {"required": "x"}}}]}, "tools[0].function.parameters.required"),
    "parameters a list": ({"messages": HI, "tools": [{"type": "function", "function": {
        "name": "f", "parameters": [1]}}]}, "tools[0].function.parameters"),
    "100,000-deep body": (DEEP, None),
    "temperature NaN": (_raw('{"messages": ' + HI_JSON + ', "temperature": NaN}'), "temperature"),
    "temperature Infinity": (_raw('{"messages": ' + HI_JSON + ', "temperature": Infinity}'), "temperature"),
    "temperature 1e400": (_raw('{"messages": ' + HI_JSON + ', "temperature": 1e400}'), "temperature"),
    "temperature 3": ({"messages": HI, "temperature": 3}, "temperature"),
    "top_p NaN": (_raw('{"messages": ' + HI_JSON + ', "top_p": NaN}'), "top_p"),
    "n=True": ({"messages": HI, "n": True}, "n"),
    "logprobs 'x'": ({"messages": HI, "logprobs": "x"}, "logprobs"),
    "top_logprobs 'x'": ({"messages": HI, "logprobs": True, "top_logprobs": "x"}, "top_logprobs"),
    "top_logprobs 21": ({"messages": HI, "logprobs": True, "top_logprobs": 21}, "top_logprobs"),
    "top_logprobs True": ({"messages": HI, "logprobs": True, "top_logprobs": True}, "top_logprobs"),
    "top_logprobs 5 (not supported)": ({"messages": HI, "logprobs": True, "top_logprobs": 5}, "top_logprobs"),
    "max_tokens NaN": (_raw('{"messages": ' + HI_JSON + ', "max_tokens": NaN}'), "max_tokens"),
}


@pytest.mark.parametrize("name", list(CLIENT_ERRORS))
def test_client_errors_are_400s_naming_the_field(tiny_engine, name):
    body, param = CLIENT_ERRORS[name]
    with Gateway(tiny_engine, max_tokens=2) as gateway:
        kwargs = {"content": body, "headers": {"content-type": "application/json"}} if isinstance(body, bytes) \
            else {"json": body}
        r = httpx.post(f"{gateway.episode_url('ep-bad')}/chat/completions", timeout=60, **kwargs)
        assert r.status_code == 400, (r.status_code, r.text[:500])
        err = r.json()["error"]
        assert err["type"] == "invalid_request_error" and err["code"] != "engine_error", err
        assert err["param"] == param, err
        if param is not None:
            assert param.split(".")[0].split("[")[0] in err["message"], err
        assert gateway.calls("ep-bad") == []  # nothing recorded, no turn used
        _still_serves(gateway)


def test_completions_client_errors_are_400s(tiny_engine):
    with Gateway(tiny_engine, max_tokens=2) as gateway:
        for body, param in ((_raw('{"prompt": "a\\ud800"}'), "prompt"),
                            (_raw('{"prompt": "hi", "temperature": NaN}'), "temperature"),
                            ({"prompt": "hi", "seed": 2 ** 64}, "seed"),
                            ({"prompt": "hi", "n": True}, "n")):
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = httpx.post(f"{gateway.base_url}/completions", timeout=60, **kwargs)
            assert r.status_code == 400 and r.json()["error"]["param"] == param, (body, r.text[:300])
        _still_serves(gateway)


def test_the_edges_of_the_accepted_ranges_are_served(tiny_engine):
    """What OpenAI accepts is still served: int64 seeds, temperature 0 and 2, top_logprobs 0."""
    with Gateway(tiny_engine, max_tokens=2) as gateway:
        for extra in ({"seed": 2 ** 63 - 1}, {"seed": -2 ** 63}, {"temperature": 0}, {"temperature": 2.0},
                      {"logprobs": True, "top_logprobs": 0}, {"n": 1}):
            r = httpx.post(f"{gateway.base_url}/chat/completions", json={"messages": HI, **extra}, timeout=60)
            assert r.status_code == 200, (extra, r.text)
            if extra.get("logprobs"):
                content = r.json()["choices"][0]["logprobs"]["content"]
                assert content and all(c["top_logprobs"] == [] for c in content)


# -- 4. a client that disconnects mid-body ---------------------------------------------------
def test_a_client_that_disconnects_mid_body_costs_one_log_line(tiny_engine, capfd):
    with Gateway(tiny_engine, max_tokens=2) as gateway:
        capfd.readouterr()
        sock = socket.create_connection(("127.0.0.1", gateway.port), timeout=10)
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                     b"Content-Type: application/json\r\nContent-Length: 10000\r\n\r\n" + b'{"messages": [')
        time.sleep(0.3)
        sock.close()
        deadline = time.monotonic() + 10
        err = ""
        while time.monotonic() < deadline and "disconnect" not in err:
            time.sleep(0.1)
            err += capfd.readouterr().err
        _still_serves(gateway)
        time.sleep(0.3)
        err += capfd.readouterr().err
    assert "Traceback" not in err, err
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and "disconnected" in lines[0] and "/v1/chat/completions" in lines[0], err
