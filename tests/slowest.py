"""Print the slowest tests recorded in one or more junit XML files (pytest --junitxml).

`make test` runs the suite as two pytest processes side by side (the Ray and browser tests,
which mostly wait on other processes, beside the rest), so pytest's own --durations sees
only half of it; this lists the slowest of both together.

    python tests/slowest.py 25 runs/junit-ray-browser.xml runs/junit-rest.xml
"""
from __future__ import annotations

import sys
import xml.etree.ElementTree as ET
from pathlib import Path


def slowest(paths: list[str], count: int) -> list[tuple[float, str, str]]:
    """(seconds, test id, file label) of the `count` slowest test cases across `paths`."""
    rows = []
    for path in paths:
        if not Path(path).is_file():
            continue  # that group did not get as far as writing its report
        for case in ET.parse(path).getroot().iter("testcase"):
            test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
            rows.append((float(case.get("time") or 0.0), test_id, Path(path).stem))
    return sorted(rows, reverse=True)[:count]


def main(argv: list[str]) -> int:
    if len(argv) < 2 or not argv[0].isdigit():
        print(__doc__.strip().splitlines()[-1].strip(), file=sys.stderr)
        return 2
    rows = slowest(argv[1:], int(argv[0]))
    print(f"===== slowest {len(rows)} tests (both processes) =====")
    for seconds, test_id, label in rows:
        print(f"{seconds:8.2f}s  {test_id}  [{label}]")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
