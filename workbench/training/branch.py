"""Branch a run: a new run that starts from a checkpoint of another one, with some settings
changed (the remedy to try), in its own folder that records where it came from.

    trainer = Trainer.from_checkpoint("runs/gn/checkpoints/step_000010", output_dir="runs/gn-lr",
                                      overrides={"training.learning_rate": 1e-4}, steps=10)
    trainer.fit()                  # steps 10..19, into runs/gn-lr; runs/gn is never written

    python -m workbench train --from runs/gn/checkpoints/step_000010 --training.learning_rate 1e-4 \\
        --steps 10 --output runs/gn-lr

What a branch is (the functions here; `Trainer.from_checkpoint` puts them together):

* Config: the checkpoint's own `config.yaml` (the settings the parent trained with), then
  the overrides, and nothing else: a setting not overridden keeps the parent's value.
  Overrides are `{"section.field": value}` or `{"section": {"field": value}}`, checked like
  any config value. An override of an `IDENTITY_FIELDS` field (model, LoRA shape,
  environment name, advantage estimator) is refused (`BranchError` naming the field): the
  checkpoint's weights and optimizer state only fit the run they came from.
* State: weights (policy, critic), optimizer moments, RNG, KL coefficient, step counter and
  metrics history come from the checkpoint (`Trainer.load_checkpoint`); the optimizer's
  learning rate and weight decay are the branch config's (an overridden one is not warned
  about as a resume with another learning rate is). The step counter continues from
  the checkpoint's step, so the branch's step N is the parent's step N with the remedy
  applied: its curves line up with the parent's, and with no override it samples the same
  seeds the parent did.
* Length: `steps=N` trains N more RL steps (the config's target, `sft.steps + num_epochs x
  num_iters_per_epoch`, becomes `step + N` plus the SFT steps still to come); without it the
  parent's target stays (a branch from the middle of a run ends where the parent ended).
* SFT warm-up: an override of `sft.steps` (the `format-errors` remedy) is a warm-up of the
  branch's own: `sft.start_step` becomes the checkpoint's step, so the branch's first
  `sft.steps` steps are SFT steps and its RL steps follow (`fit` and the CLI report held-out
  success after them).
* Folder (`output_dir`): its own. It may not be the parent's run folder or lie inside it
  (nor be the checkpoint's folder, the folder of the parent's checkpoints, or inside them),
  and neither may its `checkpoint.output_dir` / `training.log_dir`, which the branch sets
  from it (an override of those is refused): nothing of the parent is ever written. An earlier run
  found there is moved aside to `previous_runs/` (as a fresh run does). The folder gets
  `branch.json` (`BRANCH_FILE`: parent run folder, checkpoint, step, overrides with the
  parent's values, target step, date), `config.yaml` (the branch's settings), and
  `metrics.jsonl` / `episodes.jsonl` holding the parent's rows of steps before the branch
  step (copied from the parent's folder, else the checkpoint's metrics history), so its
  metrics are complete from step 0; the branch's own steps are appended after them.
  Saved batches (`rollouts/`) and held-out evaluations before the branch step stay in the
  parent's folder (`branch.json` names it). Checkpoints go to `output_dir/checkpoints`.

`load_run(branch_folder).branched_from` reads `branch.json` back (`BranchOrigin`).
"""
from __future__ import annotations

import contextlib
import datetime as _dt
import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from workbench.config import SECTIONS, ConfigError, ConfigStore
from workbench.training import checkpoint as ckpt
from workbench.training import run_files
from workbench.training.run_lock import RunLock, set_aside_earlier_run
from workbench.utils.progress import write

#: The file in a branch's folder that records where it branched from.
BRANCH_FILE = "branch.json"
#: Fields the branch itself sets (where it writes, how far it trains): not overrides.
PLACE_FIELDS = ("checkpoint.output_dir", "training.log_dir")
#: The fields that set how many steps a run trains (`steps=` sets them for a branch).
LENGTH_FIELDS = ("training.num_epochs", "training.num_iters_per_epoch")


