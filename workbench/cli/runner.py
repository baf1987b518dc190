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
from workbench.utils.files import write_text
from workbench.trajectory import format_rate
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
    `summary.md` into `out`; returns the summary rows. One writer per folder: a second rollout
    into `out` while this one runs is refused (`RunLockedError`)."""
    from workbench.training.run_lock import RunLock

    with RunLock(out):
        return _rollout_and_write(config, out, episodes)


def _rollout_and_write(config: ConfigStore, out: Path, episodes: int) -> list[dict[str, Any]]:
    from workbench.engines import make_engine
    from workbench.models import load_model_and_tokenizer
    from workbench.reward import score_batch
    from workbench.rollout import make_rollout

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
    write_text(out / "summary.md", table + "\n")
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
    demo prints its own doctor line at the end).

    One writer per run folder: the folders' lock (`workbench.training.run_lock`) is taken before
    anything is written and held until the last report is: another run writing there is refused
    with `RunLockedError` before this one writes anything, and a folder whose run already reached
    this config's target step with `RunFinishedError` (it would train nothing)."""
    from workbench.training import Trainer
    from workbench.training.run_lock import RunLock, hold_run_folders, refuse_finished_run, start_run

    config = trainer.config if trainer is not None else config
    config.training.log_dir = str(out)  # the loggers' files (metrics.jsonl, ...) go with the run's outputs
    if "jsonl" not in config.training.loggers:
        config.training.loggers = [*config.training.loggers, "jsonl"]  # every run writes metrics.jsonl
    # One writer per run folder (workbench.training.run_lock): the lock comes before anything is
    # written (it creates `out`) and is held through fit until the reports below are written.
    if trainer is None:
        lock = RunLock.of_config(config).acquire()  # RunLockedError: another run writes there
        try:
            trainer = Trainer(config)
        except BaseException:
            lock.release(remove_created=True)
            raise
        trainer._run_lock = lock
    lock = hold_run_folders(trainer, keep=True)
    try:
        try:
            start_run(trainer)  # resume (checkpoint.resume), or move an earlier run's files aside
            refuse_finished_run(trainer, out)  # a finished run's folder: nothing to train, nothing written
        except BaseException:
            lock.release(remove_created=True)
            raise
        trainer._reports_interrupt = True  # fit leaves the Ctrl-C line to RunInterrupted
        return _train_and_write(trainer, config, out, eval_episodes, minutes, transcript, print_findings)
    except KeyboardInterrupt as exc:
        raise RunInterrupted(interrupted_line(trainer, out)) from exc
    finally:
        trainer._run_lock_kept = trainer._reports_interrupt = False
        lock.release()


def nothing_trained(report: dict[str, Any]) -> str:
    """Why the run of a `train_and_report` report trained nothing ("" when a step of it took
    an optimizer step): every RL step skipped (no episode with a trained token, or every
    update undone) and every SFT step too. Names the steps and the episodes' errors."""
    import math

    trainer = report["trainer"]
    rows = [m for m in trainer.metrics_history if m.get("step", -1) >= report.get("first_step", 0)]

    def trained(m: dict[str, Any]) -> bool:
        if "sft/nll" in m:
            return not m.get("sft/skipped_updates")
        norm = m.get("actor/grad_norm")
        return isinstance(norm, (int, float)) and math.isfinite(norm)

    if not rows or any(trained(m) for m in rows):
        return ""
    def reason(m: dict[str, Any]) -> str:
        if "sft/nll" in m:
            return "the SFT step's update was undone (non-finite weights)"
        return str(m.get("actor/skipped_reason") or "no optimizer step was taken")

    reasons = sorted({reason(m) for m in rows})
    errors = [ep.error for ep in (trainer.last_batch or []) if ep.error]
    example = f"; the last step's episodes: {len(errors)} failed, e.g. {errors[0]}" if errors else ""
    return (f"the run trained nothing: all {len(rows)} of its steps ({rows[0]['step']}..{rows[-1]['step']}) were "
            f"skipped ({'; '.join(reasons)}){example}")


class RunInterrupted(KeyboardInterrupt):
    """Ctrl-C during `train_and_report`; `line` says where the run stopped and how it resumes."""

    def __init__(self, line: str):
        super().__init__(line)
        self.line = line


