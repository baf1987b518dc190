"""Command line: `python -m workbench {train,rollout,demo,export-verl,diagnose}`.

    python -m workbench rollout --env guess_number --episodes 8
    python -m workbench train --env guess_number --algo grpo --steps 20 --output runs/gn
    python -m workbench demo            # what `make demo` runs
    python -m workbench diagnose runs/gn   # the run doctor (workbench.debug.doctor)
    python -m workbench train --config run.yaml --lr 1e-4   # the file, with one field changed

Flags override `--config` only when given on the command line; without `--config`, a
flag not given takes the value shown in --help. `--device`/`--dtype` default to "auto"
(CUDA and bfloat16 when there is a GPU, else CPU and float32).

Every run writes into its output folder: `config.yaml`, `metrics.jsonl`,
`reward_curve.png`, `transcript.md` (best and worst episodes), `summary.md`,
`episodes.jsonl` (best/worst episodes every `training.log_episodes_every` steps), and
checkpoints under `checkpoints/`; `--loggers tensorboard,trackio,wandb` adds those sinks
(`workbench.training.loggers`).
"""
from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, Callable, Sequence, TextIO

from workbench.config import BACKENDS, DTYPES, EMBEDDED_MODEL, ConfigError, ConfigStore
from workbench.trajectory import Episode, TrajectoryBatch

#: Flags that set one config field each (dest -> section, field), per command.
_COMMON_FIELDS = {
    "model": ("model", "model_name"), "device": ("model", "device"), "dtype": ("model", "dtype"),
    "env": ("environment", "name"), "backend": ("inference", "backend"),
    "max_tokens": ("inference", "max_tokens"), "max_turns": ("inference", "max_turns"),
    "temperature": ("inference", "temperature"),
}
FLAG_FIELDS: dict[str, dict[str, tuple[str, str]]] = {
    "rollout": {**_COMMON_FIELDS, "seed": ("inference", "seed")},
    "train": {**_COMMON_FIELDS, "seed": ("training", "seed"), "batch_size": ("training", "batch_size"),
              "group_size": ("training", "group_size"), "lr": ("training", "learning_rate"),
              "save_interval": ("checkpoint", "save_interval"), "loggers": ("training", "loggers")},
}
#: What a flag that is not given means when there is no --config (the CLI's quick-run
#: presets; ConfigStore's own defaults fill every other field).
PRESETS: dict[str, dict[str, Any]] = {
    "rollout": {"model": EMBEDDED_MODEL, "device": "auto", "dtype": "auto", "env": "guess_number",
                "backend": "hf", "max_tokens": 32, "max_turns": 4, "temperature": 1.0, "seed": 0},
    "train": {"model": EMBEDDED_MODEL, "device": "auto", "dtype": "auto", "env": "guess_number",
              "backend": "hf", "max_tokens": 32, "max_turns": 4, "temperature": 1.0, "seed": 0,
              "algo": "grpo", "steps": 20, "batch_size": 16, "group_size": 8, "lr": 5e-4, "save_interval": 5,
              "loggers": ["jsonl"]},
}
OUTPUTS = {"rollout": "runs/rollout", "train": "runs/train", "demo": "runs/demo"}
ALGOS = {"grpo": "grpo", "ppo": "gae", "rloo": "rloo", "reinforce_plus_plus": "reinforce_plus_plus",
         "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline"}


def _help(command: str, dest: str, text: str, from_config: str | None = None) -> str:
    field = FLAG_FIELDS.get(command, {}).get(dest)
    from_config = from_config or (f"{field[0]}.{field[1]}" if field else "")
    return f"{text} (default {PRESETS[command][dest]}, or {from_config} from --config)".lstrip()


