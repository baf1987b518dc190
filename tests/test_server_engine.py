"""ServerEngine against a real `vllm serve` of the tiny model, and against a small
SGLang-protocol server (real SGLang cannot run on this machine: its PyPI wheel needs
CUDA -- see SGLangLikeServer).

One vLLM server per session (module-scoped fixture, ~20-45 s to start on CPU); the
test that kills it runs last in this module.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
import torch

from workbench.engines.base import EngineError, SamplingParams
from workbench.engines.server import ServerEngine

pytestmark = pytest.mark.vllm

# vLLM server (float32) vs transformers (float32): same tolerance and reasoning as
# tests/test_vllm_engine.py (kernel summation order only; measured ~3e-6).
LOGPROB_TOL = 1e-4
SERVER_START_TIMEOUT = 300


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _prompts(tokenizer, n=3):
    chats = ["Guess the number between 1 and 16.", "Move up, down, left or right.", "What is 2+3?",
             "Take the key, open the door."]
    return [
        list(tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                           return_dict=False))
        for c in chats[:n]
    ]


def _hf_check(model, prompt, result, greedy):
    """max |server - hf| logprob at the returned ids; for greedy also check argmax."""
    ids = result.token_ids
    with torch.no_grad():
        logits = model(torch.tensor([prompt + ids])).logits[0, len(prompt) - 1 : -1].float()
    full = torch.log_softmax(logits, -1)
    ref = full[torch.arange(len(ids)), torch.tensor(ids)]
    if greedy:
        gap = (full.max(-1).values - ref).max().item()
        assert gap <= LOGPROB_TOL, f"greedy id is not the HF argmax (gap {gap:.2e})"
    return (torch.tensor(result.logprobs) - ref).abs().max().item()


def _hf_greedy(model, prompt, n):
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(n):
            ids.append(int(model(torch.tensor([ids])).logits[0, -1].argmax()))
    return ids[len(prompt):]


@pytest.fixture(scope="module")
def hf_tiny(vllm_tiny_model_path):
    from workbench.models.loading import load_model_and_tokenizer

    return load_model_and_tokenizer(str(vllm_tiny_model_path), dtype="float32")


# ---------------------------------------------------------------------------------------
# real vLLM server
# ---------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def vllm_server(vllm_tiny_model_path, tmp_path_factory):
    """`python -m vllm.entrypoints.openai.api_server` on 127.0.0.1, torn down afterwards."""
    port = _free_port()
    log_path = tmp_path_factory.mktemp("vllm-serve") / "server.log"
    cmd = [
        sys.executable, "-m", "vllm.entrypoints.openai.api_server",
        "--model", str(vllm_tiny_model_path), "--served-model-name", "tiny",
        "--host", "127.0.0.1", "--port", str(port),
        "--dtype", "float32", "--enforce-eager", "--max-model-len", "1024",
        "--kv-cache-memory-bytes", str(64 << 20), "--block-size", "32", "--seed", "0",
        "--enable-prompt-tokens-details",
    ]
    # Engine core runs the worker in its own process (no extra worker process): starts faster.
    env = dict(os.environ, VLLM_ENABLE_V1_MULTIPROCESSING="0")
    log = open(log_path, "w")
    start = time.monotonic()
    proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    probe = ServerEngine(url, None)
    try:
        while not probe.health(timeout=2):
            if proc.poll() is not None:
                pytest.fail(f"vllm server exited with {proc.returncode}:\n{log_path.read_text()[-3000:]}")
            if time.monotonic() - start > SERVER_START_TIMEOUT:
                pytest.fail(f"vllm server not healthy after {SERVER_START_TIMEOUT} s:\n{log_path.read_text()[-3000:]}")
            time.sleep(1)
        print(f"\nvllm server ready in {time.monotonic() - start:.1f} s")
        yield {"url": url, "proc": proc, "log": log_path}
    finally:
        _stop(proc)
        log.close()


def _stop(proc: subprocess.Popen) -> None:
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)  # the server and its engine-core child
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


def test_vllm_server_ids_and_logprobs(vllm_server, hf_tiny):
    model, tok = hf_tiny
    engine = ServerEngine(vllm_server["url"], tok, kind="vllm", max_retries=1, backoff=0.1)
    prompts = _prompts(tok, 4)

    greedy = engine.generate_ids(prompts, SamplingParams(max_tokens=16, temperature=0.0))
    assert engine.model == "tiny"  # discovered through /v1/models
    worst = 0.0
    for prompt, r in zip(prompts, greedy):
        assert r.finish_reason == "length" and len(r.token_ids) == 16 == len(r.logprobs)
        assert all(isinstance(t, int) for t in r.token_ids)
        worst = max(worst, _hf_check(model, prompt, r, greedy=True))
    for prompt, r in zip(prompts, greedy):  # the same ids as a greedy loop over plain forwards
        assert r.token_ids == _hf_greedy(model, prompt, 16)

    params = SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=5)
    sampled = engine.generate_ids(prompts, params)
    for prompt, r in zip(prompts, sampled):
        worst = max(worst, _hf_check(model, prompt, r, greedy=False))
    print(f"vllm server vs HF: max |logprob diff| = {worst:.2e}")
    assert worst <= LOGPROB_TOL, f"server logprobs differ from HF by {worst:.3e}"
    assert [r.token_ids for r in engine.generate_ids(prompts, params)] == [r.token_ids for r in sampled]

    stop = sampled[0].token_ids[4]
    (stopped,) = engine.generate_ids(prompts[:1], SamplingParams(max_tokens=16, temperature=0.9, top_p=0.95, seed=5,
                                                                 stop_token_ids=[stop]))
    first = sampled[0].token_ids.index(stop)
    assert stopped.finish_reason == "stop" and stopped.token_ids == sampled[0].token_ids[: first + 1]

    # the prompts were all seen before: whole 32-token blocks come from the prefix cache
    assert all(r.num_cached_tokens >= 32 for r in engine.generate_ids(prompts, SamplingParams(max_tokens=2)))
    stats = engine.stats()
    assert stats["cached_prompt_tokens"] > 0 and stats["requests"] == 4 + 4 + 4 + 1 + 4

    with pytest.raises(EngineError, match="cannot push trainer weights"):
        engine.sync_weights(model)
    ServerEngine(vllm_server["url"], tok, on_sync="ignore").sync_weights(model)


def test_server_not_running_is_a_clear_error(hf_tiny):
    _, tok = hf_tiny
    url = f"http://127.0.0.1:{_free_port()}"
    engine = ServerEngine(url, tok, kind="vllm", model="tiny", max_retries=2, backoff=0.05)
    with pytest.raises(EngineError) as err:
        engine.generate_ids([[1, 2, 3]], SamplingParams(max_tokens=2))
    msg = str(err.value)
    assert f"server backend (vllm at {url})" in msg and "connection refused after 2 retries" in msg
    assert "is the server running?" in msg
    assert engine.stats()["retries"] == 2


# ---------------------------------------------------------------------------------------
# SGLang wire format
# ---------------------------------------------------------------------------------------

class SGLangLikeServer:
    """A real HTTP server speaking SGLang's native `/generate` protocol.

    Real SGLang cannot run here: the sglang 0.5.23 wheel on PyPI hard-requires the CUDA
    stack (torch==2.14.1, cuda-python>=13, flashinfer[cu13], sglang-kernel (CUDA
    build), nvshmem, flash-attn-4, deep-gemm) plus torchvision/torchaudio/torchcodec,
    and its CPU backend exists only as a from-source build of sgl-kernel for Xeon
    AMX (Docker recipe). So this stands in for it: the tiny HF model generates for
    real (greedy or seeded sampling, raw log_softmax logprobs, stop ids kept) and
    the answers use SGLang's field names: `meta_info.output_token_logprobs` as
    [logprob, token_id, text] triples, `finish_reason` as {"type", "matched"/"length"},
    `cached_tokens`, `output_ids`; a list of prompts answers a list.
    """

    def __init__(self, model):
        self.model = model
        self.bodies: list[dict] = []
        self.fail_next = 0
        self._lock = threading.Lock()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send(200, {"ok": True}) if self.path == "/health" else self._send(404, {"error": "no"})

            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer._lock:
                    outer.bodies.append(body)
                    if outer.fail_next > 0:
                        outer.fail_next -= 1
                        return self._send(503, {"error": "overloaded"})
                if self.path != "/generate":
                    return self._send(404, {"error": f"no route {self.path}"})
                ids = body["input_ids"]
                batch = isinstance(ids[0], list)
                prompts = ids if batch else [ids]
                sps = body["sampling_params"]
                sps = sps if isinstance(sps, list) else [sps] * len(prompts)
                outs = [outer.generate(p, sp) for p, sp in zip(prompts, sps)]
                self._send(200, outs if batch else outs[0])

            def _send(self, code, payload):
                data = json.dumps(payload).encode()
                self.send_response(code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self._thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self._thread.start()

    def generate(self, prompt, sp):
        temperature = sp.get("temperature", 1.0)
        top_k = sp.get("top_k", -1)
        stops = set(sp.get("stop_token_ids") or [])
        gen = torch.Generator().manual_seed(sp["sampling_seed"]) if sp.get("sampling_seed") is not None else None
        out, triples, finish = [], [], None
        with self._lock, torch.no_grad():
            for _ in range(sp.get("max_new_tokens", 128)):
                logits = self.model(torch.tensor([prompt + out])).logits[0, -1].float()
                raw = torch.log_softmax(logits, -1)
                if temperature == 0 or top_k == 1:
                    tok = int(raw.argmax())
                else:
                    scaled = logits / temperature
                    if top_k and top_k > 0:
                        scaled[scaled < scaled.topk(top_k).values[-1]] = -float("inf")
                    tok = int(torch.multinomial(torch.softmax(scaled, -1), 1, generator=gen))
                out.append(tok)
                triples.append([float(raw[tok]), tok, None])
                if tok in stops:
                    finish = {"type": "stop", "matched": tok}
                    break
        finish = finish or {"type": "length", "length": len(out)}
        return {"text": "", "output_ids": out, "meta_info": {
            "id": "req", "prompt_tokens": len(prompt), "completion_tokens": len(out), "cached_tokens": 0,
            "finish_reason": finish, "output_token_logprobs": triples}}

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def sglang_like(hf_tiny):
    server = SGLangLikeServer(hf_tiny[0])
    yield server
    server.close()


def test_sglang_protocol(sglang_like, hf_tiny):
    model, tok = hf_tiny
    engine = ServerEngine(sglang_like.url, tok, kind="sglang", max_retries=3, backoff=0.01)
    prompts = _prompts(tok, 2)
    greedy = engine.generate_ids(prompts, SamplingParams(max_tokens=8, temperature=0.0))
    for prompt, r in zip(prompts, greedy):
        assert r.finish_reason == "length" and len(r.token_ids) == 8
        assert _hf_check(model, prompt, r, greedy=True) <= 1e-5
    body = sglang_like.bodies[-1]
    assert isinstance(body["input_ids"], list) and all(isinstance(t, int) for t in body["input_ids"])
    assert body["return_logprob"] is True
    assert {"max_new_tokens", "temperature", "top_p", "top_k", "stop_token_ids"} <= set(body["sampling_params"])

    params = SamplingParams(max_tokens=8, temperature=1.0, seed=9)
    sampled = engine.generate_ids(prompts, params)
    seeds = sorted(b["sampling_params"]["sampling_seed"] for b in sglang_like.bodies[-2:])
    assert seeds == [9, 10]  # seed + index
    stop = sampled[0].token_ids[3]
    (stopped,) = engine.generate_ids(prompts[:1], SamplingParams(max_tokens=8, temperature=1.0, seed=9,
                                                                 stop_token_ids=[stop]))
    assert stopped.finish_reason == "stop" and stopped.token_ids[-1] == stop
    assert stopped.token_ids == sampled[0].token_ids[: sampled[0].token_ids.index(stop) + 1]

    sglang_like.fail_next = 2  # two 503s, then success: retried
    (ok,) = engine.generate_ids(prompts[:1], SamplingParams(max_tokens=2, temperature=0.0))
    assert ok.token_ids == greedy[0].token_ids[:2] and engine.stats()["retries"] == 2

    sglang_like.fail_next = 10  # more 503s than retries
    expected = r"server backend \(sglang at http://127\.0\.0\.1:\d+\): HTTP 503.*after 3 retries"
    with pytest.raises(EngineError, match=expected):
        engine.generate_ids(prompts[:1], SamplingParams(max_tokens=2))


# ---------------------------------------------------------------------------------------
# last: kill the vLLM server mid-use
# ---------------------------------------------------------------------------------------

def test_vllm_server_killed_mid_use(vllm_server, hf_tiny):
    _, tok = hf_tiny
    url = vllm_server["url"]
    engine = ServerEngine(url, tok, kind="vllm", max_retries=2, backoff=0.1)
    prompts = _prompts(tok, 2)
    assert all(r.finish_reason == "length" for r in engine.generate_ids(prompts, SamplingParams(max_tokens=4)))
    _stop(vllm_server["proc"])
    start = time.monotonic()
    with pytest.raises(EngineError) as err:
        engine.generate_ids(prompts, SamplingParams(max_tokens=4))
    msg = str(err.value)
    assert f"server backend (vllm at {url})" in msg, msg
    assert "after 2 retries" in msg and "is the server running?" in msg, msg
    assert time.monotonic() - start >= 0.1 + 0.2  # the backoff really happened
