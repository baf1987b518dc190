"""Runs trained by other trainers, read as workbench runs: one reader per format, one run folder.

    source.py     `Source` (a foreign run's steps, batches, metrics), `Provenance`, the episode builders
    verl.py       verl's rollout dumps ({step}.jsonl) and its `file` metrics logger
    trl.py        TRL GRPOTrainer's completions_NNNNN.parquet and trainer_state.json
    art.py        ART's trajectories/{split}/NNNN.parquet and history.jsonl
    verifiers.py  verifiers' vf-eval results.jsonl and metadata.json (with the trajectory column's tokens)
    prime_rl.py   prime-rl's metrics.jsonl, rollouts/step_N/.../traces.jsonl and token_exports/
    recompute.py  `--model`: imported text tokenized with the chat template, teacher-forced in batches
    write.py      a source written out as a workbench run folder (what `workbench import` does)
    command.py    `python -m workbench import PATH --output RUN`

    from workbench.importers import open_source
    src = open_source("verl_dumps/")       # the format detected, or format="verl"
    src.steps, src.batch(0), src.read_metrics(), src.provenance

`workbench.debug.load_run(PATH)` opens such a folder directly (it calls `open_source` when the
folder is not a workbench run), and `workbench import` writes one as a run folder. The
views, the doctor and `compare` then read it as any run; what the trainer did not record is
in `Provenance.absent`, and the doctor lists the checks it could not run ("not checked: verl
records no sampling logprobs"). Nothing in a source folder is ever written or moved.

Layer: beside `debug` (which imports it), above `training` (`recompute` loads models).
"""
from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

from workbench.importers.source import Provenance, Source, SourceError

__all__ = ["FORMATS", "open_source", "detect_format", "Source", "SourceError", "Provenance"]

#: Format name -> (module, Source class name). `detect_format` tries them in this order.
FORMATS: dict[str, tuple[str, str]] = {
    "trl": ("trl", "TRLSource"),
    "verl": ("verl", "VerlSource"),
    "art": ("art", "ARTSource"),
    "verifiers": ("verifiers", "VerifiersSource"),
    "prime-rl": ("prime_rl", "PrimeRLSource"),
}
#: What each format's detector looks for (the error for an unknown folder lists these).
LOOKS_FOR = {
    "verl": "{step}.jsonl rollout dumps with \"input\"/\"output\" (trainer.rollout_data_dir)",
    "trl": "completions/completions_NNNNN.parquet (GRPOTrainer with log_completions=True)",
    "art": "trajectories/{split}/NNNN.parquet (an ART model folder, .art/PROJECT/models/MODEL)",
    "verifiers": "results.jsonl with metadata.json (vf-eval)",
    "prime-rl": "rollouts/step_N/.../traces.jsonl or token_exports/step_N/ (a prime-rl output folder)",
}


def _module(name: str) -> Any:
    module, _ = FORMATS[name]
    return importlib.import_module(f"workbench.importers.{module}")


def detect_format(path: str | Path) -> tuple[str, str] | None:
    """(format, why) for the first format whose files `path` holds, or None."""
    path = Path(path)
    for name in FORMATS:
        why = _module(name).detect(path)
        if why:
            return name, why
    return None


def unknown_folder(path: str | Path) -> str:
    """The one-line error for a folder no reader knows: the formats and what each looked for."""
    looked = "; ".join(f"{name}: {what}" for name, what in LOOKS_FOR.items())
    return (f"{path} is not a run folder any reader knows (workbench: config.yaml and rollouts/; {looked}); "
            "name the format with --format if its files are further down")


def open_source(path: str | Path, format: str | None = None, *, metrics: str | Path | None = None,
                model: str | None = None, ref_model: str | None = None, **options: Any) -> Source:
    """The run in `path` written by another trainer (`format` detected when None).

    Args:
        path: the trainer's output folder (see each module for what it holds).
        format: "verl", "trl", "art", "verifiers" or "prime-rl"; None: detected.
        metrics: (verl) the `file` logger's metrics file, when it is not inside `path`.
        model: a local model folder: the text is tokenized through its chat template and
            teacher-forced (per-token logprobs and entropy, "recomputed, not sampled").
        ref_model: with `model`, a second model folder for the per-token KL to it.
        options: more of the format's reader's arguments.

    Raises:
        SourceError: `path` holds no known format, or its files cannot be read (one line).
    """
    path = Path(path)
    if not path.exists():
        raise SourceError(f"{path}: no such file or folder")
    if format is None:
        found = detect_format(path)
        if found is None:
            raise SourceError(unknown_folder(path))
        format = found[0]
    if format not in FORMATS:
        raise SourceError(f"--format {format!r}: known formats are {', '.join(FORMATS)}")
    cls = getattr(_module(format), FORMATS[format][1])
    if metrics is not None:
        options["metrics"] = metrics
    source = cls(path, **options)
    if ref_model and not model:
        raise SourceError("--ref-model needs --model (the KL is between the two models' logprobs of the text)")
    if model:
        from workbench.importers.recompute import Recompute

        source.recompute = Recompute(model, ref_model)
        source.tokenizer = source.recompute.tokenizer
        source.provenance.recomputed = source.recompute.describe()
        for name in ("token_ids", "logprobs"):
            source.provenance.absent.pop(name, None)
    return source
