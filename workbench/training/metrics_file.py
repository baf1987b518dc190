"""The run's `metrics.jsonl` (and `episodes.jsonl`): one JSON line per step, appended,
continued correctly when a run resumes from a checkpoint."""
from __future__ import annotations

import json
import os
from pathlib import Path
from typing import TextIO


def open_metrics_log(path: Path, step: int) -> TextIO:
    """Open `metrics.jsonl` for appending, first keeping only lines of steps before `step`
    (the step a run resumes from), so steps redone after an interruption appear once."""
    if path.exists():
        kept = []
        for line in path.read_text().splitlines():
            try:
                row_step = json.loads(line)["step"]
            except (json.JSONDecodeError, KeyError, TypeError):
                continue  # a line cut off by the interruption
            if isinstance(row_step, int) and row_step < step:
                kept.append(line + "\n")
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text("".join(kept))
        os.replace(tmp, path)
    return path.open("a")
