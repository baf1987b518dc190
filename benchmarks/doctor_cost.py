"""What the run doctor costs on a real run: the demo's training part (embedded SmolLM2-135M,
guess_number 1..8 in the strict format, an SFT step then LoRA GRPO steps) with every step's batch and the held-out batches
before and after saved in the run-folder layout, then `diagnose(RUN)` timed.

    python benchmarks/doctor_cost.py /tmp/doctor_run     # ~8 min on a 2-core CPU
    python benchmarks/doctor_cost.py /tmp/doctor_run --device cpu --dtype float32

Prints the findings table and one JSON line: the run's seconds, the per-step checks'
total (`perf/doctor_seconds` summed over the steps) and `diagnose` over the folder
(reading the gzip batches included), each also as a share of the run.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from workbench.cli.demo import counts, demo_config
from workbench.debug.doctor import diagnose, findings_table
from workbench.training import Trainer


def main(out: Path, device: str = "auto", dtype: str = "auto") -> dict[str, float]:
    args = argparse.Namespace(model="smollm2-135m-instruct", device=device, dtype=dtype, minutes=0)
    cfg = demo_config(args, out)
    cfg.training.log_dir = str(out)
    cfg.training.loggers = [*cfg.training.loggers, "jsonl"]  # RUN/metrics.jsonl
    start = time.perf_counter()
    trainer = Trainer(cfg)
    seeds = list(range(10_000, 10_000 + counts()["eval_episodes"]))
    trainer.evaluate(seeds)
    trainer.last_eval_batch.save(out / "evals" / "step_000000.jsonl.gz")
    trainer.fit(callbacks=[lambda tr, m: tr.last_batch.save(out / "rollouts" / f"step_{m['step']:06d}.jsonl.gz")])
    trainer.evaluate(seeds)
    trainer.last_eval_batch.save(out / "evals" / f"step_{trainer.global_step:06d}.jsonl.gz")
    run_s = time.perf_counter() - start
    hook_s = sum(m.get("perf/doctor_seconds", 0.0) for m in trainer.metrics_history)
    start = time.perf_counter()
    findings = diagnose(str(out))
    diagnose_s = time.perf_counter() - start
    print(findings_table(findings))
    return {"run_seconds": run_s, "per_step_checks_seconds": hook_s, "diagnose_seconds": diagnose_s,
            "per_step_checks_share": hook_s / run_s, "diagnose_share": diagnose_s / run_s}


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", nargs="?", default="runs/doctor_cost", help="run folder to write (default runs/doctor_cost)")
    ap.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                    help='"auto": bfloat16 on CUDA and on CPUs with bf16 instructions, else float32')
    cli = ap.parse_args()
    print(json.dumps(main(Path(cli.out), cli.device, cli.dtype)))
