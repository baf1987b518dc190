"""Checkpoints that load without running code, survive a kill at any moment, and are pruned.

A checkpoint is a folder `step_000010/` holding:

    policy.safetensors        trained weights (LoRA adapters, or the full model)
    critic.safetensors        critic weights (PPO with GAE only)
    optimizer.safetensors     optimizer state tensors, keys `state.<param index>.<name>`
    optimizer.json            the rest of the optimizer state (param groups, plain values)
    rng.safetensors / .json   torch, numpy and python RNG states
    config.yaml               the run's ConfigStore
    trainer_state.json        step, metrics history, KL coefficient, what the weights are
    MANIFEST.json             format version, and size and sha256 of every file above

Nothing is unpickled: tensors are safetensors, everything else JSON or text, and only
the files MANIFEST.json lists are read (its structure is checked first). A manifest in
the pre-version-2 layout (pickled `.pt` files) is refused. The hashes detect truncated
or half-written files; they do not prove who wrote a folder.

Writing: files go to a temp folder `.step_000010.tmp-<pid>-<random>` (fsynced); an
existing folder of the same name is renamed aside to `.step_000010.old-<pid>-<random>`,
the new folder renamed in, and the old one deleted. Killed at any point, the folder
holds either the previous complete checkpoint or the new one, or (between the two
renames) the previous one sits aside. `recover_checkpoints` (run by `list_checkpoints`,
`latest_checkpoint` and `read_checkpoint` of a missing folder) renames such a folder
back, and deletes temp, aside and half-pruned folders, but only those whose writer
process is no longer alive on this machine, so a save running in parallel is never
disturbed (folders of this process are never touched either).
"""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import random
import re
import secrets
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any, Iterator, Mapping

import numpy as np
import torch
import yaml
from safetensors import SafetensorError
from safetensors.torch import load_file, save_file

FORMAT_VERSION = 2
MANIFEST = "MANIFEST.json"
PREFIX = "step_"
#: Kinds of file a checkpoint may hold (a manifest listing anything else is refused).
FILE_SUFFIXES = (".safetensors", ".json", ".yaml")
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]*\.[a-z]+")
_SHA256 = re.compile(r"[0-9a-f]{64}")
# `.<folder>.<tmp|old|del>-<pid>-<random>`: temp, set-aside and being-deleted folders.
_SIDE = re.compile(r"\.(?P<main>.+)\.(?P<kind>tmp|old|del)-(?P<pid>\d+)-[A-Za-z0-9_]+")


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete, corrupt or in an unsupported format."""


class CheckpointMismatchError(CheckpointError):
    """A checkpoint is intact but does not fit this trainer (other model, LoRA shape, algorithm...).

    Unlike other CheckpointErrors this is not a reason to fall back to an older checkpoint."""


# -- state <-> files ---------------------------------------------------------------------
def rng_state() -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Torch, numpy and python RNG states as (tensors, JSON-able dict)."""
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    version, internal, gauss_next = random.getstate()
    tensors = {"torch": torch.get_rng_state(), "numpy": torch.from_numpy(keys.astype(np.int64))}
    meta = {"numpy": {"kind": kind, "pos": int(pos), "has_gauss": int(has_gauss), "cached_gaussian": float(cached)},
            "python": {"version": version, "internal": list(internal), "gauss_next": gauss_next}}
    return tensors, meta


def prepare_rng_state(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any]) -> dict[str, Any]:
    """Check saved RNG states (on scratch generators) and return them ready for `set_rng_state`."""
    try:
        t, n, p = tensors["torch"], meta["numpy"], meta["python"]
        state = {"torch": t.to(torch.uint8),
                 "numpy": (n["kind"], tensors["numpy"].numpy().astype(np.uint32), int(n["pos"]),
                           int(n["has_gauss"]), float(n["cached_gaussian"])),
                 "python": (p["version"], tuple(int(x) for x in p["internal"]), p["gauss_next"])}
        torch.Generator().set_state(state["torch"])
        np.random.RandomState().set_state(state["numpy"])
        random.Random().setstate(state["python"])
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        raise CheckpointError(f"the saved RNG state is malformed ({type(exc).__name__}: {exc})") from exc
    return state


