"""Learning benchmark: does LoRA GRPO / PPO raise held-out success within a time budget?

    python benchmarks/learning.py                      # both algos, 30 min of training each
    python benchmarks/learning.py --algo grpo --minutes 30
    python benchmarks/learning.py --algo ppo --minutes 30 --env guess_number
    python benchmarks/learning.py --device cuda --dtype float32   # default: auto, auto
    python benchmarks/learning.py --env arithmetic --algo grpo --minutes 30   # calculator tool

For each algorithm: build a `Trainer` on the embedded model (SmolLM2-135M-Instruct,
LoRA r=16 on all linear layers), evaluate on held-out seeds, call
`trainer.fit()` until the training time budget (or `--max-steps`) is used up,
evaluating every `--eval-every` steps for the curve (in a `fit` callback), and evaluate
again at the end. `--max-staleness 1` sets `training.max_staleness=1`: `fit` samples
the next step's batch on a thread while this step's update runs, and the update
corrects for it (truncated IS against the engine's logprobs, `training.rollout_is`).

Held-out evaluation: `--eval-episodes` (default 64) environment seeds 10_000,
10_001, ..., one episode each, greedy decoding (temperature 0), so "before" and
"after" are deterministic functions of the weights. Training seeds come from
`training.seed` counting up (0, 1, 2, ... as `Trainer._step_seeds` draws them), far
below 10_000, so no evaluation secret is trained on.

"minutes" in the results is wall time spent in the training steps (rollout + update),
the budget the issue sets; evaluations are timed separately (`eval_seconds`), and the
load average is recorded next to every timing because the machine is shared.

Tool use (`--env arithmetic`): the episodes are rolled out through the function-calling
parser (`<tool_call>{"name": "calculator", ...}</tool_call>`, run by the episode's
`MultiTurnManager`; the result comes back as a `tool` message and the model answers in
its next turn). Every evaluation also records `tool_use`: the fraction of episodes with
at least one calculator call through the parser that ran without error, so the record
shows whether the answers came through the tool. Such records also keep transcripts of
the first 4 held-out episodes before and after training.

Results: `benchmarks/results/learning.json` (a list with one record per env, algo,
`max_staleness` and training seed; a run replaces only its own record; `--out` writes
elsewhere) and a plot of the env's records next to it:
`benchmarks/results/learning.png` for guess_number, `learning_<env>.png` for the others
(held-out success and train reward vs step, one line per record; dashed with crosses:
held-out tool use; dashed with squares: held-out success of a `max_staleness=1` run).
"""
from __future__ import annotations

import argparse
import json
import os

# Before torch is imported: with the default (active) OpenMP wait policy, torch's
# worker threads spin at every barrier; on a shared, oversubscribed CPU that made a
# decode step 2-30x slower (measured: 1.4-12 s vs 0.42 s for 32 rows). PASSIVE sleeps.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import load, run_main  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
EVAL_SEED0 = 10_000

#: The arithmetic prompts. The system prompt is ARITHMETIC_PROMPT followed by the
#: parser's format instructions, here one worked episode in the format the run uses (the
#: tool result comes back as a `tool` message, rendered as a "tool" turn by the chat
#: template) instead of the stock JSON schemas of every registered tool (about 300
#: tokens, `environment_step` first). Each problem ends with ARITHMETIC_INSTRUCTION (the
#: env's `instruction` param). Measured on the untrained model, median over 8 problems of
#: the log-probability that a reply starts with "<" (the first token of a call): -7.5 to
#: -9.2 for three instruction-only system prompts, -2.7 with the example, -1.3 with the
#: example and the instruction after the problem (the example was then joined to the
#: first sentence with one newline instead of the two the system prompt uses here; a
#: system prompt that ended in two newlines instead gave -3.9 rather than -2.7).
ARITHMETIC_PROMPT = "Answer math questions with the calculator tool."
ARITHMETIC_EXAMPLE = (
    "Example:\n"
    "user: Ana has 6 coins. She buys 2 bags with 4 coins in each. How many coins does Ana have now?\n"
    'assistant: <tool_call>{"name": "calculator", "arguments": {"expression": "6 + 2 * 4"}}</tool_call>\n'
    "tool: 14\nassistant: Answer: 14"
)
ARITHMETIC_INSTRUCTION = "Use the calculator tool."

