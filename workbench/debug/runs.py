"""Reopen a finished (or running) run from its folder: `load_run(path) -> Run`.

    run = load_run("runs/demo/train")
    run                          # Run('runs/demo/train': grpo on guess_number, 8 steps, ...)
    run.metrics                  # DataFrame, one row per step (metrics.jsonl)
    run.steps                    # [0, 1, ..., 7]: steps whose batch was saved
    batch = run.batch(3)         # step 3's batch as it was trained on (advantages, KL, ...)
    run.batch()                  # the last saved step's
    run.evals, run.eval_batch(0) # held-out numbers (evals.json) and the batch evaluated at step 0
    run.checkpoints              # checkpoint folders, oldest first
    run.branched_from            # a branch (`train --from`): parent run, checkpoint, step, overrides

What a run folder holds is `workbench.training.run_files` (the layout contract). Reading
is strict: a folder without `rollouts/` (written before runs saved their batches, or with
`training.save_rollouts_every=0`), a missing file, or a file cut short raises `RunError`
saying which path, what is wrong and what to do. Nothing is cached: each `batch(step)`
reads its file again and returns a fresh batch, so changing it (e.g. re-scoring it in
the `RewardTuner`) never changes what the next call returns.

Reading stays inside the run folder: a file or folder the loader reads (config.yaml,
metrics.jsonl, evals.json, rollouts/, evals/, checkpoints/ and what is in them) that is a
symbolic link leading out of the folder raises `RunError` naming the link, and nothing
behind it is read (so a planted link cannot make an error message quote another file).
Links that stay inside the folder, and a run folder that is itself a link, are fine. A
batch file that decompresses to more than `TrajectoryBatch.load` reads (a gzip bomb) is a
`RunError` too (`workbench.trajectory.MAX_LOAD_BYTES`).
"""
from __future__ import annotations

import html
import json
import math
import numbers
import zlib
from pathlib import Path
from typing import Any

from workbench.config import ConfigError, ConfigStore
from workbench.importers.write import PROVENANCE_FILE
from workbench.training import checkpoint as ckpt
from workbench.training import run_files
from workbench.training.branch import BRANCH_FILE, BranchError, BranchOrigin, read_branch
from workbench.trajectory import BatchTooLarge, NotABatchFile, TrajectoryBatch

__all__ = ["Run", "RunError", "branch_run", "load_run", "inside_run", "read_batch"]

#: What reading a damaged batch file raises (a cut gzip stream, a half JSON line, a bad record).
_READ_ERRORS = (OSError, EOFError, ValueError, KeyError, TypeError, IndexError, zlib.error)


class RunError(RuntimeError):
    """A run folder (or one of its files) cannot be read; the message names the path,
    what is missing or damaged, and what to do."""


def load_run(run_dir: str | Path, **import_options: Any) -> "Run":
    """Open the run in `run_dir` (the CLI's `--output`, or `training.log_dir`, else
    `checkpoint.output_dir`, of a notebook run): its config, metrics and evaluation
    numbers are read now, batches when asked for. Raises `RunError`.

    A folder another trainer wrote (verl's rollout dumps, TRL's completions, ART, verifiers,
    prime-rl: `workbench.importers`) opens in place, nothing copied or written; `import_options`
    go to `workbench.importers.open_source` (`format=`, `metrics=`, `model=`, `ref_model=`)."""
    path = Path(run_dir)
    if not path.is_dir():
        what = "is a file, not a folder" if path.exists() else "no such folder"
        raise RunError(f"{path}: {what}; give the run's output folder (the CLI's --output, or "
                       "training.log_dir, else checkpoint.output_dir, of a run trained in a notebook)")
    if not any(path.iterdir()):
        raise RunError(f"{path} is empty: no run has written there yet; give the folder a run wrote (the CLI's "
                       "--output, or training.log_dir of a notebook run)")
    for name in (run_files.ROLLOUTS, run_files.EVALS, run_files.CHECKPOINTS):
        inside_run(path, path / name)
    written_here = (path / run_files.CONFIG_FILE).is_file() or run_files.saved_steps(path / run_files.ROLLOUTS)
    if import_options or not written_here:
        from workbench.importers import detect_format

        # another trainer's folder; or one of nothing any reader knows (a RunError naming the formats)
        ours = (path / run_files.ROLLOUTS).is_dir() or (path / run_files.METRICS_FILE).is_file()
        if import_options or detect_format(path) or not ours:
            return _foreign_run(path, **import_options)
    if not (path / run_files.ROLLOUTS).is_dir():
        raise RunError(
            f"{path} has no {run_files.ROLLOUTS}/ folder, so its batches cannot be reopened: it was written "
            "before runs saved each step's batch, or with training.save_rollouts_every=0. Train it again "
            "with save_rollouts_every >= 1 (the default) to reopen it; its numbers are in metrics.jsonl")
    return Run(path, _read_config(inside_run(path, path / run_files.CONFIG_FILE)),
               _read_metrics(inside_run(path, path / run_files.METRICS_FILE)),
               _read_evals(inside_run(path, path / run_files.EVALS_FILE)),
               provenance=_read_provenance(inside_run(path, path / PROVENANCE_FILE)))