def set_rng_state(state: Mapping[str, Any]) -> None:
    """Restore the global RNGs from `prepare_rng_state`'s result."""
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def optimizer_state(sd: Mapping[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """An optimizer `state_dict()` as (tensors `state.<idx>.<name>`, JSON-able rest)."""
    tensors: dict[str, torch.Tensor] = {}
    values: dict[str, dict[str, Any]] = {}
    for idx, entry in sd["state"].items():
        for name, v in entry.items():
            if isinstance(v, torch.Tensor):
                tensors[f"state.{idx}.{name}"] = v.detach().cpu().contiguous()
            else:
                values.setdefault(str(idx), {})[name] = _json_value(v, f"optimizer state {idx}.{name}")
    groups = [{k: _json_value(v, f"optimizer param_groups.{k}") for k, v in g.items()} for g in sd["param_groups"]]
    return tensors, {"param_groups": groups, "state_values": values}


class ResumedHyperparameterWarning(UserWarning):
    """A resumed run's config sets an optimizer hyperparameter the checkpoint had another value for."""


#: Optimizer hyperparameters the config sets, per optimizer (`what` in `optimizer_state_dict`):
#: on resume the config's value is used, not the checkpoint's, with a warning naming both.
CONFIG_HYPERPARAMS = {
    "optimizer": {"lr": "training.learning_rate", "weight_decay": "training.weight_decay"},
    "critic optimizer": {"lr": "training.critic_learning_rate"},
}


def optimizer_state_dict(tensors: Mapping[str, torch.Tensor], meta: Mapping[str, Any],
                         optimizer: torch.optim.Optimizer, what: str) -> dict[str, Any]:
    """Rebuild a state_dict saved by `optimizer_state` and check it fits `optimizer`
    (groups, parameter counts and state shapes); CheckpointMismatchError if it does not.
    The hyperparameters in `CONFIG_HYPERPARAMS[what]` keep `optimizer`'s values (built
    from this run's config), with a `ResumedHyperparameterWarning` when they differ."""
    try:
        groups = [dict(g) for g in meta["param_groups"]]
        state: dict[int, dict[str, Any]] = {}
        for key, t in tensors.items():
            _, idx, name = key.split(".", 2)
            state.setdefault(int(idx), {})[name] = t
        for idx, vals in meta["state_values"].items():
            state.setdefault(int(idx), {}).update(vals)
        saved_sizes = [len(g["params"]) for g in groups]
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"the saved {what} state is malformed ({type(exc).__name__}: {exc})") from exc
    current = optimizer.param_groups
    sizes = [len(g["params"]) for g in current]
    if saved_sizes != sizes:
        raise CheckpointMismatchError(f"the checkpoint's {what} has parameter groups of sizes {saved_sizes}, this "
                                      f"trainer's has {sizes}: it was written for a different model or LoRA setup")
    params = [p for g in current for p in g["params"]]
    for idx, entry in state.items():
        if not 0 <= idx < len(params):
            raise CheckpointMismatchError(f"the checkpoint's {what} has state for parameter {idx}, "
                                          f"this trainer has {len(params)} parameters")
        for name, t in entry.items():
            if isinstance(t, torch.Tensor) and t.dim() > 0 and t.shape != params[idx].shape:
                raise CheckpointMismatchError(f"the checkpoint's {what} state {idx}.{name} has shape "
                                              f"{tuple(t.shape)}, the parameter has {tuple(params[idx].shape)}")
    for saved, cur in zip(groups, current):  # JSON turned tuples (AdamW betas) into lists
        for k, v in saved.items():
            if isinstance(cur.get(k), tuple) and isinstance(v, list):
                saved[k] = tuple(v)
        for k in IMPLEMENTATION_FLAGS:  # how this process runs the step, not what was learned
            if k in cur:
                saved[k] = cur[k]
    changed = {}
    for k, field in CONFIG_HYPERPARAMS.get(what, {}).items():  # the config's value wins
        for saved, cur in zip(groups, current):
            if k in cur and k in saved and saved[k] != cur[k]:
                changed[field] = (saved[k], cur[k])
                saved[k] = cur[k]
    for field, (old, new) in changed.items():
        warnings.warn(f"resuming with {field}={new:g} from this config; the checkpoint was trained with {old:g} "
                      "(its Adam moments are kept)", ResumedHyperparameterWarning, stacklevel=3)
    return {"state": state, "param_groups": groups}


#: Optimizer param-group entries that pick an implementation (fused kernel, foreach
#: loops), not the update rule: a resumed optimizer keeps this process's choice.
IMPLEMENTATION_FLAGS = ("fused", "foreach", "capturable", "differentiable")


def check_weights(what: str, saved: Mapping[str, torch.Tensor], expected: Mapping[str, torch.Tensor]) -> None:
    """CheckpointMismatchError unless `saved` has exactly the names and shapes of `expected`."""
    missing = sorted(set(expected) - set(saved))
    extra = sorted(set(saved) - set(expected))
    shapes = [f"{n}: checkpoint {tuple(saved[n].shape)}, trainer {tuple(expected[n].shape)}"
              for n in sorted(set(saved) & set(expected)) if saved[n].shape != expected[n].shape]
    if missing or extra or shapes:
        raise CheckpointMismatchError(
            f"the checkpoint's {what} weights do not fit this trainer ({len(missing)} missing, e.g. {missing[:2]}; "
            f"{len(extra)} unexpected, e.g. {extra[:2]}; {len(shapes)} of another shape, e.g. {shapes[:2]}): "
            f"it was written for a different model, LoRA rank/targets or algorithm")


#: Config fields that must match to resume a run (model.path is local_path or model_name).
IDENTITY_FIELDS = ("model.path", "model.use_lora", "model.lora_rank", "model.lora_alpha",
                   "model.lora_target_modules", "environment.name", "training.adv_estimator")


def config_differences(saved: Mapping[str, Any], current: Mapping[str, Any]) -> list[str]:
    """`IDENTITY_FIELDS` that differ between two `ConfigStore.to_dict()`s, as "field: a -> b"."""
    def get(cfg: Mapping[str, Any], dotted: str) -> Any:
        section, name = dotted.split(".")
        sec = cfg.get(section) or {}
        if dotted == "model.path":
            return sec.get("local_path") or sec.get("model_name")
        return sec.get(name)
    return [f"{f}: checkpoint {get(saved, f)!r}, this run {get(current, f)!r}"
            for f in IDENTITY_FIELDS if get(saved, f) != get(current, f)]


def trainer_state(data: Mapping[str, Any], path: str | Path, current_config: Mapping[str, Any],
                  has_critic: bool, force: bool = False) -> dict[str, Any]:
    """Check that `read_checkpoint`'s `data` is a complete trainer checkpoint whose config
    matches `current_config` (a `ConfigStore.to_dict()`) in `IDENTITY_FIELDS` (skipped with
    `force`) and which has a critic exactly when `has_critic` (CheckpointMismatchError
    otherwise); returns trainer_state.json's global_step, metrics_history and kl_coef."""
    tensors, js = data["tensors"], data["json"]
    missing = ([f"{f}.safetensors" for f in ("policy", "optimizer", "rng") if f not in tensors]
               + [f"{f}.json" for f in ("optimizer", "rng", "trainer_state") if f not in js]
               + (["config.yaml"] if data["config_text"] is None else []))
    if missing:
        raise CheckpointError(f"{path} lacks {missing}: not a complete trainer checkpoint")
    try:
        saved_config = yaml.safe_load(data["config_text"]) or {}
        state = js["trainer_state"]
        out = {"global_step": int(state["global_step"]), "metrics_history": list(state["metrics_history"]),
               "kl_coef": float(state["kl_coef"])}
        diffs = config_differences(saved_config, current_config)
    except (yaml.YAMLError, KeyError, TypeError, ValueError, AttributeError) as exc:
        raise CheckpointError(f"{path}: trainer_state.json or config.yaml is malformed ({exc!r})") from exc
    if diffs and not force:
        raise CheckpointMismatchError(
            f"{path} was written by a run with another config ({'; '.join(diffs)}); use another "
            f"checkpoint.output_dir, or checkpoint.resume='force' (load_checkpoint(force=True)) to load it anyway")
    if ("critic" in tensors) != has_critic:
        raise CheckpointMismatchError(
            f"{path} {'has a' if 'critic' in tensors else 'has no'} critic but this trainer "
            f"{'has one' if has_critic else 'has none'} (training.adv_estimator differs)")
    return out


def _json_value(v: Any, where: str) -> Any:
    if v is None or isinstance(v, (bool, int, float, str)):
        return v
    if isinstance(v, (list, tuple)):
        return [_json_value(x, where) for x in v]
    if isinstance(v, torch.Tensor) and v.numel() == 1:
        return v.item()
    raise CheckpointError(f"cannot save {where} = {v!r} ({type(v).__name__}): only numbers, strings, "
                          f"lists and tensors are stored (nothing is pickled)")


# -- writing -------------------------------------------------------------------------------
def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_checkpoint(path: str | Path, tensors: Mapping[str, Mapping[str, torch.Tensor]],
                     json_files: Mapping[str, Any], texts: Mapping[str, str]) -> Path:
    """Write a checkpoint folder so that a kill at any moment loses nothing complete.

    Args:
        tensors: {"policy": state_dict, ...} saved as `<name>.safetensors`.
        json_files: {"trainer_state": dict, ...} saved as `<name>.json`.
        texts: {"config.yaml": text} saved verbatim (names must end in .yaml).
    An existing folder at `path` is replaced (see the module docstring for the order).
    """
    path = Path(path)
    parent = path.parent
    parent.mkdir(parents=True, exist_ok=True)
    tag = f"{os.getpid()}-{secrets.token_hex(4)}"
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-{os.getpid()}-", dir=parent))
    aside = parent / f".{path.name}.old-{tag}"
    try:
        for name, sd in tensors.items():
            save_tensors({k: v.detach().cpu().contiguous() for k, v in sd.items()}, tmp / f"{name}.safetensors")
        for name, data in json_files.items():
            (tmp / f"{name}.json").write_text(json.dumps(data))
        for name, text in texts.items():
            (tmp / name).write_text(text)
        files: dict[str, dict[str, Any]] = {}
        for p in sorted(tmp.iterdir()):
            _check_name(p.name, tmp)
            _fsync(p)
            files[p.name] = {"bytes": p.stat().st_size, "sha256": _sha256(p)}
        with (tmp / MANIFEST).open("w") as f:
            json.dump({"format_version": FORMAT_VERSION, "files": files}, f, indent=1)
            f.flush()
            os.fsync(f.fileno())
        _fsync(tmp)
        if path.exists():
            os.rename(path, aside)
        os.rename(tmp, path)
        _fsync(parent)
    except BaseException as exc:
        if aside.exists():
            if path.exists():
                shutil.rmtree(aside, ignore_errors=True)
            else:
                os.rename(aside, path)
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, OSError) and exc.errno is not None and exc.filename and str(tmp) in str(exc.filename):
            # name the checkpoint, not the temp folder that is gone now (a full disk: ENOSPC)
            raise OSError(exc.errno, exc.strerror, str(path)) from exc
        raise
    if aside.exists():
        shutil.rmtree(aside)
    return path