class BranchError(ConfigError):
    """A branch cannot start as asked (a missing or damaged checkpoint, an identity field
    overridden, an output folder inside the parent); the message names what to change.
    A `ConfigError`, so the CLI reports it in one line with exit code 2."""


@dataclass(frozen=True)
class BranchOrigin:
    """Where a branch came from: the contents of its `branch.json`."""

    checkpoint: Path
    """The checkpoint folder the branch started from."""
    step: int
    """The checkpoint's `global_step`: the branch's first step has this number."""
    parent_run: Path | None
    """The run folder the checkpoint belongs to (None for a checkpoint outside a run folder)."""
    overrides: dict[str, Any] = field(default_factory=dict)
    """The settings the branch changed, `{"section.field": value}` (only those that differ)."""
    parent_values: dict[str, Any] = field(default_factory=dict)
    """The parent's value of each overridden setting, `{"section.field": value}`."""
    until_step: int = 0
    """The absolute step the branch trains up to (`training.num_epochs x num_iters_per_epoch`)."""
    created: str = ""
    """When the branch folder was set up (UTC, ISO 8601)."""

    def to_json(self) -> dict[str, Any]:
        return {"parent_run": None if self.parent_run is None else str(self.parent_run),
                "checkpoint": str(self.checkpoint), "step": self.step, "overrides": self.overrides,
                "parent_values": self.parent_values, "until_step": self.until_step, "created": self.created}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> "BranchOrigin":
        parent = data.get("parent_run")
        return cls(checkpoint=Path(data["checkpoint"]), step=int(data["step"]),
                   parent_run=None if parent is None else Path(parent), overrides=dict(data.get("overrides") or {}),
                   parent_values=dict(data.get("parent_values") or {}), until_step=int(data.get("until_step", 0)),
                   created=str(data.get("created", "")))


# -- where the checkpoint comes from --------------------------------------------------------
def resolve_checkpoint(path: str | Path) -> Path:
    """The checkpoint folder `path` names: a `step_N` folder itself, or a run folder (its
    newest intact checkpoint, under `checkpoints/` or in the folder itself). BranchError when
    there is none."""
    path = Path(path)
    if not path.is_dir():
        there = ckpt.list_checkpoints(path.parent) if path.name.startswith(ckpt.PREFIX) else []
        if there:  # a sibling of checkpoints that are there: its run pruned it (keep_last_n)
            raise BranchError(f"--from {path}: no such folder: its run keeps only its newest checkpoints "
                              f"(checkpoint.keep_last_n) and has {', '.join(p.name for p in there)}; give one of "
                              f"those, or the run folder for its newest")
        raise BranchError(f"--from {path}: no such folder; give a checkpoint folder such as "
                          "RUN/checkpoints/step_000010 (load_run(RUN).checkpoints lists them)")
    if (path / ckpt.MANIFEST).is_file():
        return path
    for place in (path / run_files.CHECKPOINTS, path):
        found = ckpt.latest_checkpoint(place)
        if found is not None:
            return found
    raise BranchError(f"--from {path}: neither a checkpoint folder (it has no {ckpt.MANIFEST}) nor a run folder "
                      f"with checkpoints (none under {path / run_files.CHECKPOINTS}); give RUN/checkpoints/step_N")


def parent_run_folder(checkpoint: Path, saved: ConfigStore) -> Path | None:
    """The run folder a checkpoint belongs to: `RUN` for `RUN/checkpoints/step_N` (the CLI's
    layout), else the checkpoint's own parent folder when it holds the run's `metrics.jsonl`
    or `config.yaml` (a notebook run logging into `checkpoint.output_dir`), else the saved
    config's `training.log_dir` when that folder exists; None when none of these is a run."""
    checkpoint = checkpoint.resolve()
    candidates = []
    if checkpoint.parent.name == run_files.CHECKPOINTS:
        candidates.append(checkpoint.parent.parent)
    candidates.append(checkpoint.parent)
    if saved.training.log_dir:
        candidates.append(Path(saved.training.log_dir).resolve())
    for folder in candidates:
        if (folder / run_files.METRICS_FILE).is_file() or (folder / run_files.CONFIG_FILE).is_file():
            return folder
    return None


