"""Rollout throughput: the seeds' one-at-a-time harness vs our batched `Rollout`.

    python benchmarks/rollout.py [--episodes 32 --turns 3 --max-tokens 48 --env guess_number
                                  --model smollm2-135m-instruct --device auto --dtype auto]

Both run in this process on the same model weights, the same environments and seeds
(guess_number with high=64 by default), and the same sampling settings (temperature,
top_p, max new tokens per turn). Every episode takes exactly `--turns` turns: an
environment that ends earlier (a lucky guess) is restarted by `MinTurns` and play goes on.

* seed harness (`benchmarks/seed_harness.py`): one episode at a time, the context string
  rebuilt and re-encoded every turn, HF `generate` on one string prompt per turn;
* `Rollout` + `HFEngine`: all episodes advance together, one batched generate per turn,
  token-exact chat deltas.

The machine is shared, so its speed drifts: `Rollout` runs once before and once after the
seed harness (same seeds, so the same tokens) and its time is the sum of both runs
over twice the tokens, bracketing the baseline's time window.

Prints tokens generated, wall time and tokens/s for each, and last the line
`speedup vs seed harness: N.Nx`: the ratio of wall time for the same job (the same
episodes, seeds and turn count). Tokens/s is printed too, but it flatters the seed
harness: it continues raw text without a chat template or stop token, so each of its
turns runs the full max_tokens while ours stop at end-of-turn. Writes benchmarks/results/rollout.json.
"""
from __future__ import annotations

import os

# Threads that spin-wait at OpenMP barriers are ruinous on a shared 2-core machine
# (measured: 2 threads with the default policy were ~15x slower than 1 thread under
# load); must be set before torch is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import torch  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.seed_harness import MultiTurnChatHarness, SeedInferenceEngine  # noqa: E402
from envs import make_env  # noqa: E402
from workbench.config import DTYPES, resolve_device, resolve_dtype  # noqa: E402
from workbench.engines.hf import HFEngine  # noqa: E402
from workbench.models import load_model_and_tokenizer  # noqa: E402
from workbench.rollout import Rollout  # noqa: E402

DEFAULT_ENV_PARAMS = {"guess_number": {"high": 64}}


class MinTurns:
    """Benchmark wrapper: an episode lasts at least `min_turns` steps.

    When the wrapped environment ends earlier, it is reset (its rng goes on, so the
    restart is the same in both harnesses) and the episode continues.
    """

    def __init__(self, env, min_turns: int):
        self.env, self.min_turns, self.turns, self.restarts = env, min_turns, 0, 0

    def __getattr__(self, name):  # prompt prefix, action_parser, tools, max_steps, ...
        return getattr(self.env, name)

    def reset(self, seed=None):
        self.turns = 0
        return self.env.reset(seed=seed) if seed is not None else self.env.reset()

    def step(self, action):
        obs, reward, done, info = self.env.step(action)
        self.turns += 1
        if done and self.turns < self.min_turns:
            self.env.reset()
            self.restarts += 1
            done, info = False, {**info, "restarted": True}
        return obs, reward, done, info

    def is_done(self):
        return self.env.is_done()


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--episodes", type=int, default=32)
    p.add_argument("--turns", type=int, default=3, help="max turns per episode (both harnesses)")
    p.add_argument("--max-tokens", type=int, default=48, help="max new tokens per turn")
    p.add_argument("--env", default="guess_number")
    p.add_argument("--env-params", default=None, help='JSON dict, default {"high": 64} for guess_number')
    p.add_argument("--model", default="smollm2-135m-instruct")
    p.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help='"auto": bfloat16 on CUDA and on CPUs with bf16 instructions, else float32')
    p.add_argument("--temperature", type=float, default=0.7, help="the seed harness's default")
    p.add_argument("--top-p", type=float, default=0.9, help="the seed harness's default")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0, help="first environment seed")
    p.add_argument("--out", default=str(ROOT / "benchmarks" / "results" / "rollout.json"))
    return p.parse_args(argv)


def load_avg() -> list[float]:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return []


def run_seed_harness(model, tok, args, env_params, seeds) -> dict:
    engine = SeedInferenceEngine(model, tok)
    engine.generate(["warm-up"], max_new_tokens=2, temperature=args.temperature, top_p=args.top_p)
    engine.generated_tokens = engine.prompt_tokens = engine.calls = 0
    torch.manual_seed(args.seed)
    t0 = time.perf_counter()
    trajectories = []
    for s in seeds:
        env = MinTurns(make_env(args.env, seed=s, **env_params), args.turns)  # config seed = reset(seed=s)
        harness = MultiTurnChatHarness(engine, env, max_turns=args.turns, max_new_tokens=args.max_tokens,
                                       temperature=args.temperature, top_p=args.top_p)
        trajectories.append(harness.run_episode(env.get_prompt_prefix()))
    wall = time.perf_counter() - t0
    turns = [t["num_turns"] for t in trajectories]
    return {
        "episodes": len(trajectories), "turns_total": sum(turns), "turns_min": min(turns),
        "turns_mean": sum(turns) / len(turns), "generated_tokens": engine.generated_tokens,
        "prompt_tokens": engine.prompt_tokens, "generate_calls": engine.calls, "wall_s": wall,
        "tokens_per_s": engine.generated_tokens / wall, "episodes_per_s": len(trajectories) / wall,
        "mean_reward": sum(t["total_reward"] for t in trajectories) / len(trajectories),
    }