_OS_ERROR = re.compile(r"\(os error (\d+)\)")


def save_tensors(tensors: Mapping[str, torch.Tensor], path: str | Path) -> None:
    """`safetensors.torch.save_file(tensors, path)`, with a failed write raised as the
    `OSError` it was: safetensors reports a full disk as `SafetensorError("Error while
    serializing: I/O error: No space left on device (os error 28)")`; here it is
    `OSError(ENOSPC, ..., path)`, like every other write of a run, so the CLI reports it in
    one line naming the file."""
    try:
        save_file(dict(tensors), str(path))
    except SafetensorError as exc:
        found = _OS_ERROR.search(str(exc))
        if found is None:
            raise
        code = int(found.group(1))
        raise OSError(code, os.strerror(code), str(path)) from exc


# -- reading -------------------------------------------------------------------------------
def _check_name(name: Any, folder: Path) -> None:
    if not isinstance(name, str) or not _NAME.fullmatch(name) or name == MANIFEST:
        raise CheckpointError(f"{folder}/{MANIFEST} lists {name!r}: file names must be plain names "
                              f"(letters, digits, _ and -, one extension; no '/' or '..')")
    if name.endswith(".pt"):
        raise CheckpointError(f"{folder} holds {name}, a pickled file from an older, unsafe checkpoint format; "
                              f"it is not loaded because unpickling can run arbitrary code")
    if not name.endswith(FILE_SUFFIXES):
        raise CheckpointError(f"{folder}/{MANIFEST} lists {name!r}: a checkpoint holds only "
                              f"{', '.join(FILE_SUFFIXES)} files")


