"""OpenEnv servers used within their capacity: a server started with `create_app`'s
defaults serves one session at a time; the adapter learns that from its refusal, runs
the batch's episodes one after another (one notice), and a server that refuses while
a rollout runs ends only the episodes it refused, each with the server's own words."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import pytest

pytest.importorskip("openenv.core.env_server.http_server")

from openenv.core.generic_client import GenericEnvClient  # noqa: E402

from tests.test_openenv import GuessEnv, _free_port  # noqa: E402
from workbench.environments.adapters.openenv_capacity import ServerPlaces, server_words  # noqa: E402
from workbench.environments.adapters.openenv_env import OpenEnvEnvironment  # noqa: E402
from workbench.environments.base import EnvironmentBusy  # noqa: E402
from workbench.environments.registry import make_env  # noqa: E402
from workbench.rollout.async_rollout import AsyncRollout  # noqa: E402
from workbench.rollout.fork import replay  # noqa: E402
from workbench.rollout.rollout import Rollout  # noqa: E402
from workbench.trajectory import TrajectoryBatch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
NOTICE = "serves 1 environment at once"
REFUSAL = "Server at capacity: 1/1 sessions active. Cannot accept new connections. (code: CAPACITY_REACHED)"


def _serve_with_defaults() -> tuple[subprocess.Popen, str]:
    """`GuessEnv` served by OpenEnv's `create_app(Env, Action, Observation)` with nothing else
    set (one session at a time), under uvicorn in another process."""
    port = _free_port()
    code = ("import uvicorn; from openenv.core.env_server.http_server import create_app; "
            "from tests.test_openenv import GuessEnv, GuessAction, GuessObservation; "
            "app = create_app(GuessEnv, GuessAction, GuessObservation); "
            f"uvicorn.run(app, host='127.0.0.1', port={port}, log_level='critical')")
    proc = subprocess.Popen([sys.executable, "-c", code], cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            pass
        assert proc.poll() is None and time.monotonic() < deadline, "the OpenEnv server did not start"
        time.sleep(0.2)


@pytest.fixture(scope="module")
def one_at_a_time():
    """The URL of a `create_app`-defaults server (capacity 1)."""
    proc, url = _serve_with_defaults()
    yield url
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture
def fresh_places(one_at_a_time):
    """This process's places on the server start unknown (as in a new process)."""
    ServerPlaces._by_url.pop(one_at_a_time, None)
    yield one_at_a_time
    ServerPlaces._by_url.pop(one_at_a_time, None)


def _hold_session(url: str):
    """An outside client (another user of the server) holding one session."""
    client = GenericEnvClient(base_url=url).sync()
    client.connect()
    client.reset(seed=0)
    return client


def test_cli_batch_of_8_on_a_default_server_runs_one_at_a_time(one_at_a_time, tiny_model_path, tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "workbench", "train", "--env", f"openenv:{one_at_a_time}",
           "--model", str(tiny_model_path), "--steps", "1", "--batch-size", "8", "--group-size", "2",
           "--max-tokens", "4", "--max-turns", "2", "--eval-episodes", "0", "--save-interval", "0",
           "--output", str(out)]
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    metrics = json.loads((out / "metrics.jsonl").read_text().splitlines()[0])
    assert metrics["episodes"] == 8.0 and metrics["env/error_rate"] == 0.0
    assert metrics["rollout/queued_episodes"] == 7.0  # the first ran at once, the other 7 waited their turn
    batch = TrajectoryBatch.load(out / "rollouts" / "step_000000.jsonl.gz")
    assert len(batch) == 8
    for ep in batch:
        assert ep.error is None and ep.num_tokens > 0 and ep.num_turns >= 1, (ep.episode_id, ep.error)
    notices = [line for line in proc.stderr.splitlines() if NOTICE in line]
    assert len(notices) == 1, proc.stderr[-3000:]
    assert "max_concurrent_envs=N" in notices[0] and "max_concurrent=N" in notices[0]
    assert "CAPACITY_REACHED" in notices[0]  # the server's own words


@pytest.mark.parametrize("rollout_class", [Rollout, AsyncRollout])
def test_a_rollout_queues_what_the_server_cannot_take(fresh_places, tiny_engine, rollout_class, capsys):
    url = fresh_places
    envs = [make_env(f"openenv:{url}") for _ in range(4)]
    rollout = rollout_class(tiny_engine, envs, seeds=[0, 0, 1, 1], max_turns=2, max_tokens=4, step_timeout=20)
    rollout.reset()
    assert rollout.live == [0] and rollout.waiting == [1, 2, 3]
    assert envs[0].places.limit == 1 and envs[0].places.open == 1  # learnt from the refusal of episode 1
    batch = rollout.run()
    for ep in batch:
        assert ep.error is None and ep.num_tokens > 0 and ep.num_turns >= 1, (ep.episode_id, ep.error)
        assert all(t.info["state"]["secret"] == 1 + ep.env_seed % 4 for t in ep.turns)
    assert batch.meta["rollout/queued_episodes"] == 3.0
    assert envs[0].places.open == 0  # every session closed when its episode ended
    assert capsys.readouterr().err.count(NOTICE) == 1
    # a fork replays its copies side by side: it needs them all at once, and says so
    with pytest.raises(RuntimeError, match=r"needs 2 environments at once, but 1 found no room: all 1 places"):
        replay(batch[0], 1, tiny_engine, n=2, environment=lambda: make_env(f"openenv:{url}"), max_tokens=4)
    assert envs[0].places.open == 0


