"""One run per output folder: a lock file that `Trainer.fit` holds while it trains, and a
fresh run that moves an earlier one aside instead of writing over it.

    lock = begin_run(trainer)     # RunLockedError if another run holds the folder; resumes,
    ...                           # or (resume=False) moves an earlier run's files aside
    lock.release()                # fit() does this when it ends

Two processes training into one folder used to corrupt each other: one died inside the
checkpoint swap (its rename landed on the other's `step_000002`) and `metrics.jsonl`
lost rows. The second `fit` now refuses to start, naming the folder and the process
(pid, host, start time) that holds it.

The lock is `<folder>/.workbench.lock`, created with O_CREAT | O_EXCL (atomic on a local
file system) and holding JSON {pid, host, started, heartbeat}. A dead holder does not keep
it: on the same host a lock whose pid no longer runs is stale; from another host (a
shared file system) a lock whose heartbeat (its mtime, refreshed every
`HEARTBEAT_S` by a daemon thread of the holder) is older than `STALE_AFTER_S` is stale.
A stale lock is taken over with a warning.

A fresh run over a used folder (`checkpoint.resume=False` where checkpoints or logs of
an earlier run are) used to truncate the old `metrics.jsonl` and have its own first
checkpoint pruned at once (the old run's steps are higher). Now the earlier run's files
are moved aside, into `<folder>/previous_runs/<date-time>/`, with a warning naming both
places: nothing is lost, and the new run starts in a clean folder.
"""
from __future__ import annotations

import json
import os
import socket
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from workbench.training.run_files import DEMONSTRATIONS, EVALS, ROLLOUTS

LOCK_NAME = ".workbench.lock"
#: Seconds between heartbeats (mtime refreshes) of a held lock.
HEARTBEAT_S = 30.0
#: A lock from another host whose heartbeat is older than this is stale.
STALE_AFTER_S = 300.0


#: Lock files this process holds now (a lock of this pid not listed here was leaked by a
#: fit that failed before it could release it: stale).
_HELD_HERE: set[str] = set()


class RunLockedError(RuntimeError):
    """Another run (a live process) holds the output folder's lock."""


class EarlierRunMovedWarning(UserWarning):
    """A fresh run moved an earlier run's checkpoints and logs aside (`set_aside_earlier_run`)."""


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _describe(info: dict[str, Any]) -> str:
    started = info.get("started")
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(started)) if isinstance(started, (int, float)) else "?"
    return f"pid {info.get('pid')} on host {info.get('host')!r} (since {when})"


def read_lock(folder: str | Path) -> dict[str, Any] | None:
    """The holder recorded in `folder`'s lock file ({} if unreadable), None if there is none."""
    path = Path(folder) / LOCK_NAME
    try:
        text = path.read_text()
    except FileNotFoundError:
        return None
    except OSError:
        return {}
    try:
        info = json.loads(text)
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def is_stale(info: dict[str, Any], mtime: float, now: float | None = None) -> bool:
    """Whether a lock's holder is gone: a dead pid on this host, else an old heartbeat."""
    now = time.time() if now is None else now
    if info.get("host") == socket.gethostname() and isinstance(info.get("pid"), int):
        return not _pid_alive(info["pid"])
    return now - mtime > STALE_AFTER_S


