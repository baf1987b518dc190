"""SIGKILL a process that keeps saving checkpoints, at 20 random moments.

The child imports only torch and the checkpoint module. It saves each folder name three
times (so most saves replace a folder of the same name) and then moves to a new one,
prunes to the newest two, and records every save after `write_checkpoint` returned.
After each kill: a valid checkpoint is found and loads, the last recorded save is there
with its content (or a later save's), and recovery leaves no temp, set-aside or
half-deleted folders. On 49a37c7 killed saves left `.tmp-*` folders behind (and a kill
between deleting the old folder and renaming the new one in lost the checkpoint)."""
from __future__ import annotations

import os
import random
import re
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import torch

from workbench.training import checkpoint as ckpt

CHILD = r"""
import importlib.util, inspect, os, sys
import torch
spec = importlib.util.spec_from_file_location("ckpt", sys.argv[1])
ckpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ckpt)
root, i, record = sys.argv[2], int(sys.argv[3]), sys.argv[4]
old_signature = "objects" in inspect.signature(ckpt.write_checkpoint).parameters  # 49a37c7
print("ready", flush=True)
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
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    next_i, checked = 0, 0
    for kill in range(KILLS):
        where = f"(seed {seed}, kill {kill})"
        proc = subprocess.Popen([sys.executable, "-c", CHILD, ckpt.__file__, str(root), str(next_i), str(record)],
                                stdout=subprocess.PIPE, env=env)
        try:
            assert proc.stdout.readline() == b"ready\n", where
            time.sleep(rng.uniform(0.0, 0.4))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
        assert proc.returncode == -signal.SIGKILL, f"the child died on its own {where}"
        with warnings.catch_warnings():
            warnings.simplefilter("error")  # a corrupt (half-written or half-deleted) folder fails
            latest = ckpt.latest_checkpoint(root)
        if root.exists():
            leftovers = sorted(p.name for p in root.iterdir() if not p.name.startswith(ckpt.PREFIX))
            assert leftovers == [], f"stale folders after recovery {where}: {leftovers}"
        records = _records(record)
        if not records:
            continue
        name, i = records[-1]
        assert latest is not None and latest.name >= name, f"no checkpoint as new as {name} {where}"
        ckpt.read_checkpoint(latest)
        data = ckpt.read_checkpoint(root / name)
        saved = data["json"]["trainer_state"]["i"]
        assert saved >= i, f"{name} holds save {saved}, older than the recorded save {i} {where}"
        assert torch.equal(data["tensors"]["policy"]["w"], torch.full((128, 256), float(saved))), where
        assert torch.equal(data["tensors"]["optimizer"]["state.0.exp_avg"], torch.full((128, 256), saved + 0.5))
        next_i, checked = i + 1, checked + 1
    assert checked >= KILLS // 2, f"only {checked} of {KILLS} kills came after a recorded save (seed {seed})"
