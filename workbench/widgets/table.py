"""`TrajectoryTable`: a sortable, filterable list of a batch's episodes, linked to the viewers.

    conv, toks = ConversationView(batch), TokenView(batch, tokenizer)
    table = TrajectoryTable(batch, conversation=conv, tokens=toks)
    table.query = "success == True and turns > 2"    # pandas query over the columns
    table.sort_by, table.ascending = "reward", False
    table.select(3)                                  # conv and toks now show episode 3
    TrajectoryTable(run, step=3)                     # a reopened run (`load_run`); default: its last step

Columns are `batch.to_pandas("episode")` plus `index` (position in the batch),
`reward` (score, or env reward when unscored), `human_turns`, `parse_errors`, and
`adv_mean` (mean advantage over trained tokens) when the batch has advantages. The HTML
table draws the `SHOWN` columns that say something about this batch: one that is empty,
0 or False in every row (no tool calls, no errors) is left out (`shown_columns`; still
there to sort and filter on), and the headers wrap, so the table fits its output.
A bad query is shown in red and leaves the list unfiltered. Clicking a row of the
HTML table (or an entry of the list above it) selects that episode: the table is a
small anywidget whose `selected` trait the browser sets on a click.

`episode_frame(batch)` and `filter_sort(df, query, sort_by, ascending)` are the plain
functions behind it.
"""
from __future__ import annotations

from typing import Any

import ipywidgets as widgets
import traitlets

from workbench.trajectory import TrajectoryBatch
from workbench.widgets._html import STYLE, esc, html_table
from workbench.widgets._runs import batch_of

__all__ = ["TrajectoryTable", "ClickableTable", "episode_frame", "filter_sort", "shown_columns"]

_CLICK_ESM = """
function render({ model, el }) {
  const draw = () => { el.innerHTML = model.get("value"); };
  el.addEventListener("click", (event) => {
    const row = event.target.closest("tr[data-key]");
    if (!row || !el.contains(row)) return;
    const key = parseInt(row.dataset.key, 10);
    if (Number.isNaN(key)) return;
    model.set("selected", key);
    model.save_changes();
  });
  model.on("change:value", draw);
  draw();
}
export default { render };
"""

try:
    import anywidget

    class ClickableTable(anywidget.AnyWidget):
        """HTML (`value`) whose rows with `data-key` set `selected` when clicked in the browser."""

        _esm = _CLICK_ESM
        value = traitlets.Unicode("").tag(sync=True)
        selected = traitlets.Int(None, allow_none=True).tag(sync=True)
except ImportError:  # anywidget missing: rows are drawn but not clickable (the list still is)
    class ClickableTable(widgets.HTML):  # type: ignore[no-redef]
        selected = traitlets.Int(None, allow_none=True)

SHOWN = ["index", "group_id", "seed", "turns", "tokens", "trained_tokens", "reward", "env_reward", "success",
         "truncated", "error", "tool_calls", "parse_errors", "human_turns", "adv_mean"]
#: Columns drawn even when every row has the same empty value (a batch that never succeeds).
ALWAYS_SHOWN = ("index", "seed", "turns", "reward", "success")


def _empty(value: Any) -> bool:
    if value is None or value is False or value == "" or value == 0:
        return True
    return isinstance(value, float) and value != value  # NaN


def shown_columns(df) -> tuple[list[str], list[str]]:
    """(drawn, left out): the `SHOWN` columns of `df`, less those empty, 0 or False in every
    row (`ALWAYS_SHOWN` never are), and `env_reward` when it equals `reward` in every row."""
    drawn, left = [], []
    for c in SHOWN:
        if c not in df.columns:
            continue
        values = df[c].tolist()
        same = c == "env_reward" and "reward" in df.columns and values == df["reward"].tolist()
        if c not in ALWAYS_SHOWN and (same or all(_empty(v) for v in values)):
            left.append(c)
        else:
            drawn.append(c)
    return drawn, left


