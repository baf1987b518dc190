"""OpenEnv and environment timeouts (issue 43, item 5): no setting makes a run wait forever,
a run that trained nothing says so and exits non-zero, resets time out at `step_timeout`
per episode inside a rollout, and timeout and protocol errors name the server and the call.

1. a server whose every place is held (each reset refused with CAPACITY_REACHED) and
   `environment.step_timeout` 0 hung the rollout forever; now the wait for room is bounded
   (`workbench.rollout.waiting.ROOM_WAIT_S` when step_timeout is 0) and the episode ends
   with the server's words;
2. with `step_timeout` set, the same server made every step skip and the CLI exit 0 having
   trained nothing; now it exits 1 with one line saying why;
3. a reset that takes 30 s, with step_timeout 3, took 42-52 s for 4 episodes: each timed-out
   session was closed with a handshake the busy server never answered (websockets waits 10 s);
   now the unanswered session is dropped at once, so the rollout ends within the episodes'
   timeouts (about 4 x 3 s), well before the server's reset returns;
4. a reset that times out when called directly raised a bare `TimeoutError:`, and a server
   that answers with malformed JSON ended the episode with a JSONDecodeError naming nothing;
   both now name the server and the call.

Real OpenEnv servers (openenv-core's create_app under uvicorn, in another process), a real
WebSocket server for the malformed answers, the real adapter and rollout.
"""
from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

pytest.importorskip("openenv.core.env_server.http_server")

from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Observation, State  # noqa: E402

from tests.test_openenv import GuessAction, _free_port  # noqa: E402
from tests.test_openenv_capacity import _hold_session, _serve_with_defaults  # noqa: E402
from workbench.environments.adapters.openenv_capacity import ServerPlaces  # noqa: E402
from workbench.environments.registry import make_env  # noqa: E402
from workbench.rollout import waiting  # noqa: E402
from workbench.rollout.rollout import Rollout  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


class TextObservation(Observation):
    text: str = ""


