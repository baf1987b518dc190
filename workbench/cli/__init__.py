"""Command line: `python -m workbench {train,rollout,demo,export-verl,diff,diagnose,compare,audit-judge,import}`.

    __init__.py  argument parsing only: `main`, the commands and their flags
    demo.py      `make demo`: rollouts, then GRPO with held-out success before and after
    runner.py    the rollout and train jobs behind the commands and the demo
    reports.py   transcripts, curves and tables a run writes for people

    python -m workbench rollout --env guess_number --episodes 8
    python -m workbench train --env guess_number --algo grpo --steps 20 --output runs/gn
    python -m workbench demo            # what `make demo` runs
    python -m workbench diagnose runs/gn   # the run doctor (workbench.debug.doctor)
    python -m workbench compare runs/gn runs/gn2   # two runs side by side (workbench.debug.compare)
    python -m workbench train --config run.yaml --lr 1e-4   # the file, with one field changed
    python -m workbench train --from runs/gn/checkpoints/step_000010 --lr 1e-4 --steps 10 --output runs/gn-lr
                                           # a branch: that checkpoint's run, one setting changed

Flags override `--config` only when given on the command line; without `--config`, a
flag not given takes the value shown in --help. With `--from CHECKPOINT` (a branch,
`workbench.training.branch`) the checkpoint's own config.yaml takes the place of
`--config`: a flag not given keeps the parent run's value, `--steps N` trains N steps after
the checkpoint's step, `--output` (required) is the branch's own folder. `--device`/`--dtype` default to "auto":
CUDA and bfloat16 when there is a GPU; else the CPU, in bfloat16 when it reports bf16 instructions
(avx512_bf16 or amx_bf16; float32 for full fine-tuning) and float32 otherwise. The choice and its
reason are printed once.

Every run writes into its output folder: `config.yaml`, `metrics.jsonl`,
`reward_curve.png`, `transcript.md` (best and worst episodes), `summary.md`,
`episodes.jsonl` (best/worst episodes of the first step and every
`training.log_episodes_every` steps after it), `evals.json`, each step's batch under
`rollouts/` and the held-out batches under `evals/` (`workbench.training.run_files`;
reopen the run with `workbench.debug.load_run`), and checkpoints under `checkpoints/`;
`--loggers tensorboard,trackio,wandb` adds those sinks (`workbench.training.loggers`).

A bad config field or flag value, a run folder or batch file that cannot be read
(`RunError`: a missing or cut file, a link out of the run folder), a run folder another run
is writing (`RunLockedError`) or whose run is finished (`RunFinishedError`), and a file that
cannot be written (a path through a file, no permission, a read-only or full disk) print one
line (`config error: ...`, `error: ...`; `diff: ...` / `compare: ...` from those) and exit 2,
without a traceback. A run that trained nothing (every step skipped) writes its files, says
why in one line and exits 1. Ctrl-C prints one line (for `train`: the step it stopped at and
the command that resumes it from its newest checkpoint) and exits 130.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Sequence

from workbench.config import BACKENDS, DTYPES, EMBEDDED_MODEL, ConfigError, ConfigStore
from workbench.config.flags import add_config_flags, apply_config_flags, given_config_flags
from workbench.environments.params import (  # noqa: F401 - public here too
    apply_env_params, parse_env_params, parse_key_values,
)

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
#: Held-out episodes of `train` when --eval-episodes is not given (a branch: its parent's count).
DEFAULT_EVAL_EPISODES = 32
ALGOS = {"grpo": "grpo", "ppo": "gae", "rloo": "rloo", "reinforce_plus_plus": "reinforce_plus_plus",
         "reinforce_plus_plus_baseline": "reinforce_plus_plus_baseline"}


def _help(command: str, dest: str, text: str, from_config: str | None = None) -> str:
    field = FLAG_FIELDS.get(command, {}).get(dest)
    from_config = from_config or (f"{field[0]}.{field[1]}" if field else "")
    return f"{text} (default {PRESETS[command][dest]}, or {from_config} from --config)".lstrip()


def build_config(args: argparse.Namespace, base: ConfigStore | None = None) -> ConfigStore:
    """The run's config: the --config file (or `base`, a branch's checkpoint config, or
    ConfigStore defaults plus the CLI presets), then every flag given on the command line,
    and only those."""
    given = vars(args)
    command = args.command
    check_counts(args)
    if base is not None:
        config = ConfigStore.from_dict(base.to_dict())
        values = dict(given)
    elif given.get("config"):
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
        if args.output_given or not (given.get("config") or base is not None):  # else the file's stays
            config.checkpoint.output_dir = str(Path(args.output) / "checkpoints")
    if not (given.get("config") or base is not None):
        # Quick runs: the environment's step budget (which its prompt states, e.g. "You have
        # 4 guesses") is the number of turns the rollout really allows (--env-param max_steps=N wins).
        config.environment.max_steps = config.inference.max_turns
    apply_env_params(config, given.get("env_param") or [])
    if given.get("reward_param"):
        config.update("reward", parse_key_values(given["reward_param"], "--reward-param", "success_bonus=5"))
    apply_config_flags(config, args)  # --SECTION.FIELD flags, generated from the config dataclasses
    return config.validate()


def check_counts(args: argparse.Namespace) -> None:
    """The command's own number flags (not config fields): ConfigError naming the flag, before
    it is turned into config fields whose names the user never typed."""
    steps = getattr(args, "steps", None)
    if steps is not None and steps < 1:
        raise ConfigError(f"--steps must be an integer >= 1 (training steps to run; with --from, the steps after "
                          f"the checkpoint's step), got {steps}")
    for flag, dest, least in (("--episodes", "episodes", 1), ("--eval-episodes", "eval_episodes", 0)):
        value = getattr(args, dest, None)
        if value is not None and value < least:
            raise ConfigError(f"{flag} must be an integer >= {least}, got {value}")
    minutes = getattr(args, "minutes", None)
    if minutes is not None and not (minutes >= 0 and minutes != float("inf")):
        raise ConfigError(f"--minutes must be a finite number >= 0 (0 = no limit), got {minutes}")


def cmd_rollout(args: argparse.Namespace) -> int:
    """Roll out the model and write transcripts and a summary table (`workbench.cli.runner`)."""
    from workbench.cli.runner import rollout_and_report

    rollout_and_report(build_config(args), Path(args.output), args.episodes)
    return 0


def cmd_train(args: argparse.Namespace) -> int:
    from workbench.cli.runner import train_and_report

    if getattr(args, "from_checkpoint", None):
        return cmd_branch(args)
    config = build_config(args)
    eval_episodes = DEFAULT_EVAL_EPISODES if args.eval_episodes is None else args.eval_episodes
    return run_exit_code(train_and_report(config, Path(args.output), eval_episodes, args.minutes))


def run_exit_code(report: dict[str, Any]) -> int:
    """0 for a run that trained; 1, with one line saying why, for one that trained nothing
    (every step skipped: e.g. every episode failed at its environment's reset)."""
    from workbench.cli.runner import nothing_trained

    why = nothing_trained(report)
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    return 0


def branch_overrides(args: argparse.Namespace) -> tuple[Path, dict[str, Any], int | None, Any]:
    """`train --from CHECKPOINT`: (the checkpoint folder, the settings the flags given change
    `{"section.field": value}`, --steps or None, the hold on the checkpoint to exit once the
    branch has loaded it), read from the checkpoint's config.yaml without loading a model;
    ConfigError (a BranchError) saying what to fix. The hold (`branch.hold_branch_checkpoint`)
    keeps a parent that is still training from pruning the checkpoint meanwhile."""
    from workbench.training import branch

    if args.config:
        raise branch.BranchError("--from and --config cannot be combined: a branch starts from the settings in the "
                                 "checkpoint's own config.yaml; give the settings to change as flags")
    if not args.output_given:
        raise branch.BranchError("--from needs --output NEW: the branch's own folder (a branch never writes "
                                 "into the run it came from)")
    flags = given_config_flags(args)
    placed = [f"--{k}" for k in branch.PLACE_FIELDS if k.partition(".")[2] in flags.get(k.partition(".")[0], {})]
    if placed:
        raise branch.BranchError(f"{', '.join(placed)}: a branch writes to --output (checkpoints in "
                                 "OUTPUT/checkpoints, logs in OUTPUT); give --output instead")
    checkpoint, hold = branch.hold_branch_checkpoint(args.from_checkpoint)
    with hold:
        saved, state = branch.read_checkpoint_head(checkpoint)
        overrides, steps = _branch_changes(args, branch, checkpoint, saved, state)
        return checkpoint, overrides, steps, hold.pop_all()


def _branch_changes(args: argparse.Namespace, branch: Any, checkpoint: Path, saved: Any,
                    state: dict[str, Any]) -> tuple[dict[str, Any], int | None]:
    steps = getattr(args, "steps", None)
    config = build_config(args, base=saved)
    changes = branch.config_changes(saved, config)
    skip = branch.PLACE_FIELDS + (branch.LENGTH_FIELDS if steps is not None else ())
    overrides = {k: new for k, (_, new) in changes.items() if k not in skip}
    step, target = int(state["global_step"]), config.training.num_epochs * config.training.num_iters_per_epoch
    if steps is None and target <= step:
        raise branch.BranchError(f"{checkpoint} is at step {step} and its run's target is step {target} "
                                 "(training.num_epochs x num_iters_per_epoch): give --steps N to train N steps "
                                 "after it")
    return overrides, steps


def parent_eval_episodes(parent_run: Path | None) -> int | None:
    """How many held-out episodes the parent run evaluated (its evals.json), None if unknown."""
    import json

    try:
        evals = json.loads((parent_run / "evals.json").read_text()) if parent_run else []
        return int(evals[0]["eval/episodes"])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return None


def cmd_branch(args: argparse.Namespace) -> int:
    """`train --from CHECKPOINT`: a branch of that run with the flags given as overrides
    (`Trainer.from_checkpoint`), trained and reported like any run into --output. Held-out
    episodes default to the parent's count, so both evaluate the same seeds."""
    from workbench.cli.runner import train_and_report
    from workbench.training import Trainer

    checkpoint, overrides, steps, hold = branch_overrides(args)
    out = Path(args.output)
    with hold:  # until the branch has loaded it
        trainer = Trainer.from_checkpoint(checkpoint, output_dir=out, overrides=overrides, steps=steps)
    eval_episodes = args.eval_episodes
    if eval_episodes is None:
        eval_episodes = parent_eval_episodes(trainer.branched_from.parent_run) or DEFAULT_EVAL_EPISODES
    return run_exit_code(train_and_report(trainer.config, out, eval_episodes, args.minutes, trainer=trainer))


def cmd_demo(args: argparse.Namespace) -> int:
    """Rollouts of the untrained model, then a short GRPO run that learns (`workbench.cli.demo`)."""
    from workbench.cli.demo import run_demo

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
                        help=_help(cmd, "dtype", 'weights dtype; "auto" is bfloat16 on CUDA and on CPUs with bf16 '
                                                      'instructions, else float32'))
        sp.add_argument("--backend", default=unset, choices=list(BACKENDS), help=_help(cmd, "backend", ""))
        sp.add_argument("--max-tokens", type=int, default=unset, help=_help(cmd, "max_tokens", "new tokens per model turn"))
        sp.add_argument("--max-turns", type=int, default=unset, help=_help(cmd, "max_turns", ""))
        sp.add_argument("--temperature", type=float, default=unset, help=_help(cmd, "temperature", ""))
        sp.add_argument("--seed", type=int, default=unset, help=_help(cmd, "seed", ""))
        sp.add_argument("--config", help="YAML config to start from (flags given on the command line override it)")
        sp.add_argument("--output", default=unset, help=f"output folder (default {OUTPUTS[cmd]})" + (
            "; checkpoints go to OUTPUT/checkpoints, or, with --config and no --output, to the file's "
            "checkpoint.output_dir" if cmd == "train" else ""))
        add_config_flags(sp)

    r = sub.add_parser("rollout", help="roll out a model and write transcripts and a summary table",
                       usage="python -m workbench rollout [options] [--SECTION.FIELD VALUE ...]")
    common(r, "rollout")
    r.add_argument("--episodes", type=int, default=8)
    t = sub.add_parser("train", help="train with GRPO or PPO",
                       usage="python -m workbench train [options] [--SECTION.FIELD VALUE ...]")
    common(t, "train")
    t.add_argument("--algo", default=unset, choices=list(ALGOS),
                   help=_help("train", "algo", "sets training.adv_estimator (ppo: gae)", "training.adv_estimator"))
    t.add_argument("--steps", type=int, default=unset,
                   help=_help("train", "steps", "training steps: training.num_epochs=1, num_iters_per_epoch=N",
                             "num_epochs x num_iters_per_epoch"))
    t.add_argument("--batch-size", type=int, default=unset, help=_help("train", "batch_size", ""))
    t.add_argument("--group-size", type=int, default=unset, help=_help("train", "group_size", ""))
    t.add_argument("--lr", type=float, default=unset, help=_help("train", "lr", ""))
    t.add_argument("--eval-episodes", type=int, default=None,
                   help=f"held-out episodes before/after, seeds 10000.. (0 = skip; default {DEFAULT_EVAL_EPISODES}, "
                        "with --from the parent run's count)")
    t.add_argument("--from", dest="from_checkpoint", metavar="CHECKPOINT", default=None,
                   help="branch a run: start from this checkpoint (RUN/checkpoints/step_N, or a run folder for its "
                        "newest) with its run's settings, changed only by the flags given; --steps N trains N steps "
                        "after it; --output (required) is the branch's own folder, which records the origin in "
                        "branch.json (workbench.training.branch)")
    t.add_argument("--minutes", type=float, default=0,
                   help="stop after the training step that ends past this many minutes (0 = no limit)")
    t.add_argument("--save-interval", type=int, default=unset, help=_help("train", "save_interval", ""))
    t.add_argument("--loggers", type=lambda text: [n.strip() for n in text.split(",") if n.strip()], default=unset,
                   help=_help("train", "loggers", "comma-separated: jsonl, tensorboard, trackio, wandb (offline); "
                              "jsonl is always added"))
    d = sub.add_parser("demo", help="what `make demo` runs: rollouts on two envs, then a short GRPO run "
                                    "with held-out success before and after",
                       usage="python -m workbench demo [options] [--SECTION.FIELD VALUE ...]",
                       description="--SECTION.FIELD VALUE flags change the training part's config (e.g. "
                                   "--training.max_staleness 1, --training.seed 1, --sft.steps 0); the rollout "
                                   "part keeps its own.")
    d.add_argument("--model", default=EMBEDDED_MODEL)
    d.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    d.add_argument("--dtype", default="auto", choices=["auto", *DTYPES], help='"auto": bfloat16 on CUDA and on CPUs with bf16 instructions, else float32')
    d.add_argument("--output", default=unset, help=f"output folder (default {OUTPUTS['demo']})")
    d.add_argument("--minutes", type=float, default=None,
                   help="stop training after the step that ends past this many minutes (default 6; "
                        "with --past-sft 0, no limit)")
    d.add_argument("--past-sft", action="store_true",
                   help="RL past SFT: 1 SFT step (held-out 0.75: it counts up from 4 and loses every "
                        "secret 8), then 24 GRPO steps in groups of 4 (4 secrets a step) with entropy bonus 0.01 "
                        "and dynamic sampling (workbench.cli.demo.PAST_SFT)")
    add_config_flags(d)
    x = sub.add_parser("export-verl", help="write what verl's multi-turn agent loop needs to run an environment "
                                           "and its tools (workbench.compat.verl_export)")
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
    from workbench.debug.compare import add_compare_parser
    from workbench.debug.diff import add_diff_parser
    from workbench.debug.doctor import add_diagnose_parser

    add_diff_parser(sub)  # python -m workbench diff CKPT_A CKPT_B ...
    # python -m workbench diagnose RUN_DIR [--doctor.FIELD VALUE ...]: thresholds over the run's own
    add_config_flags(add_diagnose_parser(sub), sections=("doctor",))
    add_compare_parser(sub)  # python -m workbench compare RUN_A RUN_B
    from workbench.importers.command import add_import_parser

    add_import_parser(sub)  # python -m workbench import PATH --output RUN (verl, TRL, ART, verifiers, prime-rl)
    from workbench.debug.judge_audit import add_audit_judge_parser

    # python -m workbench audit-judge RUN --judge SPEC [--reward.FIELD V] [--doctor.FIELD V]
    add_config_flags(add_audit_judge_parser(sub), sections=("reward", "doctor"))
    args = p.parse_args(argv)
    args.output_given = hasattr(args, "output")
    if not args.output_given:
        args.output = OUTPUTS[args.command]
    return args


