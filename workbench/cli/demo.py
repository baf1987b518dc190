"""`make demo` (`python -m workbench demo`): the embedded model learns in front of you.

Two parts, both on the embedded SmolLM2-135M-Instruct (on the GPU when torch sees one):

1. A rollout of the untrained model on two environments (guess_number, grid), with
   transcripts and a summary table, in `OUTPUT/rollout/`.
2. A short LoRA run on guess_number (secret from 1 to 8, 4 guesses, 8 new tokens per
   turn) with the strict answer format (`environment.strict_format`: only a reply that
   is a bare number counts; a number inside a sentence is a format error the model sees).
   The untrained model never answers that way, so the run first warms up with two SFT
   steps on 16 games played by the environment's scripted expert (binary search,
   `sft` config section), then trains GRPO steps (batch 16 in groups of 8, lr 2e-4).
   Held-out success is measured before training, after the SFT warm-up and after RL on
   seeds 10_000.. with greedy decoding, so every number is a deterministic function of
   the weights. In `OUTPUT/train/`: `transcript.md` opens with one held-out episode
   before and after training side by side, `reward_curve.png`, `summary.md`,
   `metrics.jsonl`, `evals.json`, `config.yaml`.

The run ends with one line on what the trained policy does (bare answers, whether its
guesses follow the feedback, games won), the run doctor's first finding on the held-out
episodes or "no findings" (all of them in `summary.md`; `workbench.debug.doctor`), and a
line saying what to open next. With `WORKBENCH_SMOKE=1` (the test suite) every count is
cut down so it runs in seconds on a tiny model.
"""
from __future__ import annotations

import argparse
import os
import re
from pathlib import Path
from typing import Any

from workbench.config import ConfigStore
from workbench.config.flags import apply_config_flags, given_config_flags
from workbench.trajectory import Episode, TrajectoryBatch

#: guess_number as `benchmarks/learning.py` trains it: binary search always wins in 4
#: guesses (ceil(log2 8) + 1); the untrained model answers out of range greedily, so
#: held-out success starts at 0. The prompt states the budget the episode really has:
#: `max_steps` equals the rollout's `max_turns`.
GUESS_PARAMS = {"low": 1, "high": 8}
GUESS_TURNS = 4
GUESS_PROMPT = "Guess my secret number from 1 to 8. Answer with just the number."

#: Full demo / WORKBENCH_SMOKE=1 counts: "steps" GRPO steps after "sft_steps" SFT steps on
#: "sft_episodes" expert games.
FULL = {"rollout_episodes": 4, "sft_steps": 2, "sft_episodes": 16, "steps": 6, "batch_size": 16,
        "group_size": 8, "eval_episodes": 32}
SMOKE = {"rollout_episodes": 2, "sft_steps": 1, "sft_episodes": 2, "steps": 2, "batch_size": 4,
         "group_size": 2, "eval_episodes": 4}
#: The SFT warm-up's learning rate: at 2e-3 on 16 expert games, one step takes the embedded
#: model from no bare-number replies to all of them (held-out success 0.75: it counts up
#: from 4), the second to binary search (1.00), in fp32 and bf16.
SFT_LEARNING_RATE = 2e-3
#: GRPO's learning rate: the learning benchmark's 5e-4 without the warm-up; 2e-4 after it. With
#: 5e-4 after SFT had won every held-out game, 3 of 4 training seeds (bf16, 6 steps of 2 groups)
#: ended at 0.75-0.81 held out: a few groups whose secret rewards counting up (5 after "4 too
#: low") tipped the greedy policy from binary search to counting up, which loses every secret 8
#: (the doctor's heldout-regression); with 2e-4 the same seeds stayed at 1.00.
RL_LEARNING_RATE = 5e-4
RL_LEARNING_RATE_AFTER_SFT = 2e-4

