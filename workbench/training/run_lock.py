"""One writer per run folder: a lock that a run holds from before its first write to after
its last, and a fresh run that moves an earlier one aside instead of writing over it.

    lock = begin_run(trainer)     # RunLockedError if another run holds the folder; resumes,
    ...                           # or (resume=False) moves an earlier run's files aside
    lock.release()                # fit() does this when it ends

Two processes training into one folder used to corrupt each other: one died inside the
checkpoint swap (its rename landed on the other's `step_000002`) and `metrics.jsonl`
lost rows. The second run now refuses to start, naming the folder and the process
(pid, host, start time) that holds it.

Who holds it, and from when: everything a run writes into its folders happens under the
lock. `Trainer.fit` takes it (`hold_run_folders`) unless the trainer holds it already,
and gives it back when it ends. A branch (`Trainer.from_checkpoint`) takes it before it
creates or writes its folder and hands it to its trainer. The CLI's `train` takes it
before it builds the trainer and keeps it through `fit` until its evaluations, summary and
transcript are written; a second `train` or branch into the same folder is refused before
it writes anything (its config.yaml included), and one into a finished run's folder, which
would train nothing, gets `RunFinishedError` (`refuse_finished_run`).

A lock covers every folder a run writes to (`RunLock.of_config`: `checkpoint.output_dir`
and the loggers' `training.log_dir`); in each it is an OS lock (`fcntl.flock`, exclusive) on
`<folder>/.workbench.lock`, as SQLite locks its database file: the kernel holds it for the
process and drops it when the process ends, however it ends (a kill -9 included), so a dead
holder never keeps a folder and there is nothing to take over. The file's text, JSON {pid,
host, started}, is only information for the message a refused run prints. A file left by a
process that died is just a file: the next run locks it, says whose it was, and writes its own
holder into it. Locks go by the open file, so a second `acquire` in the same process (another
`Trainer.fit` that has not ended) is refused like one from another process. On release the
file is removed while still locked; a run that locked the path's old file meanwhile sees that
the path no longer names it and locks the new one, so two holders never coexist. On a file
system without `flock` (some network mounts), `acquire` raises `RunLockError` saying so.

A fresh run over a used folder (`checkpoint.resume=False`, or `resume` with no checkpoint
to resume from, where files of an earlier run are) used to truncate the old
`metrics.jsonl` and have its own first checkpoint pruned at once (the old run's steps are
higher). Now the earlier run's files (`RUN_FILES`, checkpoints) are moved aside, into
`<folder>/previous_runs/<date-time>/`, with a warning naming both places: nothing is lost,
and the new run starts in a clean folder.
"""
from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import warnings
from pathlib import Path
from typing import IO, Any

from workbench.training.run_files import CONFIG_FILE, DEMONSTRATIONS, EVALS, EVALS_FILE, ROLLOUTS

LOCK_NAME = ".workbench.lock"
#: Tries at taking a lock whose file another run removes or replaces while we lock it.
_ATTEMPTS = 20


class RunLockError(RuntimeError):
    """A run folder cannot be locked at all (its file system has no `flock`, or the lock file
    cannot be opened); the message names the folder and what to do."""


class RunLockedError(RuntimeError):
    """Another run (a live process) holds the output folder's lock."""


class EarlierRunMovedWarning(UserWarning):
    """A fresh run moved an earlier run's checkpoints and logs aside (`set_aside_earlier_run`)."""


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


