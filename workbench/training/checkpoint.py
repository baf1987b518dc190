"""Checkpoints written atomically, verified on load, pruned to the newest N.

A checkpoint is a folder `step_000010/` holding:

    policy.safetensors     trained weights (LoRA adapters, or the full model)
    critic.safetensors     critic weights (PPO with GAE only)
    optimizer.pt           optimizer state(s)
    rng.pt                 torch / python / numpy RNG states
    config.yaml            the run's ConfigStore
    trainer_state.json     step, metrics history, KL coefficient
    MANIFEST.json          size and sha256 of every file above, written last

It is first written to a hidden temp folder and renamed into place, so a crash
leaves either the old state or a complete new checkpoint. A folder whose manifest
is missing or does not match its files (cut off mid-write, disk full) is rejected
by `verify_checkpoint`, and `latest_checkpoint` falls back to the previous one.
"""
from __future__ import annotations

import hashlib
import json
import random
import shutil
import tempfile
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors.torch import load_file, save_file

MANIFEST = "MANIFEST.json"
PREFIX = "step_"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, incomplete or corrupt."""


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "python": random.getstate(), "numpy": np.random.get_state()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])


def write_checkpoint(path: str | Path, tensors: dict[str, dict[str, torch.Tensor]],
                     objects: dict[str, Any], json_files: dict[str, Any], texts: dict[str, str]) -> Path:
    """Write a checkpoint folder atomically.

    Args:
        tensors: {"policy": state_dict, ...} saved as `<name>.safetensors`.
        objects: {"optimizer": obj, "rng": obj} saved with torch.save as `<name>.pt`.
        json_files: {"trainer_state": dict} saved as `<name>.json`.
        texts: {"config.yaml": text} saved verbatim.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.tmp-", dir=path.parent))
    try:
        for name, sd in tensors.items():
            save_file({k: v.contiguous() for k, v in sd.items()}, str(tmp / f"{name}.safetensors"))
        for name, obj in objects.items():
            torch.save(obj, tmp / f"{name}.pt")
        for name, data in json_files.items():
            (tmp / f"{name}.json").write_text(json.dumps(data))
        for name, text in texts.items():
            (tmp / name).write_text(text)
        files = sorted(p for p in tmp.iterdir() if p.is_file())
        manifest = {p.name: {"bytes": p.stat().st_size, "sha256": _sha256(p)} for p in files}
        (tmp / MANIFEST).write_text(json.dumps(manifest, indent=1))
        if path.exists():
            shutil.rmtree(path)
        tmp.rename(path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return path


def verify_checkpoint(path: str | Path) -> None:
    """Raise CheckpointError unless every file matches the manifest."""
    path = Path(path)
    mf = path / MANIFEST
    if not mf.exists():
        raise CheckpointError(f"{path} has no {MANIFEST}: it was cut off before it finished writing")
    try:
        manifest = json.loads(mf.read_text())
    except json.JSONDecodeError as exc:
        raise CheckpointError(f"{path}/{MANIFEST} is not valid JSON: {exc}") from exc
    for name, meta in manifest.items():
        f = path / name
        if not f.exists():
            raise CheckpointError(f"{path} is missing {name}")
        if f.stat().st_size != meta["bytes"] or _sha256(f) != meta["sha256"]:
            raise CheckpointError(f"{path}/{name} does not match its manifest (truncated or modified)")


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Verify and read a checkpoint into {"tensors", "objects", "json", "config_text"}."""
    path = Path(path)
    verify_checkpoint(path)
    out: dict[str, Any] = {"tensors": {}, "objects": {}, "json": {}, "config_text": None}
    for f in path.iterdir():
        if f.suffix == ".safetensors":
            out["tensors"][f.stem] = load_file(str(f))
        elif f.suffix == ".pt":
            out["objects"][f.stem] = torch.load(f, weights_only=False)
        elif f.suffix == ".json" and f.name != MANIFEST:
            out["json"][f.stem] = json.loads(f.read_text())
        elif f.name == "config.yaml":
            out["config_text"] = f.read_text()
    return out


def checkpoint_name(step: int) -> str:
    return f"{PREFIX}{step:06d}"


def list_checkpoints(output_dir: str | Path) -> list[Path]:
    """Checkpoint folders under `output_dir`, oldest first (temp folders ignored)."""
    root = Path(output_dir)
    if not root.exists():
        return []
    return sorted(p for p in root.iterdir() if p.is_dir() and p.name.startswith(PREFIX))


def latest_checkpoint(output_dir: str | Path) -> Path | None:
    """The newest checkpoint that verifies; corrupt ones are skipped with a warning."""
    for path in reversed(list_checkpoints(output_dir)):
        try:
            verify_checkpoint(path)
            return path
        except CheckpointError as exc:
            warnings.warn(f"skipping corrupt checkpoint: {exc}", stacklevel=2)
    return None


def prune_checkpoints(output_dir: str | Path, keep_last_n: int) -> list[Path]:
    """Delete all but the newest `keep_last_n` checkpoints (0 keeps all); returns deleted."""
    if keep_last_n <= 0:
        return []
    paths = list_checkpoints(output_dir)
    doomed = paths[:-keep_last_n]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return doomed
