"""Strict format without SFT: constrained decoding vs the SFT warm-up, held-out success per minute.

    python benchmarks/constrained.py                       # both arms, the demo's settings
    python benchmarks/constrained.py --dtype float32 --device cpu --steps 6

Both arms play guess_number in the strict format with the demo's settings
(`workbench.cli.demo.demo_config`: secret 1..8, 4 guesses, 8 new tokens a turn, batch 16 in
groups of 8, LoRA GRPO), through `workbench.cli.runner.train_and_report` (held-out success on
32 unseen secrets, greedy, before and after):

* strict+constrained: `environment.constrained_decoding` (the reply is sampled under the
  bare-number grammar, `GuessNumberEnv.action_constraint`), no SFT; GRPO at the learning
  benchmark's 5e-4 for `--steps` steps. Its held-out games are played under the grammar too
  (the setting is the environment's).
* strict+SFT: the demo as it is: 2 SFT steps on 16 games of the scripted expert, then
  `--steps` GRPO steps at 2e-4.

Per arm: held-out success before / after (and after SFT), every reply's form on the first
held-out step before training (bare numbers), the training minutes (the `fit` steps: rollouts,
SFT and updates; the held-out evaluations are not counted), and held-out success gained per
training minute. Results: `benchmarks/results/constrained.json`, a table row (`--markdown`).
`WORKBENCH_SMOKE=1` cuts every count down (the test suite runs it on the tiny model).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see benchmarks/learning.py

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import load, machine, run_main  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
ARMS = ("strict+constrained", "strict+sft")


def arm_config(args: argparse.Namespace, arm: str, out: Path):
    from workbench.cli.demo import RL_LEARNING_RATE, demo_config

    demo_args = argparse.Namespace(model=args.model, device=args.device, dtype=args.dtype)
    cfg = demo_config(demo_args, out, remedies=arm == "strict+sft")
    if arm == "strict+constrained":
        cfg.environment.strict_format = True
        cfg.environment.constrained_decoding = True
        cfg.training.learning_rate = RL_LEARNING_RATE
    if args.steps is not None:
        cfg.training.num_iters_per_epoch = args.steps
    cfg.checkpoint.save_interval = 0
    return cfg.validate()


def run_arm(args: argparse.Namespace, arm: str, work: Path) -> dict[str, Any]:
    from workbench.cli.demo import counts
    from workbench.cli.runner import train_and_report

    out = work / arm.replace("+", "_")
    cfg = arm_config(args, arm, out)
    load0, start = load(), time.perf_counter()
    report = train_and_report(cfg, out, counts()["eval_episodes"], print_findings=False)
    wall = time.perf_counter() - start
    trainer = report["trainer"]
    steps = trainer.metrics_history
    train_seconds = sum(m.get("perf/step_seconds", 0.0) for m in steps)
    evals = report["evals"]
    before, after = evals[0]["eval/success_rate"], evals[-1]["eval/success_rate"]
    first = [ep.turns[0].action for ep in report["before"] if ep.turns]
    rec = {
        "arm": arm, "steps": trainer.global_step, "sft_steps": cfg.sft.steps,
        "rl_steps": sum(1 for m in steps if "reward/mean" in m), "learning_rate": cfg.training.learning_rate,
        "success_before": before, "success_after": after,
        "success_after_sft": (next(e["eval/success_rate"] for e in evals if e["step"] == cfg.sft.steps)
                              if report["after_sft"] is not None else None),
        "bare_number_share_before": sum(bool(re.fullmatch(r"\s*-?\d+\s*", a)) for a in first) / max(1, len(first)),
        "first_replies_before": first[:6],
        "train_seconds": round(train_seconds, 1), "wall_seconds": round(wall, 1),
        "success_gain_per_train_minute": round((after - before) / max(train_seconds / 60, 1e-9), 3),
        "train_success": [m["env/success_rate"] for m in steps if "reward/mean" in m],
        "parse_error_rate": [m["env/parse_error_rate"] for m in steps if "reward/mean" in m],
        "load": round((load0 + load()) / 2, 2),
        "model": {"name": cfg.model.model_name, "device": str(cfg.model.resolved_device()),
                  "dtype": str(cfg.model.resolved_dtype()).removeprefix("torch.")},
    }
    trainer.cleanup()
    del trainer, report
    gc.collect()
    return rec


def markdown_row(result: dict[str, Any]) -> str:
    """The README Results row: | quantity | figure | date | machine, dtype, load | command |."""
    arms = {r["arm"]: r for r in result["arms"]}
    c, s = arms["strict+constrained"], arms["strict+sft"]
    m = result["machine"]
    flags = " ".join(f for f in m.get("flags", []) if f.startswith(("avx2", "avx512f", "avx512_bf16", "amx")))
    return (f"| Strict format without SFT (guess_number 1..8, embedded SmolLM2, LoRA GRPO, held-out success on 32 "
            f"unseen secrets, greedy): constrained decoding (no SFT; {c['bare_number_share_before']:.0%} of the "
            f"untrained model's first replies bare numbers) vs the SFT warm-up | "
            f"**{c['success_before']:.2f} -> {c['success_after']:.2f} in {c['train_seconds'] / 60:.1f} training min** "
            f"({c['rl_steps']} GRPO steps; {c['success_gain_per_train_minute']:.2f} success/min) vs "
            f"{s['success_before']:.2f} -> {s['success_after']:.2f} in {s['train_seconds'] / 60:.1f} min "
            f"({s['sft_steps']} SFT + {s['rl_steps']} GRPO; {s['success_gain_per_train_minute']:.2f}/min) | "
            f"{result['date']} | {m.get('cpu', '')}, {m.get('cores')} cores, {flags}, {c['model']['dtype']}; load "
            f"{c['load']}-{s['load']} | `python benchmarks/constrained.py` |")


def main(argv: list[str] | None = None) -> dict[str, Any]:
    from workbench.config import EMBEDDED_MODEL

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default=EMBEDDED_MODEL)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--steps", type=int, default=None, help="GRPO steps per arm (default: the demo's)")
    p.add_argument("--arms", default=",".join(ARMS))
    p.add_argument("--output", default=str(RESULTS / "constrained.json"))
    p.add_argument("--markdown", action="store_true", help="print the README results row")
    args = p.parse_args(argv)
    work = Path(tempfile.mkdtemp(prefix="wb-constrained-"))
    arms = [run_arm(args, arm, work) for arm in args.arms.split(",")]
    result = {"date": datetime.date.today().isoformat(), "machine": machine(), "command":
              "python benchmarks/constrained.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "smoke": os.environ.get("WORKBENCH_SMOKE") == "1", "arms": arms}
    for r in arms:
        print(f"{r['arm']:>20}: held-out {r['success_before']:.2f} -> {r['success_after']:.2f}, "
              f"{r['train_seconds'] / 60:.1f} train min, gain/min {r['success_gain_per_train_minute']:.2f}, "
              f"bare numbers before training {r['bare_number_share_before']:.0%}")
    if not result["smoke"]:
        Path(args.output).write_text(json.dumps(result, indent=2) + "\n")
    if args.markdown and len(arms) == 2:
        print(markdown_row(result))
    return result


if __name__ == "__main__":
    run_main(lambda: (main(), 0)[1])
