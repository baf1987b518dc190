"""The run folder's batch files: each training step's scored batch and each held-out
evaluation batch, saved so a finished run can be reopened (`workbench.debug.load_run`).

The layout is a contract (the debugger, the widgets and the CLI read it):

    RUN/                           `workbench.training.loggers.log_dir(config)`
      config.yaml                  the run's ConfigStore (written when `fit` starts)
      metrics.jsonl                one line per step, `"step"` 0-based (the jsonl logger)
      evals.json                   held-out numbers, `[{"step": S, "eval/...": ...}]` (the CLI)
      rollouts/step_000000.jsonl.gz  the batch of the step whose metrics row has "step": 0,
                                   as it stood after that step's update (advantages, KL,
                                   old/ref/new logprobs, ...: `TrajectoryBatch.tensors`)
      evals/step_000000.jsonl.gz   the held-out batch evaluated at `global_step` 0
      checkpoints/step_00000K/     (CLI runs) the weights after K steps: they sampled
                                   `rollouts/step_00000K`

Files are written with `TrajectoryBatch.save` (gzip JSONL, written aside and renamed into
place, so a reader never sees half a file). `training.save_rollouts_every` (N) says which
steps are saved: every step whose 0-based number is a multiple of N, and the last step of
each `fit`; 0 saves nothing (neither rollouts nor the CLI's evaluation batches). When `fit`
starts at step S it removes saved rollouts of steps >= S (a resumed run redoes them, as
`metrics.jsonl` drops their lines), so the folder never mixes two runs' versions of a step
(evaluation batches are not removed: each is rewritten when its step is evaluated again).

A batch that cannot be saved (disk full, a value JSON cannot hold) is a `RunFilesWarning`
naming the step and the error; training goes on.
"""
from __future__ import annotations

import re
import warnings
from pathlib import Path

from workbench.config import ConfigStore
from workbench.trajectory import TrajectoryBatch

#: Sub-folder of the run folder with the training steps' batches.
ROLLOUTS = "rollouts"
#: Sub-folder of the run folder with the held-out evaluation batches.
EVALS = "evals"
#: Files of the run folder (written by `fit`, the jsonl logger and the CLI).
CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"
EVALS_FILE = "evals.json"
#: The SFT warm-up's demonstration episodes (`workbench.training.sft`), saved once.
DEMONSTRATIONS = "demonstrations.jsonl.gz"
#: Where the CLI puts checkpoints inside its run folder.
CHECKPOINTS = "checkpoints"
#: A step file's name: the 0-based step number, six digits, like checkpoint folders.
STEP_FILE = "step_{:06d}.jsonl.gz"
_STEP_FILE = re.compile(r"step_(\d{6,})\.jsonl\.gz")


class RunFilesWarning(UserWarning):
    """A step's batch could not be saved into the run folder (training went on)."""


def step_file_name(step: int) -> str:
    """`step_000042.jsonl.gz` for step 42."""
    if not isinstance(step, int) or step < 0:
        raise ValueError(f"a step number is an integer >= 0, got {step!r}")
    return STEP_FILE.format(step)


def rollout_path(run_dir: str | Path, step: int) -> Path:
    """RUN/rollouts/step_XXXXXX.jsonl.gz: the batch trained on at 0-based `step`."""
    return Path(run_dir) / ROLLOUTS / step_file_name(step)


def eval_path(run_dir: str | Path, step: int) -> Path:
    """RUN/evals/step_XXXXXX.jsonl.gz: the held-out batch evaluated at `global_step == step`."""
    return Path(run_dir) / EVALS / step_file_name(step)


def saved_steps(folder: str | Path) -> list[int]:
    """Step numbers of the step files in `folder` (rollouts/ or evals/), ascending;
    [] when the folder does not exist. Temp files of a save in progress are not listed."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    steps = (_STEP_FILE.fullmatch(p.name) for p in folder.iterdir())
    return sorted(int(m.group(1)) for m in steps if m)


def should_save(step: int, every: int, last: bool = False) -> bool:
    """Whether `fit` saves the batch of 0-based `step` with `training.save_rollouts_every=every`."""
    return every > 0 and (step % every == 0 or last)


def begin_fit(run_dir: str | Path, config: ConfigStore, first_step: int) -> None:
    """What `fit` does once before its first step: remove saved rollouts of steps >=
    `first_step` (they are about to be redone, or, with saving off, would no longer match
    `metrics.jsonl`), and, when it saves rollouts, write `config.yaml` (so the run reopens
    without the CLI)."""
    run_dir = Path(run_dir)
    if config.training.save_rollouts_every:
        config.save(run_dir / CONFIG_FILE)
    for step in saved_steps(run_dir / ROLLOUTS):
        if step >= first_step:
            rollout_path(run_dir, step).unlink(missing_ok=True)


def save_step_batch(run_dir: str | Path, step: int, batch: TrajectoryBatch) -> Path:
    """Save the batch of 0-based training `step` as RUN/rollouts/step_XXXXXX.jsonl.gz
    (replacing the file of an earlier run of that step); returns its path."""
    return batch.save(rollout_path(run_dir, step))


def save_eval_batch(run_dir: str | Path, step: int, batch: TrajectoryBatch) -> Path:
    """Save a held-out evaluation batch taken at `global_step == step` as
    RUN/evals/step_XXXXXX.jsonl.gz; returns its path."""
    return batch.save(eval_path(run_dir, step))


def record_step(run_dir: str | Path, config: ConfigStore, step: int, batch: TrajectoryBatch | None,
                last: bool = False) -> Path | None:
    """`fit`'s call after each step: save `batch` as step `step`'s rollouts when
    `training.save_rollouts_every` asks for it (`should_save`); returns the path, or None
    when nothing was saved. A failed save warns (`RunFilesWarning`) instead of raising."""
    if batch is None or not should_save(step, config.training.save_rollouts_every, last):
        return None
    return _warn_on_failure(lambda: save_step_batch(run_dir, step, batch), f"training step {step}",
                            rollout_path(run_dir, step))


def record_demonstrations(run_dir: str | Path, config: ConfigStore, batch: TrajectoryBatch | None) -> Path | None:
    """Save the SFT warm-up's demonstration episodes once as RUN/demonstrations.jsonl.gz
    (unless `training.save_rollouts_every` is 0 or they are saved already); a failed save
    warns, as in `record_step`."""
    path = Path(run_dir) / DEMONSTRATIONS
    if batch is None or not config.training.save_rollouts_every or path.exists():
        return None
    return _warn_on_failure(lambda: batch.save(path), "SFT demonstrations", path)


def record_eval(run_dir: str | Path, config: ConfigStore, step: int, batch: TrajectoryBatch | None) -> Path | None:
    """The CLI's call after each held-out evaluation: save `batch` as evals/ step `step`
    unless `training.save_rollouts_every` is 0; a failed save warns, as in `record_step`."""
    if batch is None or not config.training.save_rollouts_every:
        return None
    return _warn_on_failure(lambda: save_eval_batch(run_dir, step, batch), f"evaluation at step {step}",
                            eval_path(run_dir, step))


def _warn_on_failure(save, what: str, path: Path) -> Path | None:
    try:
        return save()
    except (OSError, TypeError, ValueError) as exc:  # disk full or read-only; a value json cannot write
        path.with_name(f".{path.name}.tmp").unlink(missing_ok=True)  # what `TrajectoryBatch.save` left aside
        warnings.warn(f"could not save the batch of the {what} to {path}: {type(exc).__name__}: {exc}; "
                      f"training goes on without this file", RunFilesWarning, stacklevel=3)
        return None
