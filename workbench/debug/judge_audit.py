"""`python -m workbench audit-judge RUN --judge ...`: the judge audit (`workbench.reward.audit_judge`)
on a batch a run saved, before training on that judge.

    python -m workbench audit-judge runs/demo/train --judge http://127.0.0.1:8000/v1
    python -m workbench audit-judge runs/demo/train --judge hf:smollm2-135m-instruct --group --held-out
    python -m workbench audit-judge RUN --judge URL --reward.judge_json true --doctor.judge_min_auc 0.8 --json

The judge's settings are the run's `reward` section (rubric, scale, timeout, ...) with the
`--reward.FIELD` flags over them; the thresholds are the run's `doctor` section with the
`--doctor.FIELD` flags over them. The batch is the last saved training step's (`--step N` for
another, `--held-out` for the latest held-out evaluation). Prints the report (or JSON with
`--json`; `--out FILE` writes the JSON too). Exit code 0 when the judge is fit to train on, 1
when it is not; a run folder that cannot be read, a bad setting, or a judge none of whose
judgments succeeded (a wrong URL, a server that is down) is one line on stderr and 2.
"""
from __future__ import annotations

import argparse
import copy
import json
import sys
from pathlib import Path
from typing import Any

from workbench.debug.runs import RunError, load_run

__all__ = ["add_audit_judge_parser", "cmd_audit_judge"]


def add_audit_judge_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`python -m workbench audit-judge RUN --judge SPEC [...]`."""
    p = subparsers.add_parser("audit-judge", help="audit a judge on a run's saved batch: agreement with the "
                                                  "environment, position and length bias, consistency, cost")
    p.add_argument("run_dir", help="a run folder (rollouts/, evals/), e.g. runs/demo/train")
    p.add_argument("--judge", required=True, metavar="SPEC",
                   help="where the judge runs: http://HOST:PORT/v1, hf:MODEL, vllm:MODEL or module:function")
    p.add_argument("--group", action="store_true", help="audit it as a group judge (each group in one prompt; "
                                                         "position bias is measured) instead of per episode")
    p.add_argument("--step", type=int, default=None, help="the training step whose batch to judge (default: the last)")
    p.add_argument("--held-out", dest="held_out", action="store_true",
                   help="judge the latest held-out evaluation's batch instead of a training step's")
    p.add_argument("--json", action="store_true", help="print the audit as JSON instead of the report")
    p.add_argument("--out", default=None, help="also write the audit as JSON to this file")
    p.set_defaults(output=None, run=cmd_audit_judge, overrides={})
    return p


def cmd_audit_judge(args: argparse.Namespace) -> int:
    """Run the audit (module docstring); returns the exit code."""
    from workbench.reward.audit import audit_judge
    from workbench.reward.group_judge import GroupJudge
    from workbench.reward.judges import Judge

    run = load_run(args.run_dir)
    if args.held_out and args.step is not None:
        raise RunError("give --step N (a training step's batch) or --held-out (the latest held-out batch), not both")
    batch = run.eval_batch() if args.held_out else run.batch(args.step)
    config = copy.deepcopy(run.config)  # the flags change this audit's settings, not the reopened run
    config.update("reward", {**args.overrides.get("reward", {}), "judge": args.judge})
    config.update("doctor", args.overrides.get("doctor", {}))
    config.validate()
    judge = (GroupJudge if args.group else Judge).from_config(config.reward, backend=args.judge)
    try:
        audit = audit_judge(batch, judge, config.doctor)
    except ValueError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    finally:
        judge.close()
    if audit.failed_share == 1.0:
        first = next((j["error"] for j in audit.judgments if j.get("error")), "")
        print(f"error: every judgment of {args.judge} failed; first: {first}", file=sys.stderr)
        return 2
    data = audit.to_dict()
    if args.out:
        Path(args.out).write_text(json.dumps(data, indent=1))
    print(json.dumps({k: v for k, v in data.items() if k != "judgments"}, indent=1) if args.json else audit.text())
    return 0 if audit.fit else 1