def read_checkpoint_head(checkpoint: Path) -> tuple[ConfigStore, dict[str, Any]]:
    """The checkpoint's config (its `config.yaml`) and `trainer_state.json`, after checking
    every file against the manifest; BranchError naming the checkpoint otherwise."""
    try:
        files = ckpt.verify_checkpoint(checkpoint)
    except ckpt.CheckpointError as exc:
        raise BranchError(f"cannot branch from {checkpoint}: {exc}") from exc
    missing = [name for name in ("config.yaml", "trainer_state.json") if name not in files]
    if missing:
        raise BranchError(f"cannot branch from {checkpoint}: it lacks {missing}, so it is not a trainer checkpoint")
    try:
        config = ConfigStore.from_dict(yaml.safe_load((checkpoint / "config.yaml").read_text()))
        state = json.loads((checkpoint / "trainer_state.json").read_text())
        int(state["global_step"])
    except (ConfigError, yaml.YAMLError, ValueError, KeyError, TypeError) as exc:
        raise BranchError(f"cannot branch from {checkpoint}: its config.yaml or trainer_state.json does not "
                          f"read ({exc})") from exc
    return config, state


# -- the branch's config --------------------------------------------------------------------------
def flat_overrides(overrides: Mapping[str, Any] | None) -> dict[str, Any]:
    """`{"section.field": v}` or `{"section": {"field": v}}` (or both) as `{"section.field": v}`;
    BranchError for a key that names no config section."""
    flat: dict[str, Any] = {}
    for key, value in (overrides or {}).items():
        if not isinstance(key, str):
            raise BranchError(f"override key {key!r} must be 'section.field' or a section name")
        if "." in key:
            if key.partition(".")[0] not in SECTIONS:
                raise BranchError(f"override {key!r}: no config section {key.partition('.')[0]!r}; "
                                  f"sections: {', '.join(SECTIONS)}")
            flat[key] = value
        elif key in SECTIONS and isinstance(value, Mapping):
            flat.update({f"{key}.{name}": v for name, v in value.items()})
        else:
            raise BranchError(f"override {key!r}: give 'section.field' (e.g. 'training.learning_rate') or "
                              f"{{section: {{field: value}}}}; sections: {', '.join(SECTIONS)}")
    return flat


def config_changes(parent: ConfigStore, branch: ConfigStore) -> dict[str, tuple[Any, Any]]:
    """Every field whose value differs: `{"section.field": (parent value, branch value)}`."""
    a, b = parent.to_dict(), branch.to_dict()
    return {f"{s}.{k}": (a[s].get(k), v) for s in b for k, v in b[s].items() if a.get(s, {}).get(k) != v}


def branch_config(saved: ConfigStore, overrides: Mapping[str, Any] | None, step: int,
                  steps: int | None = None) -> ConfigStore:
    """The branch's config: a copy of the checkpoint's `saved` config with `overrides` set
    (validated), and, with `steps`, the target `step + steps`. BranchError when an override
    names an `IDENTITY_FIELDS` field with another value, or a field that does not exist."""
    config = ConfigStore.from_dict(saved.to_dict())
    flat = flat_overrides(overrides)
    config.apply_overrides(flat)
    if flat.get("sft.steps") and "sft.start_step" not in flat:
        config.sft.start_step = step  # the branch's own warm-up comes first, from its step
    if steps is not None:
        if not isinstance(steps, int) or isinstance(steps, bool) or steps < 1:
            raise BranchError(f"steps must be an integer >= 1 (the steps to train after the branch step), "
                              f"got {steps!r}")
        # fit's target is sft.steps + num_epochs * num_iters_per_epoch: `steps` RL steps after
        # the checkpoint's step and after the SFT steps still to come from there.
        warm_up = max(0, config.sft.end_step - max(config.sft.start_step, step))
        config.training.num_epochs = 1
        config.training.num_iters_per_epoch = step + warm_up + steps - config.sft.steps
    config.validate()
    refused = ckpt.config_differences(saved.to_dict(), config.to_dict())
    if refused:
        fields = ", ".join(d.split(":")[0] for d in refused)
        raise BranchError(
            f"a branch cannot change {fields} ({'; '.join(refused).replace('this run', 'the branch')}): it starts "
            f"from the checkpoint's weights and optimizer state, which only fit the same model, LoRA shape, "
            f"environment and advantage estimator. Change other settings, or start a new run for that")
    return config


