"""One writer per run folder (issue 43, items 1 and 2): real `python -m workbench train`
processes on the tiny model, two at a time into one folder.

1. train + train: A holds the folder from before its first write; B, started while A
   evaluates "before" (A used to take the lock only in `fit`, after writing config.yaml), is
   refused before it writes anything: A's config.yaml used to say B's learning rate;
2. branch + branch: B, started while branch A evaluates "before", used to move A's files
   aside, write its own branch.json/config.yaml, cut A's metrics and delete its rollouts,
   and both exited 0; now B is refused and A's folder is as A wrote it;
3. train after a finished run: B (another learning rate) used to exit 0 having trained
   nothing, rewriting config.yaml, evals.json and summary.md; now it is refused (rc 2) and
   every file of A is unchanged.

Each test compares every file of the first run byte for byte (sha256) before and after
the second command. A's pause is real: its environment's `reset` waits for a gate file
(only in the process given WB_TEST_GATE), so A is caught in its "before" evaluation.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from workbench.environments.base import BaseEnvironment, StepResult

ROOT = Path(__file__).resolve().parents[2]
ENV = "tests.faults.test_one_writer:GateEnv"


class GateEnv(BaseEnvironment):
    """One turn, reward = reply length / 10. When the environment variable WB_TEST_GATE names
    a file that does not exist yet, `reset` writes `<gate>.waiting` and waits for the gate."""

    def reset(self) -> str:
        gate = os.environ.get("WB_TEST_GATE")
        if gate and not Path(gate).exists():
            Path(gate + ".waiting").write_text(str(os.getpid()))
            while not Path(gate).exists():
                time.sleep(0.05)
        return "Write something."

    def step(self, action: str) -> StepResult:
        n = len(action.strip())
        return "Done.", n / 10, True, {"success": n > 3}


def _train(model: Path, out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "workbench", "train", "--model", str(model), "--env", ENV, "--steps", "2",
            "--batch-size", "4", "--group-size", "2", "--max-tokens", "6", "--max-turns", "1",
            "--eval-episodes", "2", "--save-interval", "1", "--environment.step_timeout", "600",
            "--output", str(out), *extra]


def _env(gate: Path | None = None) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "WB_TEST_GATE"}
    env.update({"PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE", "CI": "1"})
    if gate is not None:
        env["WB_TEST_GATE"] = str(gate)
    return env


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` (hidden ones included) with its sha256."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _one_line_error(proc: subprocess.CompletedProcess) -> str:
    lines = [line for line in proc.stderr.splitlines() if line.strip()]
    assert "Traceback" not in proc.stderr, proc.stderr[-3000:]
    assert lines and lines[-1].startswith("error: "), proc.stderr[-3000:]
    return lines[-1]


def _held_while_second_runs(first_cmd: list[str], second_cmd: list[str], folder: Path, gate: Path):
    """Start `first_cmd` with the gate closed, wait until it waits at the gate, snapshot
    `folder`, run `second_cmd` to the end, snapshot again, open the gate and let the first
    finish. Returns (snapshot before, snapshot after, second's result, first's result)."""
    first = subprocess.Popen(first_cmd, cwd=ROOT, env=_env(gate), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 300
        while not Path(str(gate) + ".waiting").exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        assert Path(str(gate) + ".waiting").exists(), first.communicate(timeout=60)
        before = _snapshot(folder)
        try:
            second = subprocess.run(second_cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=240)
        except subprocess.TimeoutExpired as exc:  # e.g. it waits at nothing and trains: still a failure below
            second = subprocess.CompletedProcess(second_cmd, -1, exc.stdout or "", exc.stderr or "")
        after = _snapshot(folder)
        gate.write_text("open")
        out, err = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
            first.communicate()
    return before, after, second, subprocess.CompletedProcess(first_cmd, first.returncode, out, err)


@pytest.fixture(scope="module")
def finished(tiny_model_path, tmp_path_factory) -> Path:
    """A finished CLI run: 2 steps at lr 1e-4, checkpoints after each, 2 held-out episodes."""
    out = tmp_path_factory.mktemp("writer") / "finished"
    proc = subprocess.run(_train(tiny_model_path, out, "--lr", "1e-4"), cwd=ROOT, env=_env(), capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out


def test_train_into_a_folder_another_train_is_writing_is_refused_before_it_writes(tiny_model_path, tmp_path):
    folder, gate = tmp_path / "run", tmp_path / "gate"
    before, after, second, first = _held_while_second_runs(
        _train(tiny_model_path, folder, "--lr", "1e-4"), _train(tiny_model_path, folder, "--lr", "0.009"),
        folder, gate)
    line = _one_line_error(second)
    assert second.returncode == 2 and "is in use by another run" in line and "pid" in line, second.stderr[-3000:]
    assert after == before  # B changed nothing: A's config.yaml still says A's learning rate
    assert yaml.safe_load((folder / "config.yaml").read_text())["training"]["learning_rate"] == 1e-4
    assert first.returncode == 0, first.stderr[-3000:]
    rows = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows == [0, 1]
    assert [e["step"] for e in json.loads((folder / "evals.json").read_text())] == [0, 2]
    assert not list(folder.rglob(".workbench.lock"))  # released at the end


def test_branch_into_a_folder_another_branch_is_writing_is_refused_before_it_writes(finished, tiny_model_path,
                                                                                    tmp_path):
    folder, gate = tmp_path / "branch", tmp_path / "gate"
    ckpt = finished / "checkpoints" / "step_000001"
    parent_files = _snapshot(finished)

    def branch(lr: str) -> list[str]:
        return [sys.executable, "-m", "workbench", "train", "--from", str(ckpt), "--steps", "2", "--lr", lr,
                "--output", str(folder)]

    before, after, second, first = _held_while_second_runs(branch("2e-4"), branch("0.009"), folder, gate)
    line = _one_line_error(second)
    assert second.returncode == 2 and "is in use by another run" in line, second.stderr[-3000:]
    assert after == before and "branch.json" in before and "config.yaml" in before
    assert first.returncode == 0, first.stderr[-3000:]
    origin = json.loads((folder / "branch.json").read_text())
    assert origin["overrides"]["training.learning_rate"] == 2e-4 and origin["step"] == 1
    rows = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
    assert rows == [0, 1, 2]  # the parent's row of step 0, then A's steps 1 and 2
    assert sorted(p.name for p in (folder / "rollouts").iterdir()) == ["step_000001.jsonl.gz", "step_000002.jsonl.gz"]
    assert not (folder / "previous_runs").exists()  # nothing of A was moved aside
    assert _snapshot(finished) == parent_files  # and the parent was never written


def test_train_into_a_finished_run_is_refused_and_changes_nothing(finished, tiny_model_path):
    before = _snapshot(finished)
    second = subprocess.run(_train(tiny_model_path, finished, "--lr", "0.009"), cwd=ROOT, env=_env(),
                            capture_output=True, text=True, timeout=600)
    line = _one_line_error(second)
    assert second.returncode == 2 and "holds a finished run" in line and "step_000002" in line, second.stderr[-3000:]
    assert "--output NEW" in line and "--from" in line  # says what to give instead
    assert _snapshot(finished) == before