#: Per-environment settings: environment params and the run's config overrides.
#: guess_number 1..8 with 4 guesses: binary search always wins (ceil(log2 8) + 1 = 4),
#: a guesser that tries 4 different numbers wins half the time. The short system
#: prompt (about a third of the default's tokens, so every step is cheaper) gets the
#: untrained model to answer "The number is 10." / 11 / 12 / 13 greedily: a number,
#: counting up with the feedback, but out of range, so greedy success starts at 0.
#: arithmetic: one-operation problems (difficulty 1), 3 turns (the call, the answer, and
#: one more try after the env's "Call the calculator or reply 'Answer: <number>'."), 40
#: tokens per turn (a call takes 30-34 here). "</tool_call>" is a stop string, so a turn
#: ends with its call: without it the untrained model went on to write a made-up
#: "tool: 10" line and then answered that number instead of the tool's result.
SETTINGS: dict[str, dict[str, Any]] = {
    "guess_number": {
        "env": {"low": 1, "high": 8, "max_steps": 4,
                "system_prompt": "Guess my secret number from 1 to 8. Answer with just the number."},
        "inference": {"max_tokens": 8, "max_turns": 4, "temperature": 1.0},
    },
    "grid": {
        "env": {"size": 3, "n_walls": 1, "max_steps": 6},
        "inference": {"max_tokens": 8, "max_turns": 6, "temperature": 1.0},
    },
    "arithmetic": {
        "env": {"difficulty": 1, "max_steps": 4, "system_prompt": ARITHMETIC_PROMPT,
                "instruction": ARITHMETIC_INSTRUCTION},
        "inference": {"max_tokens": 40, "max_turns": 3, "temperature": 1.0, "stop": ["</tool_call>"]},
        "parser_instructions": ARITHMETIC_EXAMPLE,
    },
}

#: Per-algorithm training settings (shared by every env).
ALGOS: dict[str, dict[str, Any]] = {
    "grpo": {"adv_estimator": "grpo", "learning_rate": 5e-4, "batch_size": 16, "group_size": 8,
             "micro_batch_size": 16, "loss_agg_mode": "token-mean"},
    "ppo": {"adv_estimator": "gae", "learning_rate": 5e-4, "critic_learning_rate": 1e-3,
            "batch_size": 16, "group_size": 8, "micro_batch_size": 8, "gamma": 1.0, "lam": 1.0,
            "loss_agg_mode": "token-mean"},
}


#: The asynchronous loop's metrics kept per step (present with training.max_staleness=1).
ASYNC_METRICS = ("async/staleness_mean", "async/staleness_max", "async/overlap_seconds",
                 "rollout_corr/clipped_fraction", "rollout_corr/log_ratio_abs_mean")


