"""Multi-turn rollout throughput per generation backend, in one run, on the embedded model.

    PYTHONPATH=. .venv/bin/python benchmarks/engines.py --backends hf,vllm --episodes 128 --turns 4

Every backend rolls out the same episodes: `guess_number` with secrets in 1..1,000,000
and a budget of turns + 1 guesses (so every episode lasts all `--turns` turns), the
same environment seeds (`--group-size` episodes per seed, like GRPO), the same
sampling settings and sampling seed, on SmolLM2-135M-Instruct on `--device` in `--dtype`
(both "auto" by default: CUDA and bfloat16 when there is a GPU, else CPU and float32;
vLLM gets the same dtype). Engines are
built by `workbench.engines.make_engine` from a ConfigStore, as the Trainer builds
them (`inference.backend = "hf"` / `"vllm"`).

Modes (`--modes`): `sync` is the lock-step `Rollout` (one batched engine call per
turn); `async` is `AsyncRollout` (each episode submits its next turn as soon as its
environment step is done; vLLM continuous batching / the hf dynamic batcher).

Reported per backend and mode: wall seconds, generated tokens, generated tokens/s,
turns/s; per turn index (sync): seconds, generated tokens, mean context length
(prompt tokens fed to the engine), tokens/s; engine start-up seconds (model load for
hf; vLLM import + engine start + first weight sync for vllm); the engine's prefix
cache hit rate (vllm). Per turn (sync) also `seconds_per_token_vs_turn_0`: a later
turn's seconds per generated token over turn 0's (1.0: as fast per token as the first).
`decode_choice`: the hf engine's timed decode mode and each candidate's step time
(`HFEngine.stats()`'s `decode_*` entries). Results go to `benchmarks/results/engines.json`. The last line
is the headline: generated tokens/s of vllm over hf, both in the lock-step
`Rollout` ("HF batched"): `vllm vs hf: N.Nx`.

Before/after: `--baseline-tree DIR` first runs the hf backend of another checkout
(`DIR/benchmarks/engines.py`, e.g. a worktree of main) with the same arguments, in
its own process, and reports it as backend `hf_baseline` (with that tree's commit)
next to this tree's `hf`, run right after it on the same machine.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from pathlib import Path

# OpenMP threads that spin at barriers are ruinous on a shared machine; must be set before
# torch loads (as in benchmarks/rollout.py and workbench/__init__.py).
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks._common import machine  # noqa: E402

RESULTS = Path(__file__).resolve().parent / "results" / "engines.json"


def make_envs(n: int, turns: int):
    from envs import make_env

    return [make_env("guess_number", low=1, high=1_000_000, max_steps=turns + 1) for _ in range(n)]


def build_engine(backend: str, model, tokenizer, args) -> tuple[object, float]:
    from workbench.config import EMBEDDED_MODEL, ConfigStore
    from workbench.engines import make_engine

    config = ConfigStore()
    config.model.model_name = EMBEDDED_MODEL
    config.model.device, config.model.dtype = args.device, args.dtype
    config.inference.vllm_dtype = args.dtype  # "auto" keeps vLLM's own rule (bfloat16 on GPU, float32 on CPU)
    config.inference.backend = backend
    config.inference.max_context_tokens = args.max_context
    config.inference.seed = args.seed
    config.inference.prefix_cache_mb = args.prefix_cache_mb  # the hf engine's kept KV (vLLM sizes its own)
    config.validate()
    start = time.perf_counter()
    engine = make_engine(config, model, tokenizer)
    return engine, time.perf_counter() - start


def new_rollout(engine, args, first_seed: int = 1000, mode: str = "sync"):
    """The benchmark's `args.episodes` episodes (`args.group_size` per seed from `first_seed`)
    as a `Rollout` (`mode` "sync") or `AsyncRollout` ("async") over `engine`, not reset yet;
    the engine's prefix cache (where it has one to reset) starts empty."""
    from workbench.rollout import AsyncRollout, Rollout

    n_groups = args.episodes // args.group_size
    seeds = [first_seed + g for g in range(n_groups) for _ in range(args.group_size)]
    cls = AsyncRollout if mode == "async" else Rollout
    rollout = cls(engine, make_envs(len(seeds), args.turns), seeds=seeds, max_turns=args.turns,
                  max_tokens=args.max_tokens, temperature=args.temperature, top_p=1.0,
                  max_context_tokens=args.max_context, seed=args.seed)
    if hasattr(engine, "reset_prefix_cache"):
        engine.reset_prefix_cache()  # every run starts cold (same prompts as the previous run)
    return rollout