#: `--past-sft` (`make demo-rl`): the demo's training part with room for GRPO to add to SFT. One
#: SFT step teaches bare numbers, a first guess of 4, then counting up (held-out 0.75: every secret
#: 8 is lost); plain GRPO from there stalls in some training seeds (a deterministic count-up that
#: wins its 2-secret batches), and the doctor's remedies for that stall are these settings: an
#: entropy bonus, dynamic sampling and groups of 4 (4 secrets a step instead of 2). With them the
#: policy learned to halve (held-out 1.00) in 4 of 4 training seeds in fp32; neither part was
#: enough alone: the two remedies in groups of 8 stalled in seed 1, groups of 4 without them in
#: seeds 2 and 3 (benchmarks/rl_past_sft.py, docs/results.md, "RL past SFT").
PAST_SFT = {"sft.steps": 1, "training.group_size": 4, "training.entropy_coeff": 0.01,
            "training.dynamic_sampling": True, "training.num_iters_per_epoch": 24}
#: `--past-sft`'s time limit: none, the run is 24 steps.
PAST_SFT_MINUTES = 0.0
#: `make demo`'s time limit (`--minutes`): it stops after the step that ends past it.
DEMO_MINUTES = 6.0

#: Printed by `make demo` before `NEXT`: where to see RL add to SFT (its figures: docs/results.md).
PAST_SFT_NEXT = ("GRPO past SFT: `make demo-rl` (`python -m workbench demo --past-sft`) stops the warm-up after "
                 "1 SFT step (held-out 0.75: it counts up from 4 and loses every secret 8) and trains 24 GRPO "
                 "steps with the doctor's remedies for that stall (groups of 4, entropy bonus 0.01, dynamic "
                 "sampling); in fp32 that reached 1.00 in 4 of 4 training seeds (docs/results.md, \"RL past SFT\").")

NEXT = ("Next: `make lab` opens notebooks/01_quickstart.ipynb in JupyterLab, where you play this game by "
        "hand, look at every token's advantage and KL, and train one step at a time.")


def counts() -> dict[str, int]:
    return SMOKE if os.environ.get("WORKBENCH_SMOKE") == "1" else FULL


def demo_config(args: argparse.Namespace, out: Path, remedies: bool = True) -> ConfigStore:
    """The training part's config: guess_number in the strict format, an SFT warm-up on the
    scripted expert's games, then LoRA GRPO with the learning benchmark's settings.

    `remedies=False`: the same GRPO run without the strict format and the SFT warm-up, at the
    learning benchmark's learning rate (the benchmarks that time or diagnose plain GRPO steps
    start from it). `--SECTION.FIELD VALUE`
    flags given to `python -m workbench demo` (in `args`) are applied last, and the one
    checkpoint is written at the step the run ends on."""
    n = counts()
    cfg = ConfigStore()
    cfg.model.model_name = args.model
    cfg.model.device, cfg.model.dtype = args.device, args.dtype
    cfg.environment.name = "guess_number"
    cfg.environment.params = dict(GUESS_PARAMS)
    cfg.environment.max_steps = GUESS_TURNS
    cfg.environment.system_prompt = GUESS_PROMPT
    if remedies:
        cfg.environment.strict_format = True  # a number inside a sentence is a format error
        cfg.update("sft", {"steps": n["sft_steps"], "episodes": n["sft_episodes"],
                           "learning_rate": SFT_LEARNING_RATE})
    cfg.update("inference", {"max_tokens": 8, "max_turns": GUESS_TURNS, "temperature": 1.0})
    lr = RL_LEARNING_RATE_AFTER_SFT if remedies else RL_LEARNING_RATE
    cfg.update("training", {"adv_estimator": "grpo", "learning_rate": lr, "batch_size": n["batch_size"],
                            "group_size": n["group_size"], "micro_batch_size": n["batch_size"],
                            "loss_agg_mode": "token-mean", "use_kl_loss": False, "use_kl_in_reward": False,
                            "num_epochs": 1, "num_iters_per_epoch": n["steps"], "seed": 0})
    # A demo starts from the base model every time: no resume from an earlier demo's
    # checkpoint (that would train 0 steps), one checkpoint at the end.
    cfg.checkpoint.output_dir = str(out / "checkpoints")
    cfg.checkpoint.resume = False
    if getattr(args, "past_sft", False):  # the test suite's cut-down counts keep their steps
        cfg.apply_overrides({k: v for k, v in PAST_SFT.items()
                             if not (counts() is SMOKE and k == "training.num_iters_per_epoch")})
    apply_config_flags(cfg, args)  # e.g. --training.max_staleness 1: the user's flags come last
    if "save_interval" not in given_config_flags(args).get("checkpoint", {}):
        cfg.checkpoint.save_interval = cfg.sft.steps + cfg.training.num_epochs * cfg.training.num_iters_per_epoch
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


