"""`python -m workbench import PATH --output RUN`: another trainer's run as a workbench run folder.

    python -m workbench import verl_out/ --output runs/verl-gsm8k
    python -m workbench import trl_out/ --output runs/trl --model models/qwen --ref-model models/qwen-base
    python -m workbench diagnose runs/verl-gsm8k       # the doctor, "not checked: ..." for what verl left out

The format is detected from the files (or named with `--format`); `diagnose`, `compare` and
`load_run` also open the source folder in place. An error the input causes (an unknown
folder, an output inside the source, a damaged metrics file) is one line on stderr, exit 2.
"""
from __future__ import annotations

import argparse
import sys
from typing import Any

from workbench.importers import FORMATS, SourceError, open_source
from workbench.importers.write import write_run

__all__ = ["add_import_parser", "cmd_import"]


def add_import_parser(subparsers: Any) -> argparse.ArgumentParser:
    p = subparsers.add_parser("import", help="write a run another trainer wrote (verl, TRL, ART, verifiers, "
                                             "prime-rl) as a workbench run folder: steps, episodes, groups, "
                                             "metrics, provenance")
    p.add_argument("path", metavar="PATH", help="the trainer's output folder (verl: trainer.rollout_data_dir or a "
                                                "folder holding it; TRL: output_dir; ART: the model folder; "
                                                "verifiers: the results folder; prime-rl: output_dir)")
    p.add_argument("--output", required=True, help="the run folder to write (new or empty, not inside PATH)")
    p.add_argument("--format", choices=list(FORMATS), default=None, help="the source format (default: detected)")
    p.add_argument("--metrics", default=None, help="verl: the `file` logger's metrics file, when it is not in PATH")
    p.add_argument("--task", default="", help="a name for the task (config.yaml's environment.name), so compare "
                                               "pairs runs of the same task; default: none recorded")
    p.add_argument("--model", default=None, help="a local model folder: tokenize the text through its chat "
                                                  "template and teacher-force it (logprobs, entropy: recomputed, "
                                                  "not sampled)")
    p.add_argument("--ref-model", dest="ref_model", default=None,
                   help="with --model: a second model folder, for the per-token KL to it")
    p.set_defaults(run=cmd_import)
    return p


def cmd_import(args: argparse.Namespace) -> int:
    """Write the run; print what was imported, what the source did not record and what was
    skipped. 0 on success, 2 (one line on stderr) when the input cannot be imported."""
    from workbench.debug.runs import RunError

    try:
        source = open_source(args.path, args.format, metrics=args.metrics, model=args.model,
                             ref_model=args.ref_model)
        report = write_run(source, args.output, task=args.task, model=args.model or "")
    except (SourceError, RunError) as exc:
        print(f"import: {exc}", file=sys.stderr)
        return 2
    p = source.provenance
    print(f"import: {report['steps']} steps, {report['episodes']} episodes"
          + (f", {report['eval_steps']} held-out batches" if report["eval_steps"] else "")
          + f" {p.line()} -> {report['output']}")
    if p.absent:
        print("not recorded: " + "; ".join(p.absent.values()))
    for note in p.notes:
        print(f"note: {note}")
    if report["skipped"]:
        print(f"skipped {report['skipped']['count']} unreadable line(s) or file(s); the first: "
              f"{report['skipped']['first']}")
    print(f"next: python -m workbench diagnose {report['output']}")
    return 0
