"""Leaks (issue 43, item 10): what a Trainer starts ends with it, and repeated `fit` calls
do not grow the process.

1. every Trainer left one `wb-matmul-helper` thread running (the hf engine's split-matmul
   helper: `close()` only queued its stop, and an engine dropped without `close()` never
   stopped it): 4 -> 8 threads over 5 trainers. Now `Trainer.close()` waits for it to end,
   and a trainer that is dropped ends it when it is garbage-collected;
2. resident memory over 50 `fit` calls at `training.max_staleness` 2 (a rollout thread
   started and ended by every call) stays flat, in a fresh process.

Real trainers on the tiny model.
"""
from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
import threading
from pathlib import Path

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer

ROOT = Path(__file__).resolve().parents[2]


def _threads() -> list[str]:
    return sorted(t.name for t in threading.enumerate())


def _train_one(tiny_model_path: Path, folder: Path) -> Trainer:
    config = tiny_config(tiny_model_path, folder)
    config.training.progress = False
    trainer = Trainer(config, environment=make_env("guess_number"))
    trainer.fit(steps=1)  # decodes: the engine starts its helper thread on a CPU with 2 threads
    return trainer


def test_threads_are_back_to_the_start_count_after_each_trainer_is_closed(tiny_model_path, tmp_path):
    _train_one(tiny_model_path, tmp_path / "warm").close()  # third-party singletons (tqdm's monitor) start once
    start = _threads()
    seen = set()
    for i in range(3):
        trainer = _train_one(tiny_model_path, tmp_path / f"closed{i}")
        seen.update(_threads())
        trainer.close()
        assert _threads() == start, (i, _threads(), start)
    assert "wb-matmul-helper" in seen  # the engine did start its helper (2 torch threads: see conftest)
    for i in range(2):  # dropped without close(): the thread ends with the engine
        trainer = _train_one(tiny_model_path, tmp_path / f"dropped{i}")
        del trainer
        gc.collect()
        assert _threads() == start, (i, _threads(), start)


RSS_SCRIPT = r"""
import ctypes, gc, json, sys, warnings
from pathlib import Path
warnings.simplefilter("ignore")
import torch
torch.set_num_threads(2)
from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer

def rss_mb():
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

config = tiny_config(Path(sys.argv[1]), Path(sys.argv[2]))
config.training.max_staleness = 2
config.training.progress = False
trainer = Trainer(config, environment=make_env("guess_number"))
rss = {}
for i in range(1, 51):
    trainer.fit(steps=1)
    if i in (10, 50):
        rss[i] = rss_mb()
print(json.dumps({"rss": rss, "steps": trainer.global_step}))
"""


def test_resident_memory_is_flat_over_50_fit_calls_at_staleness_2(tiny_model_path, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE", "CI": "1"}
    out = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(tiny_model_path), str(tmp_path)], cwd=ROOT, env=env,
                         capture_output=True, text=True, timeout=1200)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["steps"] == 50
    grown = result["rss"]["50"] - result["rss"]["10"]
    # Measured on the 2-core AVX2 EPYC (fp32): +0.5 MB from fit 10 to fit 50. The growth reported
    # (468 -> 534 MB over 12 fit(steps=3) calls) was ~5 MB a call, 200 MB over these 40.
    assert grown < 30, f"resident memory grew {grown:.1f} MB from fit call 10 to 50: {result}"
