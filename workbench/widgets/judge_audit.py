"""`JudgeAuditView`: the judge audit (`workbench.reward.audit_judge`) in a notebook: the report
with its verdict, and each audited episode's environment outcome beside the judge's score,
its second score (judged again, and shown shuffled for a group judge) and its reason.

    view = JudgeAuditView(batch, judge)        # runs the audit now
    view = JudgeAuditView(audit=audit)         # shows one already run
    view.audit.fit                             # the verdict; view.html is what is shown

`audit_html(audit)` is the plain function behind it (tests read it without a kernel).
"""
from __future__ import annotations

from typing import Any

import ipywidgets as widgets

from workbench.widgets._html import STYLE, esc, html_table
from workbench.widgets._runs import batch_of

__all__ = ["JudgeAuditView", "audit_html"]

_COLUMNS = ["episode_id", "group_id", "success", "env_reward", "length", "score", "score_again", "score_shuffled",
            "reason", "error"]


def audit_html(audit: Any, max_rows: int = 60) -> str:
    """The audit's report (verdict first, in colour) and its per-episode table, as HTML."""
    verdict = ("fit to train on" if audit.fit else "NOT fit to train on: " + "; ".join(audit.missed))
    kind = "wb-good" if audit.fit else "wb-bad"
    report = "\n".join(audit.text().splitlines()[:-1])
    rows = sorted(audit.rows, key=lambda r: (r["success"] is not True, -(r["score"] if r["score"] is not None else -1)))
    cols = [c for c in _COLUMNS if any(r.get(c) is not None for r in rows)]
    return (f'{STYLE}<div class="wb-root"><div class="wb-head"><span class="wb-badge {kind}">{esc(verdict)}</span>'
            f'</div><pre style="white-space:pre-wrap">{esc(report)}</pre>'
            + html_table(rows, cols, max_rows=max_rows) + "</div>")


class JudgeAuditView(widgets.VBox):
    """The audit of `judge` on `batch` (a batch or a reopened run: its step `step`), or `audit`."""

    def __init__(self, batch: Any = None, judge: Any = None, audit: Any = None, step: int | None = None,
                 thresholds: Any = None, **kwargs: Any):
        if audit is None:
            if batch is None or judge is None:
                raise ValueError("JudgeAuditView needs batch= and judge= (it runs the audit), or audit=")
            from workbench.reward.audit import audit_judge

            if thresholds is None and getattr(batch, "config", None) is not None:
                thresholds = batch.config.doctor  # a reopened run: its own thresholds
            audit = audit_judge(batch_of(batch, step), judge, thresholds)
        self.audit = audit
        self._html = widgets.HTML(audit_html(audit))
        super().__init__([self._html], **kwargs)
        self.add_class("wb-judge-audit")

    @property
    def html(self) -> str:
        return self._html.value

    def __repr__(self) -> str:
        return f"JudgeAuditView({self.audit.model!r}, fit={self.audit.fit})"
