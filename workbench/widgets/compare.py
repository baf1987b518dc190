"""`RunComparisonView`: two runs side by side (`workbench.debug.compare_runs`) in a notebook.

    view = RunComparisonView("runs/gn", "runs/gn_strict")   # or RunComparisonView(compare_runs(...))
    view.figure                  # plotly FigureWidget: reward and success per step, A and B overlaid
    view.seed = 10003            # the held-out episode of that seed, played by A and by B, side by side

Top to bottom: the two runs by folder name (`run_names`) and, for a branch, where it
parts from its parent; the headline (held-out success A -> B, findings resolved / still
there / new, seeds fixed / broken) and any notice that the runs are not comparable on
held-out episodes; the config differences; the doctor findings with their status; the
curves (training reward and success as lines, held-out success and reward as dashed lines
with markers; A blue, B red); a seed picker and the two episodes of that seed.

What a reader would otherwise misread:
* A branch's metrics repeat its parent's rows before the branch step; those are drawn
  once, as the parent's, and a dotted line marks where the branch starts.
* A line never joins two steps with a step between them that the run has no value for
  (a branch's SFT warm-up steps have no reward: the steps are shaded and the line breaks).
* Where both runs have the same values, A's wider, paler line stays visible under B's.
* Each chart has its own legend, under it.
* The config table lists the settings someone changed; what a branch sets by itself (how
  far it trains, `training.num_iters_per_epoch`; where its warm-up starts, `sft.start_step`)
  is a line under the table.

The widget computes nothing: the comparison is `compare_runs`'s, and the pieces come from
plain functions (`comparison_figure`, `config_diff_html`, `findings_html`, `pair_html`)
that tests call without a kernel.
"""
from __future__ import annotations

import math
from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import traitlets

from workbench.widgets._html import STYLE, esc, html_table
from workbench.widgets.conversation import BRANCH_STYLE, render_episode_html
from workbench.widgets.dashboard import sync_figure_state

if TYPE_CHECKING:  # the debugger is imported when a comparison is built, not with the widgets
    from workbench.debug.compare import EpisodePair, RunComparison

__all__ = ["RunComparisonView", "comparison_figure", "config_diff_html", "findings_html", "pair_html", "TRACES",
           "run_names", "branch_step", "curve_points", "BRANCH_SET_FIELDS"]

#: Colour of each run's traces.
RUN_COLORS = {"A": "#1f77b4", "B": "#d62728"}
#: (panel, curves column, legend text) of each run's traces; panel 1 = reward, 2 = success.
TRACES = [(1, "reward/mean", "train"), (1, "eval/reward_mean", "held-out"),
          (2, "env/success_rate", "train"), (2, "eval/success_rate", "held-out")]
#: Fields a branch sets by itself (`workbench.training.branch`): how far it trains (from
#: `steps=`) and where its SFT warm-up starts. Not rows of the config table.
BRANCH_SET_FIELDS = ("training.num_epochs", "training.num_iters_per_epoch", "sft.start_step")
#: Legend of each chart (panel -> layout legend name).
_LEGENDS = {1: "legend", 2: "legend2"}


def run_names(cmp: "RunComparison") -> dict[str, str]:
    """{"A": ..., "B": ...}: each run's folder name, with its parent folder's name too when
    both folders have the same name (runs/x/train vs runs/y/train)."""
    a, b = cmp.a.path, cmp.b.path
    if a.name != b.name:
        return {"A": a.name, "B": b.name}
    return {"A": f"{a.parent.name}/{a.name}", "B": f"{b.parent.name}/{b.name}"}


def _same_folder(x: Any, y: Any) -> bool:
    try:
        return x is not None and y is not None and x.resolve() == y.resolve()
    except OSError:
        return False


def branch_step(cmp: "RunComparison") -> tuple[str, int] | None:
    """("B", step) when B is a branch of A that starts at `step` (("A", step) the other way
    round); None when neither run branched from the other."""
    for child, parent in (("B", cmp.a), ("A", cmp.b)):
        origin = getattr(cmp.b if child == "B" else cmp.a, "branched_from", None)
        if origin is not None and _same_folder(origin.parent_run, parent.path):
            return child, int(origin.step)
    return None


def curve_points(rows: Any, column: str, start: int | None = None) -> tuple[list, list]:
    """(x, y) of one run's `column` for plotly: its steps from `start` on, with a None where
    a line must break (a step without a value, or a jump over steps the run has no row for).
    Held-out columns (sparse by design) keep only the steps evaluated, joined."""
    rows = rows.sort_values("step")
    if start is not None:
        rows = rows[rows["step"] >= start]
    held = column.startswith("eval/")
    xs: list = []
    ys: list = []
    last = None
    for step, value in zip(rows["step"].tolist(), rows[column].tolist()):
        missing = value is None or (isinstance(value, float) and math.isnan(value))
        if held and missing:
            continue
        if not held and last is not None and step > last + 1 and ys and ys[-1] is not None:
            xs.append(None)
            ys.append(None)
        xs.append(int(step))
        ys.append(None if missing else float(value))
        last = step
    while ys and ys[-1] is None:  # no break at either end
        xs.pop()
        ys.pop()
    while ys and ys[0] is None:
        xs.pop(0)
        ys.pop(0)
    return xs, ys


