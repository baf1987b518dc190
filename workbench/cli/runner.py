"""The jobs behind `python -m workbench rollout|train` and `make demo`: run, then write the
run folder people read (transcripts, curve, summary, evaluations).

    rollout_and_report(config, Path("runs/rollout"), episodes=8)
    report = train_and_report(config, Path("runs/train"), eval_episodes=32)

`workbench.cli` only turns arguments into a config and calls these.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from workbench.cli.reports import plot_curve, summary_table, write_transcript
from workbench.config import ConfigStore
from workbench.utils.progress import print_markdown


def rollout_envs(config: ConfigStore, env_spec: str, episodes: int) -> tuple[list[Any], list[int]]:
    """`episodes` environments built from `env_spec` with the run's environment settings
    (`config.environment`: params, max_steps, system_prompt, seed), and seeds 0..episodes-1."""
    import dataclasses

    from workbench.environments.registry import make_env

    seeds = list(range(episodes))
    settings = dataclasses.asdict(config.environment)
    return [make_env(env_spec, settings) for _ in seeds], seeds


def rollout_and_report(config: ConfigStore, out: Path, episodes: int) -> list[dict[str, Any]]:
    """Roll out `episodes` episodes of each comma-separated environment in
    `config.environment.name` and write `rollout_<env>.jsonl`, `transcript_<env>.md` and
    `summary.md` into `out`; returns the summary rows."""
    from workbench.engines import make_engine
    from workbench.models import load_model_and_tokenizer
    from workbench.reward import score_batch
    from workbench.rollout import make_rollout

    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model_and_tokenizer(config.model.path, config.model.dtype, config.model.device,
                                          config.model.trust_remote_code)
    engine = make_engine(config, model, tok)
    rows = []
    for env_name in config.environment.name.split(","):
        envs, seeds = rollout_envs(config, env_name.strip(), episodes)
        rollout = make_rollout(config, engine, envs, seeds=seeds)
        start = time.perf_counter()
        batch = score_batch(rollout.run(), None, reward=config.reward,  # as the trainer scores
                            max_tokens=config.inference.max_tokens)
        seconds = time.perf_counter() - start
        slug = env_name.replace(":", "_").replace("/", "_")  # textarena:X / module:Class as a file name
        batch.save(out / f"rollout_{slug}.jsonl")
        write_transcript(batch, out / f"transcript_{slug}.md", f"{env_name}: rollout of {config.model.path}")
        s = batch.summary()
        rows.append({"env": env_name, "episodes": len(batch), "reward_mean": s["reward/mean"],
                     "success_rate": s["env/success_rate"], "turns_mean": s["env/turns_mean"],
                     "trained_tokens_mean": s["rollout/response_length_mean"],
                     "token_warnings": sum(len(e.warnings) for e in batch), "seconds": seconds})
        print(batch)
    table = summary_table(rows)
    (out / "summary.md").write_text(table + "\n")
    print_markdown(table)  # a table in a notebook, pipes in a terminal
    return rows


#: The held-out seeds: evaluation episode i plays seed EVAL_SEED_BASE + i (every run, every branch).
EVAL_SEED_BASE = 10_000


def train_and_report(config: ConfigStore, out: Path, eval_episodes: int, minutes: float = 0,
                     transcript: Callable[[dict[str, Any]], None] | None = None,
                     trainer: Any = None, print_findings: bool = True) -> dict[str, Any]:
    """Train with `config` and write the run's files into `out`: held-out evaluation on
    seeds 10_000.. before and after (greedy), `fit` with a step line per step, the curve,
    `transcript.md` (`transcript(report)` writes it instead when given), `evals.json`,
    `summary.md` (with the run doctor's findings). Returns {"trainer", "evals", "before",
    "after", "after_sft" (the held-out batches or None; after_sft with `sft.steps`), "stopped"
    (why fit stopped early, or ""),
    "findings" (`workbench.debug.doctor.diagnose_parts` over the steps and held-out batches)}.

    `trainer`: a Trainer already built for `out` (a branch: `Trainer.from_checkpoint`), used
    instead of building one from `config` (its own config is used); "before" is then evaluated
    at its step, on the same held-out seeds, so a branch's evaluations pair with its parent's.
    `print_findings=False`: the findings table is written to summary.md but not printed (the
    demo prints its own doctor line at the end)."""
    from workbench.utils.progress import write
    from workbench.training import Trainer, run_files

    out.mkdir(parents=True, exist_ok=True)
    config = trainer.config if trainer is not None else config
    config.training.log_dir = str(out)  # the loggers' files (metrics.jsonl, ...) go with the run's outputs
    if "jsonl" not in config.training.loggers:
        config.training.loggers = [*config.training.loggers, "jsonl"]  # every run writes metrics.jsonl
    if trainer is None:
        trainer = Trainer(config)
    config.save(out / "config.yaml")  # after Trainer: it records the environment's import path and params
    eval_seeds = list(range(EVAL_SEED_BASE, EVAL_SEED_BASE + eval_episodes))
    report: dict[str, Any] = {"trainer": trainer, "evals": [], "before": None, "after": None, "after_sft": None,
                              "stopped": ""}
    evals = report["evals"]
    first_step = trainer.global_step  # 0, or a branch's checkpoint step
    if eval_episodes:
        evals.append({"step": first_step, **trainer.evaluate(eval_seeds)})
        report["before"] = trainer.last_eval_batch
        write(f"held-out before training: {evals[-1]}")

    sft_steps, sft_end = config.sft.steps, config.sft.end_step  # a branch's warm-up starts at its step

    def on_step(tr: Any, m: dict) -> None:
        if "sft/nll" in m:  # a step of the SFT warm-up (config.sft): the expert's tokens' NLL
            write(f"step {m['step']:3d}  SFT on {m['sft/episodes']:.0f} expert episodes  "
                  f"nll {m['sft/nll']:.3f}  {m['perf/step_seconds']:.1f}s")
            if tr.global_step == sft_end and eval_episodes:
                evals.append({"step": tr.global_step, **tr.evaluate(eval_seeds)})
                report["after_sft"] = tr.last_eval_batch
                write(f"held-out after {sft_steps} SFT step{'' if sft_steps == 1 else 's'}: {evals[-1]}")
            return
        failed = m.get("rollout/failed_episodes", 0)  # named on the line train_step wrote before
        write(f"step {m['step']:3d}  reward {m['reward/mean']:+.3f}  success {m['env/success_rate']:.2f}  "
              f"ppo_kl {m.get('actor/ppo_kl', 0):+.4f}  entropy {m.get('actor/entropy', 0):.3f}  "
              f"{m['perf/step_seconds']:.1f}s" + (f"  failed {failed:.0f}/{m['episodes']:.0f}" if failed else ""))

    # fit resumes (checkpoint.resume), then its jsonl logger writes OUT/metrics.jsonl through
    # open_metrics_log, dropping lines of steps after the checkpoint (they are redone).
    trainer.fit(callbacks=[on_step], time_limit_s=minutes * 60 if minutes else None)
    if trainer.stop_reason:
        report["stopped"] = f"stopped early (--minutes {minutes:g}): {trainer.stop_reason}"
        print(report["stopped"], flush=True)
    if eval_episodes:
        evals.append({"step": trainer.global_step, **trainer.evaluate(eval_seeds)})
        report["after"] = trainer.last_eval_batch
        # OUT/evals/step_XXXXXX.jsonl.gz, written after fit: a fresh run (checkpoint.resume=False)
        # moves an earlier run's evals/ aside when fit starts.
        run_files.record_eval(out, config, first_step, report["before"])
        if report["after_sft"] is not None:
            run_files.record_eval(out, config, sft_end, report["after_sft"])
        run_files.record_eval(out, config, trainer.global_step, report["after"])
        write(f"held-out after training: {evals[-1]}")
    if transcript is not None:
        transcript(report)
    elif report["after"] is not None:
        write_transcript(report["after"], out / "transcript.md",
                         f"{config.environment.name}: held-out episodes after {trainer.global_step} "
                         f"{config.training.adv_estimator} steps")
    elif trainer.last_batch is not None:
        write_transcript(trainer.last_batch, out / "transcript.md", f"{config.environment.name}: last training batch")
    rl_steps = [m for m in trainer.metrics_history if "reward/mean" in m]  # SFT steps have no rollout
    plot_curve(rl_steps, out / "reward_curve.png", evals)
    (out / "evals.json").write_text(json.dumps(evals, indent=1))
    rows = [{"step": m["step"], "reward_mean": m.get("reward/mean", float("nan")),
             "success": m.get("env/success_rate", float("nan")), "entropy": m.get("actor/entropy", float("nan")),
             "sft_nll": m.get("sft/nll", float("nan")), "seconds": m["perf/step_seconds"]}
            for m in trainer.metrics_history]
    if not any("sft/nll" in m for m in trainer.metrics_history):
        rows = [{k: v for k, v in r.items() if k != "sft_nll"} for r in rows]
    table = summary_table(rows)
    stopped = report["stopped"]
    # The run doctor over the training steps and the held-out batches (workbench.debug.doctor).
    from workbench.debug.doctor import diagnose_parts, findings_markdown, findings_table

    held_out = [b for b in (report["before"], report["after_sft"], report["after"]) if b is not None]
    report["findings"] = diagnose_parts(trainer.doctor.history if trainer.doctor else None,
                                        [(e["step"], b) for e, b in zip(evals, held_out)], config.doctor)
    (out / "summary.md").write_text((stopped + "\n\n" if stopped else "") + table + "\n"
                                    + ("\n" + summary_table(evals) + "\n" if evals else "")
                                    + "\n" + findings_markdown(report["findings"]) + "\n")
    print_markdown(table)  # a table in a notebook, pipes in a terminal
    if print_findings:
        print(findings_table(report["findings"]))
    print(f"wrote {out}/reward_curve.png, transcript.md, metrics.jsonl, summary.md")
    return report
