"""What a reward model says of an episode (`Judgment`, kept in `Episode.judgments`), the
episode as a judge reads it (`transcript`), and reading a score out of a judge's reply.

    transcript(episode.messages)     # "[user]\\nGuess a number...\\n\\n[assistant]\\n4\\n\\n..."
    parse_score("Close but wrong.\\nSCORE: 0.3")               # (0.3, "Close but wrong.")
    parse_group_scores("1: 0.9 - won\\n2: 0.1 - gave up", 2)   # {1: (0.9, "won"), 2: (0.1, "gave up")}

A reply's score is read in this order: a JSON object with "score" (and "reason" or
"explanation"); else the last "SCORE: x" (any case; "=" or "is" instead of ":"); else a
reply that is nothing but a number. Anything else has no score, and the judgment fails:
never a 0 in its place. A group judge's reply gives one line per trajectory, "k: x - reason"
(or RULER's JSON, {"scores": [{"trajectory_id": k, "score": x, "explanation": ...}]}).
"""
from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, fields
from typing import Any

from workbench.doctor.judge_stats import judge_score  # noqa: F401 - the doctor's reading, importable here

#: Sources of a judgment, as `Judgment.source` and the metric names (`reward/<source>/score_mean`) say.
SOURCES = ("judge", "group_judge", "reward_model")
_NUM = r"[-+]?(?:\d+(?:\.\d*)?|\.\d+)"
_SCORE_RE = re.compile(rf"score\**\s*(?::|=|is)?\s*\**\s*({_NUM})", re.IGNORECASE)
_BARE_RE = re.compile(rf"^\s*\**\s*({_NUM})\s*\**\s*\.?\s*$")
_GROUP_LINE_RE = re.compile(
    rf"^\W*(?:trajectory|episode|#)?\s*(\d+)\s*[:.)\]=-]+\s*(?:score\s*[:=]?\s*)?\**\s*({_NUM})\**\s*[-:,;)]*\s*(.*)$",
    re.IGNORECASE)
#: Longest reason kept (characters).
MAX_REASON = 600


@dataclass
class Judgment:
    """One source's verdict on one episode (an entry of `Episode.judgments`)."""

    source: str
    """"judge" (per episode), "group_judge" (the episode's group in one prompt) or "reward_model"."""
    model: str
    """The judge model's name (the server's model, the folder, the function)."""
    score: float | None = None
    """The score the reward adds (times the source's weight): a judge's on 0..1 (mapped from
    its scale), a reward model's as it gave it; None when the judgment failed."""
    raw_score: float | None = None
    """The number as the judge gave it (on `reward.judge_scale_min`..`max` for judges)."""
    reason: str = ""
    """The judge's words around its score (for a reward model: empty)."""
    prompt: str = ""
    """The exact judge prompt: the chat messages as JSON (for a reward model: the text it read)."""
    error: str | None = None
    """Why the judgment failed (timeout, no score, a score out of range, a dead server), else None."""
    seconds: float = 0.0
    """Wall time of the request it came from (a group's: the group's request)."""
    prompt_tokens: int = 0
    """Judge prompt tokens of that request (a group's counts once, on the group's first episode)."""
    completion_tokens: int = 0
    """Judge reply tokens of that request (counted like `prompt_tokens`)."""
    cached: bool = False
    """Taken from the judge's cache (the same prompt was judged before)."""
    weight: float = 1.0
    """The source's weight in the episode's score."""
    position: int | None = None
    """group_judge: the episode's place (1-based) in the group's prompt."""

    @property
    def failed(self) -> bool:
        return self.score is None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Judgment":
        known = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in known})


def judgments_of(episode: Any, source: str | None = None) -> list[Judgment]:
    """The episode's judgments (all, or one source's), as `Judgment`s."""
    out = [Judgment.from_dict(j) if isinstance(j, dict) else j for j in (episode.judgments or [])]
    return [j for j in out if source is None or j.source == source]


def model_score(episode: Any) -> float | None:
    """The episode's model reward: the sum of weight x score over its judgments; None when it
    has none or one failed."""
    js = judgments_of(episode)
    if not js or any(j.failed for j in js):
        return None
    return sum(j.weight * j.score for j in js)


