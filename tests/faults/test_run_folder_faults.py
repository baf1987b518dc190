"""Run folders and the commands that read them, under bad input (issue 33, item 4):
symbolic links out of the run folder, a gzip bomb among the saved batches, bad paths
given to `diagnose` and `diff`, a damaged evals.json, and a NaN reward in evaluation.

The run folder is real: one GRPO step of the tiny model on guess_number, laid out as the
CLI lays it out (RUN/config.yaml, metrics.jsonl, rollouts/, checkpoints/). Each test
copies it and plants one fault. The commands run as real subprocesses
(`python -m workbench ...`).

Every test here failed on 59ddc95: the loader followed links out of the folder (and its
error quoted the linked file), the bomb was read whole, the CLI printed tracebacks, a
missing checkpoint was "cut off", `repr(run)` raised, and evaluation returned a NaN mean.
"""
from __future__ import annotations

import gzip
import json
import math
import os
import shutil
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from envs.guess_number import GuessNumberEnv
from tests.test_trainer import tiny_config
from workbench import RewardError, Trainer
from workbench.debug import RunError, load_run
from workbench.training import run_files
from workbench.trajectory import TrajectoryBatch

ROOT = Path(__file__).resolve().parents[2]
#: What the planted outside file holds: no error message may show it.
SECRET = "planted-secret-line root:x:0:0:root:/root:/bin/bash"


@pytest.fixture(scope="module")
def trained_run(tiny_model_path, tmp_path_factory) -> Path:
    """A run folder of one GRPO step, with a checkpoint of step 1 under checkpoints/."""
    run = tmp_path_factory.mktemp("trained") / "run"
    config = tiny_config(tiny_model_path, run)
    config.training.log_dir = str(run)
    config.checkpoint.output_dir = str(run / run_files.CHECKPOINTS)
    config.checkpoint.save_interval = 1
    Trainer(config.validate(), environment=GuessNumberEnv()).fit(steps=1)
    assert (run / run_files.CONFIG_FILE).is_file() and (run / run_files.METRICS_FILE).is_file()
    assert run_files.saved_steps(run / run_files.ROLLOUTS) == [0]
    assert (run / run_files.CHECKPOINTS / "step_000001").is_dir()
    return run


@pytest.fixture
def run(trained_run, tmp_path) -> Path:
    """A fresh copy of the trained run folder to plant a fault in."""
    copy = tmp_path / "run"
    shutil.copytree(trained_run, copy, symlinks=True)
    return copy


@pytest.fixture
def outside(tmp_path) -> Path:
    folder = tmp_path / "outside"
    folder.mkdir()
    return folder