def turn_tokens(rollout, live: list[int], k: int) -> int:
    """Tokens generated in turn `k` by the episodes at `live` (the rollout's slots)."""
    return sum(rollout.slots[i].episode.turns[k].token_end - rollout.slots[i].episode.turns[k].token_start
               for i in live if len(rollout.slots[i].episode.turns) > k)


def run_mode(engine, mode: str, args, first_seed: int = 1000) -> dict:
    rollout = new_rollout(engine, args, first_seed, mode)
    cls = type(rollout)
    stats0 = engine.stats()
    start = time.perf_counter()
    rollout.reset()
    reset_s = time.perf_counter() - start
    per_turn = []
    if mode == "sync":
        for k in range(args.turns):
            live = rollout.live
            context = [rollout.slots[i].episode.num_tokens for i in live]
            t0 = time.perf_counter()
            rollout.step()
            secs = time.perf_counter() - t0
            tokens = turn_tokens(rollout, live, k)
            per_turn.append({"turn": k, "episodes": len(live), "seconds": round(secs, 3), "generated_tokens": tokens,
                             "mean_context_tokens": round(sum(context) / max(len(context), 1), 1),
                             "tokens_per_s": round(tokens / secs, 1)})
        for row in per_turn:  # seconds per generated token, relative to turn 0's
            row["seconds_per_token_vs_turn_0"] = round(per_turn[0]["tokens_per_s"] / row["tokens_per_s"], 2)
        batch = rollout.batch
    else:
        batch = rollout.run()
        for k in range(args.turns):
            ev = [e for e in rollout.timeline if e.turn == k]
            subs = [e.time for e in ev if e.kind == "submit"]
            gens = [e for e in ev if e.kind == "generated"]
            if not subs or not gens:
                continue
            span = max(e.time for e in gens) - min(subs)
            tokens = sum(e.tokens for e in gens)
            per_turn.append({"turn": k, "episodes": len(gens), "span_seconds": round(span, 3),
                             "generated_tokens": tokens,
                             "mean_context_tokens": round(sum(e.tokens for e in ev if e.kind == "submit") / len(subs), 1)})
    seconds = time.perf_counter() - start
    stats1 = engine.stats()
    generated = sum(ep.response_length for ep in batch)
    turns = sum(ep.num_turns for ep in batch)
    out = {
        "mode": mode, "rollout": cls.__name__, "episodes": len(batch), "turns": turns,
        "all_episodes_full_length": all(ep.num_turns == args.turns for ep in batch),
        "alignment_warnings": sum(len(ep.warnings) for ep in batch),
        "seconds": round(seconds, 2), "reset_seconds": round(reset_s, 2), "generated_tokens": generated,
        "tokens_per_s": round(generated / seconds, 1), "turns_per_s": round(turns / seconds, 2),
        "mean_turn_tokens": round(generated / max(turns, 1), 1),
        "final_mean_context_tokens": round(sum(ep.num_tokens for ep in batch) / len(batch), 1),
        "per_turn": per_turn,
    }
    # the hf engine's timed decode choice (thread count, split or packed products) and step times
    out["decode_choice"] = {k: round(v, 1) for k, v in stats1.items() if k.startswith("decode_")}
    if "cached_prompt_tokens" in stats1:
        prompt = stats1["prompt_tokens"] - stats0.get("prompt_tokens", 0)
        cached = stats1["cached_prompt_tokens"] - stats0.get("cached_prompt_tokens", 0)
        out["prefix_cache_hit_rate"] = round(cached / prompt, 3) if prompt else 0.0
    if "max_running_requests" in stats1 and mode == "async":
        out["max_running_requests"] = stats1["max_running_requests"]
        out["engine_steps"] = stats1["engine_steps"] - stats0.get("engine_steps", 0)
    if "batcher_batches" in stats1 and mode == "async":
        out["batches"] = stats1["batcher_batches"] - stats0.get("batcher_batches", 0)
    return out


