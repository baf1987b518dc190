"""What lets every widget take a reopened run (`workbench.debug.load_run`) where it takes a
batch or a metrics history: `batch_of(data, step)` and `history_of(data)`.

`workbench.debug` sits below the widgets, so importing it is allowed; it is imported only
when a `Run` can exist (its module already loaded), so building a widget from a batch
never pulls in the debugger.
"""
from __future__ import annotations

import sys
from typing import Any


def is_run(obj: Any) -> bool:
    """Whether `obj` is a `workbench.debug.Run`."""
    if "workbench.debug.runs" not in sys.modules:  # no Run can exist before its module is loaded
        return False
    from workbench.debug.runs import Run

    return isinstance(obj, Run)


def batch_of(data: Any, step: int | None = None) -> Any:
    """`data.batch(step)` when `data` is a Run (step None: its last saved step), else `data`
    itself (a batch, an episode, a list of episodes); `step` is only for runs."""
    if is_run(data):
        return data.batch(step)
    if step is not None:
        raise TypeError(f"step={step!r} picks a saved step of a Run (workbench.debug.load_run); "
                        f"got a {type(data).__name__}")
    return data


def history_of(data: Any) -> Any:
    """A run's metrics (DataFrame, one row per step), or `data` unchanged."""
    return data.metrics if is_run(data) else data
