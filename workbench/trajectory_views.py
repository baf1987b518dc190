"""How a trajectory batch shows itself: a pandas table (`TrajectoryBatch.to_pandas`) and the
HTML a notebook draws for it (`TrajectoryBatch._repr_html_`).

Core layer, beside `workbench.trajectory`, which imports it (so it takes the batch as `Any`).
"""
from __future__ import annotations

from typing import Any


def batch_frame(batch: Any, level: str, fields: list[str]) -> Any:
    """`batch` as a pandas DataFrame with one row per "episode", "turn" or "token" (a column
    per token field of `fields` but the ids and the attention mask)."""
    import pandas as pd

    if level == "episode":
        rows = [{
            "episode_id": e.episode_id, "group_id": e.group_id, "env": e.env_name, "seed": e.env_seed,
            "turns": e.num_turns, "tokens": e.num_tokens, "trained_tokens": e.response_length,
            "env_reward": e.total_reward, "score": e.score, "success": e.success, "done": e.done,
            "truncated": e.truncation_reason, "error": e.error, "tool_calls": e.num_tool_calls,
            "warnings": len(e.warnings),
            "first_action": e.actions[0] if e.actions else "",
        } for e in batch.episodes]
        return pd.DataFrame(rows)
    if level == "turn":
        rows = []
        for e in batch.episodes:
            for t in e.turns:
                rows.append({
                    "episode_id": e.episode_id, "turn": t.index, "source": t.source, "action": t.action,
                    "observation": t.observation, "reward": t.reward, "done": t.done,
                    "tool_calls": len(t.tool_calls), "parse_error": t.parse_error, "env_error": t.env_error,
                    "finish_reason": t.finish_reason, "action_tokens": t.token_end - t.token_start,
                })
        return pd.DataFrame(rows)
    if level == "token":
        rows = []
        present = [k for k in fields if k not in ("input_ids", "attention_mask")]
        for b, e in enumerate(batch.episodes):
            cols = {k: batch.token_values(b, k) for k in present}
            for i, tok in enumerate(e.token_ids):
                row = {"episode_id": e.episode_id, "position": i, "token_id": tok, "turn": e.turn_index[i]}
                row.update({k: v[i] for k, v in cols.items()})
                rows.append(row)
        return pd.DataFrame(rows)
    raise ValueError(f"level must be 'episode', 'turn' or 'token', got {level!r}")


def batch_html(batch: Any) -> str:
    """The summary line, then one row per episode (the first 20) narrow enough for a
    notebook's output: its outcome, how it ended and its first reply cut to 40
    characters on one line; an empty cell is blank. `to_pandas` has every column."""
    from html import escape

    def ended(e: Any) -> str:
        if e.success:
            return "success"
        if e.error:
            return "error"
        if e.truncated:
            return f"cut ({e.truncation_reason})"
        return "done" if e.done else "running"

    def first(e: Any) -> str:
        text = (e.actions[0] if e.actions else "").replace("\n", "↵")
        return text if len(text) <= 40 else text[:39] + "…"

    head = ["episode", "group", "seed", "turns", "tokens (trained)", "reward", "ended", "first reply"]
    rows = [[e.episode_id, e.group_id, "" if e.env_seed is None else e.env_seed, e.num_turns,
             f"{e.num_tokens} ({e.response_length})", f"{e.outcome:+.3g}", ended(e), first(e)]
            for e in batch.episodes[:20]]
    cell = "<td style='text-align:{}; white-space:nowrap'>{}</td>"
    body = "".join("<tr>" + "".join(cell.format("left" if k in (1, 6, 7) else "right", escape(str(v)))
                                     for k, v in enumerate(r)) + "</tr>" for r in rows)
    more = f"<p>… and {len(batch) - 20} more episodes</p>" if len(batch) > 20 else ""
    return (f"<p><b>{escape(repr(batch))}</b></p><table><thead><tr>"
            + "".join(f"<th>{escape(h)}</th>" for h in head) + f"</tr></thead><tbody>{body}</tbody></table>{more}")