def _sft_steps(run: Any, start: int | None) -> list[int]:
    metrics = getattr(run, "metrics", None)
    if metrics is None or "sft/nll" not in getattr(metrics, "columns", []):
        return []
    rows = metrics.dropna(subset=["sft/nll"])
    return [int(s) for s in rows["step"].tolist() if start is None or s >= start]


def _spans(steps: list[int]) -> list[tuple[int, int]]:
    out: list[tuple[int, int]] = []
    for s in sorted(steps):
        if out and s == out[-1][1] + 1:
            out[-1] = (out[-1][0], s)
        else:
            out.append((s, s))
    return out


def comparison_figure(cmp: "RunComparison") -> Any:
    """A plotly Figure: reward (left) and success (right) per step, both runs overlaid (see the
    module docstring). Each trace is named "A lenient · train", "B strict · held-out", ...
    (`run_names`); for a branch, its own steps only."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = go.Figure(make_subplots(rows=1, cols=2, subplot_titles=["reward per step", "success per step"],
                                  horizontal_spacing=0.1))
    names, branch = run_names(cmp), branch_step(cmp)
    for run in ("A", "B"):
        rows = cmp.curves[cmp.curves["run"] == run]
        start = branch[1] if branch is not None and branch[0] == run else None
        for col_index, column, text in TRACES:
            xs, ys = curve_points(rows, column, start)
            held = column.startswith("eval/")
            under = run == "A"  # wider and paler: visible under B where both have the same values
            fig.add_scatter(x=xs, y=ys, name=f"{run} {names[run]} · {text}", legend=_LEGENDS[col_index],
                            mode="lines+markers", connectgaps=False, opacity=0.6 if under else 1.0,
                            line=dict(color=RUN_COLORS[run], dash="dash" if held else "solid",
                                      width=4 if under else 2),
                            marker=dict(size=(9 if held else 6) if under else (7 if held else 4),
                                        symbol="diamond" if held else "circle"),
                            row=1, col=col_index)
    if branch is not None:
        child, step = branch
        for col in (1, 2):
            fig.add_vline(x=step - 0.5, line=dict(color="#888", dash="dot", width=1), row=1, col=col)
        fig.add_annotation(x=step - 0.5, y=1.0, xref="x", yref="y domain", text=f"{child} starts",
                           showarrow=False, xanchor="left", yanchor="top", font=dict(size=10, color="#666"))
        for lo, hi in _spans(_sft_steps(cmp.b if child == "B" else cmp.a, step)):
            for col in (1, 2):
                fig.add_vrect(x0=lo - 0.5, x1=hi + 0.5, fillcolor="#999", opacity=0.12, line_width=0,
                              row=1, col=col)
            fig.add_annotation(x=(lo + hi) / 2, y=0.0, xref="x2", yref="y2 domain", text=f"{child} SFT",
                               showarrow=False, yanchor="bottom", font=dict(size=10, color="#666"))
    fig.update_xaxes(title_text="step (updates done)", tickformat="d")
    fig.update_yaxes(title_text="score", row=1, col=1)
    fig.update_yaxes(title_text="share of episodes", range=[-0.05, 1.05], row=1, col=2)
    domains = (fig.layout.xaxis.domain, fig.layout.xaxis2.domain)
    # each legend under its chart's x-axis title, at the chart's left edge, one entry a line (a
    # horizontal legend wraps at the figure's width, not its chart's, and would run under the other)
    legends = {name: dict(orientation="v", x=domains[col - 1][0], xanchor="left", y=-0.17, yanchor="top",
                          font=dict(size=10), tracegroupgap=0) for col, name in _LEGENDS.items()}
    fig.update_layout(height=500, template="plotly_white", margin=dict(l=60, r=10, t=40, b=140),
                      font=dict(size=11), **legends)
    return fig


def config_diff_html(cmp: "RunComparison") -> str:
    """The config differences as a table ("The configs are the same." when there are none).
    When one run is a branch of the other, the fields the branch set by itself
    (`BRANCH_SET_FIELDS`) are a line under the table, not rows."""
    branch = branch_step(cmp)
    own = {k: v for k, v in cmp.config_diff.items() if branch is not None and k in BRANCH_SET_FIELDS}
    rows = [{"field": k, "A": _value(a), "B": _value(b)} for k, (a, b) in cmp.config_diff.items() if k not in own]
    table = html_table(rows, ["field", "A", "B"]) if rows else '<div class="wb-root"><i>The configs are the same.</i></div>'
    if own:
        said = "; ".join(f"{k} {_value(a)} → {_value(b)}" for k, (a, b) in own.items())
        table += (f'<div class="wb-legend">set by the branch itself, not changed by hand: {esc(said)} '
                  "(how far it trains; where its warm-up starts)</div>")
    return table


def _value(value: Any) -> str:
    return "(absent)" if value is None else repr(value)


def findings_html(cmp: "RunComparison") -> str:
    """The doctor findings of both runs: check, train/held-out, status, value vs threshold in A and B."""
    from workbench.debug.compare import STATUSES

    rows = [{"check": c.name, "where": c.where(), "status": c.status,
             **{r: (f"{f.value:.3g} vs {f.threshold:.3g}" if f else "-") for r, f in (("A", c.a), ("B", c.b))}}
            for s in STATUSES for c in cmp.findings[s]]
    if not rows:
        return '<div class="wb-root"><i>No findings in either run.</i></div>'
    return html_table(rows, ["check", "where", "status", "A", "B"])


def pair_html(pair: "EpisodePair | None", names: dict[str, str] | None = None) -> str:
    """Both runs' episodes of one held-out seed as two columns (headed A and B, with the
    runs' `names` when given)."""
    if pair is None:
        return f'{STYLE}<div class="wb-root"><i>no held-out seed played by both runs</i></div>'
    names = names or {}
    cols = "".join(f'<div class="wb-branch"><div class="wb-head"><b>{run}</b> {esc(names.get(run, ""))}</div>'
                   f"{render_episode_html(ep, show_system=False, style=False)}</div>"
                   for run, ep in (("A", pair.a), ("B", pair.b)))
    return (f'{STYLE}{BRANCH_STYLE}<div class="wb-root"><div class="wb-head">seed {pair.seed}: {esc(pair.change)}'
            f'</div><div class="wb-branches">{cols}</div></div>')


