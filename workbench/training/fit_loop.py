"""The training loop behind `Trainer.fit` (its docstring says what `fit` does): the step
target, the run folder's lock, logging, the doctor, checkpoints, the time limit, Ctrl-C and
asynchronous sampling (`workbench.training.async_fit`). A function of the trainer, so that
`trainer.py` keeps the stages and this module the loop around them.
"""
from __future__ import annotations

import time
import warnings
from pathlib import Path
from typing import Any, Callable, Sequence

from workbench.training import checkpoint as ckpt
from workbench.training import run_files
from workbench.training.async_fit import RolloutAhead
from workbench.training.loggers import LoggerGroup, log_dir
from workbench.training.run_lock import begin_run
from workbench.utils.progress import fit_postfix, progress_bar, write


class FitTargetReachedWarning(UserWarning):
    """`fit` was given an absolute target step the trainer has already reached: nothing trained."""


def run_fit(trainer: Any, num_epochs: int | None, num_iters_per_epoch: int | None,
            callbacks: Sequence[Callable[[Any, dict], None]], time_limit_s: float | None,
            steps: int | None, until_step: int | None) -> list[dict[str, float]]:
    """`Trainer.fit` (see its docstring)."""
    config = trainer.checked_config()  # a field set on trainer.config after it was built is checked here
    t, c = config.training, config.checkpoint
    if steps is not None and (until_step is not None or num_epochs or num_iters_per_epoch):
        raise ValueError("fit: give steps=N (N more steps) or an absolute target (until_step, or "
                         "num_epochs/num_iters_per_epoch), not both")
    num_iters = num_iters_per_epoch or t.num_iters_per_epoch
    if steps is not None and (not isinstance(steps, int) or steps < 0):
        raise ValueError(f"fit(steps=...) must be an integer >= 0, got {steps!r}")
    trainer.loggers = LoggerGroup(trainer.config)
    # One writer per run folder (lock, released below unless the caller holds it for longer);
    # resumes, or moves an earlier run aside.
    run_lock = begin_run(trainer)
    if steps is not None:
        total = trainer.global_step + steps
    else:
        total = (until_step if until_step is not None
                 else trainer.config.sft.steps + (num_epochs or t.num_epochs) * num_iters)
        if total <= trainer.global_step:
            warnings.warn(f"fit: the trainer is at step {trainer.global_step}, already at the absolute target "
                          f"step {total}, so nothing is trained; fit(steps=N) trains N more steps",
                          FitTargetReachedWarning, stacklevel=3)  # the caller of Trainer.fit
    if total <= trainer.global_step:  # nothing to train: nothing is written either
        if not trainer._run_lock_kept:
            run_lock.release()
        trainer.stop_reason = None
        return trainer.metrics_history
    deadline = None if time_limit_s is None else time.monotonic() + time_limit_s
    trainer.stop_reason: str | None = None
    # The bar counts this call's steps (SFT and RL), not the absolute step: a branch from step 8
    # that trains 4 SFT + 2 RL steps shows 6/6; the postfix names the absolute step.
    bar = progress_bar(t.progress, total=max(total - trainer.global_step, 0), desc="fit", unit="step")
    trainer._fitting = True
    trainer._fit_total = total
    try:
        if t.max_staleness:
            trainer.ahead = RolloutAhead(trainer)
        trainer.loggers.open(trainer.global_step)
        run_dir = log_dir(trainer.config)  # each step's batch: RUN/rollouts/step_XXXXXX.jsonl.gz
        run_files.begin_fit(run_dir, trainer.config, trainer.global_step)
        while trainer.global_step < total:
            metrics = trainer.train_step()
            metrics["epoch"] = (trainer.global_step - 1) // num_iters
            if deadline is not None and time.monotonic() >= deadline and trainer.global_step < total:
                trainer.stop_reason = (f"time limit of {time_limit_s:g} s reached after {trainer.global_step} "
                                    f"of {total} steps")
            sft = "sft/nll" in metrics  # an SFT step: its batch is the expert's, not the policy's
            if trainer.doctor is not None and not sft:  # one line per new finding; diagnose/<name> in the metrics
                metrics.update(trainer.doctor.observe(trainer.last_batch, metrics["step"], trainer.metrics_history,
                                                      trainer.run_facts()))
            if sft:
                run_files.record_demonstrations(run_dir, trainer.config, trainer.last_batch)
            else:
                run_files.record_step(run_dir, trainer.config, metrics["step"], trainer.last_batch,
                                      last=trainer.global_step >= total or trainer.stop_reason is not None)
            trainer.loggers.log_step(metrics, trainer.last_batch, trainer.global_step)
            bar.update(1)
            bar.set_postfix({"step": metrics["step"], **fit_postfix(metrics)})
            for cb in callbacks:
                cb(trainer, metrics)
            last = trainer.global_step >= total or trainer.stop_reason is not None
            if c.save_interval and (trainer.global_step % c.save_interval == 0 or last):
                save_step_checkpoint(trainer)
            if trainer.stop_reason:
                break
    except KeyboardInterrupt:
        save_after_interrupt(trainer)
        raise
    finally:
        trainer._fitting = False
        if trainer.ahead is not None:  # the batch in flight is dropped; the engine gets the current weights
            ahead, trainer.ahead = trainer.ahead, None
            ahead.close()
        if not trainer._run_lock_kept:  # the CLI keeps it until its reports are written
            run_lock.release()
        bar.close()
        trainer.loggers.close()
    return trainer.metrics_history



def save_step_checkpoint(trainer: Any) -> None:
    """`checkpoint.output_dir/step_N` of the current step (pruned to `keep_last_n`),
    unless this trainer saved or loaded that step's checkpoint there already."""
    c = trainer.config.checkpoint
    path = Path(c.output_dir) / ckpt.checkpoint_name(trainer.global_step)
    if getattr(trainer, "_checkpoint_step", None) == (path.resolve(), trainer.global_step):
        return
    trainer.save_checkpoint(path)
    ckpt.prune_checkpoints(c.output_dir, c.keep_last_n)

def save_after_interrupt(trainer: Any) -> None:
    """Ctrl-C in `fit`: checkpoint the weights of the last finished step when
    checkpointing is on, unless the interrupt came inside an update, whose weights are
    neither the last step's nor the next one's (then say so and save nothing)."""
    if not trainer.config.checkpoint.save_interval or trainer.global_step == 0:
        return
    if getattr(trainer, "_updating", False):
        if getattr(trainer, "_reports_interrupt", False):
            return
        write(f"interrupted inside the update of step {trainer.global_step}: its weights may be partly updated, "
              "so no checkpoint is written; the newest checkpoint in "
              f"{trainer.config.checkpoint.output_dir} is where a resume starts")
        return
    save_step_checkpoint(trainer)
    if not getattr(trainer, "_reports_interrupt", False):  # the CLI prints its own line (where to resume)
        write(f"interrupted: saved step {trainer.global_step} to "
              f"{Path(trainer.config.checkpoint.output_dir) / ckpt.checkpoint_name(trainer.global_step)}")
