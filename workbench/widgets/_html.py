"""Shared HTML helpers for the widgets: escaping, colour scales, the stylesheet.

Everything here is a plain function on plain data, so tests (and non-widget
code, e.g. `to_html()` exports) can use it without a kernel or a browser. Styles
are inline or in a `<style>` block scoped by `wb-` class names; nothing is loaded
from the network.
"""
from __future__ import annotations

import html
import math
from typing import Sequence

#: Colour of tokens / text that carry no training signal.
GREY = "#8a8a8a"
#: End colours of the diverging scale (negative, positive) and of the sequential one.
NEG_RGB = (33, 102, 172)
POS_RGB = (178, 24, 43)
SEQ_RGB = (118, 42, 131)
MASK_RGB = (77, 146, 33)

STYLE = """
<style>
.wb-root { font-family: var(--jp-ui-font-family, -apple-system, "Segoe UI", Roboto, sans-serif); font-size: 13px; color: #222; }
.wb-head { margin: 2px 0 6px 0; color: #444; }
.wb-span { background: #ffe066; color: inherit; padding: 0 1px; border-radius: 2px; }
.wb-action { background: #e6f4de; color: inherit; padding: 0 1px; border-radius: 2px; border-bottom: 2px solid #4d9221; }
.wb-badge { display: inline-block; padding: 0 6px; margin: 0 2px; border-radius: 8px; font-size: 11px; background: #eee; color: #333; }
.wb-badge.wb-good { background: #d9f2d0; color: #225c12; }
.wb-badge.wb-bad { background: #fbd5d5; color: #8a1414; }
.wb-badge.wb-warn { background: #fff0c2; color: #6b4e00; }
.wb-msg { margin: 6px 0; padding: 6px 10px; border-radius: 10px; max-width: 92%; white-space: pre-wrap; word-break: break-word; border: 1px solid transparent; }
.wb-role { font-size: 11px; font-weight: 600; text-transform: uppercase; letter-spacing: .04em; color: #555; margin-bottom: 2px; white-space: normal; }
.wb-system { background: #f3f3f3; color: #444; font-size: 12px; border-color: #e2e2e2; }
.wb-user { background: #eef4fb; border-color: #d5e3f3; }
.wb-assistant { background: #f3efff; border-color: #ddd3fb; margin-left: 8%; }
.wb-assistant.wb-human { background: #fff7e0; border-color: #f1dc9b; }
.wb-tool { background: #f0f7f0; border-color: #cfe5cf; font-family: var(--jp-code-font-family, monospace); font-size: 12px; }
.wb-toolcall { margin-top: 4px; padding: 4px 6px; background: #fff; border: 1px dashed #9bb59b; border-radius: 6px; font-family: var(--jp-code-font-family, monospace); font-size: 12px; }
.wb-error { background: #fdecec; border-color: #e89a9a; color: #7a1010; }
.wb-errline { color: #a11; font-weight: 600; white-space: normal; }
.wb-reward { float: right; font-size: 11px; font-weight: 600; margin-left: 8px; }
.wb-end { margin: 8px 0 2px 0; padding: 4px 8px; border-top: 1px solid #ddd; color: #333; }
.wb-tokbox { font-family: var(--jp-code-font-family, monospace); font-size: 12.5px; line-height: 1.9; white-space: pre-wrap; word-break: normal; overflow-wrap: normal; color: #111; }
.wb-tok { border-radius: 2px; padding: 1px 0; }
.wb-tok.wb-untrained { color: #8a8a8a; font-style: italic; }
.wb-tok.wb-reason { border-bottom: 2px dotted #7a5cc2; }
.wb-reasoning { margin: 0 0 4px 0; padding: 2px 6px; background: #ebe4fb; color: #4a3b6b; border-radius: 6px; font-size: 12px; }
.wb-reasoning summary { cursor: pointer; color: #6a55a0; font-size: 11px; }
.wb-legend { font-size: 11px; color: #444; margin: 4px 0; }
.wb-legend .wb-bar { display: inline-block; width: 160px; height: 10px; vertical-align: middle; border: 1px solid #ccc; margin: 0 4px; }
.wb-table { border-collapse: collapse; font-size: 12px; }
.wb-table th, .wb-table td { border-bottom: 1px solid #e5e5e5; padding: 2px 8px; text-align: right; }
.wb-table th { background: #f5f5f5; white-space: normal; vertical-align: bottom; }
.wb-table td { white-space: nowrap; }
.wb-table tr.wb-selected td { background: #fff3c4; }
.wb-table.wb-clickable tbody tr { cursor: pointer; }
.wb-table.wb-clickable tbody tr:hover td { background: #f0f6ff; }
</style>
""".strip()