def run_rollout(model, tok, args, env_params, seeds) -> dict:
    engine = HFEngine(model, tok)
    from workbench.engines.base import SamplingParams

    engine.generate_ids([[1, 2, 3]], SamplingParams(max_tokens=2))  # warm-up
    before = engine.stats().get("generated_tokens", 0)
    t0 = time.perf_counter()
    rollout = Rollout(engine, [MinTurns(make_env(args.env, **env_params), args.turns) for _ in seeds], seeds=seeds,
                      max_turns=args.turns, max_tokens=args.max_tokens, temperature=args.temperature,
                      top_p=args.top_p, seed=args.seed, max_context_tokens=4096)
    batch = rollout.run()
    wall = time.perf_counter() - t0
    generated = sum(e.response_length for e in batch)
    assert generated == engine.stats()["generated_tokens"] - before
    turns = [e.num_turns for e in batch]
    return {
        "episodes": len(batch), "turns_total": sum(turns), "turns_min": min(turns),
        "turns_mean": sum(turns) / len(turns), "generated_tokens": generated,
        "prompt_tokens": engine.stats()["prompt_tokens"], "wall_s": wall,
        "tokens_per_s": generated / wall, "episodes_per_s": len(batch) / wall,
        "mean_reward": batch.summary()["reward/mean"],
        "alignment_warnings": sum(len(e.warnings) for e in batch),
        "errors": sum(e.error is not None for e in batch),
    }


def show(name: str, r: dict) -> None:
    print(f"{name:>14}: {r['episodes']} episodes, {r['turns_total']} turns (min {r['turns_min']}, "
          f"mean {r['turns_mean']:.2f}), {r['generated_tokens']} tokens generated in {r['wall_s']:.1f} s "
          f"= {r['tokens_per_s']:.1f} tok/s ({r['episodes_per_s'] * 60:.1f} episodes/min)")


def main(argv=None) -> dict:
    args = parse_args(argv)
    torch.set_num_threads(args.threads)
    env_params = json.loads(args.env_params) if args.env_params else DEFAULT_ENV_PARAMS.get(args.env, {})
    seeds = list(range(args.seed, args.seed + args.episodes))
    device = resolve_device(args.device, field="--device")
    dtype = resolve_dtype(args.dtype, device, field="--dtype")
    model, tok = load_model_and_tokenizer(args.model, dtype=dtype, device=device)
    print(f"model {args.model} ({str(dtype).removeprefix('torch.')} on {device}), env {args.env} {env_params}, {args.episodes} episodes x "
          f"<= {args.turns} turns x <= {args.max_tokens} tokens, temperature {args.temperature}, "
          f"top_p {args.top_p}, torch threads {torch.get_num_threads()}, OMP_WAIT_POLICY="
          f"{os.environ.get('OMP_WAIT_POLICY')}, load average {load_avg()}", flush=True)
    load_before = load_avg()
    first = run_rollout(model, tok, args, env_params, seeds)
    show("Rollout run 1", first)
    load_mid1 = load_avg()
    seed = run_seed_harness(model, tok, args, env_params, seeds)
    show("seed harness", seed)
    load_mid = load_avg()
    second = run_rollout(model, tok, args, env_params, seeds)
    show("Rollout run 2", second)
    load_after = load_avg()
    assert first["generated_tokens"] == second["generated_tokens"], "seeded rollouts should repeat exactly"
    ours = dict(second)
    ours["wall_s"] = (first["wall_s"] + second["wall_s"]) / 2
    ours["tokens_per_s"] = ours["generated_tokens"] / ours["wall_s"]
    ours["episodes_per_s"] = ours["episodes"] / ours["wall_s"]
    ours["runs_wall_s"] = [first["wall_s"], second["wall_s"]]
    show("Rollout (hf)", ours)
    speedup = ours["tokens_per_s"] / seed["tokens_per_s"]
    result = {
        "args": vars(args), "env_params": env_params, "seed_harness": seed, "rollout_hf": ours,
        "speedup_tokens_per_s": speedup,
        "speedup_wall_per_episode": (seed["wall_s"] / seed["episodes"]) / (ours["wall_s"] / ours["episodes"]),
        "load_average": {"before": load_before, "after_rollout_1": load_mid1, "after_seed_harness": load_mid,
                         "after": load_after},
        "device": str(device), "dtype": str(dtype).removeprefix("torch."),
        "torch": torch.__version__, "threads": torch.get_num_threads(), "cpu_count": os.cpu_count(),
        "python": platform.python_version(), "time": time.strftime("%Y-%m-%d %H:%M:%S"),
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"load average (1/5/15 min) before / after rollout 1 / after seed harness / after rollout 2: "
          f"{load_before} / {load_mid1} / {load_mid} / {load_after}; wrote {out}")
    print(f"tokens/s ratio (seed harness generates more tokens per turn): {speedup:.1f}x")
    print(f"speedup vs seed harness: {result['speedup_wall_per_episode']:.1f}x")
    return result


if __name__ == "__main__":
    main()