def _trim_memory_forever(threshold_gb: float = 2.5, every: float = 5.0) -> None:
    """Give freed heap back to the OS now and then (glibc keeps it otherwise).

    The hf engine allocates and frees KV buffers of hundreds of MB per turn; glibc keeps
    the freed pages, and at 128 episodes x 4 turns the process grew past 8 GB and was
    OOM-killed on the shared machine. `malloc_trim` takes milliseconds.
    """
    import ctypes
    import threading

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:
        return

    def loop() -> None:
        while True:
            time.sleep(every)
            rss_gb = int(open("/proc/self/statm").read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**30
            if rss_gb > threshold_gb:
                libc.malloc_trim(0)

    threading.Thread(target=loop, daemon=True, name="malloc-trim").start()


def load_engine(backend: str, args) -> tuple[object, float, float]:
    """The embedded model on `args.device` in `args.dtype` and the backend's engine over it,
    after one short call (first-call allocations): (engine, model load s, engine start s)."""
    from workbench.config import EMBEDDED_MODEL, resolve_device, resolve_dtype
    from workbench.engines.base import SamplingParams
    from workbench.models import load_model_and_tokenizer

    t0 = time.perf_counter()
    device = resolve_device(args.device, field="--device")
    model, tok = load_model_and_tokenizer(EMBEDDED_MODEL, dtype=resolve_dtype(args.dtype, device, field="--dtype"),
                                          device=device)
    model.eval()
    load_s = time.perf_counter() - t0
    engine, start_s = build_engine(backend, model, tok, args)
    warm = tok.apply_chat_template([{"role": "user", "content": "Hi"}], add_generation_prompt=True,
                                   return_dict=False)
    engine.generate_ids([list(warm)] * 2, SamplingParams(max_tokens=4))  # first-call allocations
    return engine, load_s, start_s


def run_backend(backend: str, args) -> dict:
    """Load the model, build the backend's engine, run every mode (in this process)."""
    import torch

    if args.threads:
        torch.set_num_threads(args.threads)
    _trim_memory_forever()
    engine, load_s, start_s = load_engine(backend, args)
    startup = start_s + (load_s if backend == "hf" else 0.0)
    warm_args = argparse.Namespace(**{**vars(args), "episodes": min(args.episodes, 16), "turns": 1,
                                      "group_size": min(args.episodes, 16)})
    run_mode(engine, "sync", warm_args, first_seed=0)  # warm-up rollout on other secrets (not reported)
    entry = {"engine_start_seconds": round(startup, 1), "model_load_seconds": round(load_s, 1),
             "torch_threads": torch.get_num_threads(), "modes": {}}
    if backend == "vllm":
        entry["vllm_engine_startup_seconds"] = round(getattr(engine, "startup_seconds", 0.0), 1)
    print(f"[{backend}] model loaded in {load_s:.1f}s, engine ready in {startup:.1f}s "
          f"(torch threads {torch.get_num_threads()})", flush=True)
    for mode in [m.strip() for m in args.modes.split(",") if m.strip()]:
        load = os.getloadavg()[0]
        r = run_mode(engine, mode, args)
        r["load_average_before"] = round(load, 2)
        entry["modes"][mode] = r
        print(f"[{backend}/{mode}] {r['episodes']} episodes x {args.turns} turns: {r['seconds']:.1f}s, "
              f"{r['generated_tokens']} tokens, {r['tokens_per_s']:.1f} tok/s, {r['turns_per_s']:.2f} turns/s"
              + (f", prefix cache hit {r['prefix_cache_hit_rate']:.0%}" if "prefix_cache_hit_rate" in r else "")
              + f" (load {load:.1f})", flush=True)
        for row in r["per_turn"]:
            secs = row.get("seconds", row.get("span_seconds"))
            rate = (f", {row['tokens_per_s']:.1f} tok/s ({row['seconds_per_token_vs_turn_0']:.2f}x turn 0's "
                    f"s/token)" if "seconds_per_token_vs_turn_0" in row else "")
            print(f"    turn {row['turn']}: {secs:.2f}s, {row['generated_tokens']} tokens, "
                  f"mean context {row['mean_context_tokens']:.0f}{rate}", flush=True)
    engine.close()
    return entry


def _cpu_flags() -> list[str]:
    """The vector-instruction flags that decide fp32/bf16 speed (avx2, avx512*, amx*)."""
    return [f for f in machine()["flags"] if f.startswith(("avx2", "avx512", "amx"))]


def _strip_option(argv: list[str], name: str) -> list[str]:
    """argv without `name VALUE` / `name=VALUE`."""
    out, skip = [], False
    for a in argv:
        if skip:
            skip = False
        elif a == name:
            skip = True
        elif not a.startswith(name + "="):
            out.append(a)
    return out


def main() -> None:
    from workbench.config import InferenceConfig

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--backends", default="hf,vllm")
    ap.add_argument("--modes", default="sync,async", help="sync (Rollout), async (AsyncRollout)")
    ap.add_argument("--episodes", type=int, default=128)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--group-size", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=32)
    ap.add_argument("--max-context", type=int, default=2048)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--prefix-cache-mb", type=float, default=InferenceConfig.prefix_cache_mb,
                    help="inference.prefix_cache_mb: the hf engine's kept KV of finished rows "
                         f"(default {InferenceConfig.prefix_cache_mb:g}, the config's)")
    ap.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    ap.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                    help='model weights (hf) and vLLM dtype; "auto": bfloat16 on CUDA, and for hf also on CPUs '
                         'with bf16 instructions; vLLM on CPU float32')
    ap.add_argument("--threads", type=int, default=2,
                    help="torch threads of the process, i.e. of hf generation (0: torch's default); with "
                         "OMP_WAIT_POLICY=PASSIVE 2 threads beat 1 by ~15%% for hf on 2 cores. vLLM generates "
                         "with its engine's own setting (generate_threads=1)")
    ap.add_argument("--baseline-tree", default=None,
                    help="another checkout (e.g. a worktree of main): its hf backend runs first, with the same "
                         "arguments, reported as backend hf_baseline (before/after in one run)")
    ap.add_argument("--out", default=str(RESULTS))
    ap.add_argument("--child", help=argparse.SUPPRESS)  # internal: run one backend, write JSON to --out
    args = ap.parse_args()
    if args.episodes % args.group_size:
        ap.error("--episodes must be a multiple of --group-size")
    if args.child:
        Path(args.out).write_text(json.dumps(run_backend(args.child, args)))
        return

    import subprocess
    import tempfile

    import torch

    from workbench.config import resolve_device, resolve_dtype

    device = resolve_device(args.device, field="--device")
    dtype_name = str(resolve_dtype(args.dtype, device, field="--dtype")).removeprefix("torch.")
    load_before = os.getloadavg()
    print(f"{args.episodes} episodes x {args.turns} turns per backend; load average {load_before[0]:.1f} on "
          f"{os.cpu_count()} cores", flush=True)
    results: dict = {}
    runs = [(b.strip(), b.strip(), Path(__file__).resolve()) for b in args.backends.split(",") if b.strip()]
    baseline_commit = None
    if args.baseline_tree:
        tree = Path(args.baseline_tree).resolve()
        baseline_commit = subprocess.run(["git", "-C", str(tree), "rev-parse", "HEAD"], capture_output=True,
                                         text=True).stdout.strip()
        runs.insert(0, ("hf_baseline", "hf", tree / "benchmarks" / "engines.py"))
    for label, backend, script in runs:
        # One process per backend: memory is returned in between, and vLLM's process-wide
        # settings (threads, NUMA binding) cannot touch the hf measurement.
        with tempfile.TemporaryDirectory() as tmp:
            part = Path(tmp) / f"{label}.json"
            argv = _strip_option(sys.argv[1:], "--baseline-tree")
            cmd = [sys.executable, str(script), *argv, "--child", backend, "--out", str(part)]
            env = {**os.environ, "PYTHONPATH": str(script.parents[1])}  # that tree's workbench package
            if label != backend:
                print(f"[{label}] the hf backend of {script.parents[1]} (commit {baseline_commit})", flush=True)
            done = subprocess.run(cmd, env=env)
            if done.returncode != 0 or not part.exists():
                print(f"[{label}] failed (exit code {done.returncode})", flush=True)
                continue
            results[label] = json.loads(part.read_text())
            if label != backend:
                results[label]["tree"], results[label]["commit"] = str(script.parents[1]), baseline_commit

    load_after = os.getloadavg()
    ratios = {}
    if "hf" in results and "vllm" in results:
        for mode in results["vllm"]["modes"]:
            if mode in results["hf"]["modes"]:
                ratios[mode] = results["vllm"]["modes"][mode]["tokens_per_s"] / results["hf"]["modes"][mode]["tokens_per_s"]
        if "async" in results["vllm"]["modes"] and "sync" in results["hf"]["modes"]:
            ratios["vllm_async_vs_hf_sync"] = (results["vllm"]["modes"]["async"]["tokens_per_s"]
                                               / results["hf"]["modes"]["sync"]["tokens_per_s"])
    speedups = {}  # this tree's hf over the baseline tree's, per mode (tokens/s)
    if "hf" in results and "hf_baseline" in results:
        for mode, r in results["hf"]["modes"].items():
            if mode in results["hf_baseline"]["modes"]:
                speedups[mode] = r["tokens_per_s"] / results["hf_baseline"]["modes"][mode]["tokens_per_s"]
    rows = []
    for backend, entry in results.items():
        for mode, r in entry["modes"].items():
            rows.append({"backend": backend, "rollout": r["rollout"], "episodes x turns": f"{r['episodes']} x {args.turns}",
                         "seconds": r["seconds"], "generated tokens": r["generated_tokens"],
                         "tokens/s": r["tokens_per_s"], "turns/s": r["turns_per_s"],
                         "engine start s": entry["engine_start_seconds"],
                         "prefix cache hit": r.get("prefix_cache_hit_rate", "-")})
    report = {
        "benchmark": "engines",
        "title": f"Multi-turn rollout throughput per backend (SmolLM2-135M-Instruct, {dtype_name}, {device.type.upper()})",
        "command": "python benchmarks/engines.py " + " ".join(sys.argv[1:]),
        "settings": {"episodes": args.episodes, "turns": args.turns, "group_size": args.group_size,
                     "max_tokens": args.max_tokens, "temperature": args.temperature, "seed": args.seed,
                     "env": "guess_number low=1 high=1000000 max_steps=turns+1", "dtype": dtype_name,
                     "device": str(device),
                     "max_context_tokens": args.max_context, "hf_prefix_cache_mb": args.prefix_cache_mb},
        "machine": {"cpu": machine()["cpu"], "cpu_flags": _cpu_flags(), "cpus": os.cpu_count(),
                    "torch_threads": args.threads or torch.get_num_threads(),
                    "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                    # the vector ISA torch's kernels run (ATEN_CPU_CAPABILITY can lower it), and
                    # the ISA caps set for ATen / oneDNN / MKL (e.g. an AVX2-only CPU emulated)
                    "torch_cpu_capability": torch.backends.cpu.get_cpu_capability(),
                    "isa_env": {k: os.environ[k] for k in ("ATEN_CPU_CAPABILITY", "ONEDNN_MAX_CPU_ISA",
                                                           "MKL_ENABLE_INSTRUCTIONS") if k in os.environ},
                    "load_average_before": round(load_before[0], 2), "load_average_after": round(load_after[0], 2),
                    "platform": platform.platform(), "python": platform.python_version(),
                    "torch": torch.__version__},
        "results": results,
        "ratios_vllm_over_hf_tokens_per_s": {k: round(v, 2) for k, v in ratios.items()},
        "ratios_hf_over_hf_baseline_tokens_per_s": {k: round(v, 2) for k, v in speedups.items()},
        "rows": rows,
    }
    try:
        import vllm

        report["machine"]["vllm"] = vllm.__version__
    except ImportError:
        pass
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(report, indent=1) + "\n")
    print(f"wrote {out}")
    for k, v in speedups.items():
        print(f"hf vs hf_baseline ({k}): {v:.2f}x")
    for k, v in ratios.items():
        if k != "sync":
            print(f"vllm vs hf ({k}): {v:.1f}x")
    if "sync" in ratios:
        print(f"vllm vs hf: {ratios['sync']:.1f}x")
    elif ratios:
        print(f"vllm vs hf: {next(iter(ratios.values())):.1f}x")


if __name__ == "__main__":
    main()
