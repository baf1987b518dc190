"""What the judges said of an episode, as HTML beside its environment reward: plain functions the
conversation view and the reward tuner call (tests read their output without a kernel).

    judge_badges(episode)     # ['<span ...>judge 0.80</span>', ...]: one badge per judgment
    judgments_html(episode)   # a block per judgment: source, model, score x weight, reason, error,
                              # and the exact judge prompt (folded)

An episode with no judgments (no model reward in its run) gives no badge and "".
"""
from __future__ import annotations

import json
from typing import Any

from workbench.widgets._html import esc

__all__ = ["judge_badges", "judgments_html", "judgment_rows"]


def _judgments(episode: Any) -> list[dict[str, Any]]:
    return [j if isinstance(j, dict) else j.to_dict() for j in (getattr(episode, "judgments", None) or [])]


def judgment_rows(episode: Any) -> list[dict[str, Any]]:
    """One row per judgment: source, model, score, raw_score, weight, reason, error, cached."""
    keys = ("source", "model", "score", "raw_score", "weight", "reason", "error", "cached")
    return [{k: j.get(k) for k in keys} for j in _judgments(episode)]


def judge_badges(episode: Any) -> list[str]:
    """One badge per judgment ("judge 0.80", "group judge failed"), and the environment score
    the model rewards were added to when it was recorded (`Episode.env_score`)."""
    out = []
    for j in _judgments(episode):
        name = j.get("source", "judge").replace("_", " ")
        if j.get("score") is None:
            out.append(f'<span class="wb-badge wb-bad" title="{esc(j.get("error") or "")}">{esc(name)} failed</span>')
        else:
            out.append(f'<span class="wb-badge" title="{esc(j.get("reason") or "")}">{esc(name)} '
                       f'{j["score"]:.3g}</span>')
    env = getattr(episode, "env_score", None)
    if out and env is not None:
        out.append(f'<span class="wb-badge">env score {env:+.3g}</span>')
    return out


def _prompt_text(prompt: str) -> str:
    """A judge prompt as a reader wants it: chat messages one after the other, else the text."""
    try:
        messages = json.loads(prompt)
    except (TypeError, ValueError):
        return prompt
    if not isinstance(messages, list):
        return prompt
    return "\n\n".join(f"[{m.get('role')}]\n{m.get('content')}" for m in messages if isinstance(m, dict))


def judgments_html(episode: Any) -> str:
    """A block per judgment of `episode` ("" when it has none); see the module docstring."""
    js = _judgments(episode)
    if not js:
        return ""
    parts = []
    for j in js:
        name = j.get("source", "judge").replace("_", " ")
        if j.get("score") is None:
            verdict = f'<span class="wb-badge wb-bad">failed</span> {esc(j.get("error") or "")}'
        else:
            raw = j.get("raw_score")
            shown = f"{j['score']:.3g}" + (f" (said {raw:g})" if raw is not None and raw != j["score"] else "")
            verdict = f"<b>{shown}</b> × weight {j.get('weight', 1.0):g}"
        cost = f"{j.get('seconds', 0.0):.2f} s, {j.get('prompt_tokens', 0) + j.get('completion_tokens', 0)} tokens"
        cost += ", cached" if j.get("cached") else ""
        reason = f'<div class="wb-judge-reason">{esc(j.get("reason") or "")}</div>' if j.get("reason") else ""
        prompt = (f'<details><summary>the exact judge prompt</summary><pre class="wb-judge-prompt">'
                  f'{esc(_prompt_text(j.get("prompt") or ""))}</pre></details>') if j.get("prompt") else ""
        parts.append(f'<div class="wb-judgment"><b>{esc(name)}</b> ({esc(j.get("model") or "?")}): {verdict} '
                     f'<span class="wb-legend">{cost}</span>{reason}{prompt}</div>')
    env = getattr(episode, "env_score", None)
    head = "what the judges said" + (f" · environment score {env:+.3g}" if env is not None else "")
    style = ('<style>.wb-judgments{margin:6px 0;padding:4px 8px;border:1px solid #e2d9f3;border-radius:8px;'
             'background:#faf7ff}.wb-judge-prompt{white-space:pre-wrap;font-size:11px;max-height:240px;'
             'overflow:auto}.wb-judge-reason{margin:2px 0 2px 8px;color:#444}</style>')
    return f'{style}<div class="wb-judgments"><div class="wb-role">{esc(head)}</div>{"".join(parts)}</div>'
