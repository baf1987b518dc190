"""RL past SFT: which settings make GRPO add held-out success on top of a 1-step SFT warm-up?

    python benchmarks/rl_past_sft.py --variants plain,g4 --seeds 0,1,2,3 --lr 2e-4
    python benchmarks/rl_past_sft.py --list      # the variants and their overrides
    python benchmarks/rl_past_sft.py --table     # the results so far, one line per variant

Every run is the demo's training part (`workbench.cli.demo.demo_config`: guess_number 1..8, 4
guesses, strict format, 8 new tokens a turn, LoRA on the embedded SmolLM2-135M-Instruct, GRPO
batches of 16 in groups of 8) with 1 SFT step on the scripted expert's games (after it the
policy opens with 4 and counts up by one, so it loses every secret 8: held-out 0.75), then
`--steps` GRPO steps at `--lr` with the variant's overrides; held-out success on 32 unseen
secrets (seeds 10_000.., greedy) before, after SFT and after RL. Those 32 secrets hold eight
8s and no 1, so a policy that loses only secret 1 scores 1.00 there.

Each run's record (held-out success at each evaluation, per-step training success, entropy,
share of flat groups, the doctor's fired findings, the final policy's held-out plays, seconds,
load) is appended to `--out` as soon as it ends, and a run already there (same variant, seed,
dtype, steps, lr) is skipped, so a cut-short benchmark resumes where it stopped. Several
processes may share one `--out` (one variant each, `--threads 1`).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
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

#: Variant name -> config overrides ("section.field": value) on top of the base run.
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    # the doctor's remedies for entropy-collapse and zero-variance-groups, alone and together
    "entropy": {"training.entropy_coeff": 0.01},
    "dynamic": {"training.dynamic_sampling": True},
    "both": {"training.entropy_coeff": 0.01, "training.dynamic_sampling": True},
    # more secrets a step: groups of 4 (or 2) at batch 16, or 8 groups of 4 at batch 32
    "g4": {"training.group_size": 4},
    "g2": {"training.group_size": 2},
    "b32g4": {"training.batch_size": 32, "training.group_size": 4, "training.micro_batch_size": 32},
    "both_g4": {"training.group_size": 4, "training.entropy_coeff": 0.01, "training.dynamic_sampling": True},
    "g4_ent0.03": {"training.group_size": 4, "training.entropy_coeff": 0.03},
    # the reward: a win scaled by the guesses left (environment.params.scale_by_remaining)
    "g4_shaped": {"training.group_size": 4, "environment.params.scale_by_remaining": True},
    # Dr. GRPO's advantages (not divided by the group's std)
    "drgrpo": {"training.norm_adv_by_std_in_grpo": False},
    "drgrpo_g4": {"training.norm_adv_by_std_in_grpo": False, "training.group_size": 4},
    "drgrpo_g2": {"training.norm_adv_by_std_in_grpo": False, "training.group_size": 2},
    "drgrpo_g2_ent0.05": {"training.norm_adv_by_std_in_grpo": False, "training.group_size": 2,
                          "training.entropy_coeff": 0.05},
}


def base_config(args: argparse.Namespace, seed: int, out: Path):
    from workbench.cli.demo import demo_config

    demo_args = argparse.Namespace(model=args.model, device=args.device, dtype=args.dtype)
    cfg = demo_config(demo_args, out)
    cfg.update("sft", {"steps": 1})
    cfg.update("training", {"learning_rate": args.lr, "num_iters_per_epoch": args.steps, "seed": seed})
    cfg.checkpoint.save_interval = 0
    return cfg


def run_one(args: argparse.Namespace, variant: str, seed: int, work: Path) -> dict[str, Any]:
    from workbench.cli.runner import train_and_report

    out = work / f"{variant}_seed{seed}_{args.dtype}_{args.steps}_{args.lr:g}"
    cfg = base_config(args, seed, out)
    overrides = VARIANTS[variant]
    cfg.apply_overrides(overrides).validate()
    load0, start = load(), time.perf_counter()
    report = train_and_report(cfg, out, args.eval_episodes, print_findings=False)
    seconds = time.perf_counter() - start
    trainer, evals = report["trainer"], report["evals"]
    rl = [m for m in trainer.metrics_history if "reward/mean" in m]

    def plays(batch) -> dict[str, str]:
        """Each held-out seed's guesses and outcome, e.g. {"10003": "4 5 6 7 L"}."""
        return {str(ep.env_seed): " ".join(t.action.strip() for t in ep.turns) + (" W" if ep.success else " L")
                for ep in sorted(batch, key=lambda ep: ep.env_seed)}

    rec = {
        "variant": variant, "overrides": overrides, "seed": seed, "steps": args.steps, "lr": args.lr,
        "dtype": str(next(trainer.policy.model.parameters()).dtype).removeprefix("torch."),
        "seconds": round(seconds, 1), "load": round((load0 + load()) / 2, 2),
        "success": [e["eval/success_rate"] for e in evals], "eval_steps": [e["step"] for e in evals],
        "train_success": [round(m["env/success_rate"], 3) for m in rl],
        "entropy": [round(m.get("actor/entropy", float("nan")), 4) for m in rl],
        "flat": [round(m.get("diagnose/zero-variance-groups", float("nan")), 3) for m in rl],
        "flat_rolled": [round(m["rollout/dynamic_zero_variance_rate"], 3) for m in rl
                        if "rollout/dynamic_zero_variance_rate" in m],
        "step_seconds": [round(m["perf/step_seconds"], 1) for m in rl],
        "fired": sorted({f"{f.name}{'@eval' if f.source == 'eval' else ''}" for f in report["findings"]}),
        "after_plays": plays(report["after"]),
    }
    trainer.cleanup()
    del trainer, report
    gc.collect()
    return rec


