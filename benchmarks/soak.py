"""Soak benchmark: does a long GRPO run grow in memory, open files, threads or disk?

    python benchmarks/soak.py                       # 200 steps on the tiny model
    python benchmarks/soak.py --steps 100 --every 10 --dtype float32
    python benchmarks/soak.py --device cpu --dtype bfloat16 --run-dir /tmp/soak

One `Trainer.fit(steps=N)` on the tiny random Llama (`workbench.models.build_tiny_model`,
the test suite's model) with the run settings a user gets by default: GRPO, guess_number,
batch 8 (2 groups of 4), up to 5 turns of 64 tokens, LoRA r=16, the jsonl loggers with an
episode table every 10 steps, every step's scored batch saved (`training.save_rollouts_every`
= 1) and a checkpoint every 5 steps, the newest 3 kept (`checkpoint.save_interval`,
`keep_last_n`), all in one run folder (`--run-dir`, default a fresh temporary folder;
checkpoints in `RUN/checkpoints`). Nothing is mocked.

After step 1 and every `--every` steps, a callback records:
  rss_mb        resident memory of the process (`VmRSS` in /proc/self/status)
  open_files    entries in /proc/self/fd
  threads       OS threads of the process (`Threads` in /proc/self/status) and
  py_threads    Python threads (`threading.active_count()`)
  disk_mb       bytes under the run folder
  step_seconds  mean wall time per step since the previous sample (training, logging,
                saving and checkpointing included)
  gc_objects    objects tracked by Python's garbage collector

Growth per 100 steps: the slope of a least-squares line through the samples of the second
half of the run (the first half is warm-up: allocator pools, lazily built caches, the
checkpoint folder filling to `keep_last_n`), times 100. Disk growth is mostly the saved
batches (`rollouts/step_*.jsonl.gz`) and the metrics logs, which the user asked to keep.

Results: `benchmarks/results/soak.json` (the samples, the slopes, the command, the CPU
model and its bf16 flags, the dtype, the date) and a printed table and summary.
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import shutil
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/learning.py
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import machine  # noqa: E402

from workbench.config import DTYPES, resolve_device, resolve_dtype  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"


def proc_status() -> dict[str, int]:
    """VmRSS (kB) and Threads from /proc/self/status."""
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "Threads"):
                out[key] = int(value.split()[0])
    return out


def disk_bytes(folder: Path) -> int:
    total = 0
    for dirpath, _, files in os.walk(folder):
        for name in files:
            try:
                total += os.lstat(os.path.join(dirpath, name)).st_size
            except OSError:  # pruned between listing and stat
                pass
    return total


def cpu_info() -> dict[str, Any]:
    """CPU model, logical CPUs and the bf16-related flags (`benchmarks/_common.machine`)."""
    m = machine()
    keep = [f for f in m["flags"] if f in ("avx2", "avx512f", "avx512_bf16", "amx_bf16", "amx_tile", "avx512_fp16")]
    return {"model": m["cpu"], "logical_cpus": m["cores"], "flags": keep}


def slope_per_100(samples: list[dict[str, Any]], key: str) -> float:
    """Least-squares slope of `key` against `step` over the second half of the samples, x 100."""
    half = samples[len(samples) // 2:]
    if len(half) < 2:
        return float("nan")
    xs = [s["step"] for s in half]
    ys = [s[key] for s in half]
    mx, my = sum(xs) / len(xs), sum(ys) / len(ys)
    var = sum((x - mx) ** 2 for x in xs)
    return 100 * sum((x - mx) * (y - my) for x, y in zip(xs, ys)) / var if var else float("nan")


def make_trainer(run_dir: Path, device: str, dtype: str, seed: int) -> Any:
    from envs import make_env
    from workbench.config import ConfigStore
    from workbench.models import build_tiny_model
    from workbench.training.trainer import Trainer

    cfg = ConfigStore()
    cfg.model.model_name = str(build_tiny_model())
    cfg.model.device, cfg.model.dtype = device, dtype
    cfg.training.progress = False
    cfg.training.seed = seed
    cfg.training.log_dir = str(run_dir)
    cfg.checkpoint.output_dir = str(run_dir / "checkpoints")
    cfg.checkpoint.resume = False
    cfg.environment.max_steps = cfg.inference.max_turns  # as the CLI sets it
    return Trainer(cfg.validate(), environment=make_env("guess_number", max_steps=cfg.inference.max_turns))


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=200, help="GRPO steps (default 200)")
    p.add_argument("--every", type=int, default=10, help="sample every N steps (default 10)")
    p.add_argument("--device", default="cpu", help="cpu, cuda, cuda:N or auto (default cpu: the tiny model)")
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help="weights' dtype (default auto: bfloat16 on CUDA and CPUs with bf16 instructions)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--run-dir", default=None, help="run folder (default: a fresh temporary folder, removed after)")
    p.add_argument("--out", default=str(RESULTS / "soak.json"), help="results JSON")
    args = p.parse_args(argv)
    if args.steps < 2 or args.every < 1:
        p.error("--steps must be >= 2 and --every >= 1")
    device = resolve_device(args.device)
    dtype = str(resolve_dtype(args.dtype, device)).removeprefix("torch.")
    run_dir = Path(args.run_dir) if args.run_dir else Path(tempfile.mkdtemp(prefix="wb-soak-"))
    run_dir.mkdir(parents=True, exist_ok=True)
    trainer = make_trainer(run_dir, str(device), dtype, args.seed)
    samples: list[dict[str, Any]] = []
    last = {"t": time.perf_counter(), "step": 0}

    def sample(tr: Any, metrics: dict[str, Any]) -> None:
        step = tr.global_step
        if step != 1 and step % args.every and step != args.steps:
            return
        now = time.perf_counter()
        status = proc_status()
        row = {
            "step": step,
            "rss_mb": round(status["VmRSS"] / 1024, 1),
            "open_files": len(os.listdir("/proc/self/fd")),
            "threads": status["Threads"],
            "py_threads": threading.active_count(),
            "disk_mb": round(disk_bytes(run_dir) / 2 ** 20, 3),
            "step_seconds": round((now - last["t"]) / max(step - last["step"], 1), 3),
            "gc_objects": len(gc.get_objects()),
            "load": round(os.getloadavg()[0], 2),
        }
        samples.append(row)
        print("  ".join(f"{k} {v}" for k, v in row.items()), flush=True)
        last.update(t=time.perf_counter(), step=step)  # the sampling itself is not a step's time

    started = time.time()
    trainer.fit(steps=args.steps, callbacks=[sample])
    wall = time.time() - started
    keys = ["rss_mb", "open_files", "threads", "py_threads", "disk_mb", "step_seconds", "gc_objects"]
    growth = {k: round(slope_per_100(samples, k), 3) for k in keys}
    result = {
        "benchmark": "soak",
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": "python benchmarks/soak.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "cpu": cpu_info(),
        "device": str(device), "dtype": dtype, "torch_threads": __import__("torch").get_num_threads(),
        "python": platform.python_version(),
        "steps": args.steps, "every": args.every, "wall_seconds": round(wall, 1),
        "settings": {"model": "tiny random Llama (h64, 2 layers, vocab 600)", "env": "guess_number",
                     "batch_size": trainer.config.training.batch_size,
                     "group_size": trainer.config.training.group_size,
                     "max_turns": trainer.config.inference.max_turns,
                     "max_tokens": trainer.config.inference.max_tokens,
                     "save_rollouts_every": trainer.config.training.save_rollouts_every,
                     "save_interval": trainer.config.checkpoint.save_interval,
                     "keep_last_n": trainer.config.checkpoint.keep_last_n,
                     "loggers": trainer.config.training.loggers},
        "growth_per_100_steps": growth,
        "growth_fit": "least-squares slope over the second half of the samples, x 100 steps",
        "first": samples[0], "last": samples[-1],
        "samples": samples,
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"\n{args.steps} steps in {wall / 60:.1f} min ({dtype} on {device}); first -> last sample:")
    for k in keys:
        print(f"  {k:13s} {samples[0][k]!s:>10} -> {samples[-1][k]!s:>10}   growth per 100 steps "
              f"(second half): {growth[k]:+.3f}")
    print(f"results: {out}")
    if not args.run_dir:
        shutil.rmtree(run_dir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