def test_a_server_that_refuses_mid_run_ends_only_the_refused_episodes(fresh_places, tiny_engine, capsys):
    url = fresh_places
    outside: list = []

    class TakenAfter(OpenEnvEnvironment):
        """The first episode's end lets another user of the server take its place."""

        def end_episode(self) -> None:
            super().end_episode()
            if not outside:
                outside.append(_hold_session(url))

    # max_concurrent says the limit up front, so no refusal happens before the run
    first = TakenAfter(url, max_concurrent=1)
    envs = [first] + [make_env(f"openenv:{url}", max_concurrent=1) for _ in range(2)]
    roomy = make_env("openenv:tests.test_openenv:GuessEnv")  # another server, with room
    rollout = Rollout(tiny_engine, envs + [roomy], seeds=[0, 1, 2, 3], max_turns=2, max_tokens=4, step_timeout=1.5)
    rollout.reset()
    assert rollout.live == [0, 3] and rollout.waiting == [1, 2]  # by the stated limit: no refusal yet
    start = time.monotonic()
    batch = rollout.run()
    waited = time.monotonic() - start
    assert outside, "the first episode never ended"
    assert batch[0].error is None and batch[0].num_tokens > 0
    assert batch[3].error is None and batch[3].num_tokens > 0
    for ep in (batch[1], batch[2]):  # refused by the server: ended, with its words, and nothing else
        assert ep.error is not None and REFUSAL in ep.error and "EnvironmentBusy" in ep.error, ep.error
        assert "step_timeout=1.5" in ep.error and ep.num_tokens == 0
    assert waited >= 1.5  # they waited step_timeout with nothing of the rollout running, no longer
    assert batch.meta["rollout/queued_episodes"] == 2.0
    assert first.places.open == 0
    err = capsys.readouterr().err
    assert err.count(NOTICE) == 1 and REFUSAL in err

    # the same, but the other user leaves after 0.5 s: the waiting episodes then run
    threading.Timer(0.5, outside[0].close).start()
    again = Rollout(tiny_engine, [make_env(f"openenv:{url}") for _ in range(2)], seeds=[0, 1], max_turns=2,
                    max_tokens=4, step_timeout=20)
    again.reset()
    assert again.live == [] and again.waiting == [0, 1]
    batch = again.run()
    assert [ep.error for ep in batch] == [None, None] and all(ep.num_tokens > 0 for ep in batch)
    for env in envs + [roomy]:
        env.close()


def test_a_refusal_on_a_closed_socket_still_gives_the_servers_words(fresh_places):
    url = fresh_places
    holder = _hold_session(url)
    try:
        late = GenericEnvClient(base_url=url).sync()
        late.connect()
        time.sleep(0.5)  # the server refuses and closes before this client says anything
        with pytest.raises(Exception) as info:
            late.reset(seed=0)
        assert "ConnectionClosed" in type(info.value).__name__ and REFUSAL not in str(info.value)
        assert server_words(late, info.value) == f"Server error: {REFUSAL}"
        late.close()
        env = make_env(f"openenv:{url}")
        with pytest.raises(EnvironmentBusy, match="CAPACITY_REACHED"):  # called directly: a clear error
            env.reset(seed=0)
        assert env.places.open == 0 and env.places.limit == 1
        with pytest.raises(RuntimeError, match="reset\\(\\) first"):
            env.step("1")
    finally:
        holder.close()
    one, two = make_env(f"openenv:{url}"), make_env(f"openenv:{url}")
    one.reset(seed=0)  # the server's one place, now this process's
    with pytest.raises(EnvironmentBusy, match="all 1 places .* are taken"):
        two.reset(seed=0)  # refused here, without a connection
    one.end_episode()
    assert two.reset(seed=0).startswith("Guess a digit") and two.places.open == 1
    two.close()
    with pytest.raises(ValueError, match="environment.params.max_concurrent must be a whole number"):
        make_env(f"openenv:{url}", max_concurrent=0)


class SoloGuessEnv(GuessEnv):
    """A class whose sessions may not run side by side (OpenEnv's default)."""

    SUPPORTS_CONCURRENT_SESSIONS = False


def test_a_class_without_concurrent_sessions_is_served_one_at_a_time(tiny_engine, capsys):
    envs = [make_env("openenv:tests.test_openenv_capacity:SoloGuessEnv") for _ in range(3)]
    assert envs[0].places.limit == 1  # known from the class: no refusal needed
    batch = Rollout(tiny_engine, envs, seeds=[0, 1, 2], max_turns=2, max_tokens=4, step_timeout=20).run()
    assert [ep.error for ep in batch] == [None] * 3 and all(ep.num_tokens > 0 for ep in batch)
    assert batch.meta["rollout/queued_episodes"] == 2.0
    err = capsys.readouterr().err
    assert err.count(NOTICE) == 1 and "SoloGuessEnv does not set SUPPORTS_CONCURRENT_SESSIONS = True" in err
    for env in envs:
        env.close()
