"""The debugger: reopen a finished run, fork an episode at any turn, compare two
policies token by token, a run doctor that names what went wrong, and two runs side by side.

    runs.py      load_run: a run folder reopened (config, metrics, evals, checkpoints, every step's batch)
    forking.py   fork(episode, turn, action=/observation=, policy=checkpoint): branches from any turn
    policies.py  a policy named by a checkpoint folder, "base", a Trainer or a module
    diff.py      compare_policies and `workbench diff`: the same tokens under two policies
    doctor.py    diagnose and `workbench diagnose`: the run doctor over a whole run
    compare.py   compare_runs and `workbench compare`: two runs side by side
    judge_audit.py `workbench audit-judge RUN --judge ...`: the judge audit on a run's saved batch

    from workbench.debug import load_run, branch_run, fork, compare_policies, diagnose, compare_runs
    run = load_run("runs/demo/train")       # config, metrics, evaluations, checkpoints, batches
    trainer = branch_run(run.checkpoints[-1], {"training.learning_rate": 1e-4}, output_dir="runs/lr", steps=5)
    batch = run.batch(3)                    # step 3's scored batch, exactly as it was trained on
    branches = fork(batch[0], turn=1, action="5", n=4, engine=engine)
    diff = compare_policies(run.checkpoints[0], run.checkpoints[-1], batch)
    findings = diagnose(run)                # reward hacking, collapse, dead signal, ...
    cmp = compare_runs("runs/a", "runs/b")  # config diff, curves, findings resolved/new, same seeds

Layer: above `training` and `distributed`, below `widgets`, `compat` and `cli`. Names are
imported lazily (each module pulls in what it needs when first used).
"""
from __future__ import annotations

import importlib
from typing import Any

#: Public name -> module of this package that defines it.
_NAMES = {
    "Run": "runs", "load_run": "runs", "RunError": "runs", "branch_run": "runs",
    "fork": "forking", "ReplayMismatch": "forking",
    "compare_policies": "diff", "PolicyDiff": "diff",
    "diagnose": "doctor", "Finding": "doctor", "DoctorConfig": "doctor",
    "compare_runs": "compare", "RunComparison": "compare", "RunsNotComparable": "compare",
}

__all__ = sorted(_NAMES)


def __getattr__(name: str) -> Any:
    if name in _NAMES:
        return getattr(importlib.import_module(f"workbench.debug.{_NAMES[name]}"), name)
    raise AttributeError(f"module 'workbench.debug' has no attribute {name!r}")
