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

Reward and success are always drawn. Another panel is hidden once the run shows it has
nothing to say (`panel_visibility`): none of its metrics recorded after the first step, or
every one of them the same number at every step of two or more (a KL coefficient that is
not adapted, a clip fraction of 0 with one update per batch). The status line names the
hidden panels and their constant value; the others close ranks, three to a row. A panel
with two curves (KL, losses) has its legend in its own top-right corner.

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
from pathlib import Path
import threading
import time
from typing import Any, Callable, Iterable, Mapping

import ipywidgets as widgets
import traitlets

from workbench.widgets._html import STYLE, esc
from workbench.widgets._runs import history_of, is_run

__all__ = ["TrainingDashboard", "PANELS", "Y_TITLES", "KL_NOTE", "ALWAYS_SHOWN", "history_series", "as_history",
           "panel_visibility", "sync_figure_state"]

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
#: Panels drawn even when flat (by position in PANELS): a reward stuck at 0 is the news.
ALWAYS_SHOWN = (0, 1)
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
#: The panels with two curves, each with a legend of its own in its corner: panel -> legend name.
_LEGENDS = {2: "legend", 6: "legend2"}
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


def _run_title(run: Any) -> str:
    config = run.config
    return f"{Path(run.path).name} · {config.training.adv_estimator} on {config.environment.name}"


def panel_visibility(history: Iterable[Mapping[str, Any]]) -> list[str | None]:
    """For each panel of PANELS: None when it is drawn, else why it is hidden ("not recorded",
    or "X every step" for a metric that never changed). With no step recorded every panel is
    drawn; with one, those without data are hidden; from two on, flat ones too
    (`ALWAYS_SHOWN` never are)."""
    history = list(history)
    names = [n for _, ms in PANELS for n, _ in ms]
    series = history_series(history, names)
    out: list[str | None] = []
    for p, (_, metrics) in enumerate(PANELS):
        values = [series[n][1] for n, _ in metrics]
        if p in ALWAYS_SHOWN or not history:
            out.append(None)
        elif not any(values):
            out.append("not recorded")
        elif len(history) >= 2 and all(len(set(v)) <= 1 for v in values):
            flat = [f"{v[0]:.3g}" for v in values if v]
            out.append(f"{' and '.join(flat)} every step")
        else:
            out.append(None)
    return out


