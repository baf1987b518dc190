"""`TrainingDashboard`: live training curves in a plotly `FigureWidget`.

    dash = TrainingDashboard()
    display(dash)
    trainer.fit(callbacks=[dash.callback])      # curves grow while fit() runs

    TrainingDashboard(trainer.metrics_history)  # or draw a saved history (list of dicts / DataFrame)
    TrainingDashboard(run)                      # a reopened run's metrics (`workbench.debug.load_run`)

Panels (x: training step; y titled with its unit): reward mean with a ± std band,
success rate, KL (kl/mean and actor/ppo_kl; see `KL_NOTE` for why they can be negative),
KL coefficient, entropy, clip fraction, losses (policy, value), response length,
tokens per second. Metric names are the trainer's fixed names (`PANELS`).

Redraws are throttled: `update(metrics)` records the step at once but redraws at
most every `min_interval` seconds; a step that arrives sooner is drawn by a short
timer thread (or by the next update, or by `flush()`), so a fast training loop
never waits on the browser. Drawing is one `batch_update()` that replaces the
traces' x/y arrays: the frontend gets one message per redraw.

`history_series(history)` is the plain function behind the traces.
"""
from __future__ import annotations

import copy
import math
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import ipywidgets as widgets
import traitlets

from workbench.widgets._html import STYLE, esc
from workbench.widgets._runs import history_of

__all__ = ["TrainingDashboard", "PANELS", "Y_TITLES", "KL_NOTE", "history_series", "as_history", "sync_figure_state"]

#: (panel title, [(metric name, legend label), ...]); the reward panel also draws a ± reward/std band.
PANELS: list[tuple[str, list[tuple[str, str]]]] = [
    ("reward (mean ± std)", [("reward/mean", "reward")]),
    ("success rate", [("env/success_rate", "success")]),
    ("KL to reference (estimate, can be < 0)", [("kl/mean", "kl/mean"), ("actor/ppo_kl", "ppo_kl (old→new)")]),
    ("KL coefficient", [("kl/coef", "kl coef")]),
    ("entropy", [("actor/entropy", "entropy")]),
    ("clip fraction", [("actor/pg_clipfrac", "clipfrac")]),
    ("losses", [("actor/pg_loss", "policy loss"), ("critic/vf_loss", "value loss")]),
    ("response length (tokens)", [("rollout/response_length_mean", "response length")]),
    ("throughput (tokens/s)", [("perf/tokens_per_s", "tokens/s")]),
]
#: y-axis title of each panel (by position in PANELS); every panel's x axis is the training step.
Y_TITLES = ["score", "share of episodes", "nats / token", "coefficient", "nats / token", "share of tokens",
            "loss", "tokens", "tokens / s"]
#: What the KL panel plots, shown under the figure and in the hover of its points.
KL_NOTE = ("kl/mean is the mean over sampled tokens of the run's estimator of KL(policy ‖ reference): "
           "training.kl_loss_type (default k3) when only the KL loss is on, else training.kl_penalty (default k1). "
           "k1 = logp − ref_logp is unbiased but a single token's value, and a mean over few tokens, "
           "can be negative, though the KL itself is ≥ 0; k2 (mse), k3 (low_var_kl) and abs are never negative. "
           "ppo_kl is the k1 estimate of KL(rollout policy ‖ updated policy), so it can be negative too.")
_KL_HOVER = ("step %{x}<br>%{y:.4g}<br>mean k-estimate of KL to the reference:<br>"
             "k1 can be negative, k3 cannot<extra>%{fullData.name}</extra>")
#: Stretch the figure to the output's full width (plotly sizes itself to its container).
_WIDTH_CSS = ("<style>.wb-dashboard { width: 100%; } .wb-dashboard > .widget-html, .wb-dashboard > div "
              "{ width: 100%; max-width: 100%; }</style>")
COLORS = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#8c564b", "#e377c2", "#17becf", "#7f7f7f"]


def sync_figure_state(fig: Any) -> None:
    """Store a FigureWidget's current data and layout in its synced state.

    plotly's FigureWidget sends later edits (add_trace, restyle, batch_update) as
    one-off messages to views that already exist, and refreshes its synced
    `_widget_data`/`_widget_layout` only when the figure itself is displayed. A figure
    shown inside a box, shown after it was edited, or rendered by Voilà from the
    kernel's state would come up empty. Views ignore changes of these two traits
    (live views are kept current by the messages), so this is cheap and safe.
    """
    fig._widget_layout = copy.deepcopy(fig._layout_obj._props)
    fig._widget_data = copy.deepcopy(fig._data)