def episode_frame(batch: TrajectoryBatch):
    """One row per episode with the columns the table sorts and filters on."""
    df = batch.to_pandas("episode")
    df.insert(0, "index", range(len(batch)))
    df["reward"] = [e.outcome for e in batch.episodes]
    df["human_turns"] = [sum(t.source == "human" for t in e.turns) for e in batch.episodes]
    df["parse_errors"] = [sum(bool(t.parse_error) for t in e.turns) for e in batch.episodes]
    if batch.has("advantages"):
        adv, mask = batch.tensors["advantages"].float(), batch.tensors["loss_mask"].float()
        df["adv_mean"] = ((adv * mask).sum(-1) / mask.sum(-1).clamp(min=1)).tolist()
    return df


def filter_sort(df, query: str = "", sort_by: str | None = None, ascending: bool = True):
    """(rows, error): `df.query(query)` sorted by `sort_by`; on a bad query, all rows and the error text."""
    error = None
    out = df
    if query and query.strip():
        try:
            out = df.query(query)
        except Exception as exc:  # pandas raises many kinds for a bad expression
            error = f"{type(exc).__name__}: {exc}"
            out = df
    if sort_by and sort_by in out.columns:
        out = out.sort_values(sort_by, ascending=ascending, kind="stable", na_position="last")
    return out, error


def _row_label(row: Any) -> str:
    mark = "✓" if row["success"] else ("err" if row.get("error") else " ")
    first = str(row.get("first_action", ""))[:40].replace("\n", " ")
    return f"#{row['index']:<3} {mark} R {row['reward']:+.3f} · {row['turns']} turns · {first}"


