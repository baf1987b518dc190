"""Faults of a run as a whole: its folder, its resume, its optimizer step.

1. two processes training into one output folder: the second refuses to start, naming
   the folder and the process that holds it; the first finishes with every metrics row
   and checkpoint; a lock left by a dead process is taken over;
2. `checkpoint.resume=False` in a folder holding an earlier run: the earlier run is moved
   to `previous_runs/`, nothing of it is lost, the new run's checkpoint is not pruned;
3. resuming with another learning rate: the config's value is used, with a warning
   naming both values;
4. a KeyboardInterrupt inside the optimizer step: every LoRA tensor and every Adam state
   is as before the step (none half updated, step counts not split).

Real trainers on the tiny model, real subprocesses for the second run.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.training.checkpoint import ResumedHyperparameterWarning, list_checkpoints
from workbench.training.run_lock import LOCK_NAME, EarlierRunMovedWarning, RunLockedError

ROOT = Path(__file__).resolve().parents[2]

FIRST_RUN = '''
import sys, time, pathlib
from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
c = tiny_config(pathlib.Path({model!r}), pathlib.Path({tmp!r}))
c.checkpoint.save_interval, c.checkpoint.keep_last_n = 1, 0
t = Trainer(c, environment=make_env("guess_number"))
def slow(trainer, metrics):
    pathlib.Path({started!r}).write_text(str(trainer.global_step))
    time.sleep(3)
t.fit(steps=3, callbacks=[slow])
print("FIRST DONE", t.global_step)
'''


def _rows(path: Path) -> list[int]:
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if line.strip()]


def test_two_runs_into_one_folder_second_refuses_naming_the_holder(tiny_model_path, tmp_path):
    started = tmp_path / "started"
    script = tmp_path / "first.py"
    script.write_text(FIRST_RUN.format(model=str(tiny_model_path), tmp=str(tmp_path), started=str(started)))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    first = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.monotonic() + 240
        while not started.exists() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        assert started.exists(), first.communicate(timeout=60)
        c = tiny_config(tiny_model_path, tmp_path)
        c.checkpoint.save_interval, c.checkpoint.keep_last_n = 1, 0
        second = Trainer(c, environment=make_env("guess_number"))
        with pytest.raises(RunLockedError) as err:
            second.fit(steps=3)
        message = str(err.value)
        assert c.checkpoint.output_dir in message and f"pid {first.pid}" in message
        assert second.global_step == 0
        out, errs = first.communicate(timeout=300)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 0 and "FIRST DONE 3" in out, errs[-3000:]
    folder = Path(c.checkpoint.output_dir)
    assert _rows(folder / "metrics.jsonl") == [0, 1, 2]  # one row per step, none lost
    assert [p.name for p in list_checkpoints(folder)] == ["step_000001", "step_000002", "step_000003"]
    assert not (folder / LOCK_NAME).exists()  # released when fit ended
    # The first run is over: the second may now continue it.
    second.fit(steps=1)
    assert second.global_step == 4


def test_a_lock_left_by_a_dead_process_is_taken_over(tiny_model_path, tmp_path):
    c = tiny_config(tiny_model_path, tmp_path)
    folder = Path(c.checkpoint.output_dir)
    folder.mkdir(parents=True)
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    import socket

    (folder / LOCK_NAME).write_text(json.dumps({"pid": int(dead.stdout), "host": socket.gethostname(),
                                                "started": time.time()}))
    trainer = Trainer(c, environment=make_env("guess_number"))
    with pytest.warns(UserWarning, match="was left by a run that ended without removing it"):
        trainer.fit(steps=1)
    assert trainer.global_step == 1 and not (folder / LOCK_NAME).exists()


def test_fresh_run_in_a_used_folder_moves_the_earlier_run_aside(tiny_model_path, tmp_path):
    c = tiny_config(tiny_model_path, tmp_path)
    c.checkpoint.save_interval, c.checkpoint.keep_last_n = 1, 2
    old = Trainer(c, environment=make_env("guess_number"))
    old.fit(steps=3)
    folder = Path(c.checkpoint.output_dir)
    old_rows = (folder / "metrics.jsonl").read_text()
    c2 = tiny_config(tiny_model_path, tmp_path)
    c2.checkpoint.save_interval, c2.checkpoint.keep_last_n, c2.checkpoint.resume = 1, 2, False
    new = Trainer(c2, environment=make_env("guess_number"))
    with pytest.warns(EarlierRunMovedWarning, match=str(folder)):
        new.fit(steps=1)
    assert [p.name for p in list_checkpoints(folder)] == ["step_000001"]  # the new run's, not pruned
    assert _rows(folder / "metrics.jsonl") == [0]
    (aside,) = (folder / "previous_runs").iterdir()
    assert (aside / "metrics.jsonl").read_text() == old_rows
    assert sorted(p.name for p in list_checkpoints(aside)) == ["step_000002", "step_000003"]


def test_resume_with_a_new_learning_rate_uses_the_config_and_warns(tiny_model_path, tmp_path):
    c = tiny_config(tiny_model_path, tmp_path)
    c.checkpoint.save_interval = 1
    Trainer(c, environment=make_env("guess_number")).fit(steps=1)
    c2 = tiny_config(tiny_model_path, tmp_path, learning_rate=2.5e-4)
    c2.checkpoint.save_interval = 1
    resumed = Trainer(c2, environment=make_env("guess_number"))
    with pytest.warns(ResumedHyperparameterWarning, match=r"training.learning_rate=0.00025.*0.001"):
        resumed.resume()
    assert resumed.global_step == 1
    assert [g["lr"] for g in resumed.optimizer.param_groups] == [2.5e-4]
    assert resumed.optimizer.state  # Adam moments still came from the checkpoint


def test_keyboard_interrupt_inside_the_optimizer_step_changes_nothing(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"),
                      reward_fn=lambda ep: float(sum(ep.token_ids) % 5))
    trainer.train_step()  # Adam has state (step 1) for every tensor
    opt = trainer.optimizer
    real_step = opt.step
    before: dict = {}

    def interrupted_step(*args, **kwargs):
        """The real AdamW step on the first half of the tensors, then Ctrl-C."""
        params = [p for g in opt.param_groups for p in g["params"]]
        before["weights"] = [p.detach().clone() for p in params]
        before["state"] = [{k: v.clone() for k, v in opt.state[p].items()} for p in params]
        groups = [list(g["params"]) for g in opt.param_groups]
        half = set(map(id, params[: len(params) // 2]))
        for g in opt.param_groups:
            g["params"] = [p for p in g["params"] if id(p) in half]
        try:
            real_step(*args, **kwargs)
        finally:
            for g, ps in zip(opt.param_groups, groups):
                g["params"] = ps
        raise KeyboardInterrupt

    opt.step = interrupted_step
    try:
        with pytest.raises(KeyboardInterrupt):
            trainer.train_step()
    finally:
        opt.step = real_step
    params = [p for g in opt.param_groups for p in g["params"]]
    assert all(torch.equal(p, w) for p, w in zip(params, before["weights"]))
    steps = {float(opt.state[p]["step"]) for p in params}
    assert steps == {float(before["state"][0]["step"])}, steps
    for p, st in zip(params, before["state"]):
        for k in ("exp_avg", "exp_avg_sq"):
            assert torch.equal(opt.state[p][k], st[k])