def _append(out: Path, rec: dict[str, Any]) -> None:
    """Add `rec` to `out`'s runs, re-reading the file under a lock first: several benchmark
    processes (one per variant, one thread each) may share one results file."""
    import fcntl

    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        data = json.loads(out.read_text()) if out.exists() else {"runs": []}
        data["runs"].append(rec)
        data["machine"] = machine()
        out.write_text(json.dumps(data, indent=1))


def opening(plays: dict[str, str]) -> str:
    """The final greedy policy's opening on the held-out games, e.g. "4, then 5 after too low":
    its most common first guess and its most common second guess above it. Count-up (4, 5)
    loses every secret 8; halving (4, 6) wins all."""
    from collections import Counter

    moves = [p.split()[:-1] for p in plays.values()]
    first = Counter(m[0] for m in moves if m).most_common(1)
    up = Counter(m[1] for m in moves if len(m) > 1 and m[1].isdigit() and m[0].isdigit() and int(m[1]) > int(m[0]))
    if not first:
        return "-"
    return f"{first[0][0]}" + (f", then {up.most_common(1)[0][0]} after too low" if up else "")


def table(runs: list[dict[str, Any]]) -> str:
    """One line per (lr, variant, steps, dtype): held-out success after SFT and after RL for
    each seed, the final policy's opening per seed, and in how many seeds RL added at least
    `MARGIN` on top of SFT."""
    groups: dict[tuple, list[dict[str, Any]]] = {}
    for r in runs:
        groups.setdefault((-r["lr"], r["variant"], r["steps"], r["dtype"]), []).append(r)
    lines = ["| lr | variant: overrides | GRPO steps | dtype | seed: held-out after SFT -> after RL (opening) "
             "| RL >= SFT + 0.15 |", "|---|---|---|---|---|---|"]
    for (lr, variant, steps, dtype), rs in sorted(groups.items()):
        rs = sorted(rs, key=lambda r: r["seed"])
        cells = "; ".join(f"{r['seed']}: {r['success'][1]:.2f} -> {r['success'][-1]:.2f} ({opening(r['after_plays'])})"
                          for r in rs)
        wins = sum(r["success"][-1] >= r["success"][1] + MARGIN - 1e-9 for r in rs)
        over = ", ".join(f"{k.split('.')[-1]}={v}" for k, v in rs[0]["overrides"].items()) or "demo settings"
        lines.append(f"| {-lr:g} | {variant}: {over} | {steps} | {dtype} | {cells} | {wins} of {len(rs)} |")
    return "\n".join(lines)


#: The issue's bar: held-out success after RL at least this much above after SFT.
MARGIN = 0.15


def main(argv: list[str] | None = None) -> int:
    from workbench.config import EMBEDDED_MODEL

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--variants", default="plain")
    p.add_argument("--seeds", default="0")
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--lr", type=float, default=5e-4)
    p.add_argument("--eval-episodes", type=int, default=32)
    p.add_argument("--model", default=EMBEDDED_MODEL)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS / "rl_past_sft.json"))
    p.add_argument("--keep-runs", default=None, help="keep the run folders here (default: a temporary folder)")
    p.add_argument("--list", action="store_true", help="print the variants and their overrides")
    p.add_argument("--table", action="store_true", help="print the results in --out as a table, run nothing")
    args = p.parse_args(argv)
    out = Path(args.out)
    if args.list:
        for k, v in VARIANTS.items():
            print(k, v)
        return 0
    if args.table:
        data = json.loads(out.read_text()) if out.exists() else {"runs": []}
        print(table(data["runs"]))
        return 0
    import torch

    torch.set_num_threads(args.threads)
    work = Path(args.keep_runs) if args.keep_runs else Path(tempfile.mkdtemp(prefix="rl_past_sft_"))
    try:
        for seed in [int(s) for s in args.seeds.split(",")]:
            for variant in args.variants.split(","):
                done = json.loads(out.read_text())["runs"] if out.exists() else []
                key = (variant, seed, args.dtype, args.steps, args.lr)
                if any((r["variant"], r["seed"], r["dtype"], r["steps"], r["lr"]) == key for r in done):
                    continue
                print(f"== {variant} seed {seed} {args.dtype} lr {args.lr:g} (load {load()}) ==", flush=True)
                rec = run_one(args, variant, seed, work)
                rec["date"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
                _append(out, rec)
                print(f"-> {variant} seed {seed}: {rec['success']} in {rec['seconds']} s; fired {rec['fired']}",
                      flush=True)
    finally:
        if not args.keep_runs:
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    run_main(main)