class SlowResetEnv(Environment):
    """Every reset takes 30 s (a server stuck in a slow reset)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = State()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> TextObservation:
        time.sleep(30)
        return TextObservation(text="Say something.")

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> TextObservation:
        return TextObservation(text="Done.", done=True, reward=1.0)

    @property
    def state(self) -> State:
        return self._state


def _serve(code: str) -> tuple[subprocess.Popen, str]:
    port = _free_port()
    proc = subprocess.Popen([sys.executable, "-c", code.format(port=port)], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the server did not start"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def slow_server():
    proc, url = _serve("import uvicorn; from openenv.core.env_server.http_server import create_fastapi_app; "
                       "from tests.faults.test_openenv_timeouts import SlowResetEnv, TextObservation; "
                       "from tests.test_openenv import GuessAction; "
                       "app = create_fastapi_app(SlowResetEnv, GuessAction, TextObservation, max_concurrent_envs=16); "
                       "uvicorn.run(app, host='127.0.0.1', port={port}, log_level='critical')")
    yield url
    proc.kill()
    proc.wait(10)


@pytest.fixture
def held_server():
    """A create_app-defaults server (one session at a time) whose one place an outside
    client holds: every reset of ours is refused with CAPACITY_REACHED."""
    proc, url = _serve_with_defaults()
    ServerPlaces._by_url.pop(url, None)
    holder = _hold_session(url)
    yield url
    holder.close()
    ServerPlaces._by_url.pop(url, None)
    proc.kill()
    proc.wait(10)


def test_a_server_that_refuses_every_reset_with_step_timeout_0_does_not_hang(held_server, tiny_engine,
                                                                            monkeypatch):
    monkeypatch.setattr(waiting, "ROOM_WAIT_S", 2.0, raising=False)  # the bound when step_timeout is 0 (60 s by default)
    envs = [make_env(f"openenv:{held_server}", step_timeout=0) for _ in range(2)]
    rollout = Rollout(tiny_engine, envs, seeds=[0, 1], max_turns=1, max_tokens=4, step_timeout=0)
    box: dict = {}
    worker = threading.Thread(target=lambda: box.setdefault("batch", rollout.run()), daemon=True)
    worker.start()
    worker.join(120)  # it used to wait forever
    assert not worker.is_alive(), "the rollout is still waiting for room on a server that refuses every session"
    for ep in box["batch"]:
        assert ep.error and "EnvironmentBusy" in ep.error and "CAPACITY_REACHED" in ep.error, ep.error
        assert "the wait for room is 2 s" in ep.error and ep.num_tokens == 0
    for env in envs:
        env.close()


def test_a_run_that_trained_nothing_exits_non_zero_and_says_why(held_server, tiny_model_path, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "workbench", "train", "--env", f"openenv:{held_server}",
           "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "2", "--group-size", "2",
           "--max-tokens", "4", "--max-turns", "1", "--eval-episodes", "0", "--save-interval", "0",
           "--environment.step_timeout", "2", "--output", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), "CI": "1"},
                          capture_output=True, text=True, timeout=600)
    last = [line for line in proc.stderr.splitlines() if line.strip()][-1]
    assert proc.returncode == 1, proc.stderr[-3000:]
    assert last.startswith("error: the run trained nothing: all 2 of its steps (0..1) were skipped"), last
    assert "no trained token" in last and "EnvironmentBusy" in last and "Traceback" not in proc.stderr
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2  # the run's own record is written


def test_slow_resets_end_at_step_timeout_each_and_name_the_server(slow_server, tiny_engine):
    envs = [make_env(f"openenv:{slow_server}", step_timeout=3.0) for _ in range(4)]
    start = time.monotonic()
    batch = Rollout(tiny_engine, envs, seeds=[0, 1, 2, 3], max_turns=1, max_tokens=4).run()
    took = time.monotonic() - start
    # 4 resets of 3 s each, one after another; each used to add a 10 s closing handshake (42 s
    # and more): well under the server's own 30 s reset is the bound that matters here.
    assert took < 25, f"4 resets with step_timeout 3 took {took:.1f} s"
    for ep in batch:
        assert ep.error and "reset" in ep.error and slow_server in ep.error, ep.error
        assert "within 3 s" in ep.error
    for env in envs:
        env.close()


def test_a_direct_reset_timeout_names_the_server_and_the_call(slow_server):
    env = make_env(f"openenv:{slow_server}", step_timeout=1.0)
    with pytest.raises(TimeoutError) as err:
        env.reset()
    assert str(err.value) == (f"the OpenEnv server at {slow_server} did not answer reset within 1 s "
                              "(environment.step_timeout)")
    env.close()


@pytest.fixture(scope="module")
def garbling_server():
    """A real WebSocket server at /ws that answers reset as OpenEnv does and every other
    message with text that is not JSON."""
    from websockets.asyncio.server import serve

    port = _free_port()
    ready, stop = threading.Event(), threading.Event()

    async def handler(ws):
        async for raw in ws:
            kind = json.loads(raw).get("type")
            if kind == "reset":
                await ws.send(json.dumps({"type": "observation", "data": {"observation": {"text": "Go."},
                                                                          "reward": None, "done": False}}))
            elif kind != "close":
                await ws.send("<html>502 Bad Gateway</html>")

    async def main():
        async with serve(handler, "127.0.0.1", port):
            ready.set()
            while not stop.is_set():
                await asyncio.sleep(0.05)

    thread = threading.Thread(target=lambda: asyncio.run(main()), daemon=True)
    thread.start()
    assert ready.wait(10)
    yield f"http://127.0.0.1:{port}"
    stop.set()
    thread.join(10)


def test_malformed_json_names_the_server_and_the_call(garbling_server, tiny_engine):
    env = make_env(f"openenv:{garbling_server}", action_field="message", step_timeout=5)
    try:
        assert env.reset(seed=0) == "Go."
        with pytest.raises(ValueError) as err:
            env.step("hello")
        assert str(err.value).startswith(f"the OpenEnv server at {garbling_server} answered step with text that "
                                         "is not JSON")
    finally:
        env.close()
    envs = [make_env(f"openenv:{garbling_server}", action_field="message", step_timeout=5) for _ in range(2)]
    batch = Rollout(tiny_engine, envs, seeds=[0, 1], max_turns=1, max_tokens=4).run()
    for ep in batch:
        assert ep.error and garbling_server in ep.error and "answered step with text that is not JSON" in ep.error
    for env in envs:
        env.close()
