"""Command line: `python -m workbench {train,rollout,demo}`.

    python -m workbench rollout --env guess_number --episodes 8
    python -m workbench train --env guess_number --algo grpo --steps 20 --output runs/gn
    python -m workbench demo            # what `make demo` runs

Every run writes into its output folder: `config.yaml`, `metrics.jsonl`,
`reward_curve.png`, `transcript.md` (best and worst episodes), `summary.md`,
and checkpoints under `checkpoints/`.
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Sequence

from workbench.config import EMBEDDED_MODEL, ConfigStore
from workbench.trajectory import Episode, TrajectoryBatch


def build_config(args: argparse.Namespace) -> ConfigStore:
    config = ConfigStore.load(args.config) if getattr(args, "config", None) else ConfigStore()
    config.model.model_name = args.model
    config.environment.name = args.env
    config.inference.backend = args.backend
    config.inference.max_tokens = args.max_tokens
    config.inference.max_turns = args.max_turns
    config.inference.temperature = args.temperature
    if hasattr(args, "algo"):
        config.training.adv_estimator = {"grpo": "grpo", "ppo": "gae"}.get(args.algo, args.algo)
        config.training.batch_size = args.batch_size
        config.training.group_size = args.group_size
        config.training.learning_rate = args.lr
        config.training.num_epochs = 1
        config.training.num_iters_per_epoch = args.steps
        config.training.seed = args.seed
        config.checkpoint.output_dir = str(Path(args.output) / "checkpoints")
        config.checkpoint.save_interval = args.save_interval
    return config.validate()


def episode_transcript(ep: Episode, title: str) -> str:
    """Markdown of one episode: each message, with rewards per turn."""
    lines = [f"### {title}: episode {ep.episode_id} (seed {ep.env_seed}), score {ep.score}, "
             f"success {ep.success}, turns {ep.num_turns}" + (f", truncated: {ep.truncation_reason}" if ep.truncated else ""), ""]
    turn = 0
    for msg in ep.messages:
        role = msg["role"]
        text = str(msg["content"]).strip().replace("\n", "\n> ")
        if role == "assistant":
            t = ep.turns[turn]
            lines.append(f"**assistant** (turn {turn}, reward {t.reward:+.2f}{', ' + t.parse_error if t.parse_error else ''}):")
            turn += 1
        else:
            lines.append(f"**{role}**:")
        lines.append(f"> {text}")
        lines.append("")
    if ep.warnings:
        lines.append(f"warnings: {ep.warnings}")
    return "\n".join(lines)


def write_transcript(batch: TrajectoryBatch, path: Path, heading: str) -> Path:
    eps = sorted(batch, key=lambda e: (e.score if e.score is not None else e.total_reward))
    parts = [f"# {heading}", ""]
    if eps:
        parts.append(episode_transcript(eps[-1], "Best"))
        if len(eps) > 1:
            parts.append(episode_transcript(eps[0], "Worst"))
    path.write_text("\n\n".join(parts))
    return path


def plot_curve(history: list[dict[str, Any]], path: Path, evals: list[dict[str, float]] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in history]
    mean = [m["reward/mean"] for m in history]
    std = [m["reward/std"] for m in history]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(steps, mean, label="reward mean")
    ax[0].fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    ax[0].set_xlabel("step"), ax[0].set_title("train reward")
    ax[1].plot(steps, [m["env/success_rate"] for m in history], label="train success")
    if evals:
        ax[1].plot([e["step"] for e in evals], [e["eval/success_rate"] for e in evals], "o-", label="held-out success")
    ax[1].set_ylim(-0.05, 1.05), ax[1].set_xlabel("step"), ax[1].set_title("success rate"), ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary_table(rows: list[dict[str, Any]]) -> str:
    keys = list(rows[0]) if rows else []
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(f"{r[k]:.3g}" if isinstance(r[k], float) else str(r[k]) for k in keys) + " |")
    return "\n".join(out)


def cmd_rollout(args: argparse.Namespace) -> int:
    from envs import make_env
    from workbench.engines import make_engine
    from workbench.models import load_model_and_tokenizer
    from workbench.reward import rescore
    from workbench.rollout import Rollout

    config = build_config(args)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model_and_tokenizer(config.model.path, config.model.dtype, config.model.device)
    engine = make_engine(config, model, tok)
    rows = []
    for env_name in args.env.split(","):
        seeds = list(range(args.episodes))
        rollout = Rollout(engine, [make_env(env_name) for _ in seeds], seeds=seeds,
                          max_turns=config.inference.max_turns, max_tokens=config.inference.max_tokens,
                          temperature=config.inference.temperature, seed=args.seed)
        start = time.perf_counter()
        batch = rescore(rollout.run(), None)
        seconds = time.perf_counter() - start
        batch.save(out / f"rollout_{env_name}.jsonl")
        write_transcript(batch, out / f"transcript_{env_name}.md", f"{env_name}: rollout of {config.model.path}")
        s = batch.summary()
        rows.append({"env": env_name, "episodes": len(batch), "reward_mean": s["reward/mean"],
                     "success_rate": s["env/success_rate"], "turns_mean": s["env/turns_mean"],
                     "trained_tokens_mean": s["rollout/response_length_mean"],
                     "token_warnings": sum(len(e.warnings) for e in batch), "seconds": seconds})
        print(batch)
    table = summary_table(rows)
    (out / "summary.md").write_text(table + "\n")
    print(table)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from workbench.training import Trainer

    config = build_config(args)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    config.save(out / "config.yaml")
    trainer = Trainer(config)
    eval_seeds = list(range(10_000, 10_000 + args.eval_episodes))
    evals = []
    if args.eval_episodes:
        evals.append({"step": 0, **trainer.evaluate(eval_seeds)})
        print(f"held-out before training: {evals[-1]}")
    deadline = time.monotonic() + args.minutes * 60 if args.minutes else None
    with (out / "metrics.jsonl").open("a") as log:
        def on_step(tr: Any, m: dict) -> None:
            log.write(json.dumps({k: v for k, v in m.items() if isinstance(v, (int, float, str))}) + "\n")
            log.flush()
            print(f"step {m['step']:3d}  reward {m['reward/mean']:+.3f}  success {m['env/success_rate']:.2f}  "
                  f"kl {m.get('actor/ppo_kl', 0):+.4f}  entropy {m.get('actor/entropy', 0):.3f}  "
                  f"{m['perf/step_seconds']:.1f}s", flush=True)
            if deadline is not None and time.monotonic() > deadline:
                tr.config.training.num_iters_per_epoch = tr.global_step  # stop after this step

        trainer.fit(num_epochs=1, num_iters_per_epoch=args.steps, callbacks=[on_step])
    if args.eval_episodes:
        evals.append({"step": trainer.global_step, **trainer.evaluate(eval_seeds)})
        print(f"held-out after training: {evals[-1]}")
        write_transcript(trainer.last_eval_batch, out / "transcript.md",
                         f"{args.env}: held-out episodes after {trainer.global_step} {args.algo} steps")
    elif trainer.last_batch is not None:
        write_transcript(trainer.last_batch, out / "transcript.md", f"{args.env}: last training batch")
    plot_curve(trainer.metrics_history, out / "reward_curve.png", evals)
    (out / "evals.json").write_text(json.dumps(evals, indent=1))
    rows = [{"step": m["step"], "reward_mean": m["reward/mean"], "success": m["env/success_rate"],
             "entropy": m.get("actor/entropy", float("nan")), "seconds": m["perf/step_seconds"]}
            for m in trainer.metrics_history]
    table = summary_table(rows)
    (out / "summary.md").write_text(table + "\n\n" + summary_table(evals) + "\n" if evals else table + "\n")
    print(table)
    print(f"wrote {out}/reward_curve.png, transcript.md, metrics.jsonl, summary.md")
    return 0


def cmd_demo(args: argparse.Namespace) -> int:
    """Roll out the embedded model on two envs, then a short GRPO run with a curve."""
    smoke = os.environ.get("WORKBENCH_SMOKE") == "1"
    out = Path(args.output)
    base = ["--model", args.model, "--output", str(out / "rollout"), "--max-tokens", "24", "--max-turns", "3"]
    cmd_rollout(parse_args(["rollout", "--env", "guess_number,grid", "--episodes", "2" if smoke else "8"] + base))
    train = ["train", "--env", "guess_number", "--algo", "grpo", "--model", args.model,
             "--output", str(out / "train"), "--steps", "2" if smoke else "12", "--batch-size", "8" if smoke else "16",
             "--group-size", "4" if smoke else "8", "--max-tokens", "12", "--max-turns", "4",
             "--eval-episodes", "4" if smoke else "32", "--minutes", str(args.minutes), "--lr", "5e-4"]
    return cmd_train(parse_args(train))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m workbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)

    def common(sp: argparse.ArgumentParser) -> None:
        sp.add_argument("--env", default="guess_number", help="environment name(s), comma-separated for rollout")
        sp.add_argument("--model", default=EMBEDDED_MODEL, help="hub id, local folder or the embedded model")
        sp.add_argument("--backend", default="hf", choices=["hf", "vllm", "sglang", "server"])
        sp.add_argument("--max-tokens", type=int, default=32, help="new tokens per model turn")
        sp.add_argument("--max-turns", type=int, default=4)
        sp.add_argument("--temperature", type=float, default=1.0)
        sp.add_argument("--seed", type=int, default=0)
        sp.add_argument("--config", help="YAML config to start from (flags override it)")

    r = sub.add_parser("rollout", help="roll out a model and write transcripts and a summary table")
    common(r)
    r.add_argument("--episodes", type=int, default=8)
    r.add_argument("--output", default="runs/rollout")
    t = sub.add_parser("train", help="train with GRPO or PPO")
    common(t)
    t.add_argument("--algo", default="grpo", choices=["grpo", "ppo", "rloo", "reinforce_plus_plus",
                                                        "reinforce_plus_plus_baseline"])
    t.add_argument("--steps", type=int, default=20)
    t.add_argument("--batch-size", type=int, default=16)
    t.add_argument("--group-size", type=int, default=8)
    t.add_argument("--lr", type=float, default=5e-4)
    t.add_argument("--eval-episodes", type=int, default=32, help="held-out episodes before/after (0 = skip)")
    t.add_argument("--minutes", type=float, default=0, help="stop after this many minutes (0 = no limit)")
    t.add_argument("--save-interval", type=int, default=5)
    t.add_argument("--output", default="runs/train")
    d = sub.add_parser("demo", help="what `make demo` runs: rollouts on two envs, then a short GRPO run")
    d.add_argument("--model", default=EMBEDDED_MODEL)
    d.add_argument("--output", default="runs/demo")
    d.add_argument("--minutes", type=float, default=6)
    return p.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    return {"rollout": cmd_rollout, "train": cmd_train, "demo": cmd_demo}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