def build_trainer(env_name: str, algo: str, args: argparse.Namespace):
    from envs import make_env
    from workbench.config import ConfigStore
    from workbench.training.trainer import Trainer

    setting = SETTINGS[env_name]
    cfg = ConfigStore()
    cfg.environment.name = env_name
    cfg.model.device, cfg.model.dtype = args.device, args.dtype
    cfg.model.lora_rank = 16
    cfg.model.lora_alpha = 32
    cfg.model.lora_target_modules = "all-linear"
    cfg.update("inference", setting["inference"])
    cfg.update("training", ALGOS[algo])
    cfg.training.use_kl_loss = False
    cfg.training.use_kl_in_reward = False
    cfg.training.seed = args.seed
    cfg.training.autocast_bf16 = args.bf16
    cfg.training.max_staleness = args.max_staleness  # read by fit (workbench.training.async_fit)
    # fit's run folder: no checkpoints, step files or resume; metrics.jsonl only.
    cfg.checkpoint.output_dir = tempfile.mkdtemp(prefix="wb-learning-")
    cfg.checkpoint.save_interval = 0
    cfg.checkpoint.resume = False
    cfg.training.save_rollouts_every = 0
    cfg.training.progress = False
    if args.lr:
        cfg.training.learning_rate = args.lr
    if args.batch_size:
        cfg.training.batch_size = args.batch_size
    if args.group_size:
        cfg.training.group_size = args.group_size
    cfg.validate()
    env = make_env(env_name, **setting["env"])
    return Trainer(cfg, environment=env, parser=make_parser(setting)), cfg


def make_parser(setting: dict[str, Any]):
    """None (each env's own `action_parser`), or, when the setting has
    `parser_instructions`, the function-calling parser with that text as its format
    instructions (the part of the system prompt after the env's own prompt)."""
    if "parser_instructions" not in setting:
        return None
    from workbench.tools import FunctionCallingParser

    class ExampleParser(FunctionCallingParser):
        """`FunctionCallingParser` whose format instructions are a fixed example."""

        def format_instructions(self, tools=None) -> str:
            return setting["parser_instructions"]

    return ExampleParser()


def used_tool(episode) -> bool:
    """Whether the episode made at least one calculator call through the parser that ran."""
    return any(c["name"] == "calculator" and c["success"] for t in episode.turns for c in t.tool_calls)


def tool_use_rate(episodes) -> float:
    """Fraction of `episodes` for which `used_tool` holds."""
    episodes = list(episodes)
    return sum(used_tool(ep) for ep in episodes) / max(len(episodes), 1)


def transcript(episode) -> list[dict[str, Any]]:
    """The episode's turns as {action, tool_calls, observation} (for the results file)."""
    return [{"action": t.action,
             "tool_calls": [{"arguments": c["arguments"], "result": c["result"]} for c in t.tool_calls],
             "observation": t.observation} for t in episode.turns]


def evaluate(trainer, n: int) -> dict[str, Any]:
    start, load0 = time.perf_counter(), load()
    out: dict[str, Any] = trainer.evaluate(list(range(EVAL_SEED0, EVAL_SEED0 + n)), temperature=0.0)
    out["eval_seconds"] = time.perf_counter() - start
    out["load"] = (load0 + load()) / 2
    batch = list(trainer.last_eval_batch)
    out["first_actions"] = [ep.turns[0].action if ep.turns else "" for ep in batch[:4]]
    out["tool_use"] = tool_use_rate(batch)
    out["transcripts"] = [{"seed": ep.env_seed, "problem": ep.messages[1]["content"], "success": ep.success,
                           "turns": transcript(ep)} for ep in batch[:4]]
    return out


