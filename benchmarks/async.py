"""GRPO step wall time, synchronous vs `training.max_staleness=1` (or `--max-staleness K`), in one process or on Ray.

    python benchmarks/async.py                      # both settings, 2 rounds x 4 steps per side
    python benchmarks/async.py --settings slow_env --rounds 3 --steps 5
    python benchmarks/async.py --ray                # 1 rollout worker + 1 learner (Ray, local)

Both sides train the embedded model (SmolLM2-135M-Instruct) with the demo's GRPO settings
(`workbench.cli.demo.demo_config` without its SFT warm-up and strict format: LoRA GRPO on
guess_number, 1..8, 4 turns of at most 8 tokens, batch 16 in groups of 8, lr 5e-4, dtype
"auto") through `Trainer.fit`, in two settings:

  * demo: the demo's environment as it is (its `step` takes microseconds).
  * slow_env: the same environment whose `step` first sleeps 0.3 s, as a remote sandbox,
    a web tool or an OpenEnv server does. The rollout is the demo's (`Rollout`: each turn,
    the live episodes generate in one batch, then step their environments one after
    another), so a step waits up to 16 x 4 x 0.3 s on the environment with the cores idle.
    `--env-async-rollout` runs `inference.async_rollout=True` instead (the episodes'
    environment steps wait side by side, as against a server with room for all of them).

The sides alternate, `--rounds` times each, in one process: sync `fit(steps)`, then
staleness-1 `fit(steps)` (two trainers with the same initial weights). With `--ray`
(`ray.use_ray`, 1 rollout worker + 1 learner on a local Ray cluster, with Ray's CPU
reservations at their defaults, `ray.num_cpus_per_actor`) each round builds the side's trainer, fits and shuts its Ray actors
down again, so only one side's actors hold the cores at a time. A step's wall time
is the time between the ends of consecutive steps (a `fit` callback), so for the async
side it includes waiting for the batch sampled ahead; the first step of every `fit` is
left out of the medians (the async side samples it synchronously). Reported per setting:
median step seconds per side, the median rollout and update seconds of each side (the
stages' own timers: `perf/rollout_seconds`, `perf/update_seconds`), the ratio and
`speedup vs sync: N.Nx` (sync / async), and
the overlap: per async step, the seconds the rollout thread sampled the step's batch
while the previous step's advantages and update ran (`async/overlap_seconds`), over the
step's wall time (median).

Threads: the rollout thread samples on `training.async_rollout_threads` (1) torch threads,
the update on the process's count (torch's default: one per core); `OMP_WAIT_POLICY` is
PASSIVE as in the other benchmarks. The machine's load (`uptime`) is recorded before and
after each setting: other processes share its cores, so figures from a loaded machine say
so. Results: `benchmarks/results/async.json`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/learning.py
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("HF_HUB_OFFLINE", "1")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import load, machine_line  # noqa: E402

import torch  # noqa: E402

from envs.guess_number import GuessNumberEnv  # noqa: E402
from workbench import Trainer  # noqa: E402
from workbench.cli.demo import demo_config  # noqa: E402
from workbench.config import EMBEDDED_MODEL  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
STEP_SLEEP = 0.3


class SlowGuessNumber(GuessNumberEnv):
    """guess_number whose `step` waits `STEP_SLEEP` seconds first (a remote environment)."""

    def step(self, action: str):
        time.sleep(STEP_SLEEP)
        return super().step(action)


def make_trainer(setting: str, staleness: int, out: Path, args: argparse.Namespace) -> Trainer:
    """The side's trainer: the demo's GRPO settings, `staleness`, in `setting`."""
    ns = argparse.Namespace(model=args.model, device=args.device, dtype=args.dtype)
    # GRPO steps only: without the demo's SFT warm-up (its steps sample nothing) and strict format,
    # so every timed step is a rollout + update of the same kind on both sides.
    cfg = demo_config(ns, out, remedies=False)
    cfg.checkpoint.save_interval = 0
    cfg.training.progress = False
    cfg.training.max_staleness = staleness
    cfg.training.save_rollouts_every = 0
    if args.ray:
        cfg.ray.use_ray, cfg.ray.num_actors, cfg.ray.num_learners = True, 1, 1
    env = None
    if setting == "slow_env":
        cfg.inference.async_rollout = args.env_async_rollout
        env = SlowGuessNumber(cfg.environment)
    torch.manual_seed(0)
    return Trainer(cfg.validate(), environment=env)


def timed_fit(trainer: Trainer, steps: int) -> tuple[list[float], list[float], list[dict]]:
    """Wall seconds of each step after the first, each one's overlap share, and its metrics."""
    ends: list[float] = []
    rows: list[dict] = []

    def mark(tr: Trainer, metrics: dict) -> None:
        ends.append(time.perf_counter())
        rows.append(metrics)

    trainer.fit(steps=steps, callbacks=[mark])
    walls = [b - a for a, b in zip(ends, ends[1:])]
    overlap = [float(m.get("async/overlap_seconds", 0.0)) / w for m, w in zip(rows[1:], walls)]
    return walls, overlap, rows[1:]


