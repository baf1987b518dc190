"""`RunComparisonView`: two runs side by side (`workbench.debug.compare_runs`) in a notebook.

    view = RunComparisonView("runs/gn", "runs/gn_strict")   # or RunComparisonView(compare_runs(...))
    view.figure                  # plotly FigureWidget: reward and success per step, A and B overlaid
    view.seed = 10003            # the held-out episode of that seed, played by A and by B, side by side

Top to bottom: the headline (held-out success A -> B, findings resolved / still there /
new, seeds fixed / broken) and any notice that the runs are not comparable on held-out
episodes; the config differences; the doctor findings with their status; the curves
(training reward and success as lines, held-out success and reward as dashed lines with
markers; A blue, B red); a seed picker and the two episodes of that seed.

The widget computes nothing: the comparison is `compare_runs`'s, and the pieces come from
plain functions (`comparison_figure`, `config_diff_html`, `findings_html`, `pair_html`)
that tests call without a kernel.
"""
from __future__ import annotations

from typing import TYPE_CHECKING, Any

import ipywidgets as widgets
import traitlets

from workbench.widgets._html import STYLE, esc, html_table
from workbench.widgets.conversation import BRANCH_STYLE, render_episode_html
from workbench.widgets.dashboard import sync_figure_state

if TYPE_CHECKING:  # the debugger is imported when a comparison is built, not with the widgets
    from workbench.debug.compare import EpisodePair, RunComparison

__all__ = ["RunComparisonView", "comparison_figure", "config_diff_html", "findings_html", "pair_html", "TRACES"]

#: Colour of each run's traces.
RUN_COLORS = {"A": "#1f77b4", "B": "#d62728"}
#: (panel, curves column, legend text) of each run's traces; panel 1 = reward, 2 = success.
TRACES = [(1, "reward/mean", "train reward"), (1, "eval/reward_mean", "held-out reward"),
          (2, "env/success_rate", "train success"), (2, "eval/success_rate", "held-out success")]


def comparison_figure(cmp: "RunComparison") -> Any:
    """A plotly Figure: reward (left) and success (right) per step, both runs overlaid. Each
    trace is named "A train reward", "B held-out success", ... and holds the non-NaN values
    of that run's column of `cmp.curves`."""
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots

    fig = go.Figure(make_subplots(rows=1, cols=2, subplot_titles=["reward per step", "success per step"],
                                  horizontal_spacing=0.1))
    for run in ("A", "B"):
        rows = cmp.curves[cmp.curves["run"] == run]
        for col_index, column, text in TRACES:
            points = rows.dropna(subset=[column])
            held = column.startswith("eval/")
            fig.add_scatter(x=points["step"].tolist(), y=points[column].tolist(), name=f"{run} {text}",
                            mode="lines+markers", line=dict(color=RUN_COLORS[run], dash="dash" if held else "solid"),
                            marker=dict(size=8 if held else 4, symbol="diamond" if held else "circle"),
                            row=1, col=col_index)
    fig.update_xaxes(title_text="step (updates done)", tickformat="d")
    fig.update_yaxes(title_text="score", row=1, col=1)
    fig.update_yaxes(title_text="share of episodes", range=[-0.05, 1.05], row=1, col=2)
    fig.update_layout(height=360, template="plotly_white", margin=dict(l=60, r=10, t=40, b=40),
                      legend=dict(orientation="h", y=-0.2), font=dict(size=11))
    return fig


def config_diff_html(cmp: "RunComparison") -> str:
    """The config differences as a table ("The configs are the same." when there are none)."""
    if not cmp.config_diff:
        return '<div class="wb-root"><i>The configs are the same.</i></div>'
    rows = [{"field": k, "A": repr(a), "B": repr(b)} for k, (a, b) in cmp.config_diff.items()]
    return html_table(rows, ["field", "A", "B"])


def findings_html(cmp: "RunComparison") -> str:
    """The doctor findings of both runs: check, train/held-out, status, value vs threshold in A and B."""
    from workbench.debug.compare import STATUSES

    rows = [{"check": c.name, "where": c.where(), "status": c.status,
             **{r: (f"{f.value:.3g} vs {f.threshold:.3g}" if f else "-") for r, f in (("A", c.a), ("B", c.b))}}
            for s in STATUSES for c in cmp.findings[s]]
    if not rows:
        return '<div class="wb-root"><i>No findings in either run.</i></div>'
    return html_table(rows, ["check", "where", "status", "A", "B"])


def pair_html(pair: "EpisodePair | None") -> str:
    """Both runs' episodes of one held-out seed as two columns."""
    if pair is None:
        return f'{STYLE}<div class="wb-root"><i>no held-out seed played by both runs</i></div>'
    cols = "".join(f'<div class="wb-branch"><div class="wb-head"><b>{run}</b></div>'
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
        self._head = widgets.HTML(f'{STYLE}<div class="wb-root"><div class="wb-head"><b>A</b> {esc(cmp.a.path)}<br>'
                                  f'<b>B</b> {esc(cmp.b.path)}</div>{esc(cmp.headline())}{notes}</div>')
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
        self._pair.value = pair_html(pair)

    @property
    def html(self) -> str:
        """The side-by-side episodes now shown."""
        return self._pair.value

    def __repr__(self) -> str:
        return f"RunComparisonView({self.comparison.headline()})"