class RunLock:
    """The lock of a run's folders (see the module docstring); a context manager.

    Args:
        folders: the run's folders (`checkpoint.output_dir`, and the loggers' `log_dir` when
            it is another one; `RunLock.of_config`), each created if missing and locked with its
            own `.workbench.lock`, all or none.

    Attributes:
        created: the folders `acquire` created (`release(remove_created=True)` removes them
            again when they are still empty: a run refused or failed before it wrote anything
            leaves no folder behind).
    """

    def __init__(self, folder: str | Path, *more: str | Path):
        self.folders = list(dict.fromkeys(Path(f).resolve() for f in (folder, *more)))
        self.folders.sort(key=lambda f: (len(f.parts), str(f)))  # a run folder before the folders inside it
        self.folder = Path(folder)
        self.path = self.folder / LOCK_NAME
        self.paths = [f / LOCK_NAME for f in self.folders]
        self._files: list[tuple[Path, IO[str]]] = []  # (path, open flock-ed file): the lock lives as long as the file
        self.created: list[Path] = []
        self.held = False

    @classmethod
    def of_config(cls, config: Any) -> "RunLock":
        """The lock of every folder a run of `config` writes to: `checkpoint.output_dir` and
        the loggers' folder (`training.log_dir`, the CLI's output folder)."""
        from workbench.training.loggers import log_dir

        return cls(config.checkpoint.output_dir, log_dir(config))

    def covers(self, config: Any) -> bool:
        """Whether this lock is over exactly the folders a run of `config` writes to."""
        return self.folders == RunLock.of_config(config).folders

    def acquire(self) -> "RunLock":
        """Take the lock of every folder, or raise `RunLockedError` naming the live holder
        (and hold none of them)."""
        if self.held:
            return self
        self.created = []
        for folder in self.folders:
            missing = [p for p in (folder, *folder.parents) if not p.exists()]
            if missing:
                folder.mkdir(parents=True, exist_ok=True)
                self.created += [p for p in missing if p not in self.created]
        try:
            for folder in self.folders:
                self._files.append((folder / LOCK_NAME, _lock_one(folder)))
        except BaseException:
            self._let_go()
            self._remove_created()
            raise
        self.held = True
        return self

    def _let_go(self) -> None:
        """Remove the lock files this object holds (while still locked), then unlock them."""
        for path, fh in reversed(self._files):
            try:
                if _same_file(fh, path):
                    path.unlink()
            except OSError:
                pass
            fh.close()  # closing the file drops its flock
        self._files = []

    def _remove_created(self) -> None:
        """Remove the folders `acquire` created, deepest first, where they are still empty."""
        for folder in sorted(self.created, key=lambda f: len(f.parts), reverse=True):
            try:
                folder.rmdir()
            except OSError:  # not empty (something was written there) or gone: keep it
                pass
        self.created = []

    def release(self, remove_created: bool = False) -> None:
        """Give the lock back (only if this process still holds it). `remove_created`: also
        remove the folders `acquire` created, when nothing was written into them."""
        if self.held:
            self.held = False
            self._let_go()
        if remove_created:
            self._remove_created()

    def __enter__(self) -> "RunLock":
        return self.acquire()

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"RunLock({', '.join(repr(str(f)) for f in self.folders)}, held={self.held})"


def _same_file(fh: IO[str], path: Path) -> bool:
    """Whether `path` still names the file `fh` has open (not removed or replaced since)."""
    try:
        mine, now = os.fstat(fh.fileno()), os.stat(path)
    except FileNotFoundError:
        return False
    return (mine.st_dev, mine.st_ino) == (now.st_dev, now.st_ino)


