"""`python -m workbench ...` (see workbench/cli.py)."""
import sys

from workbench.cli import main

if __name__ == "__main__":
    sys.exit(main())