def read_manifest(path: str | Path) -> dict[str, dict[str, Any]]:
    """The manifest's {file name: {"bytes", "sha256"}}, its structure checked (CheckpointError if not)."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.is_file():
        raise CheckpointError(f"{path} has no {MANIFEST}: it was cut off before it finished writing")
    try:
        manifest = json.loads(mf.read_text())
    except FileNotFoundError:  # pruned or replaced between the check and the read
        raise CheckpointError(f"{path} has no {MANIFEST}: it was removed while it was read") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise CheckpointError(f"{path}/{MANIFEST} is not valid JSON: {exc}") from exc
    if not isinstance(manifest, dict):
        raise CheckpointError(f"{path}/{MANIFEST} must be a JSON object, got {type(manifest).__name__}")
    if "format_version" not in manifest:
        if any(str(k).endswith(".pt") for k in manifest):
            raise CheckpointError(f"{path} is from an older, unsafe checkpoint format (pickled .pt files); it is "
                                  f"not loaded because unpickling can run arbitrary code. Retrain, or convert it "
                                  f"yourself in a trusted session")
        raise CheckpointError(f"{path}/{MANIFEST} has no format_version: not a checkpoint this version wrote")
    if manifest["format_version"] != FORMAT_VERSION or set(manifest) != {"format_version", "files"}:
        raise CheckpointError(f"{path}/{MANIFEST} must be {{'format_version': {FORMAT_VERSION}, 'files': {{...}}}}, "
                              f"got keys {sorted(manifest)} and format_version {manifest['format_version']!r}")
    files = manifest["files"]
    if not isinstance(files, dict):
        raise CheckpointError(f"{path}/{MANIFEST}: 'files' must be an object, got {type(files).__name__}")
    for name, meta in files.items():
        _check_name(name, path)
        if (not isinstance(meta, dict) or set(meta) != {"bytes", "sha256"} or type(meta["bytes"]) is not int
                or meta["bytes"] < 0 or not isinstance(meta["sha256"], str) or not _SHA256.fullmatch(meta["sha256"])):
            raise CheckpointError(f"{path}/{MANIFEST}: the entry for {name} must be "
                                  f"{{'bytes': int >= 0, 'sha256': 64 hex digits}}, got {meta!r}")
    return files


def verify_checkpoint(path: str | Path) -> dict[str, dict[str, Any]]:
    """Raise CheckpointError unless the manifest is well-formed and every file it lists
    matches it; returns the manifest's file table."""
    path = Path(path)
    files = read_manifest(path)
    for name, meta in files.items():
        f = path / name
        try:
            if not f.is_file():
                raise CheckpointError(f"{path} is missing {name}")
            if f.stat().st_size != meta["bytes"] or _sha256(f) != meta["sha256"]:
                raise CheckpointError(f"{path}/{name} does not match its manifest (truncated or modified)")
        except FileNotFoundError:  # pruned while it was read
            raise CheckpointError(f"{path} is missing {name}: it was removed while it was read") from None
    return files


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Verify and read a checkpoint into {"tensors", "json", "config_text"}.

    Only files the manifest lists are opened; nothing is unpickled. A missing folder
    is first looked for among folders set aside by a killed save (`recover_checkpoints`)."""
    path = Path(path)
    if not path.exists():
        recover_checkpoints(path.parent)
    files = verify_checkpoint(path)
    out: dict[str, Any] = {"tensors": {}, "json": {}, "config_text": None}
    for name in files:
        f = path / name
        stem = name.rsplit(".", 1)[0]
        try:
            if name.endswith(".safetensors"):
                out["tensors"][stem] = load_file(str(f))
            elif name.endswith(".json"):
                out["json"][stem] = json.loads(f.read_text())
            else:
                out["config_text"] = f.read_text()
        except (SafetensorError, json.JSONDecodeError, UnicodeDecodeError, OSError) as exc:
            raise CheckpointError(f"{path}/{name} matches its manifest but cannot be read: {exc}") from exc
    return out


# -- folders -------------------------------------------------------------------------------
def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True  # our own folders: a save may be running in another thread
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def recover_checkpoints(output_dir: str | Path) -> None:
    """Repair what killed saves left in `output_dir` (only folders of dead processes).

    A folder set aside (`.X.old-*`) whose `X` is missing and which verifies is renamed
    back to `X`; every other temp (`.tmp-`), aside (`.old-`) or half-pruned (`.del-`)
    folder is deleted. Folders whose writer pid is alive on this machine are left alone
    (on a filesystem shared between machines, a pid is only checked on this one)."""
    root = Path(output_dir)
    if not root.is_dir():
        return
    side = []
    for p in root.iterdir():
        m = _SIDE.fullmatch(p.name)
        if m and p.is_dir() and not _pid_alive(int(m["pid"])):
            side.append((m["kind"] != "old", -p.stat().st_mtime, p, m["main"]))
    for _, _, p, main in sorted(side):  # set-aside folders first, newest first
        target = root / main
        if p.name.startswith(f".{main}.old-") and not target.exists():
            try:
                verify_checkpoint(p)
                os.rename(p, target)
                _fsync(root)
                continue
            except (CheckpointError, OSError):
                pass
        shutil.rmtree(p, ignore_errors=True)


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint folders under `output_dir`, oldest first, after `recover_checkpoints`."""
    root = Path(output_dir)
    if not root.exists():
        return []
    recover_checkpoints(root)
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint that verifies; corrupt ones are skipped with a warning.

    A run still training saves and prunes checkpoints (`checkpoint.keep_last_n`) while this
    looks: one that vanishes while it is verified was pruned, not corrupt (a newer one was
    saved), and a folder listed while a save renamed its checkpoint in can miss it, so the
    folder is listed again until a checkpoint verifies or two listings in a row agree."""
    seen: list[Path] | None = None
    warned: set[Path] = set()
    for _ in range(16):
        paths, pruned = list_checkpoints(output_dir), False
        for path in reversed(paths):
            if path in warned:
                continue  # found corrupt on an earlier listing: not hashed again
            try:
                verify_checkpoint(path)
                return path
            except CheckpointError as exc:
                if not path.is_dir():
                    pruned = True
                    break
                warned.add(path)
                warnings.warn(f"skipping corrupt checkpoint: {exc}", stacklevel=2)
        if not pruned and paths == seen:
            return None
        seen = paths
    return None


def prune_checkpoints(output_dir: str | Path, keep_last_n: int) -> list[Path]:
    """Delete all but the newest `keep_last_n` checkpoints (0 keeps all); returns deleted.

    Each is renamed to `.X.del-<pid>-*` first, so a kill mid-delete leaves no half folder
    under a checkpoint's name. A checkpoint another process is reading under a hold
    (`hold_checkpoint`: a branch of this run loading it) is kept this time, and pruned by a
    later call once the hold is gone (a hold is a shared `flock` of its MANIFEST.json; pruning
    takes it exclusively, without waiting, while it renames the folder away)."""
    if keep_last_n <= 0:
        return []
    paths = list_checkpoints(output_dir)
    deleted = []
    for p in paths[:-keep_last_n]:
        hold = _try_exclusive_hold(p)
        if hold is None:  # a reader holds it: keep it for now
            continue
        try:
            gone = p.parent / f".{p.name}.del-{os.getpid()}-{secrets.token_hex(4)}"
            os.rename(p, gone)
        finally:
            hold.close()
        shutil.rmtree(gone, ignore_errors=True)
        deleted.append(p)
    return deleted


class CheckpointGone(CheckpointError):
    """A checkpoint folder was removed (pruned by its run's `keep_last_n`) before it could be held."""


def _open_hold(folder: Path) -> Any:
    """The folder's MANIFEST.json opened read-only, the file holds are taken on (`flock` works
    on a read-only file, so holding a checkpoint writes nothing into its run); None when the
    folder has no manifest (reading it then fails with its own CheckpointError)."""
    try:
        return open(folder / MANIFEST, "rb", buffering=0)
    except FileNotFoundError:
        if not folder.is_dir():
            raise CheckpointGone(f"{folder} is gone: its run pruned it (checkpoint.keep_last_n) before it could be "
                                 "held") from None
        return None


def _same_file(fh: Any, path: Path) -> bool:
    try:
        a, b = os.fstat(fh.fileno()), os.stat(path)
    except FileNotFoundError:
        return False
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


def _try_exclusive_hold(folder: Path) -> Any:
    """The folder's hold file locked exclusively (no reader holds it), or None (one does)."""
    import fcntl

    try:
        fh = _open_hold(folder)
    except CheckpointGone:
        return None
    if fh is None:
        return open(os.devnull, "rb")  # no manifest: nothing reads it as a checkpoint, prune it
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        fh.close()
        return None
    return fh


@contextlib.contextmanager
def hold_checkpoint(folder: str | Path) -> Iterator[Path]:
    """Hold checkpoint `folder` for reading: while the `with` block runs, `prune_checkpoints` in
    any process (the run that wrote it, still training) leaves it in place, so a branch that
    chose it can read it to the end. Raises `CheckpointGone` when the folder was pruned before
    the hold was taken (choose another: the run's newest)."""
    import fcntl

    folder = Path(folder)
    fh = _open_hold(folder)
    if fh is None:
        yield folder
        return
    try:
        fcntl.flock(fh.fileno(), fcntl.LOCK_SH)  # waits only while a pruner renames it away
        if not _same_file(fh, folder / MANIFEST):
            raise CheckpointGone(f"{folder} is gone: its run pruned it (checkpoint.keep_last_n) as it was chosen")
        yield folder
    finally:
        fh.close()