def _lock_one(folder: Path) -> IO[str]:
    """`folder`'s lock file, opened and exclusively flock-ed by this process, with this
    process written into it as the holder; `RunLockedError` naming the holder if a live run
    holds it."""
    path = folder / LOCK_NAME
    for _ in range(_ATTEMPTS):
        try:
            fh = open(os.open(path, os.O_RDWR | os.O_CREAT, 0o644), "r+", encoding="utf-8")
        except OSError as exc:
            raise RunLockError(f"cannot open the run folder's lock file {path}: {exc.strerror or exc}; give the "
                               "run a folder it can write to (--output, checkpoint.output_dir)") from exc
        try:
            fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            info = _holder(fh)
            fh.close()
            raise RunLockedError(_locked_message(folder, path, info)) from None
        except OSError as exc:
            fh.close()
            if exc.errno in (errno.ENOLCK, errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
                raise RunLockError(
                    f"{folder} is on a file system without file locks (flock: {exc.strerror}), so this run cannot "
                    "make sure it is the folder's only writer; give it an output folder on a local disk "
                    "(--output, checkpoint.output_dir)") from exc
            raise
        if not _same_file(fh, path):  # the holder removed it (released) between our open and our lock
            fh.close()
            continue
        left = _holder(fh)
        if left:  # written by a run that ended without removing it (killed): only information now
            warnings.warn(f"{path} was left by a run that ended without removing it ({_describe(left)}); "
                          "no process holds it, so this run takes the folder", stacklevel=5)
        fh.seek(0)
        fh.truncate()
        json.dump({"pid": os.getpid(), "host": socket.gethostname(), "started": time.time()}, fh)
        fh.flush()
        return fh
    raise RunLockError(f"could not take the lock {path}: other runs keep replacing it")


def _holder(fh: IO[str]) -> dict[str, Any]:
    """The holder recorded in an open lock file ({} when empty or unreadable)."""
    try:
        fh.seek(0)
        info = json.loads(fh.read() or "{}")
    except (OSError, ValueError):
        return {}
    return info if isinstance(info, dict) else {}


def _locked_message(folder: Path, path: Path, info: dict[str, Any]) -> str:
    if not info:
        return (f"{folder} is being locked by another run right now ({path} is locked and its holder is still "
                "writing its name); try again in a moment")
    same = info.get("pid") == os.getpid() and info.get("host") == socket.gethostname()
    who = "this process (another Trainer.fit that has not ended)" if same else _describe(info)
    return (f"{folder} is in use by another run: {who} holds {path}. Two runs in one folder overwrite each "
            "other's checkpoints and metrics: give this run its own folder (--output, checkpoint.output_dir), "
            "or wait for that run to end")


#: What a run writes into its folders (checkpoints `step_*`, the loggers' files, each step's
#: batch and the held-out batches: `workbench.training.run_files`; the CLI's reports and a
#: branch's record); only these are moved by `set_aside_earlier_run` (an output folder may
#: hold the user's own files).
RUN_FILES = ("metrics.jsonl", "episodes.jsonl", "tensorboard", "wandb", ROLLOUTS, EVALS, DEMONSTRATIONS,
             CONFIG_FILE, EVALS_FILE, "summary.md", "transcript.md", "reward_curve.png", "branch.json")
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
        hint = " (set checkpoint.resume=True to continue a run instead)" if why is None else ""
        warnings.warn(f"{why or 'checkpoint.resume=False starts a fresh run'}, and {folder} held an earlier one "
                      f"({names}): moved it to {dest}{hint}",
                      EarlierRunMovedWarning, stacklevel=3)
        moved.append(dest)
    return moved


class RunFinishedError(RuntimeError):
    """The run folder holds a run that already reached this run's target step: resuming it
    would train nothing (`refuse_finished_run`)."""


def hold_run_folders(trainer: Any, keep: bool = False) -> RunLock:
    """The lock of the folders `trainer`'s run writes to (`RunLock.of_config`), taken now
    unless the trainer holds it already (a branch takes it before it writes its folder);
    `RunLockedError` naming the holder otherwise. `keep=True`: `fit` leaves it held when it
    ends (the CLI writes its evaluations and summary after `fit`, and releases it itself);
    else the `fit` that ends releases it."""
    lock = getattr(trainer, "_run_lock", None)
    if lock is not None and lock.held and not lock.covers(trainer.config):
        lock.release()  # the config was pointed at other folders since
    if lock is None or not lock.held:
        lock = trainer._run_lock = RunLock.of_config(trainer.config).acquire()
    trainer._run_lock_kept = keep or getattr(trainer, "_run_lock_kept", False)
    return lock


def release_run_folders(trainer: Any, remove_created: bool = False) -> None:
    """Give back the lock `hold_run_folders` took (the trainer's run writes nothing more)."""
    lock = getattr(trainer, "_run_lock", None)
    trainer._run_lock_kept = False
    if lock is not None:
        lock.release(remove_created=remove_created)


def start_run(trainer: Any) -> None:
    """Once per run, with the run's lock held, before its first write: when nothing was
    trained or resumed yet, resume if `checkpoint.resume` is set (as `fit` documents); when
    that finds no checkpoint, or with `checkpoint.resume=False`, move an earlier run's files
    aside (`set_aside_earlier_run`), so a fresh run neither truncates nor overwrites them."""
    from workbench.training.loggers import log_dir

    c = trainer.config.checkpoint
    if trainer.global_step != 0 or trainer._resume_tried or getattr(trainer, "_run_started", False):
        trainer._run_started = True
        return
    resumed = trainer.resume() if c.resume else None
    if resumed is None:
        why = None if not c.resume else (f"checkpoint.resume is set but {c.output_dir} holds no checkpoint to "
                                         "resume from, so a fresh run starts")
        set_aside_earlier_run([c.output_dir, log_dir(trainer.config)], why=why)
    trainer._run_started = True  # a later fit() of this trainer continues its own run


def run_target(config: Any) -> int:
    """The absolute step a run of `config` trains up to: `sft.steps + num_epochs x num_iters_per_epoch`."""
    return config.sft.steps + config.training.num_epochs * config.training.num_iters_per_epoch


def refuse_finished_run(trainer: Any, out: str | Path) -> None:
    """`RunFinishedError` when the trainer (just resumed by `start_run`) is already at its
    config's target step: a second command into a finished run's folder would train nothing
    and only rewrite the first run's reports. Says what to give instead."""
    target = run_target(trainer.config)
    if trainer.global_step < target:
        return
    from workbench.training import checkpoint as ckpt

    saved = ckpt.latest_checkpoint(trainer.config.checkpoint.output_dir)
    where = saved if saved is not None else trainer.config.checkpoint.output_dir
    raise RunFinishedError(
        f"{out} holds a finished run: {where} is at step {trainer.global_step} and this run's target is step "
        f"{target} (sft.steps + training.num_epochs x num_iters_per_epoch), so there is nothing to train. Give "
        f"--output NEW for a new run, a later target (--steps N, N > {trainer.global_step}) to train it on, "
        f"--checkpoint.resume false to move it to {Path(out) / PREVIOUS_RUNS}/ and start over, or branch from it: "
        f"python -m workbench train --from {where} --steps N --output NEW")


def begin_run(trainer: Any) -> RunLock:
    """What `Trainer.fit` does before its first step: hold the run folders' lock
    (`hold_run_folders`; `RunLockedError` if another run holds them), then `start_run`
    (resume, or move an earlier run aside). Returns the held lock; released here if this
    raises and `fit` took it."""
    lock = hold_run_folders(trainer)
    try:
        start_run(trainer)
    except BaseException:
        if not trainer._run_lock_kept:
            lock.release()
        raise
    return lock
