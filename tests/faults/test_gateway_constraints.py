"""Grammars a client sends the gateway (issue 50, item 3): a real `Gateway` on 127.0.0.1 over the
tiny model, real HTTP clients.

- A valid json_schema with 10,000 properties took 27-57 s to compile, inside the engine's batch,
  and a concurrent 4-token chat waited 26-55 s for it. The grammar now compiles on the gateway's
  compile thread, after a size check (`max_constraint_bytes`, a 400 naming it) and under a
  deadline (`constraint_timeout`, a 400 naming it); other requests are served meanwhile.
- `{"type": "string", "pattern": "^[a-z]{200}$"}` (and the same in a tool's parameters) got a 500
  `engine_error` (the grammar library's "Check failed"); it is a 400 naming the field, and no
  400 carries the library's log prefix (`[20:50:28] /project/cpp/json_schema_converter.cc:4944:`).
- `top_logprobs` 50 was refused as "must be an integer in 0..20" though only 0 is served; two
  tools of one name were accepted.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time

import httpx
import pytest

from workbench.gateway import Gateway

HI = [{"role": "user", "content": "hi"}]
LIBRARY_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\]|/project/|\.cc:\d+")


def _wide_schema(n: int, tag: str, required: bool = False) -> dict:
    names = [f"{tag}_{i}" for i in range(n)]
    schema = {"type": "object", "properties": {name: {"type": "string"} for name in names}}
    return {**schema, "required": names} if required else schema


def _json_schema(schema: dict) -> dict:
    return {"type": "json_schema", "json_schema": {"name": "wide", "schema": schema}}


SERVE = """
import sys, time
from workbench.engines.hf import HFEngine
from workbench.gateway import Gateway
from workbench.models import build_tiny_model, load_model_and_tokenizer
model, tok = load_model_and_tokenizer(str(build_tiny_model()), dtype="float32", device="cpu")
gateway = Gateway(HFEngine(model, tok), max_tokens=4, max_constraint_bytes=2_000_000, constraint_timeout=600).start()
print(gateway.base_url, flush=True)
time.sleep(3600)
"""


def test_a_10000_property_schema_never_holds_a_concurrent_chat(tmp_path):
    """The gateway runs in a process of its own, killed at the end: the big grammar's compile
    (a minute or more on 2 cores) cannot be interrupted, and it must not burn a core under the
    tests that come after."""
    # 10,000 properties, all required (~300 KB of JSON; optional ones would take far longer)
    big = {"messages": HI, "max_tokens": 4, "response_format": _json_schema(_wide_schema(10_000, "field", True))}
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "OMP_NUM_THREADS": "1"}
    server = subprocess.Popen([sys.executable, "-c", SERVE], stdout=subprocess.PIPE, text=True, env=env)
    try:
        base_url = server.stdout.readline().strip()
        assert base_url.startswith("http://127.0.0.1:"), base_url
        out: dict = {}

        def send():
            try:
                out["response"] = httpx.post(f"{base_url}/chat/completions", json=big, timeout=900)
            except httpx.HTTPError as exc:  # the server is killed while it compiles: expected
                out["error"] = exc

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        time.sleep(1.0)  # the big request is in, its grammar compiling
        waits = []
        deadline = time.monotonic() + 12
        while time.monotonic() < deadline and sender.is_alive():
            start = time.monotonic()
            r = httpx.post(f"{base_url}/chat/completions", json={"messages": HI, "max_tokens": 4}, timeout=300)
            waits.append(time.monotonic() - start)
            assert r.status_code == 200, r.text
            time.sleep(0.2)
        assert sender.is_alive(), out  # still compiling after 13 s: the chats above ran beside it
        assert len(waits) >= 5 and max(waits) < 5.0, waits
    finally:
        server.kill()
        server.wait(timeout=60)


def test_a_schema_over_the_size_limit_is_a_400_naming_the_setting_at_once(tiny_engine):
    big = {"messages": HI, "response_format": _json_schema(_wide_schema(10_000, "size"))}
    with Gateway(tiny_engine, max_tokens=4) as gateway:
        start = time.monotonic()
        r = httpx.post(f"{gateway.base_url}/chat/completions", json=big, timeout=120)
        assert time.monotonic() - start < 5.0
        assert r.status_code == 400, r.text[:300]
        err = r.json()["error"]
        assert err["param"] == "response_format" and err["code"] == "constraint_too_large", err
        assert "max_constraint_bytes (65,536)" in err["message"], err


def test_a_compile_past_the_deadline_is_a_400_naming_the_setting(tiny_engine):
    # 1,000 optional properties: ~4 s to compile (it grows with the square of their number)
    slow = {"messages": HI, "response_format": _json_schema(_wide_schema(1_000, "slow"))}
    with Gateway(tiny_engine, max_tokens=4, max_constraint_bytes=2_000_000, constraint_timeout=0.5) as gateway:
        start = time.monotonic()
        r = httpx.post(f"{gateway.base_url}/chat/completions", json=slow, timeout=300)
        assert time.monotonic() - start < 5.0
        err = r.json()["error"]
        assert r.status_code == 400 and err["code"] == "constraint_timeout", err
        assert "constraint_timeout (0.5 s)" in err["message"] and err["param"] == "response_format", err
        r = httpx.post(f"{gateway.base_url}/chat/completions", json={"messages": HI}, timeout=60)
        assert r.status_code == 200  # served meanwhile


LONG_REPEAT = {"type": "string", "pattern": "^[a-z]{200}$"}


@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_a_schema_the_grammar_library_cannot_compile_is_a_400_in_the_gateways_words(tiny_engine, where):
    if where == "response_format":
        body = {"messages": HI, "response_format": _json_schema(LONG_REPEAT)}
    else:
        tool = {"type": "function", "function": {"name": "spell", "parameters": {
            "type": "object", "properties": {"word": LONG_REPEAT}, "required": ["word"]}}}
        body = {"messages": HI, "tools": [tool], "tool_choice": "required"}
    with Gateway(tiny_engine, max_tokens=4) as gateway:
        r = httpx.post(f"{gateway.base_url}/chat/completions", json=body, timeout=120)
        assert r.status_code == 400, r.text[:500]
        err = r.json()["error"]
        assert err["param"] == where and err["type"] == "invalid_request_error", err
        assert err["message"].startswith(f"{where}: "), err
        assert "failed an internal check" in err["message"], err
        assert not LIBRARY_PREFIX.search(err["message"]), err


def test_an_invalid_regex_is_a_400_without_the_librarys_prefix(tiny_engine):
    with Gateway(tiny_engine, max_tokens=4) as gateway:
        r = httpx.post(f"{gateway.base_url}/completions",
                       json={"prompt": "hi", "structured_outputs": {"regex": "(unclosed"}}, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "structured_outputs", err
        assert "The parenthesis is not closed" in err["message"] and not LIBRARY_PREFIX.search(err["message"]), err


def test_two_tools_of_one_name_and_top_logprobs_50_are_400s_that_say_what_is_served(tiny_engine):
    tool = {"type": "function", "function": {"name": "lookup", "parameters": {"type": "object"}}}
    with Gateway(tiny_engine, max_tokens=4) as gateway:
        r = httpx.post(f"{gateway.base_url}/chat/completions", json={"messages": HI, "tools": [tool, tool]},
                       timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "tools[1].function.name", err
        assert "'lookup' is the name of tools[0] too" in err["message"], err
        r = httpx.post(f"{gateway.base_url}/chat/completions",
                       json={"messages": HI, "logprobs": True, "top_logprobs": 50}, timeout=60)
        err = r.json()["error"]
        assert r.status_code == 400 and err["param"] == "top_logprobs", err
        assert "0..20" not in err["message"] and "top_logprobs=50 is not supported" in err["message"], err
        assert "send top_logprobs=0" in err["message"], err
