"""Importing a large verl run and diagnosing it: wall time and peak memory, each in a process of its own.

    python benchmarks/import_scale.py                    # 200 steps x 512 rollouts, ~2,000 characters each
    python benchmarks/import_scale.py --steps 20 --keep /tmp/verl_scale

1. verl 0.9.1's own writer (`RayPPOTrainer._write_generations`, from `make peers`) writes the dump:
   `--steps` files of `--rows` rollouts (64 prompts x 8 a step), each reply about `--chars`
   characters: a random window of a text of words drawn from a 2,000-word vocabulary (fixed
   seed), "acc" and "pred" extra infos,
   and a `file`-logger metrics line per step.
2. `python -m workbench import DUMP --output RUN` (read, grouped, written as a run folder).
3. `python -m workbench diagnose RUN` (every check over every step's batch).
4. `diagnose` on the dump in place (`load_run(DUMP)`, nothing written).

Each of 2-4 runs in a fresh Python process on `--threads` torch threads (default 2); its wall
time and peak resident memory (`ru_maxrss` of that process) are printed with the machine, and
the JSON goes to benchmarks/results/import_scale.json. The budgets of issue 51: import under
60 s, diagnose under 20 s, memory under 4 GB, on 2 cores.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import load, machine, machine_line  # noqa: E402

PEER = Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "workbench")).expanduser() / "pkgs" / "verl-0.9.1"
WRITER = r'''
import json, random, sys
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
from verl.utils.tracking import FileLogger
steps, rows, chars, out = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
rng = random.Random(0)
vocab = ["w%d" % i for i in range(2000)]
text = " ".join(rng.choices(vocab, k=600000))  # each reply: a random window of it, whole words
import os
os.environ["VERL_FILE_LOGGER_PATH"] = out + "/metrics.jsonl"
logger = FileLogger("bench", "scale")
for step in range(1, steps + 1):
    inputs, outputs, gts, scores, acc = [], [], [], [], []
    for i in range(rows):
        q = i // 8
        inputs.append("system\nSolve it.\nuser\nQuestion %d of step %d: add the numbers.\nassistant\n" % (q, step))
        start = text.index(" ", rng.randrange(len(text) - 2 * chars)) + 1
        outputs.append(text[start:text.rindex(" ", start, start + chars + 8)])
        right = rng.random() < 0.3
        gts.append(str(q)); scores.append(float(right)); acc.append(right)
    RayPPOTrainer._write_generations(inputs, outputs, gts, scores, {"acc": acc, "pred": gts}, out + "/rollout", step)
    logger.log(data={"critic/score/mean": sum(scores) / rows, "actor/entropy": 1.0, "response_length/mean": 500.0},
               step=step)
logger.finish()
'''
PHASE = r'''
import json, resource, sys, time
import torch
torch.set_num_threads(int(sys.argv[1]))
t0 = time.perf_counter()
what = sys.argv[2]
if what == "import":
    from workbench.importers import open_source
    from workbench.importers.write import write_run
    report = write_run(open_source(sys.argv[3]), sys.argv[4])
    extra = {"episodes": report["episodes"], "steps": report["steps"]}
else:
    from workbench.debug import diagnose, load_run
    findings = diagnose(load_run(sys.argv[3]))
    extra = {"findings": [f.name for f in findings], "not_checked": len(findings.not_checked)}
seconds = time.perf_counter() - t0
print(json.dumps({"seconds": seconds, "peak_rss_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, **extra}))
'''


def phase(name: str, threads: int, *args: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": str(threads), "HF_HUB_OFFLINE": "1",
           "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", PHASE, str(threads), name, *args], env=env, capture_output=True,
                          text=True)
    if done.returncode:
        raise SystemExit(f"{name} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=200)
    ap.add_argument("--rows", type=int, default=512)
    ap.add_argument("--chars", type=int, default=2000)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--keep", default=None, help="write the dump and the run here and keep them")
    args = ap.parse_args()
    if not (PEER / "verl").is_dir():
        raise SystemExit(f"verl 0.9.1 is not in {PEER}: run `make peers` (its writer writes the dump)")
    work = Path(args.keep) if args.keep else Path(tempfile.mkdtemp(prefix="import_scale_"))
    dump, run = work / "verl_dump", work / "run"
    shutil.rmtree(dump, ignore_errors=True)
    shutil.rmtree(run, ignore_errors=True)
    dump.mkdir(parents=True)
    start_load = load()
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", WRITER, str(args.steps), str(args.rows), str(args.chars), str(dump)],
                   env={**os.environ, "PYTHONPATH": str(PEER)}, check=True, capture_output=True)
    written = time.perf_counter() - t0
    size = sum(p.stat().st_size for p in (dump / "rollout").iterdir()) / 2**20
    results = {"import": phase("import", args.threads, str(dump), str(run)),
               "diagnose": phase("diagnose", args.threads, str(run)),
               "diagnose_in_place": phase("diagnose", args.threads, str(dump))}
    out = {"machine": machine(), "load_start": start_load, "load_end": load(), "threads": args.threads,
           "steps": args.steps, "rows": args.rows, "chars": args.chars, "dump_mib": round(size, 1),
           "verl_writer_seconds": round(written, 1), **results}
    print(f"machine: {machine_line()}; torch threads {args.threads}; load {start_load} -> {out['load_end']}")
    print(f"dump: {args.steps} steps x {args.rows} rollouts x ~{args.chars} chars = {size:.0f} MiB "
          f"(verl's writer: {written:.0f} s)")
    for name, r in results.items():
        print(f"{name:18s} {r['seconds']:6.1f} s   peak RSS {r['peak_rss_gb']:.2f} GB   "
              + ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("seconds", "peak_rss_gb")))
    (ROOT / "benchmarks" / "results").mkdir(exist_ok=True)
    (ROOT / "benchmarks" / "results" / "import_scale.json").write_text(json.dumps(out, indent=1))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
