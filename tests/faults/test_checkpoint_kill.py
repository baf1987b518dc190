"""SIGKILL a process that keeps saving checkpoints, at 20 random moments.

A helper process imports only torch and the checkpoint module, once, and forks a fresh
child for each kill (a new Python that imports torch costs ~1.5 s a kill here). The child
saves each folder name three times (so most saves replace a folder of the same name) and
then moves to a new one, prunes to the newest two, and records every save after
`write_checkpoint` returned.
After each kill: a valid checkpoint is found and loads, the last recorded save is there
with its content (or a later save's), and recovery leaves no temp, set-aside or
half-deleted folders. On 49a37c7 killed saves left `.tmp-*` folders behind (and a kill
between deleting the old folder and renaming the new one in lost the checkpoint)."""
from __future__ import annotations

import os
import random
import re
import signal
import time
import warnings
from pathlib import Path

import torch

from tests.faults.forks import Forks
from workbench.training import checkpoint as ckpt

CHILD = r"""
import importlib.util, inspect, os, sys
import torch
spec = importlib.util.spec_from_file_location("ckpt", sys.argv[1])
ckpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ckpt)
root, record = sys.argv[2], sys.argv[3]
old_signature = "objects" in inspect.signature(ckpt.write_checkpoint).parameters  # 49a37c7


def save_forever(i):
    while True:
        name = f"step_{i // 3:06d}"
        w = torch.full((128, 256), float(i))
        kw = dict(tensors={"policy": {"w": w}, "optimizer": {"state.0.exp_avg": w + 0.5}},
                  json_files={"trainer_state": {"i": i}}, texts={"config.yaml": f"i: {i}\n"})
        if old_signature:
            kw["objects"] = {}
        ckpt.write_checkpoint(os.path.join(root, name), **kw)
        ckpt.prune_checkpoints(root, 2)
        with open(record, "a") as f:
            f.write(f"{name} {i}\n")
            f.flush()
            os.fsync(f.fileno())
        i += 1


def run(line):  # each forked child (tests/faults/forks.py): saves from save number `line` until it is killed
    save_forever(int(line))
"""

KILLS = 20


def _records(path: Path) -> list[tuple[str, int]]:
    if not path.exists():
        return []
    return [(m[1], int(m[2])) for line in path.read_text().splitlines()
            if (m := re.fullmatch(r"(step_\d{6}) (\d+)", line))]


def test_sigkill_at_random_moments_never_loses_the_newest_save(tmp_path):
    seed = time.time_ns() % 1_000_000
    rng = random.Random(seed)
    root, record = tmp_path / "ckpt", tmp_path / "saves.log"
    next_i, checked = 0, 0
    with Forks(CHILD, ckpt.__file__, str(root), str(record)) as forks:
        for kill in range(KILLS):
            where = f"(seed {seed}, kill {kill})"
            pid = forks.start(str(next_i))
            time.sleep(rng.uniform(0.0, 0.4))
            os.kill(pid, signal.SIGKILL)
            assert forks.ended() == -signal.SIGKILL, f"the child died on its own {where}"
            next_i, checked = _check_after_kill(root, record, next_i, checked, where)
    assert checked >= KILLS // 2, f"only {checked} of {KILLS} kills came after a recorded save (seed {seed})"


def _check_after_kill(root: Path, record: Path, next_i: int, checked: int, where: str) -> tuple[int, int]:
    """After a kill: a valid checkpoint is found, no stale folders are left, and the last recorded
    save is there with its content (or a later save's). Returns the next save's number and the
    count of kills checked against a recorded save."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a corrupt (half-written or half-deleted) folder fails
        latest = ckpt.latest_checkpoint(root)
    if root.exists():
        leftovers = sorted(p.name for p in root.iterdir() if not p.name.startswith(ckpt.PREFIX))
        assert leftovers == [], f"stale folders after recovery {where}: {leftovers}"
    records = _records(record)
    if not records:
        return next_i, checked
    name, i = records[-1]
    assert latest is not None and latest.name >= name, f"no checkpoint as new as {name} {where}"
    ckpt.read_checkpoint(latest)
    data = ckpt.read_checkpoint(root / name)
    saved = data["json"]["trainer_state"]["i"]
    assert saved >= i, f"{name} holds save {saved}, older than the recorded save {i} {where}"
    assert torch.equal(data["tensors"]["policy"]["w"], torch.full((128, 256), float(saved))), where
    assert torch.equal(data["tensors"]["optimizer"]["state.0.exp_avg"], torch.full((128, 256), saved + 0.5))
    return i + 1, checked + 1