def one_line(exc: BaseException) -> str:
    """An error's message as one line (a message with line breaks, e.g. a grammar library's,
    joined with "; "), so the CLI's promise of one line on stderr holds."""
    return "; ".join(part.strip() for part in str(exc).splitlines() if part.strip()) or type(exc).__name__


def os_error_line(exc: OSError) -> str:
    """One line for a failed file operation: what failed, on which path, and what to do."""
    import errno

    where = " -> ".join(str(f) for f in (exc.filename, exc.filename2) if f is not None)
    what = exc.strerror or str(exc) or type(exc).__name__
    hint = {errno.ENOSPC: "the disk is full: free some space (or give --output on another disk) and run the "
                          "command again; a run resumes from its newest complete checkpoint",
            errno.EDQUOT: "the disk quota is used up: free some space and run the command again",
            errno.EACCES: "this user may not write there: give an --output folder you can write to",
            errno.EPERM: "this user may not write there: give an --output folder you can write to",
            errno.EROFS: "that file system is read-only: give an --output folder on a writable disk",
            errno.ENOTDIR: "a part of that path is a file, not a folder: give an --output folder path",
            errno.EEXIST: "a file is in the way: give another path"}.get(exc.errno, "")
    return f"{what}: {where}" + (f" ({hint})" if hint else "") if where else f"{what}" + (f" ({hint})" if hint else "")


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; returns its exit code. What a user did wrong or what the machine
    refused (a bad flag or config value, a run folder that cannot be read or is in use by
    another run or finished, a file that cannot be written, a full disk) prints one line on
    stderr and returns 2, without a traceback; Ctrl-C prints one line (for `train`: where the
    run can resume) and returns 130."""
    args = parse_args(argv)
    from workbench.debug.runs import RunError  # here, not at the top: --help stays quick (no torch)
    from workbench.training.run_lock import RunFinishedError, RunLockedError, RunLockError
    from workbench.rollout.template import TemplateError
    from workbench.training.checkpoint import CheckpointError
    from workbench.training.sft import ExpertError

    try:
        if args.command == "export-verl":
            from workbench.compat.verl_export import cmd_export_verl

            return cmd_export_verl(args)
        if args.command == "diff":
            from workbench.debug.diff import cmd_diff

            return cmd_diff(args)
        if args.command == "diagnose":
            args.doctor_overrides = given_config_flags(args).get("doctor", {})
            return args.run(args)
        if args.command in ("compare", "import"):
            return args.run(args)
        if args.command == "audit-judge":
            args.overrides = given_config_flags(args)
            return args.run(args)
        return {"rollout": cmd_rollout, "train": cmd_train, "demo": cmd_demo}[args.command](args)
    except ConfigError as exc:  # names the field; a traceback adds nothing
        print(f"config error: {one_line(exc)}", file=sys.stderr)
        return 2
    except (RunError, RunLockedError, RunLockError, RunFinishedError, ExpertError, TemplateError,
            CheckpointError) as exc:  # the message says what to do (a checkpoint of another model: which, and the fix)
        print(f"error: {one_line(exc)}", file=sys.stderr)
        return 2
    except OSError as exc:  # a file that cannot be written (a full disk, a path through a file, no permission)
        print(f"error: {os_error_line(exc)}", file=sys.stderr)
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C: one line, and for a run where it can resume
        from workbench.cli.runner import RunInterrupted

        if isinstance(exc, RunInterrupted):
            line = f": {exc.line}"
        elif args.command in ("train", "demo"):
            line = " before training started: there is nothing to resume; run the command again"
        else:
            line = ""
        print(f"\ninterrupted (Ctrl-C){line}", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