def run(env_name: str, algo: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    torch.set_num_threads(args.threads)
    t_init = time.perf_counter()
    trainer, cfg = build_trainer(env_name, algo, args)
    tooled = bool(trainer.environment.get_tools())  # record tool use and transcripts

    def tool_text(value: float | None) -> str:
        return f"tool use {value:.3f} " if tooled else ""

    def curve_point(ev: dict[str, Any], minutes: float) -> dict[str, Any]:
        """One held-out point of the curve (tool use too, for envs with tools)."""
        return {"step": trainer.global_step, "train_minutes": minutes, "success": ev["eval/success_rate"],
                "reward": ev["eval/reward_mean"], **({"tool_use": ev["tool_use"]} if tooled else {})}

    print(f"[{algo}] trainer ready in {time.perf_counter() - t_init:.1f}s (load {load()})", flush=True)
    before = evaluate(trainer, args.eval_episodes)
    print(f"[{algo}] before: success {before['eval/success_rate']:.3f} reward {before['eval/reward_mean']:.3f} "
          f"{tool_text(before['tool_use'])}"
          f"({before['eval_seconds']:.0f}s, load {before['load']:.1f}) e.g. {before['first_actions'][:2]}", flush=True)
    curve = [curve_point(before, 0.0)]
    steps: list[dict[str, Any]] = []
    budget = args.minutes * 60.0
    train_seconds = 0.0
    eval_seconds = before["eval_seconds"]
    wall0 = time.perf_counter()
    target = args.max_steps if args.max_steps is not None else 10**9

    def next_step_fits() -> bool:
        # Stay inside the budget: start a step only if a typical recent step still fits.
        recent = sorted(s["seconds"] for s in steps[-5:])
        return train_seconds + (recent[len(recent) // 2] if recent else 0.0) <= budget

    mark = {"t": time.perf_counter(), "load": load()}  # when (and at what load) the step began

    def on_step(tr, m: dict[str, Any]) -> None:
        """`fit`'s callback after every step: the step's row, the curve's evaluations,
        and the time budget (a step's time is from the end of the previous callback to
        this one, so evaluations are not counted in it)."""
        nonlocal train_seconds, eval_seconds
        dt = time.perf_counter() - mark["t"]
        train_seconds += dt
        row = {"step": tr.global_step, "seconds": dt, "load": (mark["load"] + load()) / 2,
               "reward": m["reward/mean"], "reward_std": m["reward/std"], "success": m["env/success_rate"],
               "turns": m["env/turns_mean"], "response_length": m["rollout/response_length_mean"],
               "rollout_seconds": m["perf/rollout_seconds"], "update_seconds": m["perf/update_seconds"],
               "entropy": m.get("actor/entropy"), "grad_norm": m.get("actor/grad_norm"),
               "value_loss": m.get("critic/vf_loss"),
               **{k: m[k] for k in ASYNC_METRICS if k in m}}
        if tooled:
            row["tool_use"] = tool_use_rate(tr.last_batch)
        steps.append(row)
        stale = f"staleness {row['async/staleness_mean']:.1f} " if "async/staleness_mean" in row else ""
        print(f"[{algo}] step {row['step']:3d} {dt:5.0f}s (rollout {row['rollout_seconds']:.0f}s, update "
              f"{row['update_seconds']:.0f}s, load {row['load']:.1f}) reward {row['reward']:+.3f} "
              f"success {row['success']:.2f} {tool_text(row.get('tool_use'))}{stale}"
              f"turns {row['turns']:.2f} len {row['response_length']:.1f} "
              f"| {train_seconds / 60:.1f}/{args.minutes} min", flush=True)
        if not next_step_fits():
            tr.stop_reason = f"time budget of {args.minutes} min used"  # fit stops after this step
        last = tr.stop_reason is not None or tr.global_step >= target
        if not last and args.eval_every and tr.global_step % args.eval_every == 0:
            # With max_staleness=1 the evaluation first waits for the batch sampled ahead
            # (which keeps its weight version), so that wait counts as evaluation time.
            ev = evaluate(tr, args.eval_episodes)
            eval_seconds += ev["eval_seconds"]
            curve.append(curve_point(ev, train_seconds / 60))
            print(f"[{algo}]   eval @ {tr.global_step}: success {ev['eval/success_rate']:.3f} "
                  f"{tool_text(ev['tool_use'])}"
                  f"({ev['eval_seconds']:.0f}s) e.g. {ev['first_actions'][:2]}", flush=True)
        mark["t"], mark["load"] = time.perf_counter(), load()

    # fit runs the loop the config describes: with training.max_staleness=1 the next
    # step's batch is sampled on a thread while this step's update runs.
    trainer.fit(until_step=target, callbacks=[on_step])
    after = evaluate(trainer, args.eval_episodes)
    eval_seconds += after["eval_seconds"]
    curve.append(curve_point(after, train_seconds / 60))
    tool_change = f"tool use {before['tool_use']:.3f} -> {after['tool_use']:.3f} " if tooled else ""
    print(f"[{algo}] after {trainer.global_step} steps / {train_seconds / 60:.1f} min: success "
          f"{before['eval/success_rate']:.3f} -> {after['eval/success_rate']:.3f} "
          f"{tool_change}"
          f"e.g. {after['first_actions'][:2]}", flush=True)
    rec = {
        "env": env_name, "algo": algo, "max_staleness": cfg.training.max_staleness,
        "success_before": before["eval/success_rate"], "success_after": after["eval/success_rate"],
        "minutes": round(train_seconds / 60, 2), "steps": trainer.global_step,
        "reward_before": before["eval/reward_mean"], "reward_after": after["eval/reward_mean"],
        "wall_minutes": round((time.perf_counter() - wall0 + before["eval_seconds"]) / 60, 2),
        "eval_seconds": round(eval_seconds, 1),
        "eval": {"seeds": f"{EVAL_SEED0}..{EVAL_SEED0 + args.eval_episodes - 1}",
                 "episodes": args.eval_episodes, "decoding": "greedy (temperature 0)"},
        "train_seeds": f"training.seed={cfg.training.seed}: {cfg.training.seed * 1_000_003}.. counting up "
                       f"({cfg.training.batch_size // cfg.training.group_size} per step)",
        "first_actions_before": before["first_actions"], "first_actions_after": after["first_actions"],
        **({"tool_use_before": before["tool_use"], "tool_use_after": after["tool_use"],
            "tool_use_means": "fraction of held-out episodes with >= 1 calculator call through the "
                              "function-calling parser that ran without error",
            "transcripts_before": before["transcripts"], "transcripts_after": after["transcripts"]}
           if tooled else {}),
        "mean_load": round(sum(s["load"] for s in steps) / max(len(steps), 1), 2),
        "mean_step_seconds": round(train_seconds / max(len(steps), 1), 1),
        "config": {"env_params": SETTINGS[env_name]["env"], "inference": SETTINGS[env_name]["inference"],
                   **{k: SETTINGS[env_name][k] for k in ("parser_instructions",) if k in SETTINGS[env_name]},
                   "training": {k: getattr(cfg.training, k) for k in (
                       "adv_estimator", "learning_rate", "critic_learning_rate", "batch_size", "group_size",
                       "micro_batch_size", "loss_agg_mode", "use_kl_loss", "use_kl_in_reward", "autocast_bf16",
                       "clip_ratio", "gamma", "lam", "seed", "max_staleness", "rollout_is",
                       "rollout_is_threshold", "async_rollout_threads")},
                   "model": {"name": cfg.model.model_name, "device": str(cfg.model.resolved_device()),
                             "dtype": str(cfg.model.resolved_dtype()).removeprefix("torch."),
                             "lora_rank": cfg.model.lora_rank,
                             "lora_alpha": cfg.model.lora_alpha, "targets": cfg.model.lora_target_modules}},
        "curve": curve, "train_steps": steps,
    }
    trainer.cleanup()
    return rec


def record_key(r: dict[str, Any]) -> tuple:
    """What a record measured: env, algo, max_staleness (0 in records made before the
    field existed) and training seed."""
    return (r.get("env"), r.get("algo"), r.get("max_staleness", 0),
            r.get("config", {}).get("training", {}).get("seed", 0))


def save(records: list[dict[str, Any]], path: Path) -> list[dict[str, Any]]:
    """Merge `records` into the JSON list at `path` (a record of the same env, algo,
    max_staleness and training seed is replaced)."""
    old: list[dict[str, Any]] = []
    if path.exists():
        try:
            old = json.loads(path.read_text())
        except json.JSONDecodeError:
            old = []
    keys = {record_key(r) for r in records}
    merged = [r for r in old if record_key(r) not in keys] + records
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(merged, indent=1))
    return merged


def plot(records: list[dict[str, Any]], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(11, 4))
    for r in records:
        label = f"{r['algo']} ({r['env']})"
        if r.get("max_staleness"):
            label += f", staleness {r['max_staleness']}"
        if len({record_key(x)[3] for x in records}) > 1:
            label += f", seed {record_key(r)[3]}"
        stale = {"linestyle": "--", "marker": "s"} if r.get("max_staleness") else {"marker": "o"}
        line, = ax1.plot([c["step"] for c in r["curve"]], [c["success"] for c in r["curve"]], label=label, **stale)
        if "tool_use" in r["curve"][0]:
            ax1.plot([c["step"] for c in r["curve"]], [c["tool_use"] for c in r["curve"]], marker="x",
                     linestyle="--", color=line.get_color(), label=f"{label}: tool use")
        xs, ys = [s["step"] for s in r["train_steps"]], [s["reward"] for s in r["train_steps"]]
        line, = ax2.plot(xs, ys, alpha=0.3, linewidth=1)
        smooth = [sum(ys[max(0, i - 4):i + 1]) / len(ys[max(0, i - 4):i + 1]) for i in range(len(ys))]
        ax2.plot(xs, smooth, color=line.get_color(), linewidth=2, label=f"{label}, mean of last 5")
    ax1.set_title(f"held-out success (greedy, {records[0]['eval']['episodes'] if records else ''} seeds)")
    ax1.set_xlabel("step")
    ax1.set_ylabel("success rate / tool use" if any("tool_use" in r["curve"][0] for r in records) else "success rate")
    ax1.set_ylim(-0.02, 1.02)
    ax1.legend()
    ax2.set_title("train reward (mean of batch, T=1.0 rollouts)")
    ax2.set_xlabel("step")
    ax2.set_ylabel("reward")
    ax2.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--algo", choices=["grpo", "ppo", "both"], default="both")
    p.add_argument("--env", choices=sorted(SETTINGS), default="guess_number")
    p.add_argument("--minutes", type=float, default=30.0, help="training time budget per algo")
    p.add_argument("--max-steps", type=int, default=None)
    p.add_argument("--eval-episodes", type=int, default=64)
    p.add_argument("--eval-every", type=int, default=3, help="held-out eval every N steps (0: only before/after)")
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--batch-size", type=int, default=None)
    p.add_argument("--group-size", type=int, default=None)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bf16", action="store_true", help="training.autocast_bf16=True")
    p.add_argument("--max-staleness", type=int, default=0,
                   help="training.max_staleness: 0 synchronous, k >= 1 the next k batches sampled while this one "
                        "trains")
    p.add_argument("--device", default="auto", help='model.device: "auto" (CUDA when available, else CPU), "cpu", ...')
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help='model.dtype: "auto" is bfloat16 on CUDA and on CPUs with bf16 instructions, else float32')
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS / "learning.json"))
    args = p.parse_args(argv)

    algos = ["grpo", "ppo"] if args.algo == "both" else [args.algo]
    out = Path(args.out)
    for algo in algos:
        rec = run(args.env, algo, args)
        merged = save([rec], out)
        png = out.with_suffix(".png") if args.env == "guess_number" else out.with_name(f"{out.stem}_{args.env}.png")
        plot([r for r in merged if r["env"] == args.env], png)
        gain = rec["success_after"] - rec["success_before"]
        print(f"{rec['env']} {algo}: success {rec['success_before']:.3f} -> {rec['success_after']:.3f} "
              f"({gain:+.3f}) in {rec['minutes']:.1f} min, {rec['steps']} steps", flush=True)
    return 0


if __name__ == "__main__":
    run_main(main)  # with glibc's MALLOC_ENV (benchmarks/_common.py): many trainers in one process
