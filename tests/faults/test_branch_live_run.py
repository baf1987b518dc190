"""Branching from a run that is still training (issue 50, item 4).

`train --from RUN` while RUN trained with a checkpoint every step (`--checkpoint.save_interval
1`) and kept only the newest ones (`checkpoint.keep_last_n`) ended in a traceback, 3 times of 3:
`CheckpointError: ... has no MANIFEST.json: it was cut off before it finished writing`. Nothing
was cut off: the running run pruned the checkpoint between the branch choosing it and loading
it. Now a branch holds the checkpoint it chose (a shared `flock` on its MANIFEST.json) until it
has loaded it, and pruning, which takes that lock exclusively without waiting, leaves a held
checkpoint for its next call; a checkpoint pruned before the hold is chosen again (the run's
newest) or, when the user named it, refused in one line naming what happened and what to pass.
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.debug import load_run
from workbench.training import checkpoint as ckpt
from workbench.training.branch import BranchError, hold_branch_checkpoint

REPO = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "OMP_WAIT_POLICY": "PASSIVE"}


def _train(model: Path, out: Path, steps: int, *extra: str) -> list[str]:
    return ["train", "--model", str(model), "--dtype", "float32", "--steps", str(steps), "--batch-size", "2",
            "--group-size", "2", "--max-tokens", "4", "--max-turns", "1", "--eval-episodes", "0",
            "--checkpoint.save_interval", "1", "--output", str(out), *extra]


def _prune_in_another_process(folder: Path, keep: int) -> list[str]:
    code = ("import sys; from workbench.training.checkpoint import prune_checkpoints; "
            f"print([p.name for p in prune_checkpoints({str(folder)!r}, {keep})])")
    done = subprocess.run([sys.executable, "-c", code], env=_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return eval(done.stdout.strip())  # a list of names printed by the line above


def test_a_held_checkpoint_survives_another_processes_pruning(tiny_model_path, tmp_path):
    out = tmp_path / "run"
    assert main(_train(tiny_model_path, out, 3, "--checkpoint.keep_last_n", "0")) == 0
    folder = out / "checkpoints"
    first, second, third = ckpt.list_checkpoints(folder)
    with ckpt.hold_checkpoint(first):
        assert _prune_in_another_process(folder, 1) == ["step_000002"]  # the held one is kept for now
        assert [p.name for p in ckpt.list_checkpoints(folder)] == ["step_000001", "step_000003"]
        ckpt.verify_checkpoint(first)  # whole, readable
    assert _prune_in_another_process(folder, 1) == ["step_000001"]  # once let go, the next prune takes it
    assert ckpt.list_checkpoints(folder) == [third]
    assert sorted(p.name for p in third.iterdir()) == sorted([*ckpt.read_manifest(third), "MANIFEST.json"])  # no file added


def test_a_named_checkpoint_pruned_before_it_is_held_is_one_line(tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_train(tiny_model_path, out, 2, "--checkpoint.keep_last_n", "0")) == 0
    first = out / "checkpoints" / "step_000001"
    ckpt.prune_checkpoints(out / "checkpoints", 1)  # what the running run does between choosing and loading
    with pytest.raises(ckpt.CheckpointGone, match="pruned"):
        with ckpt.hold_checkpoint(first):
            pass
    with pytest.raises(BranchError, match=r"its run keeps only its newest checkpoints \(checkpoint.keep_last_n\) "
                                          r"and has step_000002; give one of those, or the run folder"):
        hold_branch_checkpoint(first)
    capsys.readouterr()
    rc = main(["train", "--from", str(first), "--steps", "1", "--output", str(tmp_path / "branch")])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert rc == 2 and len(err) == 1 and "keeps only its newest checkpoints" in err[0], err


def test_branches_from_a_run_that_is_training_and_pruning_load_every_time(tiny_model_path, tmp_path):
    """The issue's case for real: the parent trains in another process, a checkpoint every step,
    keeping only the newest one; three branches from its run folder while it trains."""
    parent = tmp_path / "parent"
    args = _train(tiny_model_path, parent, 40, "--checkpoint.keep_last_n", "1")
    proc = subprocess.Popen([sys.executable, "-m", "workbench", *args], env=_env(), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not list((parent / "checkpoints").glob("step_*")) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.2)
        steps = []
        for i in range(3):
            assert proc.poll() is None, "the parent finished before every branch started: give it more steps"
            out = tmp_path / f"branch{i}"
            rc = main(["train", "--from", str(parent), "--steps", "1", "--eval-episodes", "0", "--output", str(out)])
            assert rc == 0
            steps.append(load_run(out).branched_from.step)
        assert steps == sorted(steps) and steps[0] >= 1
    finally:
        proc.kill()
        proc.communicate(timeout=60)


_SAVE_AND_PRUNE = """
import sys, torch
from workbench.training import checkpoint as ckpt
folder, steps = sys.argv[1], int(sys.argv[2])
weights = {"w": torch.arange(1_000_000, dtype=torch.float32)}  # 4 MB: verifying it takes a while
for step in range(1, steps + 1):
    ckpt.write_checkpoint(f"{folder}/{ckpt.checkpoint_name(step)}", {"policy": weights},
                          {"trainer_state": {"global_step": step}}, {"config.yaml": "{}"})
    ckpt.prune_checkpoints(folder, 1)
"""


def test_the_newest_checkpoint_is_found_while_its_run_saves_and_prunes(tmp_path, recwarn):
    """A run saving a checkpoint and pruning the one before it, over and over: every look for
    the newest finds one that verifies, and none is reported corrupt (one pruned while it was
    verified is listed again). Before, such a look found none ("none under .../checkpoints")."""
    folder = tmp_path / "checkpoints"
    folder.mkdir()
    proc = subprocess.Popen([sys.executable, "-c", _SAVE_AND_PRUNE, str(folder), "400"], env=_env(),
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 120
        while ckpt.latest_checkpoint(folder) is None and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            time.sleep(0.01)
        looks, steps = 0, []
        while proc.poll() is None:
            found = ckpt.latest_checkpoint(folder)
            assert found is not None, f"no checkpoint found after {looks} looks"
            steps.append(int(found.name.removeprefix(ckpt.PREFIX)))
            looks += 1
        assert proc.wait() == 0, proc.communicate()[1][-3000:]
    finally:
        proc.kill()
    assert looks >= 50, looks  # the run saved long enough to race the looks
    assert steps == sorted(steps) and len(set(steps)) > 10, steps  # newest each time, moving on
    assert not [w for w in recwarn if "corrupt" in str(w.message)], [str(w.message) for w in recwarn]