def _foreign_run(path: Path, **options: Any) -> "Run":
    """A run another trainer wrote (`workbench.importers`), presented without a copy."""
    from workbench.importers import SourceError, open_source

    try:
        source = open_source(path, **options)
        return Run(path, source.build_config(), source.read_all_metrics(), source.read_evals(), source=source,
                   provenance=source.provenance)
    except SourceError as exc:
        raise RunError(str(exc)) from exc


def _read_provenance(path: Path) -> Any:
    """RUN/provenance.json (an imported run's `workbench.importers.Provenance`), or None."""
    if not path.is_file():
        return None
    from workbench.importers import Provenance

    try:
        return Provenance.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (ValueError, TypeError) as exc:
        raise RunError(f"{path} is damaged ({exc}); `workbench import` writes it: import the run again") from exc


def inside_run(run_dir: str | Path, path: str | Path) -> Path:
    """`path` (a file or folder in the run folder `run_dir`), after checking that no symbolic
    link on the way leads out of the run folder; raises `RunError` naming the link (and
    reading nothing behind it) if one does. Links within the folder are followed as usual,
    and `run_dir` may itself be a link. A path that does not exist passes (the caller says
    it is missing)."""
    root, path = Path(run_dir), Path(path)
    real_root = root.resolve()
    try:
        parts = path.relative_to(root).parts
    except ValueError:
        raise RunError(f"{path} is not inside the run folder {root}") from None
    here = root
    for part in parts:
        here = here / part
        if not here.is_symlink():
            continue
        target = here.resolve()
        if target != real_root and real_root not in target.parents:
            raise RunError(
                f"{here} is a symbolic link to {target}, outside the run folder {root}; a run is read only from "
                "inside its folder, so it is not followed. Copy what it points to into the run folder in place "
                "of the link")
    return path


def branch_run(checkpoint: "str | Path | Run", overrides: dict[str, Any] | None = None, *,
               output_dir: str | Path, steps: int | None = None, **trainer_kwargs: Any) -> Any:
    """Branch a run to try a remedy: a `Trainer` that continues from `checkpoint` (a
    checkpoint folder, or a run folder or `Run` for its newest checkpoint) with `overrides`
    (`{"section.field": value}`), writing only into `output_dir`, ready to `fit`; the same as
    `Trainer.from_checkpoint` and `python -m workbench train --from` (what a branch is:
    `workbench.training.branch`).

        run = load_run("runs/gn")
        trainer = branch_run(run.checkpoints[-2], {"training.learning_rate": 1e-4},
                             output_dir="runs/gn-lr", steps=10)
        trainer.fit()
        load_run("runs/gn-lr").branched_from      # parent, checkpoint, step, overrides
    """
    from workbench.training import Trainer

    source = checkpoint.path if isinstance(checkpoint, Run) else checkpoint
    return Trainer.from_checkpoint(source, output_dir=output_dir, overrides=overrides, steps=steps, **trainer_kwargs)


