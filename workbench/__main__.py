"""`python -m workbench ...` (see workbench/cli/__init__.py).

The command line owns its process, so it chooses the OpenMP wait policy before torch
loads: passive waiting (unless you set OMP_WAIT_POLICY yourself), because spinning OpenMP
threads made torch up to 15x slower on a busy CPU (2 spinning threads vs 1, a shared 2-core
x86_64 machine, fp32, 2026-11-22). `import workbench` sets nothing.
"""
import os
import sys

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from workbench.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main())
