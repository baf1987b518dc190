"""The findings panel: each finding's evidence opens in the conversation view with the
span of the reply marked (no browser: the widgets' HTML and the plain functions)."""
from __future__ import annotations

from tests.doctor_policies import count_up_from_4, roll
from tests.test_doctor_checks import GUESS
from workbench.debug.doctor import diagnose
from workbench.widgets import FindingsPanel
from workbench.widgets.conversation import render_episode_html
from workbench.widgets.findings import evidence_episode, finding_html, findings_table_html


def test_panel_opens_the_evidence_episode_with_the_span_marked(tiny_model_and_tokenizer):
    batch = roll(tiny_model_and_tokenizer[1], "guess_number", count_up_from_4, groups=8, **GUESS)
    findings = diagnose(batch)
    assert findings[0].name == "parse-from-incidental-span"
    panel = FindingsPanel(findings, {("train", 0): batch})
    ev = findings[0].evidence[1]
    episode = panel.pick(0, evidence=1)
    assert episode is batch[ev.episode_id] and panel.conversation.episode is episode
    digit = ev.text[ev.span[0]:ev.span[1]]
    assert f'You have <mark class="wb-span">{digit}</mark> guesses left, so' in panel.conversation.html
    assert panel.conversation.html.count('<mark class="wb-span"') == 1  # only the evidence turn
    marked = panel.conversation.html.count('<mark class="wb-action"')  # the other turns' action spans, and the key
    assert marked == 1 + sum(1 for t in episode.turns if t.index != ev.turn and t.info.get("action_span"))
    assert "parse-from-incidental-span" in panel._table.value and "Do:" in panel._detail.value
    panel.conversation.show(0)  # navigating away clears the mark
    assert '<mark class="wb-span"' not in panel.conversation.html
    assert repr(panel) == f"FindingsPanel({len(findings)} findings, showing #0)"


def test_plain_functions(tiny_model_and_tokenizer):
    batch = roll(tiny_model_and_tokenizer[1], "grid", lambda env, ep: "hello there", max_turns=2)
    f = next(f for f in diagnose(batch) if f.name == "format-errors")
    assert evidence_episode(batch, f.evidence[0]) is batch[f.evidence[0].episode_id]
    assert evidence_episode({("eval", 0): batch}, f.evidence[0]) is None  # the evidence is a training step's
    assert "format-errors" in findings_table_html([f]) and "no findings" in findings_table_html([])
    assert '<tr class="wb-selected" data-key="0">' in findings_table_html([f, f], selected=0)
    assert "hello there" in finding_html(f)
    html = render_episode_html(batch[0], highlight={0: [6, 11]})
    assert 'hello <mark class="wb-span">there</mark>' in html
    empty = FindingsPanel([])
    assert empty.pick(0) is None