class Run:
    """A run folder, reopened (see the module docstring; build it with `load_run`).

    Attributes:
        path: the run folder.
        config: the run's `ConfigStore` (config.yaml).
        metrics: pandas DataFrame, one row per training step (metrics.jsonl; "step" is 0-based
            and pairs with `batch(step)`).
        evals: held-out evaluations `[{"step": S, "eval/success_rate": ..., ...}]`
            (evals.json; [] when the run has none).
        branched_from: where a branch came from (`workbench.training.branch.BranchOrigin`,
            from branch.json: `parent_run`, `checkpoint`, `step`, `overrides`,
            `parent_values`), None for a run that is not a branch. A branch's metrics
            hold its parent's rows before `step`; its saved batches start at `step`.
    """

    def __init__(self, path: Path, config: ConfigStore, metrics: Any, evals: list[dict[str, Any]],
                 source: Any = None, provenance: Any = None):
        self.path = Path(path)
        self.config = config
        self.metrics = metrics
        self.evals = evals
        self.source = source
        """For a folder another trainer wrote, read in place: its `workbench.importers.Source`
        (the batches come from it); None for a run folder."""
        self.provenance = provenance
        """For an imported run (read in place, or written by `workbench import`): its
        `workbench.importers.Provenance` (format, source folder, the fields it did not record);
        None for a run the workbench trained."""
        self._tokenizer: Any = None
        try:
            self.branched_from: BranchOrigin | None = read_branch(self.path)
        except BranchError as exc:
            raise RunError(str(exc)) from exc

    def parent(self) -> "Run":
        """The run this one branched from (`load_run` of `branched_from.parent_run`);
        RunError for a run that is not a branch or whose parent folder is gone."""
        origin = self.branched_from
        if origin is None or origin.parent_run is None:
            raise RunError(f"{self.path} is not a branch of a run folder (no {BRANCH_FILE} naming a "
                           "parent_run)")
        return load_run(origin.parent_run)

    # -- what was saved -----------------------------------------------------------------------
    @property
    def steps(self) -> list[int]:
        """0-based steps whose batch is saved (`rollouts/`), ascending (read from the folder
        each time, so a run still training shows its new steps)."""
        if self.source is not None:
            return self.source.steps
        return run_files.saved_steps(self.path / run_files.ROLLOUTS)

    @property
    def eval_steps(self) -> list[int]:
        """Steps (`global_step` at the time) whose held-out batch is saved (`evals/`), ascending."""
        if self.source is not None:
            return self.source.eval_steps
        return run_files.saved_steps(self.path / run_files.EVALS)

    @property
    def checkpoints(self) -> list[Path]:
        """Checkpoint folders, oldest first: under `checkpoints/` (CLI runs), else in the run
        folder itself (a notebook run whose logs went to `checkpoint.output_dir`), else in the
        config's `checkpoint.output_dir` when that is an absolute path. [] when there are none.
        Listing tidies folders left by dead writers (`checkpoint.list_checkpoints`).
        A checkpoint folder (or `checkpoints/`) that is a link out of the run folder raises
        `RunError`, as every read of the run folder does (the config's absolute
        `checkpoint.output_dir` is where the run said it saved them, and is read as such).
        An imported run has none: its trainer's checkpoints are in its own format."""
        if self.provenance is not None:
            return []
        places = [inside_run(self.path, self.path / run_files.CHECKPOINTS), self.path]
        for place in places:
            if place.is_dir():
                for entry in place.iterdir():
                    if entry.name.startswith(ckpt.PREFIX):
                        inside_run(self.path, entry)
        if Path(self.config.checkpoint.output_dir).is_absolute():
            places.append(Path(self.config.checkpoint.output_dir))
        for place in places:
            found = ckpt.list_checkpoints(place)
            if found:
                return found
        return []

    # -- batches --------------------------------------------------------------------------------
    def batch(self, step: int | None = None) -> TrajectoryBatch:
        """The batch of training step `step` (0-based, as in `metrics["step"]`) exactly as
        it stood after that step's update; None = the last saved step."""
        step = self._pick(step, self.steps, "training batch", run_files.ROLLOUTS)
        if self.source is not None:
            return self._from_source(self.source.batch, step)
        return read_batch(inside_run(self.path, run_files.rollout_path(self.path, step)), step)

    def eval_batch(self, step: int | None = None) -> TrajectoryBatch:
        """The held-out batch evaluated at `global_step == step` (0 = before training);
        None = the last one."""
        step = self._pick(step, self.eval_steps, "evaluation batch", run_files.EVALS)
        if self.source is not None:
            return self._from_source(self.source.eval_batch, step)
        return read_batch(inside_run(self.path, run_files.eval_path(self.path, step)))

    def _from_source(self, read: Any, step: int) -> TrajectoryBatch:
        from workbench.importers import SourceError

        try:
            return read(step)
        except (SourceError, OSError) as exc:
            raise RunError(f"{self.path}: step {step} does not read: {exc}") from exc

    def tokenizer(self) -> Any:
        """The tokenizer of the run's model (`config.model.path`), to decode batches' tokens;
        loaded on the first call, then kept."""
        from workbench.models.loading import load_tokenizer

        if self._tokenizer is not None:
            return self._tokenizer
        if self.source is not None and self.source.tokenizer is not None:
            return self.source.tokenizer
        if self.provenance is not None and not self.config.model.path:
            raise RunError(f"{self.path} was imported from {self.provenance.trainer} without a model, so it has "
                           "no tokenizer (and no token ids): import it with --model MODEL_FOLDER to tokenize it")
        try:
            self._tokenizer = load_tokenizer(self.config.model.path, self.config.model.trust_remote_code)
            return self._tokenizer
        except (OSError, ValueError) as exc:
            raise RunError(f"the tokenizer of this run's model {self.config.model.path!r} (config.yaml, "
                           f"model.path) does not load here: {exc}; pass one yourself, e.g. "
                           "TokenView(run, tokenizer=...)") from exc

    def _pick(self, step: int | None, saved: list[int], what: str, folder: str) -> int:
        if step is None:
            if not saved and self.source is not None:
                raise RunError(f"{self.path} holds no complete {what} of {self.source.format} yet")
            if not saved:
                raise RunError(f"{self.path / folder} holds no {what} yet (no step finished, or "
                               "training.save_rollouts_every=0 and no evaluation ran)")
            return saved[-1]
        whole = isinstance(step, numbers.Real) and not isinstance(step, bool) and math.isfinite(step) \
            and step == int(step)  # numpy ints and 3.0 (a float "step" column) pass
        if not whole or step < 0:
            raise RunError(f"step {step!r}: a step is a 0-based step number (an int >= 0, as in "
                           f"metrics['step']), or None for the last; saved steps in {self.path / folder}: "
                           f"{_ranges(saved) or 'none'}")
        origin = self.branched_from
        if step not in saved and origin is not None and int(step) < origin.step and origin.parent_run is not None:
            method = "batch" if folder == run_files.ROLLOUTS else "eval_batch"
            raise RunError(f"step {step} comes before this branch's first step {origin.step}: it is the parent's, "
                           f"saved in {origin.parent_run} (run.parent().{method}({step}))")
        if step not in saved and self.source is not None:
            raise RunError(f"{self.path}: {self.source.format} wrote no complete {what} of step {step} (steps: "
                           f"{_ranges(saved) or 'none'})")
        if step not in saved:
            every = self.config.training.save_rollouts_every
            raise RunError(f"{self.path / folder / run_files.step_file_name(int(step))} is missing: no {what} "
                           f"of step {step} was saved (saved steps: {_ranges(saved) or 'none'}; the run saved "
                           f"every {every} steps and each fit's last). Ask for one of those")
        return int(step)

    # -- display -------------------------------------------------------------------------------
    def _summary(self) -> dict[str, Any]:
        t, df = self.config.training, self.metrics
        last = df.iloc[-1].to_dict() if len(df) else {}
        origin = self.branched_from
        branch = {} if origin is None else {"branched from": f"{origin.checkpoint} (step {origin.step})"
                                            + "".join(f", {k}={v!r}" for k, v in origin.overrides.items())}
        p = self.provenance
        imported = {} if p is None else {"imported from": p.line(), "not recorded": ", ".join(p.absent) or "-"}
        return {
            **branch, **imported,
            "algorithm": t.adv_estimator if p is None else (p.estimator or "not recorded"),
            "environment": self.config.environment.name or ("not recorded" if p is not None else ""),
            "model": self.config.model.path, "metric steps": len(df),
            "saved steps": _ranges(self.steps) or "none",
            "last reward": last.get("reward/mean"), "last success": last.get("env/success_rate"),
            "evals": ", ".join(f"step {e.get('step')}: {_number(e.get('eval/success_rate', float('nan')))}"
                               for e in self.evals) or "none",
        }

    def __repr__(self) -> str:
        s = self._summary()
        origin = self.branched_from
        parent = str(origin.parent_run or origin.checkpoint) if origin is not None else ""
        branch = "" if origin is None else f", branched at step {origin.step} from {parent!r}"
        imported = "" if self.provenance is None else f", imported from {self.provenance.trainer}"
        return (f"Run({str(self.path)!r}{imported}: {s['algorithm']} on {s['environment']}, "
                f"{s['metric steps']} steps, "
                f"saved batches {s['saved steps']}, evals [{s['evals']}]{branch})")

    def _repr_html_(self) -> str:
        s = self._summary()
        try:
            s["checkpoints"] = ", ".join(p.name for p in self.checkpoints) or "none"
        except RunError as exc:  # a link out of the run folder: say so, a display never raises
            s["checkpoints"] = f"not listed: {exc}"
        rows = "".join(f"<tr><th style='text-align:left'>{html.escape(k)}</th>"
                       f"<td style='text-align:left'>{html.escape(_cell(v))}</td></tr>" for k, v in s.items())
        return f"<p><b>Run</b> <code>{html.escape(str(self.path))}</code></p><table>{rows}</table>"


