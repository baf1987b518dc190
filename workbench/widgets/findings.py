"""`FindingsPanel`: the run doctor's findings next to the dashboard; picking a finding's
evidence opens that episode in a `ConversationView` with the span of the reply marked.

    findings = diagnose(run)                       # workbench.debug.doctor
    panel = FindingsPanel(findings, run)           # run: load_run(...), a run folder's batches, ...
    panel.pick(0, evidence=1)                      # finding 0, its second evidence episode
    panel.conversation.html                        # the episode, the span in <mark class="wb-span">

Where the evidence episodes come from (`batches`): a reopened run (`.batch(step)`,
`.eval_batch(step)`), a dict `{("train" | "eval", step): TrajectoryBatch}`, or one
`TrajectoryBatch` that holds every evidence episode. The logic is in plain functions
(`findings_table_html`, `finding_html`, `evidence_episode`) that tests call without a
browser.
"""
from __future__ import annotations

from typing import Any, Sequence

import ipywidgets as widgets
import traitlets

from workbench.doctor.findings import Evidence, Finding
from workbench.trajectory import Episode, TrajectoryBatch
from workbench.widgets._html import STYLE, esc, html_table
from workbench.widgets.conversation import ConversationView, highlight_html

__all__ = ["FindingsPanel", "findings_table_html", "finding_html", "evidence_episode", "finding_label"]


def finding_label(i: int, f: Finding) -> str:
    """Short label for the finding list: name, severity, the number against its threshold."""
    held = " · held-out" if f.source == "eval" else ""
    return f"#{i} {f.name}{held} · {f.severity} · {f.value:.3g} vs {f.threshold:.3g}"


def findings_table_html(findings: Sequence[Finding], selected: int | None = None) -> str:
    """All findings as an HTML table (the selected row marked)."""
    rows = [{"#": i, "check": f.name, "severity": f.severity, "value": f"{f.value:.3g}", "threshold": f"{f.threshold:.3g}",
             "where": ("held-out" if f.source == "eval" else "train") + (f" step {f.step}" if f.step is not None else ""),
             "evidence": len(f.evidence)} for i, f in enumerate(findings)]
    if not rows:
        return f'{STYLE}<div class="wb-root"><i>no findings</i></div>'
    return html_table(rows, ["#", "check", "severity", "value", "threshold", "where", "evidence"], selected, key="#")


def finding_html(f: Finding) -> str:
    """One finding: what was measured, what to do, and each evidence reply with its span marked."""
    items = "".join(f"<li>{esc(e.where())}: <code>{highlight_html(e.text, e.span)}</code></li>" for e in f.evidence)
    return (f'{STYLE}<div class="wb-root"><b>{esc(f.name)}</b> ({esc(f.severity)}): {esc(f.message)}.'
            f"<br><i>Do:</i> {esc(f.advice)}<ul>{items}</ul></div>")


def evidence_episode(batches: Any, ev: Evidence) -> Episode | None:
    """The episode an evidence entry names, from `batches` (see the module docstring), or None."""
    batch = None
    if isinstance(batches, TrajectoryBatch):
        batch = batches
    elif isinstance(batches, dict):
        batch = batches.get((ev.source, ev.step))
    elif batches is not None:
        load = getattr(batches, "eval_batch" if ev.source == "eval" else "batch", None)
        try:
            batch = load(ev.step) if callable(load) and ev.step is not None else None
        except (OSError, ValueError, KeyError):
            batch = None
    if batch is None:
        return None
    return next((e for e in batch if e.episode_id == ev.episode_id and
                 (ev.seed is None or e.env_seed == ev.seed)), None)


class FindingsPanel(widgets.VBox):
    """The doctor's findings; picking one (and one of its evidence episodes) opens the
    episode in the conversation view below with the span marked.

    Args:
        findings: from `diagnose` (fired findings).
        batches: where the evidence episodes are (see the module docstring).
    """

    finding = traitlets.Int(0, help="index of the selected finding")
    evidence = traitlets.Int(0, help="index of the selected evidence entry of that finding")

    def __init__(self, findings: Sequence[Finding], batches: Any = None, **kwargs: Any):
        self.findings = list(findings)
        self.batches = batches
        self._pick = widgets.Dropdown(options=[(finding_label(i, f), i) for i, f in enumerate(self.findings)],
                                      layout=widgets.Layout(width="560px"))
        self._evidence = widgets.Dropdown(options=[], layout=widgets.Layout(width="560px"))
        self._table = widgets.HTML()
        self._detail = widgets.HTML()
        self.conversation = ConversationView()
        super().__init__([self._table, self._pick, self._detail, self._evidence, self.conversation], **kwargs)
        self.add_class("wb-findings")
        self._pick.observe(lambda c: self.pick(c["new"]) if c["new"] is not None else None, names="value")
        self._evidence.observe(lambda c: self.pick(self.finding, c["new"]) if c["new"] is not None else None,
                               names="value")
        self.pick(0)

    def pick(self, finding: int, evidence: int = 0) -> Episode | None:
        """Select a finding and one of its evidence entries; returns the episode opened (or None)."""
        if not self.findings:
            self._table.value = findings_table_html([])
            return None
        finding = max(0, min(finding, len(self.findings) - 1))
        f = self.findings[finding]
        evidence = max(0, min(evidence, len(f.evidence) - 1)) if f.evidence else 0
        self.finding, self.evidence = finding, evidence
        with self.hold_trait_notifications():
            self._pick.value = finding
            self._evidence.options = [(e.where(), k) for k, e in enumerate(f.evidence)]
            self._evidence.value = evidence if f.evidence else None
        self._table.value = findings_table_html(self.findings, finding)
        self._detail.value = finding_html(f)
        if not f.evidence:
            self.conversation.set_batch(None)
            return None
        ev = f.evidence[evidence]
        ep = evidence_episode(self.batches, ev)
        self.conversation.set_batch([ep] if ep is not None else None)
        if ep is not None and ev.turn is not None and ev.span:
            self.conversation.highlight = {ev.turn: list(ev.span)}
        return ep

    def __repr__(self) -> str:
        return f"FindingsPanel({len(self.findings)} findings, showing #{self.finding})"