def resume_command(config: ConfigStore, out: Path) -> str:
    """The command that continues the run in `out` from its newest checkpoint: its own
    config.yaml, its folders, `checkpoint.resume` on."""
    parts = ["python -m workbench train", f"--config {out / 'config.yaml'}", f"--output {out}"]
    if Path(config.checkpoint.output_dir).resolve() != (out / "checkpoints").resolve():
        parts.append(f"--checkpoint.output_dir {config.checkpoint.output_dir}")
    if config.checkpoint.resume is not True:
        parts.append("--checkpoint.resume true")
    return " ".join(parts)


def interrupted_line(trainer: Any, out: Path) -> str:
    """Where an interrupted run stopped and whether (and how) it can resume."""
    from workbench.training import checkpoint as ckpt

    config = trainer.config
    saved = ckpt.latest_checkpoint(config.checkpoint.output_dir)
    step = trainer.global_step
    if saved is None or not (out / "config.yaml").is_file():
        why = ("checkpoint.save_interval is 0" if not config.checkpoint.save_interval
               else "none was saved before the interrupt")
        return f"stopped at step {step} with no checkpoint in {config.checkpoint.output_dir} ({why}): nothing to resume"
    return f"stopped at step {step}; {saved} holds the newest checkpoint; resume with: {resume_command(config, out)}"


def _train_and_write(trainer: Any, config: ConfigStore, out: Path, eval_episodes: int, minutes: float,
                     transcript: Callable[[dict[str, Any]], None] | None, print_findings: bool) -> dict[str, Any]:
    """`train_and_report` once the run folder is held and the run resumed or set up."""
    from workbench.utils.progress import write
    from workbench.training import run_files

    config.save(out / "config.yaml")  # after Trainer: it records the environment's import path and params
    eval_seeds = list(range(EVAL_SEED_BASE, EVAL_SEED_BASE + eval_episodes))
    first_step = trainer.global_step  # 0, a resumed run's step, or a branch's checkpoint step
    report: dict[str, Any] = {"trainer": trainer, "evals": [], "before": None, "after": None, "after_sft": None,
                              "stopped": "", "first_step": first_step}
    evals = report["evals"]
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
        env_errors = round(m.get("env/environment_error_rate", 0) * m["episodes"])  # of those: environment errors
        write(f"step {m['step']:3d}  reward {m['reward/mean']:+.3f}  success {format_rate(m['env/success_rate'])}  "
              f"ppo_kl {m.get('actor/ppo_kl', 0):+.4f}  entropy {m.get('actor/entropy', 0):.3f}  "
              f"{m['perf/step_seconds']:.1f}s" + (f"  failed {failed:.0f}/{m['episodes']:.0f}" if failed else "")
              + (f" ({env_errors} environment errors)" if env_errors else ""))

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
    write_text(out / "evals.json", json.dumps(evals, indent=1))
    rows = [{"step": m["step"], "reward_mean": m.get("reward/mean", float("nan")),
             "success": m.get("env/success_rate", float("nan")), "entropy": m.get("actor/entropy", float("nan")),
             "sft_nll": m.get("sft/nll", float("nan")), "seconds": m["perf/step_seconds"]}
            for m in trainer.metrics_history]
    if not any("sft/nll" in m for m in trainer.metrics_history):
        rows = [{k: v for k, v in r.items() if k != "sft_nll"} for r in rows]
    table = summary_table(rows)
    stopped = report["stopped"]
    # The run doctor over the training steps and the held-out batches (workbench.debug.doctor).
    from workbench.debug.doctor import RunPlace, diagnose_parts, findings_markdown, findings_table
    from workbench.training import checkpoint as ckpt

    held_out = [b for b in (report["before"], report["after_sft"], report["after"]) if b is not None]
    report["findings"] = diagnose_parts(trainer.doctor.history if trainer.doctor else None,
                                        [(e["step"], b) for e, b in zip(evals, held_out)], config.doctor,
                                        facts=trainer.run_facts())
    place = RunPlace(out, config, ckpt.list_checkpoints(config.checkpoint.output_dir))  # remedies as commands
    write_text(out / "summary.md", (stopped + "\n\n" if stopped else "") + table + "\n"
               + ("\n" + summary_table(evals) + "\n" if evals else "")
               + "\n" + findings_markdown(report["findings"], place) + "\n")
    print_markdown(table)  # a table in a notebook, pipes in a terminal
    if print_findings:
        print(findings_table(report["findings"], place))
    print(f"wrote {out}/reward_curve.png, transcript.md, metrics.jsonl, summary.md")
    return report
