"""`make demo` (`python -m workbench demo`): the embedded model learns in front of you.

Two parts, both on the embedded SmolLM2-135M-Instruct (on the GPU when torch sees one):

1. A rollout of the untrained model on two environments (guess_number, grid), with
   transcripts and a summary table, in `OUTPUT/rollout/`.
2. A short LoRA GRPO run on guess_number with the learning benchmark's settings
   (`benchmarks/learning.py`: secret from 1 to 8, 4 guesses, a one-line prompt, 8 new
   tokens per turn, batch 16 in groups of 8, lr 5e-4). Held-out success is measured
   before and after on seeds 10_000.. with greedy decoding, so both numbers are
   deterministic functions of the weights. In `OUTPUT/train/`: `transcript.md` opens
   with one held-out episode before and after training side by side, `reward_curve.png`,
   `summary.md`, `metrics.jsonl`, `evals.json`, `config.yaml`.

The run ends with the run doctor's first finding on the held-out episodes (all of them
in `summary.md`; `workbench.debug.doctor`) and a line saying what to open next. With `WORKBENCH_SMOKE=1` (the test
suite) every count is cut down so it runs in seconds on a tiny model.
"""
from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from workbench.config import ConfigStore
from workbench.trajectory import Episode, TrajectoryBatch

#: guess_number as `benchmarks/learning.py` trains it: binary search always wins in 4
#: guesses (ceil(log2 8) + 1); the untrained model answers out of range greedily, so
#: held-out success starts at 0. The prompt states the budget the episode really has:
#: `max_steps` equals the rollout's `max_turns`.
GUESS_PARAMS = {"low": 1, "high": 8}
GUESS_TURNS = 4
GUESS_PROMPT = "Guess my secret number from 1 to 8. Answer with just the number."

#: Full demo / WORKBENCH_SMOKE=1 counts.
FULL = {"rollout_episodes": 4, "steps": 8, "batch_size": 16, "group_size": 8, "eval_episodes": 32}
SMOKE = {"rollout_episodes": 2, "steps": 2, "batch_size": 4, "group_size": 2, "eval_episodes": 4}

NEXT = ("Next: `make lab` opens notebooks/01_quickstart.ipynb in JupyterLab, where you play this game by "
        "hand, look at every token's advantage and KL, and train one step at a time.")


def counts() -> dict[str, int]:
    return SMOKE if os.environ.get("WORKBENCH_SMOKE") == "1" else FULL


def demo_config(args: argparse.Namespace, out: Path) -> ConfigStore:
    """The training part's config: LoRA GRPO on guess_number with the learning benchmark's settings."""
    n = counts()
    cfg = ConfigStore()
    cfg.model.model_name = args.model
    cfg.model.device, cfg.model.dtype = args.device, args.dtype
    cfg.environment.name = "guess_number"
    cfg.environment.params = dict(GUESS_PARAMS)
    cfg.environment.max_steps = GUESS_TURNS
    cfg.environment.system_prompt = GUESS_PROMPT
    cfg.update("inference", {"max_tokens": 8, "max_turns": GUESS_TURNS, "temperature": 1.0})
    cfg.update("training", {"adv_estimator": "grpo", "learning_rate": 5e-4, "batch_size": n["batch_size"],
                            "group_size": n["group_size"], "micro_batch_size": n["batch_size"],
                            "loss_agg_mode": "token-mean", "use_kl_loss": False, "use_kl_in_reward": False,
                            "num_epochs": 1, "num_iters_per_epoch": n["steps"], "seed": 0})
    # A demo starts from the base model every time: no resume from an earlier demo's
    # checkpoint (that would train 0 steps), one checkpoint at the end.
    cfg.checkpoint.output_dir = str(out / "checkpoints")
    cfg.checkpoint.resume = False
    cfg.checkpoint.save_interval = n["steps"]
    return cfg.validate()


def rollout_config(args: argparse.Namespace) -> ConfigStore:
    """Part 1's config: the untrained model on guess_number and grid, 4 turns of up to 24
    tokens (the environments' step budget is the same 4 turns), sampled at temperature 1."""
    cfg = ConfigStore()
    cfg.model.model_name = args.model
    cfg.model.device, cfg.model.dtype = args.device, args.dtype
    cfg.environment.name = "guess_number,grid"
    cfg.environment.max_steps = 4
    cfg.update("inference", {"max_tokens": 24, "max_turns": 4, "temperature": 1.0, "seed": 0})
    return cfg.validate()