def _number(value: Any) -> str:
    """A number as 0.00; anything else (a string written into evals.json) as its short repr."""
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return f"{value:.2f}"
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if value != value else f"{value:.3g}"  # NaN: not known (a success the env does not report)
    return str(value)


def _ranges(steps: list[int]) -> str:
    """[0, 1, 2, 5, 7, 8] -> "0-2, 5, 7-8"."""
    spans: list[list[int]] = []
    for s in steps:
        if spans and s == spans[-1][1] + 1:
            spans[-1][1] = s
        else:
            spans.append([s, s])
    return ", ".join(str(a) if a == b else f"{a}-{b}" for a, b in spans)


def _read_config(path: Path) -> ConfigStore:
    if not path.is_file():
        raise RunError(f"{path} is missing: a run folder holds the config it trained with (written by fit and "
                       "the CLI); copy it from where the run was trained, or save it there with "
                       "trainer.config.save(...)")
    try:
        return ConfigStore.load(path)
    except ConfigError as exc:
        raise RunError(f"{path} does not load as a ConfigStore: {exc}") from exc


def _read_metrics(path: Path) -> Any:
    import pandas as pd

    if not path.is_file():
        raise RunError(f"{path} is missing: the run was trained without the jsonl logger (training.loggers) "
                       "or stopped before its first step; train it with 'jsonl' in training.loggers")
    rows = []
    for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
        try:
            row = json.loads(line)
        except json.JSONDecodeError as exc:
            raise RunError(f"{path} line {number} is cut short or damaged ({exc}): the run was killed while "
                           "writing it; resuming the run rewrites the file without it, or delete that line") from exc
        if not isinstance(row, dict) or "step" not in row:
            raise RunError(f"{path} line {number} is not a metrics row (a JSON object with a 'step')")
        rows.append(row)
    return pd.DataFrame(rows)


