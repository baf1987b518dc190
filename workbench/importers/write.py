"""A run another trainer wrote, written out as a workbench run folder (`workbench import`).

    RUN/config.yaml          `Source.build_config`: the defaults, the task and model named at import
    RUN/metrics.jsonl        the source's metrics, mapped to the workbench's names (its own names
                             kept beside them), each step's batch numbers filled in
    RUN/evals.json           held-out numbers per evaluation step (where the source has evaluations)
    RUN/rollouts/step_*.jsonl.gz, RUN/evals/step_*.jsonl.gz
                             each step's batch (`workbench.training.run_files`, the layout contract)
    RUN/provenance.json      `Provenance`: the format, the source folder, what it did not record,
                             how groups and steps were formed, what was skipped

The source folder is only read: an output folder inside it, or one that already holds
files, is refused before anything is written.
"""
from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from workbench.importers.source import Source, SourceError, batch_metrics
from workbench.training import run_files

__all__ = ["write_run", "check_output", "PROVENANCE_FILE"]

#: The imported run's provenance file (`workbench.debug.runs` reads it).
PROVENANCE_FILE = "provenance.json"


def _row(record: dict[str, Any]) -> dict[str, Any]:
    out = {}
    for k, v in record.items():
        if hasattr(v, "item"):
            v = v.item()
        if isinstance(v, float) and not math.isfinite(v):
            continue  # NaN: the source logged nothing of that name at that step
        if v is None:
            continue
        out[k] = v
    return out


def check_output(source: str | Path, output: str | Path) -> Path:
    """`output` as a Path, after checking that writing there leaves the source folder `source`
    untouched and overwrites nothing; SourceError (one line) otherwise."""
    out, source = Path(output).resolve(), Path(source).resolve()
    if out == source or source in out.parents:
        raise SourceError(f"--output {output} is inside the source folder {source}; an import never "
                          "writes there: give a folder elsewhere, e.g. runs/NAME")
    if out.exists() and (not out.is_dir() or any(out.iterdir())):
        raise SourceError(f"--output {output} already exists and is not an empty folder; give a new folder")
    return out


def write_run(source: Source, output: str | Path, task: str = "", model: str = "") -> dict[str, Any]:
    """Write `source` as a workbench run folder at `output` (see the module docstring); returns
    {"output", "steps", "episodes", "eval_steps", "skipped"}. Raises SourceError."""
    out = check_output(source.path, output)
    out.mkdir(parents=True, exist_ok=True)
    episodes, per_step = 0, []
    for step in source.steps:  # each step read once: saved (gzip level 1: the text is most of it), counted
        batch = source.batch(step)
        episodes += len(batch)
        per_step.append({"step": step, **batch_metrics(batch)})
        batch.save(run_files.rollout_path(out, step), compresslevel=1)
    for step in source.eval_steps:
        source.eval_batch(step).save(run_files.eval_path(out, step), compresslevel=1)
    metrics = source.read_all_metrics(per_step)
    with (out / run_files.METRICS_FILE).open("w", encoding="utf-8") as f:
        for record in metrics.to_dict("records"):
            row = _row(record)
            row["step"] = int(row["step"])
            f.write(json.dumps(row, default=str) + "\n")
    evals = source.read_evals()
    if evals:
        (out / run_files.EVALS_FILE).write_text(json.dumps(evals, indent=1), encoding="utf-8")
    source.build_config(task, model).save(out / run_files.CONFIG_FILE)
    (out / PROVENANCE_FILE).write_text(json.dumps(source.provenance.to_dict(), indent=1, default=str),
                                       encoding="utf-8")
    return {"output": str(out), "steps": len(source.steps), "episodes": episodes,
            "eval_steps": len(source.eval_steps), "skipped": dict(source.provenance.skipped)}