def _relink(path: Path, target: Path) -> None:
    """Replace `path` (a file or folder) with a symbolic link to `target`."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
    path.symlink_to(target)


def _workbench(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.run([sys.executable, "-m", "workbench", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)


def _assert_clean_error(proc: subprocess.CompletedProcess, *words: str) -> str:
    """rc 2, no traceback, one short message on stderr that holds every word."""
    err = proc.stderr.strip()
    assert proc.returncode == 2, (proc.returncode, err[-2000:])
    assert "Traceback" not in err, err[-2000:]
    assert len(err.splitlines()) == 1, err
    for word in words:
        assert word in err, (word, err)
    return err


# -- links out of the run folder ----------------------------------------------------------------
def test_config_linked_to_an_outside_file_is_refused_without_showing_its_contents(run, outside):
    secret = outside / "passwd"
    secret.write_text(SECRET + "\n")
    _relink(run / "config.yaml", secret)
    with pytest.raises(RunError) as info:
        load_run(run)
    text = str(info.value)
    assert "config.yaml" in text and "symbolic link" in text and "outside the run folder" in text
    assert "planted-secret" not in text and "root:x" not in text


def test_config_linked_to_the_system_password_file_is_refused(run):
    if not Path("/etc/passwd").is_file():
        pytest.skip("no /etc/passwd here")
    _relink(run / "config.yaml", Path("/etc/passwd"))
    with pytest.raises(RunError, match="config.yaml is a symbolic link to /etc/passwd, outside") as info:
        load_run(run)
    assert "root:" not in str(info.value)


def test_a_batch_file_linking_out_is_named_as_a_link_not_as_damaged(run, outside):
    secret = outside / "passwd"
    secret.write_text(SECRET + "\n")
    step_file = run_files.rollout_path(run, 0)
    _relink(step_file, secret)
    loaded = load_run(run)
    with pytest.raises(RunError) as info:
        loaded.batch(0)
    text = str(info.value)
    assert str(step_file) in text and "symbolic link" in text and "outside the run folder" in text
    assert "damaged" not in text and "planted-secret" not in text


@pytest.mark.parametrize("name", ["config.yaml", "metrics.jsonl", "evals.json", "rollouts", "evals", "checkpoints"])
def test_every_file_the_loader_reads_is_refused_when_it_links_out(run, outside, name):
    """The outside target is a valid copy, so only the link itself is wrong (before the fix
    each of these loaded without a word)."""
    if name == "evals.json":
        (run / name).write_text(json.dumps([{"step": 0, "eval/success_rate": 0.5}]))
    if name == "evals":
        TrajectoryBatch.load(run_files.rollout_path(run, 0)).save(run_files.eval_path(run, 0))
    target = outside / name
    (shutil.copytree if (run / name).is_dir() else shutil.copy)(run / name, target)
    _relink(run / name, target)
    with pytest.raises(RunError) as info:
        load_run(run)
    text = str(info.value)
    assert f"{run / name} is a symbolic link to {target.resolve()}, outside the run folder" in text


def test_a_checkpoint_folder_linking_out_is_refused(run, outside):
    target = outside / "step_000001"
    shutil.copytree(run / "checkpoints" / "step_000001", target)
    _relink(run / "checkpoints" / "step_000001", target)
    loaded = load_run(run)
    with pytest.raises(RunError, match="step_000001 is a symbolic link"):
        loaded.checkpoints
    assert "not listed: " in loaded._repr_html_() and "symbolic link" in loaded._repr_html_()


def test_links_that_stay_inside_the_folder_and_a_linked_run_folder_load(run, tmp_path):
    kept = run / "saved" / "config.yaml"
    kept.parent.mkdir()
    shutil.copy(run / "config.yaml", kept)
    _relink(run / "config.yaml", Path("saved") / "config.yaml")  # relative, inside
    alias = tmp_path / "latest"
    alias.symlink_to(run)
    loaded = load_run(alias)
    assert loaded.steps == [0] and len(loaded.batch(0)) == 4
    assert [p.name for p in loaded.checkpoints] == ["step_000001"]


# -- a gzip bomb --------------------------------------------------------------------------------
def _gzip_bomb(path: Path, megabytes: int) -> None:
    """A gzip file that decompresses to `megabytes` MiB of one repeated byte, no newline."""
    chunk = b"0" * (1 << 20)
    packer = zlib.compressobj(9, zlib.DEFLATED, 31)  # 31: gzip container
    with open(path, "wb") as f:
        for _ in range(megabytes):
            f.write(packer.compress(chunk))
        f.write(packer.flush())


def test_a_gzip_bomb_among_the_batches_is_refused_naming_the_file_within_bounded_memory(run):
    """1.3 MB on disk, 1.3 GB decompressed: before the fix it was read whole (a MemoryError
    where memory is short). Now reading stops at the documented line limit, in a process
    whose peak memory stays far below what the file decompresses to."""
    step_file = run_files.rollout_path(run, 0)
    _gzip_bomb(step_file, 1300)
    assert step_file.stat().st_size < 2_000_000
    probe = ("import resource, sys\n"
             "from workbench.debug import load_run, RunError\n"
             "try:\n"
             "    load_run(sys.argv[1]).batch(0)\n"
             "    print('LOADED')\n"
             "except RunError as exc:\n"
             "    print('RUNERROR', exc)\n"
             # VmHWM: this process image's own peak (ru_maxrss survives exec, so under a big
             # pytest process it would report the parent's size)
             "print('MAXRSS_KB', next(int(l.split()[1]) for l in open('/proc/self/status') "
             "if l.startswith('VmHWM')))\n")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-c", probe, str(run)], env=env, capture_output=True, text=True,
                          timeout=300)
    out = proc.stdout
    assert "RUNERROR" in out, (out, proc.stderr[-3000:])
    assert str(step_file) in out and "max_line_bytes" in out and "gzip bomb" in out
    peak_mb = int(out.split("MAXRSS_KB")[1]) / 1024
    assert peak_mb < 1000, peak_mb  # the line limit is 256 MiB; the file holds 1300 MiB


def test_batch_load_limits_are_documented_arguments(tmp_path):
    real = tmp_path / "real.jsonl.gz"
    bomb = tmp_path / "bomb.jsonl.gz"
    _gzip_bomb(bomb, 3)
    from workbench.trajectory import BatchTooLarge, Episode

    TrajectoryBatch([Episode(token_ids=[1, 2, 3], loss_mask=[0, 1, 1], rollout_logprobs=[0.0, -1.0, -2.0],
                             turn_index=[-1, 0, 0])]).save(real)
    assert len(TrajectoryBatch.load(real)) == 1
    with pytest.raises(BatchTooLarge, match="bomb.jsonl.gz line 1 is longer than 1048576 bytes"):
        TrajectoryBatch.load(bomb, max_line_bytes=1 << 20)
    with pytest.raises(BatchTooLarge, match="decompresses to more than 100 bytes"):
        TrajectoryBatch.load(real, max_bytes=100)
    lines = gzip.open(real, "rb").read().split(b"\n")
    with gzip.open(bomb, "wb") as f:  # a blank line among the episodes: damaged, named by line
        f.write(lines[0] + b"\n\n" + lines[1] + b"\n")
    with pytest.raises(ValueError, match="line 2 is cut short or damaged"):
        TrajectoryBatch.load(bomb)


# -- the CLI: one-line errors, rc 2 -------------------------------------------------------------
def _truncated_copy(src: Path, dst: Path) -> Path:
    data = src.read_bytes()
    dst.write_bytes(data[: len(data) // 2])
    return dst


def test_diagnose_gives_one_line_errors_for_bad_paths(run, tmp_path):
    system_file = "/etc/passwd" if Path("/etc/passwd").is_file() else sys.executable
    empty = tmp_path / "empty"
    empty.mkdir()
    _truncated_copy(run_files.rollout_path(run, 0), run_files.rollout_path(run, 0))
    missing = tmp_path / "nonexistent"
    _assert_clean_error(_workbench("diagnose", str(missing), cwd=tmp_path), "error: ", str(missing), "no such folder")
    _assert_clean_error(_workbench("diagnose", system_file, cwd=tmp_path), system_file, "not a folder")
    _assert_clean_error(_workbench("diagnose", str(empty), cwd=tmp_path), str(empty), "is empty: no run has written there yet")
    _assert_clean_error(_workbench("diagnose", str(run), cwd=tmp_path), "step_000000.jsonl.gz", "cut short")


def test_diff_gives_one_line_errors_for_bad_batches_and_steps(run, tmp_path):
    system_file = "/etc/passwd" if Path("/etc/passwd").is_file() else sys.executable
    cut = _truncated_copy(run_files.rollout_path(run, 0), tmp_path / "cut.jsonl.gz")
    err = _assert_clean_error(_workbench("diff", "base", "base", "--batch", system_file, cwd=tmp_path),
                              system_file, "not a workbench trajectory batch file")
    assert "root:" not in err
    _assert_clean_error(_workbench("diff", "base", "base", "--batch", str(cut), cwd=tmp_path), str(cut), "cut short")
    _assert_clean_error(_workbench("diff", "base", "base", "--run", str(run), "--step", "-1", cwd=tmp_path),
                        "--step -1", ">= 0", "saved in")
    _assert_clean_error(_workbench("diff", "base", "base", "--run", str(run), "--eval", "-2", cwd=tmp_path),
                        "--eval -2", ">= 0")


def test_diff_of_a_step_without_checkpoint_lists_the_checkpoints_there(run, tmp_path):
    err = _assert_clean_error(_workbench("diff", "0", "1", "--run", str(run), cwd=tmp_path),
                              "no checkpoint of step 0", "step_000001")
    assert "cut off" not in err
    shutil.rmtree(run / "checkpoints")
    err = _assert_clean_error(_workbench("diff", "base", "3", "--run", str(run), cwd=tmp_path),
                              "no checkpoint of step 3", "checkpoints there: none")
    missing = tmp_path / "no_such_ckpt"
    err = _assert_clean_error(_workbench("diff", str(missing), "base", "--run", str(run), cwd=tmp_path),
                              str(missing), "no such checkpoint folder")
    assert "cut off" not in err


def test_run_batch_of_a_negative_step_is_a_run_error(run):
    with pytest.raises(RunError, match=r"step -1: a step is a 0-based step number .* saved steps in .*: 0"):
        load_run(run).batch(-1)


# -- display ------------------------------------------------------------------------------------
def test_repr_of_a_run_shows_a_non_numeric_eval_value(run):
    (run / "evals.json").write_text(json.dumps([{"step": 0, "eval/success_rate": "n/a"},
                                                {"step": 3, "eval/success_rate": 0.25}, {"step": 5}]))
    loaded = load_run(run)
    text = repr(loaded)
    assert "step 0: 'n/a'" in text and "step 3: 0.25" in text and "step 5: nan" in text
    assert "n/a" in loaded._repr_html_()


# -- evaluation ---------------------------------------------------------------------------------
class NaNRewardEnv(GuessNumberEnv):
    """guess_number whose every step pays a NaN reward."""

    def step(self, action: str):
        obs, _, done, info = super().step(action)
        return obs, math.nan, done, info


def test_a_nan_reward_in_evaluation_is_a_reward_error_naming_the_episode(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=NaNRewardEnv())
    with pytest.raises(RewardError) as info:
        trainer.evaluate([100, 101])
    text = str(info.value)
    assert text.startswith("evaluation (seeds [100, 101]): environment reward nan at turn 0 of episode 0")
    assert "env seed 100" in text
    assert len(trainer.last_eval_batch) == 2  # the batch is kept to look at