def _read_evals(path: Path) -> list[dict[str, Any]]:
    if not path.is_file():
        return []
    try:
        evals = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise RunError(f"{path} is cut short or damaged ({exc}); the CLI writes it once at the end of a "
                       "run: run the evaluation again or delete the file") from exc
    if not isinstance(evals, list) or not all(isinstance(e, dict) for e in evals):
        raise RunError(f"{path} is not a list of evaluations ([{{'step': ..., 'eval/...': ...}}, ...])")
    for i, e in enumerate(evals):
        step = e.get("step")
        if not isinstance(step, int) or isinstance(step, bool) or step < 0:
            raise RunError(f"{path} entry {i} has \"step\": {json.dumps(step)}; each evaluation's step is the "
                           "global step it was taken at, an integer >= 0 (the CLI writes it): fix or delete that "
                           "entry")
    return evals


def read_batch(path: str | Path, step: int | None = None) -> TrajectoryBatch:
    """`TrajectoryBatch.load(path)`, with every way a file can fail to load (missing, not a
    batch, cut short, too large) as a `RunError` naming the file and what to do. With
    `step`, the batch must be that step's (its `meta["step"]`, when it has one)."""
    path = Path(path)
    if path.is_dir():
        raise RunError(f"{path} is a folder, not a batch file (give a .jsonl.gz file written by "
                       "TrajectoryBatch.save, e.g. RUN/rollouts/step_000000.jsonl.gz)")
    try:
        batch = TrajectoryBatch.load(path)
    except FileNotFoundError as exc:
        raise RunError(f"{path} is missing (no such file, or deleted while the run was open)") from exc
    except BatchTooLarge as exc:
        raise RunError(str(exc)) from exc
    except NotABatchFile as exc:
        raise RunError(f"{exc}; give a batch file written by TrajectoryBatch.save (a run's "
                       "rollouts/step_XXXXXX.jsonl.gz)") from exc
    except _READ_ERRORS as exc:
        # load's ValueErrors name the file and the line; the rest (a cut gzip stream, a bad record) do not
        what = str(exc) if isinstance(exc, ValueError) and str(path) in str(exc) else \
            f"{path} is cut short or damaged ({type(exc).__name__}: {exc})"
        raise RunError(
            f"{what}. Batches are written whole and renamed into place, so a run's batch file was damaged later "
            "(an interrupted copy, a full disk): copy it again from where the run was trained, or delete it to "
            "reopen the other steps") from exc
    saved = batch.meta.get("step")
    if step is not None and saved is not None and saved != step:
        raise RunError(f"{path} holds the batch of step {saved}, not of step {step}: the file was renamed "
                       "or copied over; put it back under its own name")
    return batch