# -- the branch's folder ---------------------------------------------------------------------------
def check_output(output_dir: Path, checkpoint: Path, parent_run: Path | None, config: ConfigStore) -> None:
    """BranchError when the branch would write into its parent: the output folder, its
    `checkpoint.output_dir` or `training.log_dir` equal to or inside the parent run folder,
    the checkpoint's folder or the folder holding the parent's checkpoints."""
    guarded = [p for p in (parent_run, checkpoint.resolve().parent, checkpoint.resolve()) if p is not None]
    places = {"the output folder": output_dir, "checkpoint.output_dir": Path(config.checkpoint.output_dir)}
    if config.training.log_dir:
        places["training.log_dir"] = Path(config.training.log_dir)
    for what, place in places.items():
        place = place.resolve()
        for guard in guarded:
            if place == guard or guard in place.parents:
                raise BranchError(
                    f"{what} {place} is {'the' if place == guard else 'inside the'} parent's folder {guard}: a "
                    f"branch never writes into the run it came from; give it a folder of its own (e.g. "
                    f"--output {guard.parent if guard == parent_run else output_dir.parent}/<name>)")


def _rows_before(path: Path, step: int) -> list[str]:
    """The lines of a metrics-style JSONL file whose `"step"` is below `step` (others, and
    lines cut short, are left out)."""
    if not path.is_file():
        return []
    kept = []
    for line in path.read_text(encoding="utf-8").splitlines():
        try:
            row_step = json.loads(line)["step"]
        except (json.JSONDecodeError, KeyError, TypeError):
            continue
        if isinstance(row_step, int) and row_step < step:
            kept.append(line + "\n")
    return kept