def _content(message: dict[str, Any]) -> str:
    content = message.get("content")
    if isinstance(content, list):  # OpenAI content parts
        content = "".join(p.get("text", "") for p in content if isinstance(p, dict))
    text = "" if content is None else str(content)
    calls = message.get("tool_calls")
    if calls:
        text += ("\n" if text else "") + "tool calls: " + json.dumps(calls, default=str)
    return text


def transcript(messages: list[dict[str, Any]]) -> str:
    """Chat messages as a judge reads them: "[role]" then the content, a blank line between."""
    return "\n\n".join(f"[{m.get('role', '?')}]\n{_content(m).strip()}" for m in messages)


def common_prefix(message_lists: list[list[dict[str, Any]]]) -> int:
    """How many leading messages every list shares (the group's common opening)."""
    if not message_lists:
        return 0
    n = min(len(m) for m in message_lists)
    k = 0
    while k < n and all(_same(m[k], message_lists[0][k]) for m in message_lists[1:]):
        k += 1
    return k


def _same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    return a.get("role") == b.get("role") and _content(a) == _content(b)


def _reason_without(text: str, start: int, end: int) -> str:
    reason = (text[:start] + text[end:]).strip().strip("*").strip()
    return reason[:MAX_REASON]


def _json_objects(text: str) -> list[Any]:
    """Every JSON value that starts at a "{" of `text` and parses (largest first tried)."""
    out = []
    decoder = json.JSONDecoder()
    for m in re.finditer(r"\{", text):
        try:
            value, _ = decoder.raw_decode(text[m.start():])
        except ValueError:
            continue
        out.append(value)
        if len(out) >= 8:
            break
    return out


def parse_score(text: str) -> tuple[float, str] | None:
    """(score, reason) read from a judge's reply (module docstring), or None: no score."""
    for obj in _json_objects(text):
        if isinstance(obj, dict) and "score" in obj:
            try:
                value = float(obj["score"])
            except (TypeError, ValueError):
                continue
            reason = obj.get("reason", obj.get("explanation", ""))
            return value, str(reason)[:MAX_REASON]
    matches = list(_SCORE_RE.finditer(text))
    if matches:
        m = matches[-1]
        return float(m.group(1)), _reason_without(text, m.start(), m.end())
    bare = _BARE_RE.match(text)
    if bare:
        return float(bare.group(1)), ""
    return None


def parse_group_scores(text: str, n: int) -> dict[int, tuple[float, str]]:
    """{trajectory number (1..n): (score, reason)} read from a group judge's reply; a number
    given twice keeps its first line. Missing numbers are simply absent."""
    out: dict[int, tuple[float, str]] = {}
    for obj in _json_objects(text):
        rows = obj.get("scores") if isinstance(obj, dict) else None
        if not isinstance(rows, list):
            continue
        for row in rows:
            if not isinstance(row, dict):
                continue
            try:
                k = int(str(row.get("trajectory_id", row.get("trajectory", row.get("id")))).strip())
                value = float(row["score"])
            except (TypeError, ValueError, KeyError):
                continue
            if 1 <= k <= n and k not in out:
                out[k] = (value, str(row.get("explanation", row.get("reason", "")))[:MAX_REASON])
        if out:
            return out
    for line in text.splitlines():
        m = _GROUP_LINE_RE.match(line.strip())
        if m:
            k = int(m.group(1))
            if 1 <= k <= n and k not in out:
                out[k] = (float(m.group(2)), m.group(3).strip()[:MAX_REASON])
    return out


def on_scale(value: float, low: float, high: float) -> float | None:
    """`value` mapped from [low, high] to [0, 1]; None when it lies outside the scale."""
    if not (low <= value <= high):
        return None
    return (value - low) / (high - low)


__all__ = ["Judgment", "MAX_REASON", "SOURCES", "common_prefix", "judge_score", "judgments_of", "model_score",
           "on_scale", "parse_group_scores", "parse_score", "transcript"]