def run_setting(setting: str, args: argparse.Namespace) -> dict[str, Any]:
    before = load()
    with tempfile.TemporaryDirectory() as tmp:
        # One process: both trainers live through all rounds. Ray: a side's trainer (and its
        # actors) exists only for its own fit, so the two sides' actors never share the cores.
        sides = {k: None if args.ray else make_trainer(setting, k, Path(tmp) / f"s{k}", args)
                 for k in (0, args.max_staleness)}
        walls: dict[int, list[float]] = {k: [] for k in sides}
        shares: list[float] = []
        stages: dict[int, dict[str, list[float]]] = {k: {"rollout": [], "update": []} for k in sides}
        for r in range(args.rounds):
            for k in sides:
                trainer = sides[k] or make_trainer(setting, k, Path(tmp) / f"s{k}_r{r}", args)
                w, o, rows = timed_fit(trainer, args.steps)
                if sides[k] is None:
                    trainer.cleanup()
                walls[k] += w
                stages[k]["rollout"] += [m["perf/rollout_seconds"] for m in rows]
                stages[k]["update"] += [m.get("perf/update_seconds", 0.0) for m in rows]
                if k:
                    shares += o
                print(f"  {setting} round {r} staleness {k}: steps {[round(x, 2) for x in w]}", flush=True)
        for trainer in sides.values():
            if trainer is not None:
                trainer.cleanup()
    k = args.max_staleness
    sync, asy = statistics.median(walls[0]), statistics.median(walls[k])
    return {"setting": setting, "sync_step_s": sync, "async_step_s": asy, "ratio": asy / sync,
            "speedup": sync / asy, "overlap_share": statistics.median(shares),
            "rollout_s": {k: statistics.median(v["rollout"]) for k, v in stages.items()},
            "update_s": {k: statistics.median(v["update"]) for k, v in stages.items()}, "sync_steps": walls[0],
            "async_steps": walls[k], "max_staleness": k, "load_before": before, "load_after": load()}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--settings", default="demo,slow_env")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--steps", type=int, default=4, help="steps per fit (the first is not timed)")
    p.add_argument("--model", default=EMBEDDED_MODEL)
    p.add_argument("--device", default="auto")
    p.add_argument("--dtype", default="auto")
    p.add_argument("--env-async-rollout", action="store_true",
                   help="slow_env with inference.async_rollout=True (environment waits side by side)")
    p.add_argument("--max-staleness", type=int, default=1,
                   help="training.max_staleness of the asynchronous side (default 1; the other side is 0)")
    p.add_argument("--ray", action="store_true",
                   help="ray.use_ray: 1 rollout worker + 1 learner on a local Ray cluster (default: one process)")
    p.add_argument("--out", default=None, help="results JSON (default benchmarks/results/async.json, "
                                               "async_ray.json with --ray)")
    args = p.parse_args()
    if args.max_staleness < 1:
        p.error(f"--max-staleness must be >= 1 (the asynchronous side), got {args.max_staleness}")
    if args.out is None:
        args.out = str(RESULTS / ("async_ray.json" if args.ray else "async.json"))
    record = {"date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine_line(),
              "torch_threads": torch.get_num_threads(), "dtype": args.dtype,
              "env_async_rollout": args.env_async_rollout,
              "path": "ray: 1 rollout worker + 1 learner" if args.ray else "one process",
              "command": "python benchmarks/async.py " + " ".join(sys.argv[1:]), "results": []}
    print(f"{record['date']}  {record['machine']}  torch threads {record['torch_threads']}", flush=True)
    for setting in args.settings.split(","):
        res = run_setting(setting, args)
        record["results"].append(res)
        print(f"{setting}: sync {res['sync_step_s']:.2f} s/step, staleness {res['max_staleness']} {res['async_step_s']:.2f} s/step "
              f"({res['ratio']:.2f}x the sync time), overlap {res['overlap_share']:.0%} of the step; rollout "
              f"{res['rollout_s'][0]:.1f} / {res['rollout_s'][res['max_staleness']]:.1f} s, update "
              f"{res['update_s'][0]:.1f} / {res['update_s'][res['max_staleness']]:.1f} s (sync / async); "
              f"load {res['load_before']} -> {res['load_after']}", flush=True)
        print(f"{setting} ({record['path']}): speedup vs sync: {res['speedup']:.1f}x", flush=True)
    Path(args.out).write_text(json.dumps(record, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
