"""What a judge costs a training step: the embedded model (SmolLM2-135M-Instruct) judging its
own episodes in this process (`reward.judge = "hf:smollm2-135m-instruct"`, the hf engine, one
batch per step), beside the step's rollout and update, on 16 episodes of 4 turns.

    python benchmarks/judges.py                       # 3 measured steps after 1 warm-up step
    python benchmarks/judges.py --group --steps 5     # the group judge (a prompt per group of 8)
    python benchmarks/judges.py --dtype float32

The game is guess_number over 1..100 with 4 guesses (so nearly every episode plays all 4 turns),
replies of at most 16 tokens, GRPO with LoRA in groups of 8; the judge gives a JSON verdict
(`reward.judge_json`, at most 128 tokens) at temperature 0. Each step's `perf/rollout_seconds`,
`perf/judge_seconds` and `perf/update_seconds` come from the trainer's metrics; the first step
warms the models and is not counted. Prints the machine, dtype, threads and load, one line per
step, the medians and the ratio judge / rollout, and one JSON line.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import load, machine_line  # noqa: E402


def main(steps: int, dtype: str, group: bool, threads: int) -> dict:
    import tempfile
    import warnings

    import torch

    torch.set_num_threads(threads)
    from workbench import ConfigStore, Trainer
    from workbench.config import EMBEDDED_MODEL, resolve_dtype

    out = Path(tempfile.mkdtemp(prefix="wb-bench-judges-"))
    c = ConfigStore()
    c.model.model_name, c.model.dtype, c.model.device = EMBEDDED_MODEL, dtype, "cpu"
    c.environment.name = "guess_number"
    c.environment.params = {"low": 1, "high": 100}
    c.environment.max_steps = 4
    c.update("inference", {"max_tokens": 16, "max_turns": 4, "temperature": 1.0})
    c.update("training", {"batch_size": 16, "group_size": 8, "micro_batch_size": 16, "learning_rate": 2e-4,
                          "progress": False, "seed": 0})
    c.checkpoint.output_dir, c.checkpoint.save_interval = str(out), 0
    where = f"hf:{EMBEDDED_MODEL}"
    c.update("reward", {"group_judge" if group else "judge": where, "judge_json": True, "judge_dtype": dtype,
                        "env_weight": 1.0})
    trainer = Trainer(c.validate())
    rows = []
    try:
        for k in range(steps + 1):
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                m = trainer.train_step()
            row = {"step": k, "rollout_s": m["perf/rollout_seconds"], "judge_s": m["perf/judge_seconds"],
                   "update_s": m["perf/update_seconds"], "step_s": m["perf/step_seconds"],
                   "turns_mean": m["env/turns_mean"], "judge_failed": m["reward/judge_failed"],
                   "judge_tokens": m["reward/judge_tokens"]}
            print(("warm-up " if k == 0 else "step    ") + " ".join(
                f"{key} {v:.2f}" if isinstance(v, float) else f"{key} {v}" for key, v in row.items()), flush=True)
            if k:
                rows.append(row)
    finally:
        trainer.close()
    med = {key: statistics.median(r[key] for r in rows) for key in ("rollout_s", "judge_s", "update_s", "step_s")}
    result = {"machine": machine_line(), "dtype": str(resolve_dtype(dtype, torch.device("cpu"))).replace("torch.", ""),
              "threads": threads, "load_end": load(), "judge": "group_judge" if group else "judge",
              "episodes": 16, "turns": 4, "steps_measured": len(rows), **{f"median_{k}": v for k, v in med.items()},
              "judge_over_rollout": med["judge_s"] / med["rollout_s"],
              "judge_tokens_per_step": statistics.median(r["judge_tokens"] for r in rows),
              "date": time.strftime("%Y-%m-%d")}
    print(f"medians over {len(rows)} steps: rollout {med['rollout_s']:.1f} s, judge {med['judge_s']:.1f} s, "
          f"update {med['update_s']:.1f} s; judge / rollout = {result['judge_over_rollout']:.2f}")
    return result


if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=3, help="measured steps after the warm-up step (default 3)")
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float32"],
                    help='"auto": bfloat16 on CPUs with bf16 instructions, else float32')
    ap.add_argument("--group", action="store_true", help="the group judge instead of the per-episode judge")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (default 2)")
    cli = ap.parse_args()
    print(machine_line(), f"| load {load()}")
    print(json.dumps(main(cli.steps, cli.dtype, cli.group, cli.threads)))
