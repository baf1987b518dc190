"""Re-judging a stored batch with an edited rubric, and which episodes changed rank: the plain
functions behind the reward tuner's "re-judge" panel (`RewardTuner.rejudge`).

    table = rejudge_table(batch, judge, rubric="1 only if the assistant names the secret number")
    table[table.rank_change != 0]        # the episodes the new rubric ranks differently
    judge_columns(batch)                 # each episode's recorded judge score and reason

`judge` is a `workbench.reward.Judge` or `GroupJudge` (or anything `audit_judge` takes that is
one); the new verdicts are asked for with the cache off. "before" is the score the episode
recorded from the same kind of judge (`Episode.judgments`), or, without one, the judge asked now
with its own rubric. Ranks: 1 = the highest score; `rank_change` > 0 moved up.
"""
from __future__ import annotations

import math
from typing import Any

__all__ = ["judge_columns", "rejudge_table", "rejudge_html"]


def _recorded(episode: Any, source: str | None = None) -> dict[str, Any] | None:
    for j in getattr(episode, "judgments", None) or []:
        j = j if isinstance(j, dict) else j.to_dict()
        if source is None or j.get("source") == source:
            return j
    return None


def judge_columns(batch: Any) -> dict[str, list[Any]]:
    """{"judge": recorded judge score per episode (NaN: none or failed), "judge_reason": its reason}."""
    from workbench.doctor.judge_stats import judge_reason, judge_score

    scores = [judge_score(ep) for ep in batch]
    return {"judge": [math.nan if s is None else s for s in scores], "judge_reason": [judge_reason(ep) for ep in batch]}


def rejudge_table(batch: Any, judge: Any, rubric: str | None = None):
    """DataFrame, one row per episode: episode, group, success, env_reward, judge_before,
    judge_after, rank_before, rank_after, rank_change, reason_after, error_after."""
    import pandas as pd

    episodes = list(batch)
    new = judge.with_rubric(rubric) if rubric is not None else judge
    after = _verdicts(new, episodes)
    before_recorded = [_recorded(ep, judge.source) for ep in episodes]
    if any(r is None for r in before_recorded):  # nothing recorded from this kind of judge: ask it with its rubric
        before = [j.score for j in _verdicts(judge, episodes)]
    else:
        before = [r.get("score") for r in before_recorded]
    df = pd.DataFrame({
        "episode": [ep.episode_id for ep in episodes], "group": [ep.group_id for ep in episodes],
        "success": [bool(ep.success) for ep in episodes], "env_reward": [ep.total_reward for ep in episodes],
        "judge_before": [math.nan if b is None else float(b) for b in before],
        "judge_after": [math.nan if j.score is None else float(j.score) for j in after],
        "reason_after": [j.reason for j in after], "error_after": [j.error or "" for j in after]})
    df["rank_before"] = df["judge_before"].rank(ascending=False, method="min")
    df["rank_after"] = df["judge_after"].rank(ascending=False, method="min")
    df["rank_change"] = (df["rank_before"] - df["rank_after"]).fillna(0).astype(int)
    return df


def _verdicts(judge: Any, episodes: list[Any]) -> list[Any]:
    return judge.judge(episodes, use_cache=False)  # Judge and GroupJudge alike


def rejudge_html(table: Any, rubric: str) -> str:
    """The episodes whose rank the new rubric changed, biggest move first (HTML)."""
    from workbench.widgets._html import STYLE, esc, html_table

    moved = table[table["rank_change"] != 0]
    moved = moved.reindex(moved["rank_change"].abs().sort_values(ascending=False).index)
    failed = int((table["error_after"] != "").sum())
    head = (f'<div class="wb-head">re-judged {len(table)} episodes with the rubric <i>{esc(rubric[:120])}</i>: '
            f'{len(moved)} changed rank; mean judge score {table["judge_before"].mean():.3g} → '
            f'<b>{table["judge_after"].mean():.3g}</b>' + (f'; {failed} judgments failed' if failed else "") + "</div>")
    cols = ["episode", "group", "success", "env_reward", "judge_before", "judge_after", "rank_before", "rank_after",
            "rank_change", "reason_after"]
    body = html_table(moved.to_dict("records"), cols, max_rows=50) if len(moved) else \
        '<div class="wb-legend">no episode changed rank</div>'
    return f'{STYLE}<div class="wb-root">{head}{body}</div>'