def esc(text: object) -> str:
    """HTML-escape text (quotes too, so it is safe inside attributes)."""
    return html.escape(str(text), quote=True)


def fmt(value: float | None, digits: int = 4) -> str:
    """A compact number: 4 significant digits, explicit sign for signed values."""
    if value is None:
        return "—"
    if isinstance(value, float) and math.isnan(value):
        return "nan"
    return f"{value:+.{digits}g}" if value != 0 else "0"


def _mix(rgb: tuple[int, int, int], t: float) -> tuple[int, int, int]:
    """Blend white -> rgb by t in [0, 1]."""
    t = max(0.0, min(1.0, t))
    return tuple(int(round(255 + (c - 255) * t)) for c in rgb)  # type: ignore[return-value]


def rgb_css(rgb: tuple[int, int, int]) -> str:
    return f"rgb({rgb[0]},{rgb[1]},{rgb[2]})"


def diverging_color(value: float, center: float, scale: float) -> tuple[str, str]:
    """(background, text colour) on a blue-white-red scale centred at `center`.

    `scale` is the distance from the centre that gets the full colour; values
    beyond it saturate.
    """
    if scale <= 0 or not math.isfinite(value):
        return "rgb(255,255,255)", "#111"
    t = (value - center) / scale
    rgb = _mix(POS_RGB if t > 0 else NEG_RGB, abs(t))
    return rgb_css(rgb), ("#fff" if abs(t) > 0.6 else "#111")


def sequential_color(value: float, low: float, high: float, reverse: bool = False,
                     rgb: tuple[int, int, int] = SEQ_RGB) -> tuple[str, str]:
    """(background, text colour) on a white -> `rgb` scale over [low, high]."""
    if high <= low or not math.isfinite(value):
        t = 0.0
    else:
        t = (value - low) / (high - low)
    if reverse:
        t = 1.0 - t
    t = max(0.0, min(1.0, t))
    return rgb_css(_mix(rgb, t)), ("#fff" if t > 0.6 else "#111")


def gradient_css(kind: str) -> str:
    """CSS linear-gradient for a legend bar of the given scale kind."""
    if kind == "diverging":
        return (f"linear-gradient(to right, {rgb_css(NEG_RGB)}, rgb(255,255,255), {rgb_css(POS_RGB)})")
    if kind == "mask":
        return f"linear-gradient(to right, #e6e6e6 50%, {rgb_css(_mix(MASK_RGB, 0.45))} 50%)"
    return f"linear-gradient(to right, rgb(255,255,255), {rgb_css(SEQ_RGB)})"


def html_table(rows: Sequence[dict], columns: Sequence[str], selected: int | None = None,
               key: str | None = None, max_rows: int = 200, clickable: bool = False) -> str:
    """A small HTML table of dict rows (class `wb-table`); the row whose `key` equals `selected` is highlighted.
    Headers show the column names with "_" as spaces, so a narrow column's header wraps.

    With `key`, each row carries its key in `data-key` (`clickable` adds the pointer
    cursor; a widget listens for the clicks).
    """
    head = "".join(f"<th>{esc(str(c).replace('_', ' '))}</th>" for c in columns)  # spaces let a header wrap
    body = []
    for row in list(rows)[:max_rows]:
        cls = ' class="wb-selected"' if key is not None and selected is not None and row.get(key) == selected else ""
        data = f' data-key="{esc(row.get(key))}"' if key is not None else ""
        cells = "".join(f"<td>{esc(_cell(row.get(c)))}</td>" for c in columns)
        body.append(f"<tr{cls}{data}>{cells}</tr>")
    more = f'<div class="wb-legend">… {len(rows) - max_rows} more rows</div>' if len(rows) > max_rows else ""
    table_cls = "wb-table wb-clickable" if clickable else "wb-table"
    return f'<table class="{table_cls}"><thead><tr>{head}</tr></thead><tbody>{"".join(body)}</tbody></table>{more}'


def _cell(value: object) -> str:
    if value is None:
        return ""
    if isinstance(value, float):
        if math.isnan(value):
            return ""
        return f"{value:.4g}"
    return str(value)
