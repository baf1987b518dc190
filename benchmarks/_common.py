"""What the benchmarks share: the machine they ran on, its load, and glibc's allocator
settings for the long multi-run scripts.

    from benchmarks._common import load, machine, machine_line, run_main

Each benchmark puts the repository root on `sys.path` before importing this module, as it
does for `workbench` (the scripts run as `python benchmarks/NAME.py`).
"""
from __future__ import annotations

import os
import platform
import sys
from pathlib import Path
from typing import Any, Callable

#: glibc keeps freed activation buffers of every sequence length around (a PPO run's
#: resident size grew past 13 GB, and 7 runs in one process reached 6.7 GB, before the OOM
#: killer ended them); mmap'ing large blocks returns them. glibc reads these only at
#: start-up, so `run_main` re-executes the script once with them set.
MALLOC_ENV = {"MALLOC_MMAP_THRESHOLD_": "1048576", "MALLOC_TRIM_THRESHOLD_": "1048576"}

#: The CPU flags that decide the dtype "auto" picks and the matmul kernels torch runs.
FLAG_PREFIXES = ("avx", "amx", "fma", "f16c")


def load() -> float:
    """The 1-minute load average: other processes share the cores, so figures carry it."""
    return round(os.getloadavg()[0], 2)


def machine() -> dict[str, Any]:
    """CPU model, the flags that matter for the dtype, cores, and the Python/torch versions."""
    import torch

    info = {"cpu": platform.processor() or platform.machine(), "flags": [], "cores": os.cpu_count(),
            "python": platform.python_version(), "torch": torch.__version__,
            "cuda": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None}
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return info
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key.strip() == "model name":
            info["cpu"] = value.strip()
        if key.strip() == "flags":
            info["flags"] = sorted(f for f in value.split() if f.startswith(FLAG_PREFIXES))
            break
    return info


def machine_line() -> str:
    """'<CPU model> (<cores> cores; <avx2/avx512f/avx512_bf16/amx flags>)' for a header."""
    m = machine()
    keep = [f for f in m["flags"] if f.startswith(("avx512_bf16", "amx", "avx2", "avx512f"))]
    return f"{m['cpu']} ({m['cores']} cores; {' '.join(keep)})"


def run_main(main: Callable[[], int]) -> None:
    """`raise SystemExit(main())`, after re-executing the script once with `MALLOC_ENV` set
    (for the scripts that run many trainers in one process)."""
    if any(k not in os.environ for k in MALLOC_ENV):
        os.environ.update({k: v for k, v in MALLOC_ENV.items() if k not in os.environ})
        os.execv(sys.executable, [sys.executable, *sys.argv])
    raise SystemExit(main())
