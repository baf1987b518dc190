"""Kernel floors: how much of a later turn and of a GRPO step is matmuls and attention.

    python benchmarks/floors.py --dtype float32                 # both parts, ~6 min on 2 cores
    python benchmarks/floors.py --part turns --episodes 64      # one part, fewer episodes

Two of the CPU speed targets are ratios: a later turn's seconds per generated token within
1.3x of turn 0's (`benchmarks/engines.py`), and a GRPO step at least 3x faster than TRL's
(`benchmarks/update.py`). This script says how far each sits from what the kernels alone
take on this machine. It runs the same work with `torch.profiler` on and sums, by phase,
the self time of the matmul ops (`MATMUL_OPS`: MKL's packed and plain GEMMs) and of the
attention ops (`ATTENTION_OPS`: `scaled_dot_product_attention`'s kernels, forward and
backward). Everything else -- elementwise ops, copies, sampling, Python -- is "other".

- `turns`: benchmarks/engines.py's episodes (guess_number, `--group-size` per seed,
  `--max-tokens` per turn) through the hf engine's lock-step `Rollout`, one profile per
  turn. `floor_vs_turn_0` of turn k: its seconds per token if its "other" time per
  token were turn 0's and its kernels took what they took, over turn 0's seconds per
  token, i.e. 1 + ((mm_k + attn_k) / tokens_k - (mm_0 + attn_0) / tokens_0) / (s_0 / tokens_0).
  What a later turn adds in kernels is the prefill of each row's observation (turn 0
  prefilled one prompt per group) and attention over the grown context. The profiler's
  cost per op inflates turn 0's "other", which lowers this floor: it is a lower bound.
- `grpo`: benchmarks/update.py's step of ours (1 prompt x 8 completions, <= 64 tokens, LoRA
  r=16 all-linear, fp32 weights), `--grpo-steps` steps after two warm-ups. `floor_seconds`
  = the step's matmul + attention seconds; `ceiling_vs_trl` = TRL's step median from
  `--trl-json` (an update.py result of the same machine and dtype) over that floor: the
  ratio to TRL the step would have if nothing but its kernels took time.

The profiled wall times are a little slower than unprofiled ones (the time the profiler
takes to collect a profile afterwards is left out); the kernel seconds are the ops' own. Results go to `benchmarks/results/floors_<dtype>.json`.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other benchmarks (see benchmarks/engines.py)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import load, machine  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
#: Matmul ops by profiler name (self time: `aten::linear`/`aten::matmul` only dispatch to these).
MATMUL_OPS = ("mkl::_mkl_linear", "aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")
#: Attention ops: CPU sdpa runs `_scaled_dot_product_flash_attention_for_cpu` (and its backward).
ATTENTION_OPS = ("scaled_dot_product", "flash_attention")


def kernel_seconds(prof: Any) -> dict[str, float]:
    """Self seconds of the matmul and the attention ops in a finished profile."""
    mm = attn = 0.0
    for ev in prof.key_averages():
        secs = ev.self_cpu_time_total / 1e6
        if ev.key in MATMUL_OPS:
            mm += secs
        elif any(s in ev.key for s in ATTENTION_OPS):
            attn += secs
    return {"matmul_seconds": round(mm, 3), "attention_seconds": round(attn, 3)}


def profiled(fn: Any) -> tuple[Any, float, dict[str, float]]:
    """(fn()'s result, its wall seconds, its kernel seconds) with the profiler on; the
    kernel dict's "profiler_seconds" is the time spent collecting the profile afterwards."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        t0 = time.perf_counter()
        out = fn()
        secs = time.perf_counter() - t0
    kern = kernel_seconds(prof)
    kern["profiler_seconds"] = round(time.perf_counter() - t0 - secs, 3)
    return out, secs, kern


# -- turns ----------------------------------------------------------------------------
def run_turns(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.engines import load_engine, new_rollout, turn_tokens

    # benchmarks/engines.py's settings for its defaults (its --max-context, --temperature, --seed)
    bench = argparse.Namespace(device="cpu", dtype=args.dtype, max_context=2048, seed=0, temperature=1.0,
                               prefix_cache_mb=args.prefix_cache_mb, episodes=args.episodes, turns=args.turns,
                               group_size=args.group_size, max_tokens=args.max_tokens)
    engine, _, _ = load_engine("hf", bench)
    warm_up = new_rollout(engine, argparse.Namespace(**{**vars(bench), "episodes": min(args.episodes, 16),
                                                        "turns": 1}), first_seed=0)
    warm_up.reset()  # the engine's timed decode choice, on other secrets
    warm_up.step()
    r = new_rollout(engine, bench)
    r.reset()
    rows = []
    for k in range(args.turns):
        live = list(r.live)
        context = [r.slots[i].episode.num_tokens for i in live]
        _, secs, kern = profiled(r.step)
        tokens = turn_tokens(r, live, k)
        kern.pop("profiler_seconds")
        other = secs - kern["matmul_seconds"] - kern["attention_seconds"]
        rows.append({"turn": k, "episodes": len(live), "seconds": round(secs, 3), "generated_tokens": tokens,
                     "mean_context_tokens": round(sum(context) / max(len(context), 1), 1), **kern,
                     "other_seconds": round(other, 3), "load": load()})
        print(f"[turns] turn {k}: {secs:.2f}s, {tokens} tokens, matmul {kern['matmul_seconds']:.2f}s, attention "
              f"{kern['attention_seconds']:.2f}s, other {other:.2f}s", flush=True)
    t0 = rows[0]
    per_token0 = t0["seconds"] / t0["generated_tokens"]
    kern0 = (t0["matmul_seconds"] + t0["attention_seconds"]) / t0["generated_tokens"]
    for row in rows:
        per_token = row["seconds"] / row["generated_tokens"]
        kern = (row["matmul_seconds"] + row["attention_seconds"]) / row["generated_tokens"]
        row["seconds_per_token_vs_turn_0"] = round(per_token / per_token0, 2)
        row["floor_vs_turn_0"] = round(1 + (kern - kern0) / per_token0, 2)
    engine.close()
    return {"episodes": args.episodes, "turns": args.turns, "group_size": args.group_size,
            "max_tokens": args.max_tokens, "per_turn": rows}


# -- grpo -----------------------------------------------------------------------------
def run_grpo(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.update import make_trainer

    trainer = make_trainer("cpu", args.dtype)
    phases: dict[str, dict[str, float]] = {}
    collecting: dict[str, float] = {}  # seconds the profiler took to collect each phase's profile
    for name in ("rollout", "update"):  # profile each phase apart: kernel seconds by phase
        original = getattr(trainer, name)

        def wrapped(*a: Any, _f: Any = original, _n: str = name, **kw: Any) -> Any:
            out, secs, kern = profiled(lambda: _f(*a, **kw))
            collecting[_n] = kern.pop("profiler_seconds")
            phases[_n] = {"seconds": round(secs, 3), **kern}
            return out

        setattr(trainer, name, wrapped)
    rows = []
    for i in range(args.grpo_steps + 2):
        t0 = time.perf_counter()
        trainer.train_step()
        secs = time.perf_counter() - t0 - sum(collecting.values())  # the step, less the profiles' collection
        if i < 2:
            continue  # warm-ups: the decode choice, first packs
        kern = sum(p["matmul_seconds"] + p["attention_seconds"] for p in phases.values())
        rows.append({"step_seconds": round(secs, 3), **{f"{n}_{k}": v for n, p in phases.items() for k, v in p.items()},
                     "floor_seconds": round(kern, 3), "load": load()})
        print(f"[grpo] step: {secs:.2f}s; rollout {phases['rollout']} update {phases['update']}", flush=True)
    trainer.cleanup()
    out: dict[str, Any] = {"steps": rows}
    for key in rows[0]:
        out[f"{key}_median"] = round(statistics.median(r[key] for r in rows), 3)
    trl_path = Path(args.trl_json)
    if trl_path.exists():
        trl = json.loads(trl_path.read_text())
        if trl.get("config", {}).get("dtype") == args.dtype and "trl" in trl:
            trl_step = trl["trl"]["step_seconds_median"]
            out["trl_json"] = str(trl_path.relative_to(ROOT) if trl_path.is_relative_to(ROOT) else trl_path)
            out["trl_step_seconds_median"] = trl_step
            out["ceiling_vs_trl"] = round(trl_step / out["floor_seconds_median"], 2)
            out["step_needed_for_3x_trl"] = round(trl_step / 3, 3)
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--part", choices=["both", "turns", "grpo"], default="both")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--episodes", type=int, default=128)
    p.add_argument("--turns", type=int, default=4)
    p.add_argument("--group-size", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prefix-cache-mb", type=float, default=2048.0)
    p.add_argument("--grpo-steps", type=int, default=4)
    p.add_argument("--trl-json", default=str(RESULTS / "update.json"),
                   help="an update.py result with TRL's step on this machine and dtype")
    p.add_argument("--out", default=None, help="default: benchmarks/results/floors_<dtype>.json")
    args = p.parse_args(argv)
    import torch

    torch.set_num_threads(args.threads)
    result: dict[str, Any] = {"benchmark": "floors", "command": "python benchmarks/floors.py " + " ".join(
        sys.argv[1:] if argv is None else argv), "date": time.strftime("%Y-%m-%d"), "dtype": args.dtype,
        "machine": {**machine(), "threads": torch.get_num_threads(), "load_before": load()}}
    if args.part in ("both", "turns"):
        result["turns"] = run_turns(args)
    if args.part in ("both", "grpo"):
        result["grpo"] = run_grpo(args)
    out = Path(args.out or RESULTS / f"floors_{args.dtype}.json")
    out.write_text(json.dumps(result, indent=1) + "\n")
    for row in result.get("turns", {}).get("per_turn", []):
        print(f"turn {row['turn']}: {row['seconds_per_token_vs_turn_0']:.2f}x turn 0's s/token measured (profiled), "
              f"{row['floor_vs_turn_0']:.2f}x with only its kernels' extra time")
    g = result.get("grpo")
    if g:
        print(f"GRPO step {g['step_seconds_median']:.2f}s (profiled), kernels {g['floor_seconds_median']:.2f}s"
              + (f"; TRL {g['trl_step_seconds_median']:.2f}s: ceiling {g['ceiling_vs_trl']:.1f}x" if "ceiling_vs_trl"
                 in g else ""))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
