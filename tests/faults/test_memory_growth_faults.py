"""Long runs: resident memory does not grow with every new sequence length (issue 33, item 5).

The soak benchmark (benchmarks/soak.py, tiny model, bf16 on a CPU with bf16 instructions)
found resident memory growing from 540 MB to 1.7 GB over 200 GRPO steps while Python's
objects, open files and threads stayed flat: oneDNN compiles and keeps a kernel (with its
buffers) for every bf16 matmul shape, up to 1024 per cache, and a run's batches have a new
sequence length at almost every step. `load_model` now bounds those caches for a 16-bit
model on the CPU (`workbench.models.loading.bound_onednn_caches`).

The check runs in a fresh process (resident memory is per process, and the caches are
process-wide): the real tiny model loaded by `load_model` in bfloat16, a forward and
backward at 240 distinct sequence lengths, memory read after `malloc_trim` so freed
heap does not count.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = r"""
import ctypes, json, os, sys
import torch
from workbench.models.loading import load_model

def rss_mb():
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) for line in f if line.startswith("VmRSS")) / 1024

torch.set_num_threads(1)
model = load_model(sys.argv[1], dtype="bfloat16", device="cpu")
model.train()
rss = {}
for length in range(1, 241):
    ids = torch.randint(0, 500, (2, length))
    model(input_ids=ids).logits.float().mean().backward()
    model.zero_grad(set_to_none=True)
    if length in (40, 240):
        rss[length] = rss_mb()
print(json.dumps({"rss": rss, "env": {k: os.environ.get(k) for k in
                  ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}}))
"""


def cpu_has_bf16() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


@pytest.mark.skipif(not sys.platform.startswith("linux") or not torch.backends.mkldnn.is_available()
                    or not cpu_has_bf16(), reason="needs Linux and a CPU whose bf16 matmuls run through oneDNN")
def test_bf16_training_memory_does_not_grow_with_each_sequence_length(tiny_model_path):
    env = {k: v for k, v in os.environ.items()
           if k not in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    out = subprocess.run([sys.executable, "-c", SCRIPT, str(tiny_model_path)], env=env, capture_output=True,
                         text=True, timeout=600, cwd=ROOT)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    grown = result["rss"]["240"] - result["rss"]["40"]
    # Unbounded: ~1.5 MB per new length here (~300 MB over these 200). Bounded: the caches
    # are full after the first lengths and stay at their size.
    assert grown < 60, f"resident memory grew {grown:.0f} MB over 200 new sequence lengths: {result}"
    assert result["env"] == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128", "LRU_CACHE_CAPACITY": "128"}


def test_your_own_onednn_cache_settings_win(monkeypatch):
    from workbench.models.loading import bound_onednn_caches

    monkeypatch.setenv("LRU_CACHE_CAPACITY", "7")
    monkeypatch.setenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "")  # (restored after the test)
    monkeypatch.delenv("ONEDNN_PRIMITIVE_CACHE_CAPACITY")
    assert bound_onednn_caches() == {"ONEDNN_PRIMITIVE_CACHE_CAPACITY": "128", "LRU_CACHE_CAPACITY": "7"}