class TrainingDashboard(widgets.VBox):
    """Training curves that update live during `fit()` (see the module docstring).

    Args:
        history: metrics already recorded (list of dicts, DataFrame, or a `Run` from
            `workbench.debug.load_run`) to draw at once.
        min_interval: minimum seconds between redraws while training.
        height: figure height in pixels with three rows of panels (fewer rows, less height).
        title: text above the figure; default for a `Run`: its folder's name, estimator and
            environment ("gn-strict · grpo on guess_number"), else "training".
    """

    steps = traitlets.Int(0, help="number of metric records received")

    def __init__(self, history: Any = None, min_interval: float = 0.5, height: int = 640,
                 title: str | None = None, **kwargs: Any):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        self.history: list[dict[str, Any]] = []
        self.min_interval = float(min_interval)
        if title is None:
            title = _run_title(history) if is_run(history) else "training"
        self.title = title
        self.height = int(height)
        #: why each panel is hidden (None: drawn), as of the last redraw (`panel_visibility`)
        self.hidden: list[str | None] = [None] * len(PANELS)
        self._arranged: tuple[int, ...] | None = None
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
        self._panel_of: dict[int, int] = {}  # trace position -> panel position
        color = iter(COLORS * 2)
        for p, (_, metrics) in enumerate(PANELS):
            r, c = p // cols + 1, p % cols + 1
            if p == 0:
                for key, fill in (("_band_hi", None), ("_band_lo", "tonexty")):
                    self.figure.add_scatter(x=[], y=[], mode="lines", line=dict(width=0, color="#1f77b4"),
                                            fill=fill, fillcolor="rgba(31,119,180,0.18)", hoverinfo="skip",
                                            showlegend=False, name=key, row=r, col=c)
                    self.trace_index[key] = len(self.figure.data) - 1
                    self._panel_of[len(self.figure.data) - 1] = p
            legend = _LEGENDS.get(p)
            for name, label in metrics:
                hover = _KL_HOVER if name in ("kl/mean", "actor/ppo_kl") else None
                self.figure.add_scatter(x=[], y=[], mode="lines+markers", name=label,
                                        line=dict(color=next(color), width=2), marker=dict(size=4),
                                        showlegend=legend is not None, legend=legend or "legend",
                                        hovertemplate=hover, row=r, col=c)
                self.trace_index[name] = len(self.figure.data) - 1
                self._panel_of[len(self.figure.data) - 1] = p
            self.figure.update_yaxes(title_text=Y_TITLES[p], title_standoff=4, row=r, col=c)
            self.figure.update_xaxes(title_text="step", title_standoff=2, row=r, col=c)
        legend_style = dict(xanchor="right", yanchor="top", bgcolor="rgba(255,255,255,0.75)", borderwidth=0,
                            font=dict(size=10), tracegroupgap=0)
        self.figure.update_layout(height=height, autosize=True, margin=dict(l=60, r=10, t=40, b=40),
                                  template="plotly_white", font=dict(size=11),
                                  **{name: dict(legend_style) for name in _LEGENDS.values()})
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
        self.hidden = panel_visibility(self.history)
        with self.figure.batch_update():
            self._arrange()
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
                    if _LEGENDS.get(self._panel_of[idx]) is not None:
                        self.figure.data[idx].showlegend = bool(xs) or not self.history  # no entry for an empty curve
        sync_figure_state(self.figure)
        self._status.value = self._status_html()
        self._last_draw = time.monotonic()
        self._dirty = False
        self.redraws += 1

    def _arrange(self) -> None:
        """Lay the drawn panels out three to a row (hidden ones get no room and no title);
        the figure's height follows the number of rows. Called inside a batch_update."""
        shown = tuple(p for p, why in enumerate(self.hidden) if why is None)
        if shown == self._arranged:
            return
        self._arranged = shown
        cols = min(3, max(len(shown), 1))
        rows = max(1, -(-len(shown) // cols))
        margin_t, margin_b, gap = 40, 40, 70  # px: the room for a row's x ticks, x title and the next title
        row_px = (self.height - margin_t - margin_b - 2 * gap) / 3  # a row as tall as with three rows
        height = margin_t + margin_b + rows * row_px + (rows - 1) * gap
        plot_h = height - margin_t - margin_b
        hspace = 0.07 if cols == 3 else 0.1
        col_w = (1 - (cols - 1) * hspace) / cols
        layout = self.figure.layout
        layout.height = round(height)
        for p in range(len(PANELS)):
            suffix = "" if p == 0 else str(p + 1)
            xaxis, yaxis = layout["xaxis" + suffix], layout["yaxis" + suffix]
            note = layout.annotations[p]
            visible = p in shown
            for idx, panel in self._panel_of.items():
                if panel == p:
                    self.figure.data[idx].visible = visible
            xaxis.visible = yaxis.visible = note.visible = visible
            if not visible:  # out of the way: a sliver in the bottom-right corner
                xaxis.domain, yaxis.domain = [0.999, 1.0], [0.0, 0.001]
                if p in _LEGENDS:
                    layout[_LEGENDS[p]].visible = False
                continue
            k = shown.index(p)
            r, c = divmod(k, cols)
            x0 = c * (col_w + hspace)
            top = 1 - r * (row_px + gap) / plot_h
            bottom = top - row_px / plot_h
            xaxis.domain, yaxis.domain = [x0, x0 + col_w], [max(bottom, 0.0), min(top, 1.0)]
            note.x, note.y = x0 + col_w / 2, min(top, 1.0)
            if p in _LEGENDS:
                layout[_LEGENDS[p]].update(visible=True, x=x0 + col_w, y=min(top, 1.0))

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
        hidden = [f"{PANELS[p][0]} ({why})" for p, why in enumerate(self.hidden) if why is not None]
        more = (f'<div class="wb-legend">not drawn, nothing to see: {esc("; ".join(hidden))}</div>'
                if hidden else "")
        return f'{STYLE}{_WIDTH_CSS}<div class="wb-root wb-head">{" · ".join(bits)}{more}</div>'

    def __repr__(self) -> str:
        last = self.history[-1] if self.history else {}
        r = _number(last.get("reward/mean"))
        return (f"TrainingDashboard(steps={len(self.history)}"
                + (f", last reward/mean={r:.3g}" if r is not None else "") + ")")