def _write(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def write_branch_folder(output_dir: Path, origin: BranchOrigin, config: ConfigStore,
                        metrics_history: list[dict[str, Any]]) -> None:
    """Write the branch's `branch.json`, `config.yaml`, and the parent's `metrics.jsonl` /
    `episodes.jsonl` rows before the branch step (from the parent's folder; metrics from
    `metrics_history`, the checkpoint's, when the parent's folder has none). An earlier run
    in the folder was moved aside by the caller."""
    output_dir.mkdir(parents=True, exist_ok=True)
    _write(output_dir / BRANCH_FILE, json.dumps(origin.to_json(), indent=1) + "\n")
    config.save(output_dir / run_files.CONFIG_FILE)
    parent = origin.parent_run
    metrics = _rows_before(parent / run_files.METRICS_FILE, origin.step) if parent else []
    if not metrics:
        metrics = [json.dumps(jsonl_row(m)) + "\n"
                   for m in metrics_history if isinstance(m.get("step"), int) and m["step"] < origin.step]
    _write(output_dir / run_files.METRICS_FILE, "".join(metrics))
    episodes = _rows_before(parent / "episodes.jsonl", origin.step) if parent else []
    if episodes:
        _write(output_dir / "episodes.jsonl", "".join(episodes))


def jsonl_row(metrics: Mapping[str, Any]) -> dict[str, Any]:
    """A metrics-history entry as the jsonl logger writes it to metrics.jsonl (numbers and strings)."""
    return {k: v for k, v in metrics.items() if isinstance(v, (int, float, str))}


def read_branch(run_dir: str | Path) -> BranchOrigin | None:
    """The `BranchOrigin` recorded in `run_dir/branch.json`, None when the run is not a
    branch; BranchError when the file is damaged."""
    path = Path(run_dir) / BRANCH_FILE
    if not path.is_file():
        return None
    try:
        return BranchOrigin.from_json(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise BranchError(f"{path} is damaged ({exc}); it records where this run branched from "
                          "(parent_run, checkpoint, step, overrides)") from exc


def now_utc() -> str:
    return _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds")


def check_before_load(config: ConfigStore, step: int, trainer_kwargs: Mapping[str, Any],
                      changed: tuple[str, ...] = ()) -> None:
    """What a branch from `step` can check before any model loads, beyond its config: when it
    changes an `environment.*` setting or has SFT warm-up steps still to run (`sft.end_step >
    step`), the environment is built (not reset) the way the trainer builds it
    (`trainer_kwargs["environment"]`, else `make_env(environment.name, environment)`), so a
    setting it refuses (a strict format it does not have) is a BranchError now, and an SFT
    warm-up needs it to have a scripted expert (`env.expert_action`). Errors other than
    ConfigError are left to the trainer, which builds it again."""
    sft = config.sft.steps > 0 and config.sft.end_step > step
    if not sft and not any(k.startswith("environment.") for k in changed):
        return
    from workbench.environments.registry import make_env, make_environment
    from workbench.training.sft import expert_of

    given = trainer_kwargs.get("environment")
    try:
        env = make_environment(given) if given is not None else make_env(config.environment.name, config.environment)
    except ConfigError as exc:
        raise BranchError(f"the branch's environment refuses its settings: {exc}") from None
    except Exception:  # noqa: BLE001 - the trainer builds it again and reports its own error
        return
    try:
        if sft:
            expert_of(env)
    except ConfigError as exc:
        raise BranchError(f"sft.steps {config.sft.steps}: an SFT warm-up learns from the environment's scripted "
                          f"expert, and {exc}; branch without sft.steps") from None
    finally:
        close = getattr(env, "close", None)
        if callable(close):
            close()


# -- putting it together -----------------------------------------------------------------------------
def start_branch(trainer_cls: Any, checkpoint: str | Path, output_dir: str | Path,
                 overrides: Mapping[str, Any] | None, steps: int | None,
                 trainer_kwargs: Mapping[str, Any]) -> Any:
    """`Trainer.from_checkpoint` (its docstring is the reference): check everything that can
    be checked from the checkpoint's config (BranchError, before any model loads and before
    anything is written; `check_before_load`), take the branch folders' lock, build
    `trainer_cls(config, **trainer_kwargs)`, load the checkpoint, then set up the branch's folder
    (`write_branch_folder`). The trainer holds the lock; its `fit` releases it when it ends. When
    any of this fails the lock is given back and the folders it created are removed."""
    placed = [k for k in flat_overrides(overrides) if k in PLACE_FIELDS]
    if placed:
        raise BranchError(f"a branch's {', '.join(placed)} is set by its output folder (checkpoints in "
                          "OUTPUT/checkpoints, logs in OUTPUT): give output_dir (--output) instead")
    path, hold = hold_branch_checkpoint(checkpoint)
    with hold:  # the parent, still training, cannot prune it until the branch has loaded it
        return _start_held(trainer_cls, path, output_dir, overrides, steps, trainer_kwargs)


def hold_branch_checkpoint(checkpoint: str | Path) -> tuple[Path, contextlib.ExitStack]:
    """(the checkpoint folder `checkpoint` names, a held `ckpt.hold_checkpoint` of it to exit
    when the branch has loaded it). A run still training prunes its old checkpoints
    (`checkpoint.keep_last_n`); one pruned between choosing and holding it is chosen again
    (the run's newest) when `checkpoint` names a run folder, and a BranchError saying what
    happened and what to pass when it named that checkpoint itself."""
    for _ in range(8):
        path = resolve_checkpoint(checkpoint)
        stack = contextlib.ExitStack()
        try:
            stack.enter_context(ckpt.hold_checkpoint(path))
            return path, stack
        except ckpt.CheckpointGone:
            if path.resolve() == Path(checkpoint).resolve():
                run = path.parent.parent if path.parent.name == run_files.CHECKPOINTS else path.parent
                raise BranchError(
                    f"cannot branch from {path}: its run, still training, pruned it (checkpoint.keep_last_n) before "
                    f"the branch could hold it; give one it keeps, or the run folder for its newest: --from {run}"
                ) from None
    raise BranchError(f"cannot branch from {checkpoint}: its run keeps pruning the newest checkpoint before the branch "
                      "can hold it; give a checkpoint folder it keeps (load_run(RUN).checkpoints)")


def _start_held(trainer_cls: Any, path: Path, output_dir: str | Path, overrides: Mapping[str, Any] | None,
                steps: int | None, trainer_kwargs: Mapping[str, Any]) -> Any:
    """`start_branch` once its checkpoint `path` is held."""
    saved, state = read_checkpoint_head(path)
    step = int(state["global_step"])
    config = branch_config(saved, overrides, step, steps)
    out = Path(output_dir)
    config.checkpoint.output_dir = str(out / run_files.CHECKPOINTS)
    config.training.log_dir = str(out)
    parent_run = parent_run_folder(path, saved)
    check_output(out, path, parent_run, config)
    changes = {k: v for k, v in config_changes(saved, config).items()
               if k not in PLACE_FIELDS and (steps is None or k not in LENGTH_FIELDS)}
    check_before_load(config, step, trainer_kwargs, tuple(changes))
    # From here on the branch writes: its folders' lock first (RunLockedError, naming the run that
    # holds them, before anything is created or written), held by the trainer until its fit ends.
    lock = RunLock.of_config(config).acquire()
    trainer = None
    try:
        trainer = trainer_cls(config, **trainer_kwargs)
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer.load_checkpoint(path)
        for w in caught:  # an overridden learning rate is the point of the branch: no warning about it
            if not (issubclass(w.category, ckpt.ResumedHyperparameterWarning)
                    and any(f"{k}=" in str(w.message) for k in changes)):
                warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
        trainer._resume_tried = trainer._run_started = True  # fit neither resumes nor sets this run aside
        origin = BranchOrigin(
            checkpoint=path.resolve(), step=step, parent_run=parent_run,
            overrides={k: new for k, (_, new) in changes.items()},
            parent_values={k: old for k, (old, _) in changes.items()},
            until_step=config.sft.steps + config.training.num_epochs * config.training.num_iters_per_epoch,
            created=now_utc())
        set_aside_earlier_run([config.checkpoint.output_dir, out], why=f"a branch starts a new run in {out}")
        write_branch_folder(out, origin, config, trainer.metrics_history)
    except BaseException:
        lock.release(remove_created=True)  # a branch that failed leaves no folder it made behind
        if trainer is not None:
            trainer.cleanup()
        raise
    trainer._run_lock, trainer._run_lock_kept = lock, False  # its fit writes under it, and releases it
    trainer.branched_from = origin
    write(f"branched from {path} (step {step})" + (
        ": " + ", ".join(f"{k} {origin.parent_values[k]!r} -> {v!r}" for k, v in origin.overrides.items())
        if origin.overrides else " with the parent's settings") + f"; writing to {out}")
    return trainer


__all__ = ["BRANCH_FILE", "BranchError", "BranchOrigin", "branch_config", "check_output", "config_changes",
           "flat_overrides", "parent_run_folder", "read_branch", "read_checkpoint_head", "resolve_checkpoint",
           "start_branch", "write_branch_folder"]
