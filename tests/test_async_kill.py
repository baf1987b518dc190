"""SIGKILL an asynchronous run (`training.max_staleness` 1 and 2) while a batch sampled ahead
is in flight, then resume it: no step is lost or counted twice.

The first child trains with a checkpoint and a saved batch every step. Its environment's
`reset` blocks for ever on the seeds of step K+1 (sampled ahead, on the rollout thread),
and the fit callback of step K waits until that thread is blocked inside its rollout,
writes a marker and sleeps. The parent then SIGKILLs the child at a known point: step K is
logged (`metrics.jsonl`, `rollouts/step_K`), its checkpoint (written after the callbacks)
is not, and the batch of step K+1 is being sampled on the thread. A second child resumes
(`checkpoint.resume=True`) from the checkpoint of step K and redoes step K: `fit` drops
the metrics lines of steps >= K first (`open_metrics_log`) and removes their saved batches
(`run_files.begin_fit`). The parent checks the step numbers of the metrics file, the saved
batches, the checkpoint's step and history, and that the first resumed step sampled its
batch anew (weight version = that step, staleness 0). Without the metrics file's
truncation the step K line appears twice (checked by hand)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.training import checkpoint as ckpt
from workbench.training.run_files import ROLLOUTS, rollout_path, saved_steps
from workbench.trajectory import TrajectoryBatch

ROOT = Path(__file__).resolve().parents[1]

CHILD = r"""
import json, sys, time
from pathlib import Path
from envs.guess_number import GuessNumberEnv
from tests.test_async_fit import config
from workbench import Trainer
import torch

model, out, mode, staleness, kill_step, target = (Path(sys.argv[1]), Path(sys.argv[2]), sys.argv[3],
                                                   int(sys.argv[4]), int(sys.argv[5]), int(sys.argv[6]))
blocked, ready = out / "thread_blocked", out / "kill_me"


class BlockingEnv(GuessNumberEnv):
    # In the run to be killed, the rollout of step kill_step + 1 (sampled ahead, on the
    # rollout thread) never gets past its first reset.
    def reset(self):
        if mode == "kill" and self._seed in blocking_seeds:
            blocked.write_text("1")
            while True:
                time.sleep(1)
        return super().reset()


cfg = config(model, out, max_staleness=staleness)
cfg.checkpoint.save_interval, cfg.checkpoint.resume = 1, mode == "resume"
cfg.training.save_rollouts_every = 1
torch.manual_seed(0)
trainer = Trainer(cfg, environment=BlockingEnv())
blocking_seeds = set(trainer._step_seeds(kill_step + 1))


def wait_in_step(tr, metrics):
    if mode == "kill" and metrics["step"] == kill_step:
        while not blocked.exists():  # the batch of step kill_step + 1 is inside its rollout, on the thread
            time.sleep(0.02)
        ready.write_text(json.dumps({"global_step": tr.global_step, "in_flight": tr.ahead.in_flight,
                                     "thread_alive": tr.ahead.running}))
        while True:
            time.sleep(1)


history = trainer.fit(until_step=target, callbacks=[wait_in_step])
(out / "resumed.json").write_text(json.dumps({"global_step": trainer.global_step,
                                              "history_steps": [m["step"] for m in history]}))
"""


def _child(tiny_model_path: Path, out: Path, mode: str, staleness: int, kill_step: int, target: int):
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    args = [sys.executable, "-c", CHILD, str(tiny_model_path), str(out), mode, str(staleness), str(kill_step),
            str(target)]
    return subprocess.Popen(args, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def _lines(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines()]


def kill_and_resume(tiny_model_path: Path, out: Path, staleness: int, kill_step: int, target: int) -> None:
    proc = _child(tiny_model_path, out, "kill", staleness, kill_step, target)
    ready = out / "kill_me"
    try:
        deadline = time.monotonic() + 240
        while not ready.exists():
            if proc.poll() is not None:
                pytest.fail(f"the child ended before the kill: {proc.stdout.read().decode()[-3000:]}")
            assert time.monotonic() < deadline, "the child never reached the kill point"
            time.sleep(0.05)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    assert proc.returncode == -signal.SIGKILL
    at_kill = json.loads(ready.read_text())
    assert at_kill == {"global_step": kill_step + 1, "in_flight": kill_step + 1, "thread_alive": True}
    # What the killed run left: step kill_step logged and saved, its checkpoint not written.
    assert _lines(out / "metrics.jsonl") == list(range(kill_step + 1))
    assert saved_steps(out / ROLLOUTS) == list(range(kill_step + 1))
    newest = ckpt.latest_checkpoint(out)
    assert newest is not None and newest.name == ckpt.checkpoint_name(kill_step)

    resumed = _child(tiny_model_path, out, "resume", staleness, kill_step, target)
    log, _ = resumed.communicate(timeout=300)
    assert resumed.returncode == 0, log.decode()[-3000:]
    done = json.loads((out / "resumed.json").read_text())
    assert done == {"global_step": target, "history_steps": list(range(target))}
    # No gap, no duplicate: one metrics line and one saved batch per step.
    assert _lines(out / "metrics.jsonl") == list(range(target))
    assert sorted(p.name for p in (out / ROLLOUTS).iterdir()) == [rollout_path(out, s).name for s in range(target)]
    state = ckpt.read_checkpoint(ckpt.latest_checkpoint(out))["json"]["trainer_state"]
    assert state["global_step"] == target
    assert [m["step"] for m in state["metrics_history"]] == list(range(target))
    # The step redone after the resume sampled its batch anew, with its own weights.
    rows = {s: json.loads(line) for s, line in zip(range(target), (out / "metrics.jsonl").read_text().splitlines())}
    first = TrajectoryBatch.load(rollout_path(out, kill_step))
    assert {ep.weight_version for ep in first} == {kill_step}
    assert rows[kill_step]["async/staleness_max"] == 0.0
    for step in range(kill_step + 1, target):  # then sampled ahead again
        batch = TrajectoryBatch.load(rollout_path(out, step))
        assert all(step - staleness <= ep.weight_version < step for ep in batch)
        assert 0.0 < rows[step]["async/staleness_max"] <= staleness


@pytest.mark.parametrize("staleness", [1, 2])
def test_sigkill_with_a_batch_in_flight_resumes_without_gap_or_duplicate(tiny_model_path, tmp_path, staleness):
    kill_and_resume(tiny_model_path, tmp_path, staleness=staleness, kill_step=2, target=5)
