"""One-line errors on the command line (issue 43, items 8 and 9): each case used to end in
a traceback (or a wrong result); now it prints one line on stderr and exits 2, and Ctrl-C
prints one line saying where the run can resume (exit 130, the shell's code for Ctrl-C).

compare: `--out` naming an existing folder (IsADirectoryError after the report printed),
evals.json with `"step": null` (IntCastingNaNError), `--episodes -1` (silently dropped a row).
train: `--output FILE/sub` (NotADirectoryError), an output the user cannot write
(PermissionError; as root, a read-only file system), a full disk (SafetensorError: No space
left; a real full disk: a small tmpfs, when this machine lets the test mount one), Ctrl-C
(37 frames). The full disk's error translation is also checked where no tmpfs can be
mounted: a real ENOSPC from writing /dev/full, turned into the CLI's line.
RunLockedError is in test_one_writer.py; config values in test_validation_paths.py.
"""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.cli import main, os_error_line

ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE", "CI": "1"}


def _train(model: Path, out: Path | str, *extra: str) -> list[str]:
    return [sys.executable, "-m", "workbench", "train", "--model", str(model), "--batch-size", "4",
            "--group-size", "2", "--max-tokens", "8", "--max-turns", "2", "--eval-episodes", "2", "--output", str(out),
            *extra]


def _one_line(stderr: str, starts: str = "error: ") -> str:
    assert "Traceback" not in stderr, stderr[-3000:]
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert lines and lines[-1].startswith(starts), stderr[-3000:]
    return lines[-1]


@contextlib.contextmanager
def _tmpfs(where: Path, size: str, read_only: bool = False):
    """A real small file system at `where` (tmpfs); skips the test where mounting is not allowed."""
    where.mkdir(parents=True, exist_ok=True)
    opts = f"size={size}" + (",ro" if read_only else "")
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here ({mounted.stderr.decode().strip()})")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


# -- compare -----------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tiny_model_path, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("cli") / "run"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "1", "--batch-size", "4", "--group-size", "2",
                 "--max-tokens", "8", "--max-turns", "2", "--save-interval", "1", "--eval-episodes", "2",
                 "--output", str(out)]) == 0
    return out


def test_compare_out_naming_a_folder_is_refused_before_the_report(run_dir, tmp_path, capsys):
    folder = tmp_path / "reports"
    folder.mkdir()
    rc = main(["compare", str(run_dir), str(run_dir), "--out", str(folder)])
    captured = capsys.readouterr()
    assert rc == 2 and captured.out == ""  # nothing printed, then a traceback, as before
    line = _one_line(captured.err, "compare: ")
    assert f"--out {folder} is a folder" in line and "compare.md" in line
    assert list(folder.iterdir()) == []


def test_compare_of_evals_with_a_null_step_names_the_file_and_entry(run_dir, tmp_path, capsys):
    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    evals = json.loads((copy / "evals.json").read_text())
    evals[1]["step"] = None
    (copy / "evals.json").write_text(json.dumps(evals))
    rc = main(["compare", str(run_dir), str(copy)])
    line = _one_line(capsys.readouterr().err, "compare: ")
    assert rc == 2 and "evals.json entry 1 has \"step\": null" in line


def test_compare_with_negative_episodes_is_refused(run_dir, capsys):
    rc = main(["compare", str(run_dir), str(run_dir), "--episodes", "-1"])
    line = _one_line(capsys.readouterr().err, "compare: ")
    assert rc == 2 and "--episodes must be an integer >= 0" in line


# -- train ----------------------------------------------------------------------------------------------
def test_output_under_a_file_is_one_line(tiny_model_path, tmp_path, capsys):
    (tmp_path / "file").write_text("not a folder")
    rc = main(["train", "--model", str(tiny_model_path), "--steps", "1", "--output", str(tmp_path / "file" / "sub")])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and "Not a directory" in line and str(tmp_path / "file" / "sub") in line
    assert "a part of that path is a file" in line


def test_an_output_that_cannot_be_written_is_one_line(tiny_model_path, tmp_path, capsys):
    if os.geteuid() == 0:  # root writes through permissions: a read-only file system is what refuses it
        ctx = _tmpfs(tmp_path / "ro", "1m", read_only=True)
    else:
        (tmp_path / "ro").mkdir()
        (tmp_path / "ro").chmod(0o555)
        ctx = contextlib.nullcontext(tmp_path / "ro")
    with ctx as place:
        rc = main(["train", "--model", str(tiny_model_path), "--steps", "1", "--output", str(place / "run")])
    line = _one_line(capsys.readouterr().err)
    assert rc == 2 and str(place / "run") in line
    assert "Read-only file system" in line or "Permission denied" in line


def test_a_full_disk_is_one_line_and_leaves_the_run_consistent(tiny_model_path, tmp_path):
    with _tmpfs(tmp_path / "full", "96k") as disk:
        out = disk / "run"
        proc = subprocess.run(_train(tiny_model_path, out, "--steps", "3", "--save-interval", "1"), cwd=ROOT,
                              env=_env(), capture_output=True, text=True, timeout=600)
        line = _one_line(proc.stderr)
        assert proc.returncode == 2 and "No space left on device" in line and "the disk is full" in line, line
        assert str(out) in line and ".tmp-" not in line  # names the run's file, not a temp file that is gone
        left = [p.name for p in (out / "checkpoints").iterdir()] if (out / "checkpoints").exists() else []
        assert not [n for n in left if n.startswith(".")]  # no half-written checkpoint left behind


def test_enospc_from_a_real_write_is_the_clis_one_line():
    import stat

    if not stat.S_ISCHR(os.stat("/dev/full").st_mode):
        pytest.skip("/dev/full is not the full device here")
    from workbench.config import ConfigStore

    with pytest.raises(OSError) as err:
        ConfigStore().save("/dev/full")  # a real ENOSPC (at the flush) where no tmpfs can be mounted
    assert err.value.errno == errno.ENOSPC and err.value.filename == "/dev/full"  # the writer names its file
    line = os_error_line(err.value)
    assert line.startswith("No space left on device") and "/dev/full" in line and "the disk is full" in line


def test_ctrl_c_prints_one_line_with_where_the_run_resumes(tiny_model_path, tmp_path):
    out = tmp_path / "run"
    # Python turns SIGINT into KeyboardInterrupt only where it started with SIGINT's default action; a
    # shell's background job (`make test &`) ignores it, and the child would inherit that: reset it.
    proc = subprocess.Popen(_train(tiny_model_path, out, "--steps", "40", "--save-interval", "1"), cwd=ROOT,
                            env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    try:
        deadline = time.monotonic() + 300
        metrics = out / "metrics.jsonl"
        while (not metrics.exists() or len(metrics.read_text().splitlines()) < 2) and time.monotonic() < deadline:
            assert proc.poll() is None, proc.communicate()
            time.sleep(0.1)
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 130, err[-3000:]
    line = _one_line(err, "interrupted (Ctrl-C): stopped at step ")
    assert "resume with: python -m workbench train --config" in line and str(out / "checkpoints" / "step_") in line
    command = line.split("resume with: ", 1)[1]
    argv = shlex.split(command)
    resumed = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=_env(), capture_output=True, text=True,
                             timeout=900)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    steps = [json.loads(row)["step"] for row in (out / "metrics.jsonl").read_text().splitlines()]
    assert steps == list(range(40))  # continued from the checkpoint, no step twice, none missing