def _turn_rows(ep: Episode) -> list[tuple[str, str]]:
    """(model's reply, what the environment answered) per turn."""
    rows = []
    for t in ep.turns:
        obs = t.observation if isinstance(t.observation, str) else ""
        rows.append((t.action.strip(), obs.strip()))
    return rows


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ") or " "


def side_by_side(before: Episode, after: Episode, steps: int) -> str:
    """Markdown: one held-out episode (same seed) before and after training, turn by turn."""
    head = (f"## Held-out episode, seed {before.env_seed}: before and after {steps} GRPO steps\n\n"
            f"Prompt: {_cell(next((m['content'] for m in before.messages if m['role'] == 'user'), ''))}\n\n"
            f"| turn | before: model | before: environment | after: model | after: environment |\n"
            f"|---|---|---|---|---|")
    b, a = _turn_rows(before), _turn_rows(after)
    lines = [head]
    for i in range(max(len(b), len(a))):
        bm, bo = b[i] if i < len(b) else ("", "")
        am, ao = a[i] if i < len(a) else ("", "")
        lines.append(f"| {i} | {_cell(bm)} | {_cell(bo)} | {_cell(am)} | {_cell(ao)} |")
    lines.append(f"| result | success {before.success}, return {before.outcome:+.2f} | | "
                 f"success {after.success}, return {after.outcome:+.2f} | |")
    return "\n".join(lines)


def showcase_index(before: TrajectoryBatch, after: TrajectoryBatch) -> int:
    """The held-out episode to show: the first one lost before training and won after,
    else the first one whose return changed, else the first."""
    pairs = list(zip(before, after))
    for i, (b, a) in enumerate(pairs):
        if not b.success and a.success:
            return i
    for i, (b, a) in enumerate(pairs):
        if a.outcome != b.outcome:
            return i
    return 0


def write_demo_transcript(report: dict[str, Any], path: Path) -> Path:
    """transcript.md: the side-by-side held-out episode, then the best and worst after training."""
    from workbench.reports import episode_transcript

    before, after, trainer = report["before"], report["after"], report["trainer"]
    parts = [f"# guess_number: held-out episodes before and after {trainer.global_step} GRPO steps"]
    if before is not None and after is not None and len(before) and len(after):
        i = showcase_index(before, after)
        parts.append(side_by_side(before[i], after[i], trainer.global_step))
        eps = sorted(after, key=lambda e: e.outcome)
        parts.append(episode_transcript(eps[-1], "Best after training"))
        if len(eps) > 1:
            parts.append(episode_transcript(eps[0], "Worst after training"))
    path.write_text("\n\n".join(parts) + "\n")
    return path


def run_demo(args: argparse.Namespace) -> int:
    """Part 1: rollouts of the untrained model; part 2: a short GRPO run that learns."""
    from workbench.runner import rollout_and_report, train_and_report

    n = counts()
    out = Path(args.output)
    print("== 1/2: the untrained model plays guess_number and grid ==", flush=True)
    rollout_and_report(rollout_config(args), out / "rollout", n["rollout_episodes"])
    print(f"\n== 2/2: {n['steps']} LoRA GRPO steps on guess_number (1..8, {GUESS_TURNS} guesses), "
          f"held-out success on {n['eval_episodes']} unseen secrets before and after ==", flush=True)
    train_out = out / "train"
    config = demo_config(args, train_out)
    report = train_and_report(config, train_out, n["eval_episodes"], args.minutes,
                              transcript=lambda r: write_demo_transcript(r, train_out / "transcript.md"))
    evals = report["evals"]
    before, after = evals[0]["eval/success_rate"], evals[-1]["eval/success_rate"]
    steps = report["trainer"].global_step
    print(f"\nheld-out success: {before:.2f} -> {after:.2f} after {steps} GRPO steps "
          f"({n['eval_episodes']} unseen secrets, greedy)")
    print(f"the same held-out episode before and after: {train_out / 'transcript.md'}; "
          f"curve: {train_out / 'reward_curve.png'}")
    held_out = [f for f in report["findings"] if f.source == "eval"] or report["findings"]
    print("\n" + (held_out[0].line() if held_out else "doctor: no findings")
          + f"\n(every finding with its evidence episodes: {train_out / 'summary.md'}, or "
            f"`python -m workbench diagnose {train_out}`; reopen the run with "
            f"`workbench.debug.load_run({str(train_out)!r})`)")
    print(NEXT)
    return 0
