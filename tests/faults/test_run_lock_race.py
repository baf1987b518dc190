"""The run folder's lock under races (issue 50, item 2): an OS lock (`fcntl.flock`) that dies
with its process, so no takeover can hand one folder to two processes.

The lock used to be a pid file taken over when its pid was dead: three processes starting
together over a stale lock file each read it as stale, and each unlinked "the stale lock",
which could already be the lock another of them had just made; more than one held the folder
in 11 and 16 of 60 trials. A live pid that the OS had reused after the lock was written kept
the folder refused until someone deleted the file.

The race is real: three processes (forked once, then run 60 trials together), released at
the same instant by a barrier each trial, all try to take one folder whose lock file names a
dead pid; each reports whether it got it, and the holders keep it until every one has tried.
"""
from __future__ import annotations

import json
import multiprocessing
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from workbench.training.run_lock import LOCK_NAME, RunLock, RunLockedError

TRIALS = 60
PROCESSES = 3


def _dead_pid() -> int:
    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(done.stdout)


def _contender(folder: str, start, tried, results, trials: int) -> None:
    """One of the racing processes: each trial, wait for the others, try the lock, report,
    hold it until everyone has tried, then let go."""
    import warnings

    warnings.simplefilter("ignore")
    for trial in range(trials):
        start.wait()
        lock = RunLock(Path(folder) / f"trial{trial}")
        try:
            lock.acquire()
            got = True
        except RunLockedError:
            got = False
        results.put((trial, os.getpid(), got))
        tried.wait()  # every contender has tried while the holders still hold
        if got:
            lock.release()


def test_three_processes_over_a_stale_lock_never_both_hold_the_folder(tmp_path):
    dead = _dead_pid()
    for trial in range(TRIALS):  # each trial's folder starts with a lock file left by a dead process
        folder = tmp_path / f"trial{trial}"
        folder.mkdir()
        (folder / LOCK_NAME).write_text(json.dumps({"pid": dead, "host": socket.gethostname(),
                                                    "started": time.time() - 60}))
    ctx = multiprocessing.get_context("fork")
    start, tried = ctx.Barrier(PROCESSES), ctx.Barrier(PROCESSES)
    results = ctx.Queue()
    procs = [ctx.Process(target=_contender, args=(str(tmp_path), start, tried, results, TRIALS))
             for _ in range(PROCESSES)]
    for p in procs:
        p.start()
    got: dict[int, list[bool]] = {t: [] for t in range(TRIALS)}
    try:
        for _ in range(TRIALS * PROCESSES):
            trial, _pid, held = results.get(timeout=120)
            got[trial].append(held)
    finally:
        for p in procs:
            p.join(timeout=60)
            if p.is_alive():
                p.kill()
    holders = {t: sum(v) for t, v in got.items()}
    assert [t for t, n in holders.items() if n > 1] == [], f"trials with two or more holders: {holders}"
    assert [t for t, n in holders.items() if n == 0] == [], f"trials where nobody got the free folder: {holders}"
    assert all(p.exitcode == 0 for p in procs), [p.exitcode for p in procs]
    assert not list(tmp_path.rglob(LOCK_NAME))  # every holder removed its file when it let go


def test_a_lock_file_naming_a_live_reused_pid_does_not_keep_the_folder(tmp_path):
    """The file names a live process (this test's parent, as a pid the OS reused would be) that
    holds no lock: the folder is free, and the run says whose file it was."""
    folder = tmp_path / "run"
    folder.mkdir()
    (folder / LOCK_NAME).write_text(json.dumps({"pid": os.getppid(), "host": socket.gethostname(),
                                                "started": time.time() + 3600}))
    with pytest.warns(UserWarning, match=rf"left by a run that ended without removing it \(pid {os.getppid()}"):
        lock = RunLock(folder).acquire()
    assert json.loads((folder / LOCK_NAME).read_text())["pid"] == os.getpid()
    lock.release()
    assert not (folder / LOCK_NAME).exists()


def test_a_killed_holder_frees_the_folder_at_once(tmp_path):
    """kill -9 of a holding process: the kernel drops its lock, the next run takes the folder."""
    folder = tmp_path / "run"
    script = ("import sys, time; from workbench.training.run_lock import RunLock; "
              f"lock = RunLock({str(folder)!r}).acquire(); print('HELD', flush=True); time.sleep(600)")
    holder = subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert holder.stdout.readline().strip() == "HELD"
        with pytest.raises(RunLockedError, match=rf"pid {holder.pid} on host"):
            RunLock(folder).acquire()
        holder.kill()
        holder.wait(timeout=30)
        with pytest.warns(UserWarning, match=rf"pid {holder.pid}"):
            lock = RunLock(folder).acquire()
        lock.release()
    finally:
        if holder.poll() is None:
            holder.kill()


def test_a_second_lock_in_the_same_process_is_refused_until_the_first_lets_go(tmp_path):
    first = RunLock(tmp_path / "run").acquire()
    with pytest.raises(RunLockedError, match="this process"):
        RunLock(tmp_path / "run").acquire()
    first.release()
    RunLock(tmp_path / "run").acquire().release()