class RunLock:
    """The lock of one output folder (see the module docstring); a context manager.

    Args:
        folder: the run folder (`checkpoint.output_dir`); created if missing.
    """

    def __init__(self, folder: str | Path):
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.held = False

    def acquire(self) -> "RunLock":
        """Take the lock, or raise `RunLockedError` naming the live holder."""
        self.folder.mkdir(parents=True, exist_ok=True)
        mine = {"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}
        for _ in range(3):
            try:
                fd = os.open(self.path, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
            except FileExistsError:
                info = read_lock(self.folder)
                if info is None:
                    continue  # released meanwhile: try again
                try:
                    mtime = self.path.stat().st_mtime
                except FileNotFoundError:
                    continue
                same = info.get("pid") == os.getpid() and info.get("host") == mine["host"]
                if info and not is_stale(info, mtime) and not (same and str(self.path) not in _HELD_HERE):
                    who = "this process (another Trainer.fit that has not ended)" if same else _describe(info)
                    raise RunLockedError(
                        f"{self.folder} is in use by another run: {who} holds {self.path}. Two runs in one "
                        "folder overwrite each other's checkpoints and metrics: give this run its own "
                        "checkpoint.output_dir, or wait for that run to end. (If that process is gone, "
                        f"delete {self.path}.)")
                if not info and time.time() - mtime < HEARTBEAT_S:
                    raise RunLockedError(f"{self.folder} is being locked by another run right now ({self.path} "
                                         "is still being written); try again in a moment")
                if not same:
                    warnings.warn(f"taking over the lock of {self.folder} from a run that is gone "
                                  f"({_describe(info) if info else 'unreadable lock file'})", stacklevel=3)
                try:
                    self.path.unlink()
                except FileNotFoundError:
                    pass
                continue
            with os.fdopen(fd, "w") as fh:
                json.dump(mine, fh)
            self.held = True
            _HELD_HERE.add(str(self.path))
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name="wb-run-lock", daemon=True)
            self._thread.start()
            return self
        raise RunLockedError(f"could not take the lock {self.path}: other runs keep taking it")

    def _beat(self) -> None:
        while not self._stop.wait(HEARTBEAT_S):
            try:
                os.utime(self.path)
            except OSError:
                return

    def release(self) -> None:
        """Give the lock back (only if this process still holds it)."""
        if not self.held:
            return
        self.held = False
        self._stop.set()
        _HELD_HERE.discard(str(self.path))
        info = read_lock(self.folder)
        if info and info.get("pid") == os.getpid() and info.get("host") == socket.gethostname():
            try:
                self.path.unlink()
            except FileNotFoundError:
                pass

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RunLock({str(self.folder)!r}, held={self.held})"


#: What a run writes into its folders (checkpoints `step_*`, the loggers' files, each step's
#: batch and the held-out batches: `workbench.training.run_files`); only these are moved by
#: `set_aside_earlier_run` (an output folder may hold the user's own files).
RUN_FILES = ("metrics.jsonl", "episodes.jsonl", "tensorboard", "wandb", ROLLOUTS, EVALS, DEMONSTRATIONS)
#: Subfolder of an output folder that earlier runs are moved into.
PREVIOUS_RUNS = "previous_runs"


def earlier_run(folder: str | Path) -> list[Path]:
    """What in `folder` belongs to an earlier run: checkpoint folders (`step_*`), the
    loggers' files and saved batches (`RUN_FILES`, metrics.jsonl only when it has rows); [] if none."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    found = sorted(p for p in folder.iterdir() if p.is_dir() and p.name.startswith("step_"))
    for name in RUN_FILES:
        path = folder / name
        if path.exists() and not (path.is_file() and path.stat().st_size == 0):
            found.append(path)
    return found


def set_aside_earlier_run(folders: list[str | Path], why: str | None = None) -> list[Path]:
    """Before a fresh run (`checkpoint.resume=False`, or a branch: `workbench.training.branch`):
    move an earlier run's checkpoints and logs out of each folder into
    `<folder>/previous_runs/<date-time>/` (warning once per folder, naming both places and
    `why` the new run starts fresh), so the new run neither truncates the old metrics nor has
    its first checkpoints pruned as older than the old ones. Nothing is deleted. Returns
    the folders the old runs went to."""
    moved = []
    for folder in dict.fromkeys(Path(f).resolve() for f in folders):
        found = earlier_run(folder)
        if not found:
            continue
        base = folder / PREVIOUS_RUNS / time.strftime("%Y%m%d-%H%M%S")
        dest, n = base, 1
        while dest.exists():
            n += 1
            dest = base.with_name(f"{base.name}-{n}")
        dest.mkdir(parents=True)
        for path in found:
            os.replace(path, dest / path.name)
        names = ", ".join(p.name for p in found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "")
        why = why or "checkpoint.resume=False starts a fresh run"
        hint = "" if "resume" not in why else " (set checkpoint.resume=True to continue a run instead)"
        warnings.warn(f"{why}, and {folder} held an earlier one ({names}): moved it to {dest}{hint}",
                      EarlierRunMovedWarning, stacklevel=3)
        moved.append(dest)
    return moved


def begin_run(trainer: Any) -> RunLock:
    """What `Trainer.fit` does before its first step: take the output folder's lock (or
    `RunLockedError`), then, when nothing was trained or resumed yet, resume if
    `checkpoint.resume` is set (as `fit` documents), else move an earlier run's files
    aside (`set_aside_earlier_run`). Returns the held lock (released by `fit` when it
    ends; released here if this raises)."""
    from workbench.training.loggers import log_dir

    c = trainer.config.checkpoint
    fresh = trainer.global_step == 0 and not trainer._resume_tried
    previous = getattr(trainer, "_run_lock", None)
    if previous is not None:  # this trainer's earlier fit ended (one cell at a time): let go of its lock
        previous.release()
    lock = trainer._run_lock = RunLock(c.output_dir).acquire()
    try:
        if c.resume and fresh:
            trainer.resume()
        elif fresh and not getattr(trainer, "_run_started", False):
            set_aside_earlier_run([c.output_dir, log_dir(trainer.config)])
        trainer._run_started = True  # a later fit() of this trainer continues its own run
    except BaseException:
        lock.release()
        raise
    return lock
