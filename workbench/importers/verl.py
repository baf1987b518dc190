"""verl's rollout dumps and its `file` metrics logger, read as a workbench run.

What verl writes (its source, 0.9.1):

    trainer.rollout_data_dir/{step}.jsonl     one line per rollout, written by
                                             `RayPPOTrainer._write_generations` after step `step`
                                             (1-based: the first training step is 1): "input"
                                             and "output" (decoded with skip_special_tokens, a
                                             multi-turn conversation one flat string), "gts",
                                             "score" (the summed token-level scores), "step",
                                             and every reward-extra-info list of the batch's
                                             length ("acc", "pred", "request_id", "uid", ...)
    trainer.validation_data_dir/{step}.jsonl  the same for a validation run at `step` (0 =
                                             before training); its extra infos hold "reward"
    VERL_FILE_LOGGER_PATH (or ./{project}/{experiment}.jsonl)
                                             the `file` logger: {"step": N, "data": {...}} a line

Point `workbench import` (or `load_run`) at the rollout folder, or at a folder that holds it
(and the validation folder, whose name contains "val", and the metrics file) within two levels;
`--metrics FILE` names a metrics file elsewhere. A training step S (1-based in verl) is the
run's step S-1; a validation at verl step S is the held-out batch at step S (S updates done).

Groups: the "uid" column when the dump has one (a reward function that returns it), else
the same input text and ground truth ("gts") within a step: the rollouts of one dataset row.
Success: a "success" column, else verl's math reward's "acc" (0/1 or a bool), else none.

verl writes a step's file in place, line by line, so the newest file is taken as complete only
once it ends with a newline and holds as many rows as the step before it (or the metrics file
has that step): `load_run` on a run still training reads the complete steps and leaves out
the one being written.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from workbench.importers.source import (
    Source, SourceError, absent_reason, group_by_key, group_by_prompt, map_metrics, metric_frame,
    number, read_jsonl, success_of, text_episode,
)
from workbench.trajectory import TrajectoryBatch

__all__ = ["VerlSource", "detect", "METRICS"]

_STEP_FILE = re.compile(r"(\d+)\.jsonl")
#: Workbench metric name -> verl names it is read from (first present wins).
METRICS: dict[str, tuple[str, ...]] = {
    "reward/mean": ("critic/score/mean",),
    "reward/max": ("critic/score/max",),
    "reward/min": ("critic/score/min",),
    "rollout/response_length_mean": ("response_length/mean",),
    "env/turns_mean": ("num_turns/mean",),
    "actor/entropy": ("actor/entropy",),
    "actor/pg_clipfrac": ("actor/pg_clipfrac",),
    "actor/ppo_kl": ("actor/ppo_kl",),
    "actor/pg_loss": ("actor/pg_loss",),
    "actor/grad_norm": ("actor/grad_norm",),
    "kl/mean": ("actor/kl_loss", "actor/reward_kl_penalty"),
    "critic/vf_loss": ("critic/vf_loss",),
    "perf/rollout_seconds": ("timing_s/gen",),
    "perf/step_seconds": ("timing_s/step",),
}
#: Columns of a dump row that are not extra information about the rollout.
_BASE = ("input", "output", "score", "step")
#: Keys read as success, in order.
SUCCESS_KEYS = ("success", "acc")


def _first_row(path: Path) -> dict[str, Any] | None:
    try:
        with path.open("rb") as f:
            line = f.readline(1 << 24)
        row = json.loads(line)
    except (OSError, ValueError):
        return None
    return row if isinstance(row, dict) else None


def _dump_files(folder: Path) -> dict[int, Path]:
    return {int(m.group(1)): p for p in folder.iterdir() if p.is_file() and (m := _STEP_FILE.fullmatch(p.name))}


def _is_dump(folder: Path) -> bool:
    files = _dump_files(folder) if folder.is_dir() else {}
    row = next((r for r in map(_first_row, list(files.values())[:3]) if r is not None), None)
    return row is not None and "input" in row and "output" in row


def _is_metrics(path: Path) -> bool:
    row = _first_row(path)
    return row is not None and isinstance(row.get("step"), int) and isinstance(row.get("data"), dict)


def _folders(root: Path, depth: int = 2) -> list[Path]:
    out, level = [root], [root]
    for _ in range(depth):
        level = [c for f in level for c in sorted(f.iterdir()) if c.is_dir() and not c.is_symlink()]
        out += level
    return out


def detect(path: Path) -> str | None:
    """Why `path` is a verl run (a sentence), or None."""
    if not path.is_dir():
        return None
    dumps = [f for f in _folders(path) if _is_dump(f)]
    return f"verl rollout dump in {dumps[0]}" if dumps else None


class VerlSource(Source):
    """A verl run: its rollout (and validation) dumps and its `file` logger's metrics."""

    format = "verl"

    def __init__(self, path: str | Path, metrics: str | Path | None = None):
        super().__init__(path)
        if not self.path.is_dir():
            raise SourceError(f"{self.path}: no such folder")
        dumps = [f for f in _folders(self.path) if _is_dump(f)]
        val = [f for f in dumps if "val" in f.name.lower()]
        train = [f for f in dumps if f not in val]
        if len(train) > 1:
            raise SourceError(f"{self.path} holds {len(train)} verl rollout dump folders ("
                              + ", ".join(str(f) for f in train) + "); point at one of them")
        if not dumps:
            raise SourceError(f"{self.path}: no verl rollout dump ({{step}}.jsonl files with \"input\" and "
                              "\"output\") within two folder levels")
        self.train_dir = train[0] if train else None
        self.val_dir = val[0] if val else None
        self.metrics_file = Path(metrics).resolve() if metrics else self._find_metrics()
        if self.metrics_file is not None and not self.metrics_file.is_file():
            raise SourceError(f"--metrics {self.metrics_file}: no such file")
        p = self.provenance
        p.steps = "verl's training step S (1-based) is step S-1 here; a validation at verl step S is the " \
                  "held-out batch at step S"
        p.absent = {name: absent_reason("verl", name, hint) for name, hint in (
            ("token_ids", "import with --model to tokenize the text"),
            ("logprobs", "import with --model to recompute them"),
            ("advantages", ""), ("action_span", ""), ("finish_reason", ""), ("parse_errors", ""),
            ("environment_errors", ""), ("tool_calls", ""), ("env_seed", ""), ("held_out", ""),
            ("alignment", ""), ("messages", ""))}
        if self.metrics_file is None:
            p.absent["metrics"] = absent_reason("verl", "metrics", "none was found beside the dump (its `file` "
                                                "logger writes one; give it with --metrics)")
        self._rows_cache: dict[Path, int] = {}

    def _find_metrics(self) -> Path | None:
        found = [p for f in _folders(self.path) for p in sorted(f.glob("*.jsonl"))
                 if not _STEP_FILE.fullmatch(p.name) and _is_metrics(p)]
        if len(found) > 1:
            raise SourceError(f"{self.path} holds {len(found)} verl metrics files ("
                              + ", ".join(str(p) for p in found) + "); name one with --metrics")
        return found[0] if found else None

    # -- which steps are complete ------------------------------------------------------------------
    def _complete(self, files: dict[int, Path]) -> dict[int, Path]:
        """`files` without the newest one while verl may still be writing it."""
        if not files:
            return {}
        last = max(files)
        path = files[last]
        try:
            with path.open("rb") as f:
                f.seek(0, 2)
                size = f.tell()
                f.seek(max(0, size - 1))
                ends = f.read(1) == b"\n"
        except OSError:
            ends = False
        done = ends and (self._metric_steps_reach(last) or (len(files) > 1 and self._count(path)
                                                            == self._count(files[max(s for s in files if s < last)])))
        if not done:
            self.provenance.notes = [n for n in self.provenance.notes if not n.startswith("left out")] + [
                f"left out {path.name}: verl is still writing it (or it was cut short)"]
            return {s: p for s, p in files.items() if s != last}
        return files

    def _count(self, path: Path) -> int:
        if path not in self._rows_cache:
            with path.open("rb") as f:
                self._rows_cache[path] = sum(1 for line in f if line.strip())
        return self._rows_cache[path]

    def _metric_steps_reach(self, step: int) -> bool:
        if self.metrics_file is None:
            return False
        return any(int(r.get("step", -1)) >= step and r.get("data") for r in self._metric_rows())

    def _train_files(self) -> dict[int, Path]:
        if self.train_dir is None:
            return {}
        return {s - 1: p for s, p in self._complete(_dump_files(self.train_dir)).items() if s >= 1}

    def _eval_files(self) -> dict[int, Path]:
        return self._complete(_dump_files(self.val_dir)) if self.val_dir is not None else {}

    # -- batches -----------------------------------------------------------------------------------
    def _batch(self, where: Path, step: int, split: str) -> TrajectoryBatch:
        rows = list(read_jsonl(where, self.skipped, f"{where.parent.name}/{where.name}"))
        has_uid = bool(rows) and all("uid" in r for r in rows)
        groups = group_by_key(r["uid"] for r in rows) if has_uid else \
            group_by_prompt(json.dumps([r.get("input", ""), r.get("gts")], default=str) for r in rows)
        self.provenance.groups = "uid" if has_uid else "same prompt and ground truth (gts) within a step"
        reports = any(success_of(r, SUCCESS_KEYS) is not None for r in rows)
        if reports:
            key = next(k for k in SUCCESS_KEYS if any(k in r for r in rows))
            note = f"success: the dump's {key!r} column"
            self.provenance.absent.pop("success", None)
            if note not in self.provenance.notes:
                self.provenance.notes.append(note)
        else:
            self.provenance.absent["success"] = absent_reason("verl", "success", "its dump has no \"success\" or "
                                                              "\"acc\" column")
        episodes = []
        for i, (row, group) in enumerate(zip(rows, groups)):
            score = number(row.get("score"))
            extra = {k: v for k, v in row.items() if k not in _BASE}
            episodes.append(text_episode(
                i, str(row.get("input", "")), str(row.get("output", "")), score=score, group=group,
                env_name=str(row.get("data_source", "")), rewards={"score": score},
                success=success_of(row, SUCCESS_KEYS), extra=extra))
        return TrajectoryBatch(episodes)

    # -- metrics -----------------------------------------------------------------------------------
    def _metric_rows(self) -> list[dict[str, Any]]:
        if self.metrics_file is None:
            return []
        return list(read_jsonl(self.metrics_file, self.skipped, self.metrics_file.name))

    def read_metrics(self) -> Any:
        rows = []
        for r in self._metric_rows():
            data = r.get("data") if isinstance(r.get("data"), dict) else {}
            step = r.get("step")
            if not isinstance(step, int) or not data:
                continue
            train = {k: v for k, v in data.items() if not k.startswith("val")}
            if step >= 1 and train:  # step 0 holds only the validation before training
                rows.append({**train, "source_step": step, "step": step - 1})
        rows, used = map_metrics(rows, METRICS)
        self.provenance.metric_names = used
        frame = metric_frame(rows)
        return frame