class TrajectoryTable(widgets.VBox):
    """Episodes of a batch as a sortable, filterable list; selecting one opens it in linked views.

    Args:
        batch: the `TrajectoryBatch`, or a `Run` (`workbench.debug.load_run`).
        conversation, tokens: views to drive (anything with an `index` trait, e.g.
            `ConversationView`, `TokenView`); more with `link(view)`.
        max_rows: rows drawn in the HTML table.
        step: with a `Run`, the saved step whose batch is listed (default: the last).
    """

    selected = traitlets.Int(None, allow_none=True, help="batch index of the selected episode")
    query = traitlets.Unicode("", help="pandas query filtering the rows, e.g. 'success == True'")
    sort_by = traitlets.Unicode("index", help="column to sort by")
    ascending = traitlets.Bool(True)

    def __init__(self, batch: TrajectoryBatch | Any, conversation: Any = None, tokens: Any = None,
                 max_rows: int = 100, step: int | None = None, **kwargs: Any):
        batch = batch_of(batch, step)
        self.batch = batch
        self.max_rows = max_rows
        self.views: list[Any] = []
        self.df = episode_frame(batch)
        self.rows = self.df
        self.error: str | None = None
        cols = [c for c in self.df.columns if c not in ("first_action",)]
        self._sort = widgets.Dropdown(options=cols, value="index", description="sort by",
                                      layout=widgets.Layout(width="240px"))
        self._order = widgets.ToggleButton(value=False, description="descending", icon="sort-amount-desc",
                                           layout=widgets.Layout(width="auto", min_width="120px"))
        self._filter = widgets.Text(placeholder="filter, e.g. success == True and turns > 2", continuous_update=False,
                                    description="filter", layout=widgets.Layout(width="420px"))
        self._list = widgets.Select(options=[], rows=8, layout=widgets.Layout(width="640px"))
        self._list.add_class("wb-table-select")
        self._msg = widgets.HTML()
        self._table = ClickableTable()
        self._table.add_class("wb-table-html")
        self._table.observe(self._on_row_click, names="selected")
        super().__init__([widgets.HBox([self._sort, self._order, self._filter]), self._msg, self._list,
                          self._table], **kwargs)
        self.add_class("wb-trajectory-table")
        self._sort.observe(lambda c: setattr(self, "sort_by", c["new"]), names="value")
        self._order.observe(lambda c: setattr(self, "ascending", not c["new"]), names="value")
        self._filter.observe(lambda c: setattr(self, "query", c["new"]), names="value")
        self._list.observe(self._on_list, names="value")
        for view in (conversation, tokens):
            if view is not None:
                self.link(view)
        self._refresh()

    # -- public ------------------------------------------------------------------------------
    def link(self, view: Any) -> None:
        """Make `view.index` follow the selection."""
        self.views.append(view)
        if self.selected is not None:
            view.index = self.selected

    def select(self, index: int) -> None:
        """Select the episode at batch position `index` (opens it in the linked views)."""
        if not 0 <= index < len(self.batch):
            raise IndexError(f"episode {index} out of range (batch of {len(self.batch)})")
        self.selected = index

    def set_batch(self, batch: TrajectoryBatch | Any, step: int | None = None) -> None:
        """List another batch (or a `Run`'s step `step`)."""
        batch = batch_of(batch, step)
        self.batch = batch
        self.df = episode_frame(batch)
        self.selected = None
        self._refresh()

    @property
    def html(self) -> str:
        return self._table.value

    # -- internals ----------------------------------------------------------------------------
    _updating = False

    @traitlets.observe("query", "sort_by", "ascending")
    def _on_controls(self, change: dict) -> None:
        if self._filter.value != self.query:
            self._filter.value = self.query
        if self._sort.value != self.sort_by and self.sort_by in self._sort.options:
            self._sort.value = self.sort_by
        if self._order.value == self.ascending:
            self._order.value = not self.ascending
        self._refresh()

    @traitlets.observe("selected")
    def _on_selected(self, change: dict) -> None:
        i = change["new"]
        if i is None:
            return
        for view in self.views:
            view.index = i
        if self._list.value != i and i in self.rows["index"].tolist():
            self._list.value = i
        self._table.value = self._table_html()

    def _on_row_click(self, change: dict) -> None:
        i = change["new"]
        if i is not None and i != self.selected and 0 <= i < len(self.batch):
            self.selected = i

    def _on_list(self, change: dict) -> None:
        if self._updating:
            return
        if change["new"] is not None and change["new"] != self.selected:
            self.selected = change["new"]

    def _refresh(self) -> None:
        self.rows, self.error = filter_sort(self.df, self.query, self.sort_by, self.ascending)
        opts = [(_row_label(r), int(r["index"])) for r in self.rows.to_dict("records")]
        self._updating = True  # changing the options must not change the selection
        try:
            self._list.options = opts
            if self.selected is not None and self.selected in self.rows["index"].tolist():
                self._list.value = self.selected
            else:
                self._list.index = None
        finally:
            self._updating = False
        n, total = len(self.rows), len(self.df)
        left = shown_columns(self.df)[1]
        if self.error:
            self._msg.value = f'{STYLE}<div class="wb-root wb-errline">bad filter: {esc(self.error)}</div>'
        else:
            empty = f" · not drawn, empty in every row: {esc(', '.join(left))}" if left else ""
            self._msg.value = (f'{STYLE}<div class="wb-root wb-legend">{n} of {total} episodes · click a row to open '
                               f'it below{empty}</div>')
        self._table.value = self._table_html()

    def _table_html(self) -> str:
        cols = shown_columns(self.df)[0]
        if self._table.selected != self.selected:
            self._table.selected = self.selected
        return STYLE + '<div class="wb-root">' + html_table(self.rows.to_dict("records"), cols, self.selected,
                                                            key="index", max_rows=self.max_rows,
                                                            clickable=True) + "</div>"

    def __repr__(self) -> str:
        return (f"TrajectoryTable({len(self.rows)}/{len(self.df)} episodes, sort={self.sort_by!r}"
                f"{'' if self.ascending else ' desc'}, query={self.query!r}, selected={self.selected})")