def build_config(args: argparse.Namespace) -> ConfigStore:
    """The run's config: the --config file (or ConfigStore defaults plus the CLI presets),
    then every flag given on the command line, and only those."""
    given = vars(args)
    command = args.command
    if given.get("config"):
        config = ConfigStore.load(args.config)
        values = dict(given)
    else:
        config = ConfigStore()
        values = {**PRESETS[command], **given}
    for dest, (section, name) in FLAG_FIELDS[command].items():
        if dest in values:
            setattr(getattr(config, section), name, values[dest])
    if command == "train":
        if "algo" in values:
            config.training.adv_estimator = ALGOS.get(values["algo"], values["algo"])
        if "steps" in values:
            config.training.num_epochs = 1
            config.training.num_iters_per_epoch = values["steps"]
        if args.output_given or not given.get("config"):  # else the file's checkpoint.output_dir stays
            config.checkpoint.output_dir = str(Path(args.output) / "checkpoints")
    if not given.get("config"):
        # Quick runs: the environment's step budget (which its prompt states, e.g. "You have
        # 4 guesses") is the number of turns the rollout really allows (--env-param max_steps=N wins).
        config.environment.max_steps = config.inference.max_turns
    resolve_env_args(config, given.get("env_param") or [])
    if given.get("reward_param"):
        config.update("reward", parse_key_values(given["reward_param"], "--reward-param", "success_bonus=5"))
    return config.validate()


