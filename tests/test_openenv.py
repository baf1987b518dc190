"""OpenEnv environments: a real OpenEnv server (written here on OpenEnv's base classes) on
127.0.0.1, as a running server by URL and as a class the adapter serves itself; check_env,
a rollout, failures that end one episode, and one training step through the CLI."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Optional

import httpx
import pytest

pytest.importorskip("openenv.core.env_server.http_server")

from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from workbench.environments.checker import check_env  # noqa: E402
from workbench.environments.registry import describe_env, make_env  # noqa: E402
from workbench.rollout.rollout import Rollout  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]


class GuessAction(Action):
    message: str


class GuessObservation(Observation):
    text: str = ""
    guesses_left: int = 0


class GuessState(State):
    secret: int = 0
    success: bool = False


class GuessEnv(Environment):
    """Guess a digit 1..4 in 3 tries; the secret comes from the reset seed. A guess of
    "sleep" hangs for 30 s (for the step_timeout test)."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state = GuessState()

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> GuessObservation:
        self._state = GuessState(episode_id=episode_id, step_count=0, secret=1 + (seed or 0) % 4)
        return GuessObservation(text="Guess a digit from 1 to 4. You have 3 guesses.", guesses_left=3)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> GuessObservation:
        if action.message.strip() == "sleep":
            time.sleep(30)
        self._state.step_count += 1
        won = str(self._state.secret) in action.message
        self._state.success = won
        left = 3 - self._state.step_count
        done = won or left <= 0
        text = "Correct!" if won else f"No. {left} guesses left."
        return GuessObservation(text=text, guesses_left=left, done=done, reward=1.0 if won else 0.0)

    @property
    def state(self) -> GuessState:
        return self._state


class BoardObservation(Observation):
    board: str = ""
    score: int = 0


class BoardEnv(Environment):
    """An environment whose observation has no common text field."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> BoardObservation:
        return BoardObservation(board="x..", score=0)

    def step(self, action: GuessAction, timeout_s: Optional[float] = None, **kwargs: Any) -> BoardObservation:
        return BoardObservation(board="xx.", score=1, done=True, reward=0.5)

    @property
    def state(self) -> State:
        return State()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def guess_server():
    """`GuessEnv` served by OpenEnv's own create_app under uvicorn, in another process."""
    port = _free_port()
    code = ("import uvicorn; from openenv.core.env_server.http_server import create_fastapi_app; "
            "from tests.test_openenv import GuessEnv, GuessAction, GuessObservation; "
            "app = create_fastapi_app(GuessEnv, GuessAction, GuessObservation, max_concurrent_envs=16); "
            f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='warning')")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)})
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                break
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the OpenEnv server did not start"
        time.sleep(0.2)
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:  # a session still sleeping in the "sleep" step holds it up
        proc.kill()
        proc.wait(10)


def test_a_running_server_by_url_plays_and_passes_check_env(guess_server):
    env = make_env(f"openenv:{guess_server}")
    assert describe_env(env).name == f"openenv:{guess_server}"
    assert env.reset(seed=2) == "Guess a digit from 1 to 4. You have 3 guesses."
    obs, reward, done, info = env.step("1")
    assert (obs, reward, done) == ("No. 2 guesses left.", 0.0, False)
    assert info["state"]["secret"] == 3 and info["state"]["step_count"] == 1 and info["success"] is False
    obs, reward, done, info = env.step("it is 3")
    assert (obs, reward, done, info["success"]) == ("Correct!", 1.0, True, True)
    assert env.action_field == "message"  # read from the server's /schema
    check_env(env)
    env.close()


def test_rollout_and_failures_end_only_their_episode(guess_server, tiny_engine):
    good = make_env(f"openenv:{guess_server}")
    dead = make_env(f"openenv:http://127.0.0.1:{_free_port()}")  # nothing listens there
    rollout = Rollout(tiny_engine, [good, dead, make_env(f"openenv:{guess_server}")], seeds=[0, 0, 1], max_turns=2,
                      max_tokens=4, step_timeout=20)
    batch = rollout.run()
    assert batch[1].error and "reset raised" in batch[1].error and batch[1].num_tokens == 0
    for ep in (batch[0], batch[2]):
        assert ep.error is None and ep.num_turns >= 1
        assert all(t.info["state"]["secret"] == 1 + ep.env_seed % 4 for t in ep.turns)
        assert not [w for w in ep.warnings if "mismatch" in w]
    # a step that hangs past step_timeout raises from the client's own timeout (no stuck thread),
    # which ends that episode in a rollout; the server's other sessions go on
    slow = make_env(f"openenv:{guess_server}", step_timeout=1.0)
    slow.reset(seed=0)
    start = time.monotonic()
    with pytest.raises(Exception):
        slow.step("sleep")
    assert time.monotonic() - start < 5
    other = make_env(f"openenv:{guess_server}")
    other.reset(seed=1)
    assert other.step("2")[1] == 1.0
    for env in (good, dead, other):
        env.close()


def test_observation_without_a_text_field_is_a_clear_error():
    env = make_env("openenv:tests.test_openenv:BoardEnv")
    with pytest.raises(ValueError, match=r"keys are \['board', 'score'\].*observation_field"):
        env.reset(seed=0)
    env.close()
    env = make_env("openenv:tests.test_openenv:BoardEnv", observation_field="board")
    assert env.reset(seed=0) == "x.."
    assert env.step("a")[:3] == ("xx.", 0.5, True)
    served = env._served
    copy = __import__("copy").deepcopy(env)
    assert copy.url == env.url and copy.reset(seed=0) == "x.."
    env.close()
    assert served.thread.is_alive()  # the copy still holds the server
    copy.close()
    served.thread.join(10)
    assert not served.thread.is_alive()  # the last close stops it


def test_cli_trains_one_step_on_an_openenv_class(tmp_path, tiny_model_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "workbench", "train", "--env", "openenv:tests.test_openenv:GuessEnv",
           "--model", str(tiny_model_path), "--steps", "1", "--batch-size", "4", "--group-size", "2",
           "--max-tokens", "4", "--max-turns", "2", "--eval-episodes", "0", "--save-interval", "0",
           "--output", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    # a session's end is not an error: no server traceback per episode (openenv-core's handler closes
    # a socket the client already closed; uvicorn logged each as "Exception in ASGI application")
    assert "Traceback" not in proc.stderr and "Exception in ASGI application" not in proc.stderr, proc.stderr[-3000:]
    import json

    lines = (out / "metrics.jsonl").read_text().splitlines()
    metrics = json.loads(lines[0])
    assert metrics["step"] == 0 and metrics["episodes"] == 4.0 and metrics["env/error_rate"] == 0.0
    config = (out / "config.yaml").read_text()
    assert "openenv:tests.test_openenv:GuessEnv" in config
