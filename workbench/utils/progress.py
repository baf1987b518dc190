"""Progress bars for rollouts, evaluation and `Trainer.fit` (`tqdm.auto`).

In Jupyter the bars are notebook widgets, in a terminal text bars (on stderr, tqdm's
default). Whether they show is `progress_enabled(setting)`:

    True   always
    False  never
    None   automatic: off when the environment variable `CI` is set (to anything but
           "", "0" or "false"); otherwise on in a Jupyter kernel or when stderr is a
           terminal, and off when it is not (pytest's capture, a log file, a pipe).

`training.progress` is that setting for a `Trainer`; `Rollout(progress=...)` takes it
directly.

In a Jupyter kernel a bar is a widget only while it runs: when it closes, its output is
replaced by plain text (the final bar as tqdm writes it; nothing for a bar that does not
stay, `leave=False`) and the widget is closed. A saved notebook then holds text where the
bars were, not views of widgets that no longer exist (which JupyterLab shows as "Error
displaying widget: model not found" when the notebook is opened again).
"""
from __future__ import annotations

import os
import sys
from typing import Any, Sequence

#: Text of the fit bar's postfix: metric name -> short label.
FIT_POSTFIX = {"reward/mean": "reward", "env/success_rate": "success"}


def in_jupyter() -> bool:
    """True inside a Jupyter kernel (IPython's ZMQ shell); IPython is not imported for it."""
    ipython = sys.modules.get("IPython")
    if ipython is None:
        return False
    shell = ipython.get_ipython()
    return shell is not None and type(shell).__name__ == "ZMQInteractiveShell"


def running_in_ci() -> bool:
    """True when `CI` is set to something other than "", "0" or "false"."""
    return os.environ.get("CI", "").strip().lower() not in ("", "0", "false")


def progress_enabled(setting: bool | None) -> bool:
    """Resolve a progress setting (see the module docstring)."""
    if setting is not None:
        return bool(setting)
    if running_in_ci():
        return False
    if in_jupyter():
        return True
    isatty = getattr(sys.stderr, "isatty", None)
    return bool(isatty and isatty())


def progress_bar(setting: bool | None, total: int, desc: str, initial: int = 0, unit: str = "it",
                 leave: bool = True) -> Any:
    """A `tqdm.auto` bar, or a bar that does nothing when `progress_enabled(setting)` is False."""
    if not progress_enabled(setting):
        return _NoBar()
    kwargs = dict(total=total, initial=initial, desc=desc, unit=unit, leave=leave, dynamic_ncols=True)
    if in_jupyter():
        try:
            return _notebook_bar_class()(**kwargs)
        except ImportError:  # no ipywidgets: tqdm.auto's text bar below
            pass
    from tqdm.auto import tqdm

    return tqdm(**kwargs)


_NOTEBOOK_BAR: Any = None


def _notebook_bar_class() -> Any:
    """tqdm's notebook bar, displayed under a display id so that `close()` can replace the
    widget's output with text (see the module docstring)."""
    global _NOTEBOOK_BAR
    if _NOTEBOOK_BAR is not None:
        return _NOTEBOOK_BAR
    from IPython.display import display
    from tqdm.notebook import tqdm as notebook_tqdm

    class NotebookBar(notebook_tqdm):
        def __init__(self, *args: Any, **kwargs: Any):
            super().__init__(*args, display=False, **kwargs)
            self._handle = None if self.disable else display(self.container, display_id=True)
            self.displayed = True

        def close(self) -> None:
            if self.disable:
                return
            ended_early = bool(self.total and self.n < self.total)
            d = self.format_dict
            d["ncols"] = None  # no width to fit: tqdm draws its 10-character bar
            text = self.format_meter(**d) if (self.leave or ended_early) else ""
            super().close()
            if self._handle is not None:
                self._handle.update({"text/plain": text}, raw=True)
            self.container.close()

    _NOTEBOOK_BAR = NotebookBar
    return NotebookBar


class _NoBar:
    """What `progress_bar` returns when bars are off: the tqdm methods used here, doing nothing."""

    n = 0

    def update(self, n: int = 1) -> None:
        self.n += n

    def set_postfix(self, *args: Any, **kwargs: Any) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> "_NoBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class EpisodeBar:
    """A bar over a rollout's episodes: `refresh()` moves it to the number that have ended.

        with EpisodeBar(rollout.slots, setting, "rollout") as bar:
            while ...:
                rollout.step()
                bar.refresh()
    """

    def __init__(self, slots: Sequence[Any], setting: bool | None, desc: str, leave: bool = True):
        self.slots = slots
        self.bar = progress_bar(setting, total=len(slots), desc=desc, unit="episode", leave=leave,
                                initial=self.done())

    def done(self) -> int:
        """Episodes of the rollout that have ended."""
        return sum(1 for s in self.slots if s.episode.done)

    def refresh(self) -> None:
        """Advance the bar to the number of ended episodes."""
        done = self.done()
        if done > self.bar.n:
            self.bar.update(done - self.bar.n)

    def __enter__(self) -> "EpisodeBar":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.refresh()
        self.bar.close()


def fit_postfix(metrics: dict[str, Any]) -> dict[str, str]:
    """The fit bar's postfix for one step's metrics (`FIT_POSTFIX`)."""
    return {label: f"{metrics[name]:.3g}" for name, label in FIT_POSTFIX.items()
            if isinstance(metrics.get(name), (int, float)) and metrics[name] == metrics[name]}  # NaN: not known


def print_markdown(text: str) -> None:
    """Print Markdown (e.g. a `| a | b |` table): in a Jupyter kernel it is displayed as
    Markdown, so a table reads as a table rather than as pipes; elsewhere it is printed."""
    if in_jupyter():
        from IPython.display import Markdown, display

        display(Markdown(text))
    else:
        print(text)


def write(text: str) -> None:
    """Print a line without breaking an active terminal bar (`tqdm.write`)."""
    from tqdm.auto import tqdm

    tqdm.write(text, file=sys.stdout)