def side_by_side(before: Episode, after: Episode, training: str) -> str:
    """Markdown: one held-out episode (same seed) before and after `training` (words such
    as "1 SFT + 6 GRPO steps"), turn by turn."""
    head = (f"## Held-out episode, seed {before.env_seed}: before and after {training}\n\n"
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
    from workbench.cli.reports import episode_transcript

    before, after, trainer = report["before"], report["after"], report["trainer"]
    training = training_words(trainer)
    parts = [f"# guess_number: held-out episodes before and after {training}"]
    if before is not None and after is not None and len(before) and len(after):
        i = showcase_index(before, after)
        parts.append(side_by_side(before[i], after[i], training))
        eps = sorted(after, key=lambda e: e.outcome)
        parts.append(episode_transcript(eps[-1], "Best after training"))
        if len(eps) > 1:
            parts.append(episode_transcript(eps[0], "Worst after training"))
    path.write_text("\n\n".join(parts) + "\n")
    return path


def training_words(trainer: Any) -> str:
    """"1 SFT + 6 GRPO steps" (or "6 GRPO steps"): the steps `trainer` has taken, by kind."""
    sft = sum("sft/nll" in m for m in trainer.metrics_history)
    rl = trainer.global_step - sft
    algo = trainer.config.training.adv_estimator.upper()
    return (f"{sft} SFT + " if sft else "") + _steps(rl, algo)


def _steps(n: int, kind: str) -> str:
    """"1 SFT step", "2 GRPO steps"."""
    return f"{n} {kind} step{'' if n == 1 else 's'}"


_BARE_NUMBER = re.compile(r"\s*-?\d+\s*")


def guessing_summary(batch: TrajectoryBatch) -> dict[str, int]:
    """What a guess_number policy does, counted over `batch`'s episodes: replies in all
    ("replies") and those that are a bare number ("bare"); follow-ups ("follow_ups": a
    bare guess right after a "too low"/"too high" answer to a bare guess) and those that
    moved the way the feedback said ("followed": higher after "too low", lower after
    "too high"); games won ("won") of "games"."""
    out = {"replies": 0, "bare": 0, "follow_ups": 0, "followed": 0, "won": 0, "games": len(batch)}
    for ep in batch:
        out["won"] += bool(ep.success)
        last: tuple[int, str] | None = None  # (previous bare guess, the environment's answer to it)
        for t in ep.turns:
            out["replies"] += 1
            bare = _BARE_NUMBER.fullmatch(t.action or "")
            guess = int(t.action) if bare else None
            out["bare"] += guess is not None
            if last is not None and guess is not None:
                prev, answer = last
                if "too low" in answer or "too high" in answer:
                    out["follow_ups"] += 1
                    out["followed"] += guess > prev if "too low" in answer else guess < prev
            obs = t.observation if isinstance(t.observation, str) else ""
            last = (guess, obs) if guess is not None else None
    return out


def learned_line(batch: TrajectoryBatch) -> str:
    """One sentence a newcomer reads: what the trained policy does on the held-out games."""
    c = guessing_summary(batch)
    bare = c["bare"] / c["replies"] if c["replies"] else 0.0
    follow = (f"after \"too low\" it guesses higher and after \"too high\" lower in {c['followed']} of "
              f"{c['follow_ups']} follow-up guesses" if c["follow_ups"] else "it made no follow-up guesses")
    return (f"what it learned: {bare:.0%} of its replies are a bare number, {follow}, "
            f"and it wins {c['won']} of {c['games']} unseen games")


def part_two(config: ConfigStore, eval_episodes: int) -> str:
    """The training part's heading, from the config that runs."""
    e, t = config.environment, config.training
    form = ("strict format: the reply must be a bare number" if e.strict_format
            else "lenient format: the first number in the reply counts")
    grpo = t.num_epochs * t.num_iters_per_epoch
    sft = (f"{_steps(config.sft.steps, 'SFT')} on {config.sft.episodes} games of a scripted expert, then "
           if config.sft.steps else "")
    evals = "before, after SFT and after RL" if config.sft.steps else "before and after RL"
    stale = f", max_staleness {t.max_staleness}" if t.max_staleness else ""
    return (f"guess_number ({e.params.get('low')}..{e.params.get('high')}, {e.max_steps} guesses, {form}): "
            f"{sft}{grpo} LoRA GRPO steps ({t.batch_size} episodes in groups of {t.group_size}){stale}; "
            f"held-out success on {eval_episodes} unseen secrets {evals}")


def run_demo(args: argparse.Namespace) -> int:
    """Part 1: rollouts of the untrained model; part 2: a short GRPO run that learns."""
    from workbench.cli.runner import rollout_and_report, train_and_report

    n = counts()
    out = Path(args.output)
    print("== 1/2: the untrained model plays guess_number and grid ==", flush=True)
    rollout_and_report(rollout_config(args), out / "rollout", n["rollout_episodes"])
    train_out = out / "train"
    config = demo_config(args, train_out)
    print(f"\n== 2/2: {part_two(config, n['eval_episodes'])} ==", flush=True)
    minutes = args.minutes if args.minutes is not None else PAST_SFT_MINUTES if args.past_sft else DEMO_MINUTES
    report = train_and_report(config, train_out, n["eval_episodes"], minutes,
                              transcript=lambda r: write_demo_transcript(r, train_out / "transcript.md"),
                              print_findings=False)  # its doctor line comes at the end
    evals, trainer = report["evals"], report["trainer"]
    rl_steps = trainer.global_step - sum("sft/nll" in m for m in trainer.metrics_history)
    stages = [f"{evals[0]['eval/success_rate']:.2f} before training"]
    if report["after_sft"] is not None:
        stages.append(f"{evals[1]['eval/success_rate']:.2f} after {_steps(config.sft.steps, 'SFT')}")
    stages.append(f"{evals[-1]['eval/success_rate']:.2f} after {_steps(rl_steps, 'GRPO')}")
    print(f"\nheld-out success: {' -> '.join(stages)} ({n['eval_episodes']} unseen secrets, greedy)")
    if report["after"] is not None:
        print(learned_line(report["after"]))
    print(f"the same held-out episode before and after: {train_out / 'transcript.md'}; "
          f"curve: {train_out / 'reward_curve.png'}")
    held_out = [f for f in report["findings"] if f.source == "eval"] or report["findings"]
    print("\n" + (held_out[0].line() if held_out else "doctor: no findings")
          + f"\n(every finding with its evidence episodes: {train_out / 'summary.md'}, or "
            f"`python -m workbench diagnose {train_out}`; reopen the run with "
            f"`workbench.debug.load_run({str(train_out)!r})`)")
    if not args.past_sft:
        print(PAST_SFT_NEXT)
    print(NEXT)
    return 0