def as_history(history: Any) -> list[dict[str, Any]]:
    """A metrics history as a list of dicts (accepts a list of dicts, a DataFrame or a `Run`)."""
    history = history_of(history)
    if history is None:
        return []
    if hasattr(history, "to_dict") and hasattr(history, "columns"):
        return [dict(r) for r in history.to_dict("records")]
    return [dict(m) for m in history]


def _number(value: Any) -> float | None:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return None
    return v if math.isfinite(v) else None


def history_series(history: Iterable[Mapping[str, Any]], names: Iterable[str]) -> dict[str, tuple[list, list]]:
    """{metric: (steps, values)} for each name, skipping steps where it is missing or not finite.

    The x value is the record's "step" when present, else its position.
    """
    out: dict[str, tuple[list, list]] = {n: ([], []) for n in names}
    for i, rec in enumerate(history):
        step = _number(rec.get("step"))
        x = int(step) if step is not None and float(step).is_integer() else (step if step is not None else i)
        for n in out:
            v = _number(rec.get(n))
            if v is not None:
                out[n][0].append(x)
                out[n][1].append(v)
    return out


class TrainingDashboard(widgets.VBox):
    """Training curves that update live during `fit()` (see the module docstring).

    Args:
        history: metrics already recorded (list of dicts, DataFrame, or a `Run` from
            `workbench.debug.load_run`) to draw at once.
        min_interval: minimum seconds between redraws while training.
        height: figure height in pixels.
        title: text above the figure.
    """

    steps = traitlets.Int(0, help="number of metric records received")

    def __init__(self, history: Any = None, min_interval: float = 0.5, height: int = 640,
                 title: str = "training", **kwargs: Any):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        self.history: list[dict[str, Any]] = []
        self.min_interval = float(min_interval)
        self.title = title
        self._lock = threading.RLock()
        self._last_draw = 0.0
        self._timer: threading.Timer | None = None
        self._dirty = False
        self.redraws = 0
        rows, cols = 3, 3
        base = make_subplots(rows=rows, cols=cols, subplot_titles=[p[0] for p in PANELS],
                             horizontal_spacing=0.07, vertical_spacing=0.12)
        self.figure = go.FigureWidget(base)
        #: metric name -> index of its trace in figure.data; "_band_hi"/"_band_lo" for the reward band.
        self.trace_index: dict[str, int] = {}
        color = iter(COLORS * 2)
        for p, (_, metrics) in enumerate(PANELS):
            r, c = p // cols + 1, p % cols + 1
            if p == 0:
                for key, fill in (("_band_hi", None), ("_band_lo", "tonexty")):
                    self.figure.add_scatter(x=[], y=[], mode="lines", line=dict(width=0, color="#1f77b4"),
                                            fill=fill, fillcolor="rgba(31,119,180,0.18)", hoverinfo="skip",
                                            showlegend=False, name=key, row=r, col=c)
                    self.trace_index[key] = len(self.figure.data) - 1
            for name, label in metrics:
                hover = _KL_HOVER if name in ("kl/mean", "actor/ppo_kl") else None
                self.figure.add_scatter(x=[], y=[], mode="lines+markers", name=label,
                                        line=dict(color=next(color), width=2), marker=dict(size=4),
                                        showlegend=len(metrics) > 1, hovertemplate=hover, row=r, col=c)
                self.trace_index[name] = len(self.figure.data) - 1
            self.figure.update_yaxes(title_text=Y_TITLES[p], title_standoff=4, row=r, col=c)
            self.figure.update_xaxes(title_text="step", title_standoff=2, row=r, col=c)
        self.figure.update_layout(height=height, autosize=True, margin=dict(l=60, r=10, t=40, b=40),
                                  template="plotly_white", legend=dict(orientation="h", y=-0.08), font=dict(size=11))
        self.figure.update_xaxes(tickformat="d", dtick=1)
        self._status = widgets.HTML()
        self._status.add_class("wb-dashboard-status")
        self._note = widgets.HTML(f'{STYLE}<div class="wb-root wb-legend">{esc(KL_NOTE)}</div>')
        self._note.add_class("wb-dashboard-note")
        kwargs.setdefault("layout", widgets.Layout(width="100%"))
        super().__init__([self._status, self.figure, self._note], **kwargs)
        self.add_class("wb-dashboard")
        if history is not None:
            self.set_history(history)
        else:
            self._draw()
            self._last_draw = 0.0  # the first real step draws at once

    # -- feeding ------------------------------------------------------------------------
    @property
    def callback(self) -> Callable[[Any, dict], None]:
        """A `fit()` callback: `cb(trainer, metrics)` -> `self.update(metrics)`."""
        def dashboard_callback(trainer: Any, metrics: dict) -> None:
            self.update(metrics)
        return dashboard_callback

    def update(self, metrics: Mapping[str, Any], force: bool = False) -> None:
        """Record one step's metrics; redraw now unless the last redraw was < min_interval ago."""
        with self._lock:
            self.history.append(dict(metrics))
            self.steps = len(self.history)
            self._dirty = True
            wait = self.min_interval - (time.monotonic() - self._last_draw)
            if force or wait <= 0:
                self._draw()
            elif self._timer is None:
                self._timer = threading.Timer(wait, self._timer_flush)
                self._timer.daemon = True
                self._timer.start()

    def set_history(self, history: Any) -> None:
        """Replace everything with a saved history (list of dicts, DataFrame or `Run`) and redraw."""
        with self._lock:
            self.history = as_history(history)
            self.steps = len(self.history)
            self._draw()

    def flush(self) -> None:
        """Draw any step not drawn yet (call after fit() if you need the final frame at once)."""
        with self._lock:
            if self._dirty:
                self._draw()

    def clear(self) -> None:
        self.set_history([])

    # -- reading ------------------------------------------------------------------------
    def series(self, name: str) -> tuple[list, list]:
        """(x, y) currently drawn for metric `name`."""
        tr = self.figure.data[self.trace_index[name]]
        return list(tr.x or ()), list(tr.y or ())

    # -- internals ----------------------------------------------------------------------
    def _timer_flush(self) -> None:
        with self._lock:
            self._timer = None
            if self._dirty:
                self._draw()

    def _draw(self) -> None:
        names = [n for _, ms in PANELS for n, _ in ms] + ["reward/std"]
        series = history_series(self.history, names)
        mx, my = series["reward/mean"]
        sx, sy = series["reward/std"]
        std_at = dict(zip(sx, sy))
        band_x = [x for x in mx if x in std_at]
        mean_at = dict(zip(mx, my))
        steps = max((len(xs) for xs, _ in series.values()), default=0)
        with self.figure.batch_update():
            self.figure.update_xaxes(dtick=max(1, -(-steps // 8)))  # whole steps, at most ~8 ticks
            for name, idx in self.trace_index.items():
                if name == "_band_hi":
                    self.figure.data[idx].x = band_x
                    self.figure.data[idx].y = [mean_at[x] + std_at[x] for x in band_x]
                elif name == "_band_lo":
                    self.figure.data[idx].x = band_x
                    self.figure.data[idx].y = [mean_at[x] - std_at[x] for x in band_x]
                else:
                    xs, ys = series[name]
                    self.figure.data[idx].x = xs
                    self.figure.data[idx].y = ys
        sync_figure_state(self.figure)
        self._status.value = self._status_html()
        self._last_draw = time.monotonic()
        self._dirty = False
        self.redraws += 1

    def _status_html(self) -> str:
        if not self.history:
            return f'{STYLE}{_WIDTH_CSS}<div class="wb-root wb-head"><b>{esc(self.title)}</b> · no steps yet</div>'
        last = self.history[-1]
        bits = [f"<b>{esc(self.title)}</b>", f"step {esc(last.get('step', len(self.history)))}"]
        for key, label, pct in (("reward/mean", "reward", False), ("env/success_rate", "success", True),
                                ("kl/mean", "KL", False), ("perf/step_seconds", "s/step", False)):
            v = _number(last.get(key))
            if v is not None:
                bits.append(f"{label} {v:.0%}" if pct else f"{label} {v:.3g}")
        return f'{STYLE}{_WIDTH_CSS}<div class="wb-root wb-head">{" · ".join(bits)}</div>'

    def __repr__(self) -> str:
        last = self.history[-1] if self.history else {}
        r = _number(last.get("reward/mean"))
        return (f"TrainingDashboard(steps={len(self.history)}"
                + (f", last reward/mean={r:.3g}" if r is not None else "") + ")")