class RunComparisonView(widgets.VBox):
    """Two runs side by side (see the module docstring).

    Args:
        a: a `RunComparison`, or run A (folder or `Run`) with `b`.
        b: run B (folder or `Run`) when `a` is a run.
        doctor: thresholds to judge both runs with (`compare_runs`'s `doctor`).
    """

    seed = traitlets.Int(-1, help="held-out seed shown side by side (-1: none)")

    def __init__(self, a: Any, b: Any = None, doctor: Any = None, **kwargs: Any):
        import plotly.graph_objects as go

        from workbench.debug.compare import RunComparison, compare_runs

        if isinstance(a, RunComparison):
            self.comparison = a
        else:
            if b is None:
                raise TypeError("RunComparisonView(a, b): give two runs (folders or Runs), or one RunComparison")
            self.comparison = compare_runs(a, b, doctor=doctor)
        cmp = self.comparison
        notes = "".join(f'<div class="wb-errline">{esc(n)}</div>' for n in cmp.notices)
        self.names = run_names(cmp)
        branch = branch_step(cmp)
        parts = {run: "" for run in ("A", "B")}
        if branch is not None:
            child, step = branch
            parent = "A" if child == "B" else "B"
            parts[child] = f" · a branch of {parent}, from its checkpoint at step {step}"
        self._head = widgets.HTML(
            f'{STYLE}<div class="wb-root"><div class="wb-head">'
            + "<br>".join(f'<b>{run}</b> {esc(self.names[run])}{esc(parts[run])}' for run in ("A", "B"))
            + f'</div>{esc(cmp.headline())}{notes}</div>')
        self._config = widgets.HTML(f"{STYLE}<b>Config differences</b>{config_diff_html(cmp)}")
        self._findings = widgets.HTML(f"{STYLE}<b>Doctor findings</b>{findings_html(cmp)}")
        self.figure = go.FigureWidget(comparison_figure(cmp))
        sync_figure_state(self.figure)
        self._by_seed = {p.seed: p for p in cmp.pairs}
        self._pick = widgets.Dropdown(options=[(f"seed {p.seed} · {p.change}", p.seed) for p in cmp.pairs],
                                      description="held-out", layout=widgets.Layout(width="360px"))
        self._pair = widgets.HTML()
        super().__init__([self._head, self._config, self._findings, self.figure, self._pick, self._pair], **kwargs)
        self.add_class("wb-compare")
        self._pick.observe(lambda c: setattr(self, "seed", c["new"]) if c["new"] is not None else None, names="value")
        self.observe(lambda c: self._show(), names="seed")
        self.seed = cmp.pairs[0].seed if cmp.pairs else -1
        self._show()

    def _show(self) -> None:
        pair = self._by_seed.get(self.seed)
        if pair is not None and self._pick.value != self.seed:
            self._pick.value = self.seed
        self._pair.value = pair_html(pair, self.names)

    @property
    def html(self) -> str:
        """The side-by-side episodes now shown."""
        return self._pair.value

    def __repr__(self) -> str:
        return f"RunComparisonView({self.comparison.headline()})"