def parse_key_values(pairs: Sequence[str], flag: str, example: str) -> dict[str, Any]:
    """`["a=1", "b=x"]` -> {"a": 1, "b": "x"}: each value is read as YAML."""
    import yaml

    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {pair!r}: write it as KEY=VALUE, e.g. {flag} {example}")
        try:
            values[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            values[key.strip()] = value
    return values


def parse_env_params(pairs: Sequence[str]) -> dict[str, Any]:
    """`["high=32", "name=x"]` -> {"high": 32, "name": "x"}: each value is read as YAML."""
    return parse_key_values(pairs, "--env-param", "high=32")


def resolve_env_args(config: ConfigStore, env_params: Sequence[str]) -> ConfigStore:
    """Add `--env-param`s to `config.environment.params` and check that every
    comma-separated `--env` spec resolves (ConfigError saying what is wrong otherwise)."""
    from workbench.env_registry import REGISTRY

    params = parse_env_params(env_params)
    fields = {f.name for f in dataclasses.fields(config.environment)} - {"name", "params", "import_path"}
    for key in sorted(fields & set(params)):  # max_steps, system_prompt, seed, ...: EnvironmentConfig fields
        setattr(config.environment, key, params.pop(key))
    config.environment.params = {**config.environment.params, **params}
    for spec in config.environment.name.split(","):
        try:
            REGISTRY.resolve(spec.strip())
        except ValueError as exc:
            raise ConfigError(f"--env {spec.strip()}: {exc}") from exc
    return config


def episode_transcript(ep: Episode, title: str) -> str:
    """Markdown of one episode: each message, with rewards per turn."""
    lines = [f"### {title}: episode {ep.episode_id} (seed {ep.env_seed}), "
             + (f"score {ep.score:+.2f}, " if ep.score is not None else f"return {ep.total_reward:+.2f}, ") +
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
    eps = sorted(batch, key=lambda e: e.outcome)
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


def open_metrics_log(path: Path, step: int) -> TextIO:
    """Open `metrics.jsonl` for appending, first keeping only lines of steps before `step`
    (the step a run resumes from), so steps redone after an interruption appear once."""
    if path.exists():
        kept = []
        for line in path.read_text().splitlines():
            try:
                row_step = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut off by the interruption
            if isinstance(row_step, int) and row_step < step:
                kept.append(line + "\n")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    return path.open("a")


def cmd_rollout(args: argparse.Namespace) -> int:
    from workbench.engines import make_engine
    from workbench.env_registry import make_env
    from workbench.models import load_model_and_tokenizer
    from workbench.reward import score_batch
    from workbench.rollout import Rollout

    config = build_config(args)
    out = Path(args.output)
    out.mkdir(parents=True, exist_ok=True)
    model, tok = load_model_and_tokenizer(config.model.path, config.model.dtype, config.model.device)
    engine = make_engine(config, model, tok)
    rows = []
    for env_name in config.environment.name.split(","):
        seeds = list(range(args.episodes))
        envs = [make_env(env_name, {"params": dict(config.environment.params)}) for _ in seeds]
        rollout = Rollout(engine, envs, seeds=seeds,
                          max_turns=config.inference.max_turns, max_tokens=config.inference.max_tokens,
                          temperature=config.inference.temperature, seed=config.inference.seed)
        start = time.perf_counter()
        batch = score_batch(rollout.run(), None, reward=config.reward)  # as the trainer scores
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
    print(table)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    config = build_config(args)
    train_and_report(config, Path(args.output), args.eval_episodes, args.minutes)
    return 0


def train_and_report(config: ConfigStore, out: Path, eval_episodes: int, minutes: float = 0,
                     transcript: Callable[[dict[str, Any]], None] | None = None) -> dict[str, Any]:
    """Train with `config` and write the run's files into `out`: held-out evaluation on
    seeds 10_000.. before and after (greedy), `fit` with a step line per step, the curve,
    `transcript.md` (`transcript(report)` writes it instead when given), `evals.json`,
    `summary.md` (with the run doctor's findings). Returns {"trainer", "evals", "before",
    "after" (the held-out batches or None), "stopped" (why fit stopped early, or ""),
    "findings" (`workbench.debug.doctor.diagnose_parts` over the steps and held-out batches)}."""
    from workbench.training import Trainer
    from workbench.training.progress import write

    out.mkdir(parents=True, exist_ok=True)
    config.training.log_dir = str(out)  # the loggers' files (metrics.jsonl, ...) go with the run's outputs
    if "jsonl" not in config.training.loggers:
        config.training.loggers = [*config.training.loggers, "jsonl"]  # every run writes metrics.jsonl
    trainer = Trainer(config)
    config.save(out / "config.yaml")  # after Trainer: it records the environment's import path and params
    eval_seeds = list(range(10_000, 10_000 + eval_episodes))
    report: dict[str, Any] = {"trainer": trainer, "evals": [], "before": None, "after": None, "stopped": ""}
    evals = report["evals"]
    if eval_episodes:
        evals.append({"step": 0, **trainer.evaluate(eval_seeds)})
        report["before"] = trainer.last_eval_batch
        write(f"held-out before training: {evals[-1]}")

    def on_step(tr: Any, m: dict) -> None:
        write(f"step {m['step']:3d}  reward {m['reward/mean']:+.3f}  success {m['env/success_rate']:.2f}  "
              f"ppo_kl {m.get('actor/ppo_kl', 0):+.4f}  entropy {m.get('actor/entropy', 0):.3f}  "
              f"{m['perf/step_seconds']:.1f}s")

    # fit resumes (checkpoint.resume), then its jsonl logger writes OUT/metrics.jsonl through
    # open_metrics_log, dropping lines of steps after the checkpoint (they are redone).
    trainer.fit(callbacks=[on_step], time_limit_s=minutes * 60 if minutes else None)
    if trainer.stop_reason:
        report["stopped"] = f"stopped early (--minutes {minutes:g}): {trainer.stop_reason}"
        print(report["stopped"], flush=True)
    if eval_episodes:
        evals.append({"step": trainer.global_step, **trainer.evaluate(eval_seeds)})
        report["after"] = trainer.last_eval_batch
        write(f"held-out after training: {evals[-1]}")
    if transcript is not None:
        transcript(report)
    elif report["after"] is not None:
        write_transcript(report["after"], out / "transcript.md",
                         f"{config.environment.name}: held-out episodes after {trainer.global_step} "
                         f"{config.training.adv_estimator} steps")
    elif trainer.last_batch is not None:
        write_transcript(trainer.last_batch, out / "transcript.md", f"{config.environment.name}: last training batch")
    plot_curve(trainer.metrics_history, out / "reward_curve.png", evals)
    (out / "evals.json").write_text(json.dumps(evals, indent=1))
    rows = [{"step": m["step"], "reward_mean": m["reward/mean"], "success": m["env/success_rate"],
             "entropy": m.get("actor/entropy", float("nan")), "seconds": m["perf/step_seconds"]}
            for m in trainer.metrics_history]
    table = summary_table(rows)
    stopped = report["stopped"]
    # The run doctor over the training steps and the held-out batches (workbench.debug.doctor).
    from workbench.debug.doctor import diagnose_parts, findings_markdown, findings_table

    report["findings"] = diagnose_parts(trainer.doctor.history if trainer.doctor else None,
                                        [(e["step"], b) for e, b in zip(evals, [report["before"], report["after"]])])
    (out / "summary.md").write_text((stopped + "\n\n" if stopped else "") + table + "\n"
                                    + ("\n" + summary_table(evals) + "\n" if evals else "")
                                    + "\n" + findings_markdown(report["findings"]) + "\n")
    print(table)
    print(findings_table(report["findings"]))
    print(f"wrote {out}/reward_curve.png, transcript.md, metrics.jsonl, summary.md")
    return report


def cmd_demo(args: argparse.Namespace) -> int:
    """Rollouts of the untrained model, then a short GRPO run that learns (`workbench.demo`)."""
    from workbench.demo import run_demo

    return run_demo(args)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    """Parse argv. Config flags not given are absent from the result (argparse.SUPPRESS),
    so `build_config` can tell them from values written in --config."""
    p = argparse.ArgumentParser(prog="python -m workbench", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    unset = argparse.SUPPRESS

    def common(sp: argparse.ArgumentParser, cmd: str) -> None:
        sp.add_argument("--env", default=unset, help=_help(
            cmd, "env", "environment: a registered name, module:Class, textarena:<id> or reasoning_gym:<task> "
            "(comma-separated for rollout)"))
        sp.add_argument("--env-param", dest="env_param", action="append", default=unset, metavar="K=V",
                        help="environment setting, repeatable (e.g. --env-param high=32); the value is read "
                             "as YAML (32 -> int, true -> bool); added to environment.params, except "
                             "EnvironmentConfig fields (max_steps, system_prompt, step_timeout), which set "
                             "that field. Without --config, max_steps defaults to --max-turns")
        sp.add_argument("--reward-param", dest="reward_param", action="append", default=unset, metavar="K=V",
                        help="reward shaping weight, repeatable (e.g. --reward-param success_bonus=5); sets "
                             "reward.K (step_reward_weight, success_bonus, invalid_action_penalty, "
                             "efficiency_bonus, max_steps)")
        sp.add_argument("--model", default=unset, help=_help(cmd, "model", "hub id, local folder or the embedded model"))
        sp.add_argument("--device", default=unset,
                        help=_help(cmd, "device", '"auto" (CUDA when available, else CPU), "cpu", "cuda", "cuda:1"'))
        sp.add_argument("--dtype", default=unset, choices=["auto", *DTYPES],
                        help=_help(cmd, "dtype", 'weights dtype; "auto" is bfloat16 on CUDA, float32 on CPU'))
        sp.add_argument("--backend", default=unset, choices=list(BACKENDS), help=_help(cmd, "backend", ""))
        sp.add_argument("--max-tokens", type=int, default=unset, help=_help(cmd, "max_tokens", "new tokens per model turn"))
        sp.add_argument("--max-turns", type=int, default=unset, help=_help(cmd, "max_turns", ""))
        sp.add_argument("--temperature", type=float, default=unset, help=_help(cmd, "temperature", ""))
        sp.add_argument("--seed", type=int, default=unset, help=_help(cmd, "seed", ""))
        sp.add_argument("--config", help="YAML config to start from (flags given on the command line override it)")
        sp.add_argument("--output", default=unset, help=f"output folder (default {OUTPUTS[cmd]})" + (
            "; checkpoints go to OUTPUT/checkpoints, or, with --config and no --output, to the file's "
            "checkpoint.output_dir" if cmd == "train" else ""))

    r = sub.add_parser("rollout", help="roll out a model and write transcripts and a summary table")
    common(r, "rollout")
    r.add_argument("--episodes", type=int, default=8)
    t = sub.add_parser("train", help="train with GRPO or PPO")
    common(t, "train")
    t.add_argument("--algo", default=unset, choices=list(ALGOS),
                   help=_help("train", "algo", "sets training.adv_estimator (ppo: gae)", "training.adv_estimator"))
    t.add_argument("--steps", type=int, default=unset,
                   help=_help("train", "steps", "training steps: training.num_epochs=1, num_iters_per_epoch=N",
                             "num_epochs x num_iters_per_epoch"))
    t.add_argument("--batch-size", type=int, default=unset, help=_help("train", "batch_size", ""))
    t.add_argument("--group-size", type=int, default=unset, help=_help("train", "group_size", ""))
    t.add_argument("--lr", type=float, default=unset, help=_help("train", "lr", ""))
    t.add_argument("--eval-episodes", type=int, default=32, help="held-out episodes before/after (0 = skip)")
    t.add_argument("--minutes", type=float, default=0,
                   help="stop after the training step that ends past this many minutes (0 = no limit)")
    t.add_argument("--save-interval", type=int, default=unset, help=_help("train", "save_interval", ""))
    t.add_argument("--loggers", type=lambda text: [n.strip() for n in text.split(",") if n.strip()], default=unset,
                   help=_help("train", "loggers", "comma-separated: jsonl, tensorboard, trackio, wandb (offline); "
                              "jsonl is always added"))
    d = sub.add_parser("demo", help="what `make demo` runs: rollouts on two envs, then a short GRPO run "
                                    "with held-out success before and after")
    d.add_argument("--model", default=EMBEDDED_MODEL)
    d.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    d.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help='"auto": bfloat16 on CUDA, float32 on CPU')
    d.add_argument("--output", default=unset, help=f"output folder (default {OUTPUTS['demo']})")
    d.add_argument("--minutes", type=float, default=6,
                   help="stop training after the step that ends past this many minutes (default 6)")
    x = sub.add_parser("export-verl", help="write what verl's multi-turn agent loop needs to run an environment "
                                           "and its tools (workbench.verl_export)")
    x.add_argument("--env", help="environment: a registered name, module:Class, textarena:<id> or "
                                 "reasoning_gym:<task> (default: environment.name of --config, else guess_number)")
    x.add_argument("--env-param", dest="env_param", action="append", metavar="K=V",
                   help="environment setting, repeatable; the value is read as YAML; added to environment.params")
    x.add_argument("--config", help="YAML config whose sections are mapped onto verl's trainer config "
                                    "(default: ConfigStore defaults)")
    x.add_argument("--out", "--output", dest="output", required=True, help="output folder")
    x.add_argument("--train-size", type=int, default=None,
                   help="rows (seeds 0..N-1) in train.parquet (default: num_iters_per_epoch x batch_size / group_size)")
    x.add_argument("--val-size", type=int, default=32, help="rows (seeds from 10000) in val.parquet (default 32)")
    from workbench.debug.doctor import add_diagnose_parser  # python -m workbench diagnose RUN_DIR

    add_diagnose_parser(sub)
    args = p.parse_args(argv)
    args.output_given = hasattr(args, "output")
    if not args.output_given:
        args.output = OUTPUTS[args.command]
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        if args.command == "export-verl":
            from workbench.verl_export import cmd_export_verl

            return cmd_export_verl(args)
        if args.command == "diagnose":
            return args.run(args)
        return {"rollout": cmd_rollout, "train": cmd_train, "demo": cmd_demo}[args.command](args)
    except ConfigError as exc:  # names the field; a traceback adds nothing
        print(f"config error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
