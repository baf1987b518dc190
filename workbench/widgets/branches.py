"""Forks shown beside the episode they came from (the "continue from here" of `ConversationView`).

    html = render_branches_html(original, branches)   # one column per episode, original first
    branches = continue_from(original, turn=1, engine=trainer, action="8", n=2)

`continue_from` is `workbench.debug.fork` with the view's settings; `render_branches_html`
lays the original and its branches out side by side: each column's head gives its return
(outcome), whether it succeeded and the turn where it parts from the original; the turns
before that are folded (they are the original's, token for token) and the edited turn is
marked.
"""
from __future__ import annotations

from typing import Any

from workbench.trajectory import Episode, TrajectoryBatch
from workbench.widgets._html import STYLE, esc

__all__ = ["continue_from", "render_branches_html", "BRANCH_STYLE"]

BRANCH_STYLE = """<style>
.wb-branches { display: flex; gap: 8px; align-items: flex-start; overflow-x: auto; }
.wb-branch { flex: 1 1 0; min-width: 260px; border: 1px solid #ddd; border-radius: 8px; padding: 4px 6px; }
.wb-branch.wb-original { border-color: #999; }
.wb-assistant.wb-edited { background: #e8f0ff; border-color: #9db8ef; }
</style>"""


def continue_from(episode: Episode, turn: int, engine: Any, config: Any = None, action: str | None = None,
                  observation: str | None = None, n: int = 2, **options: Any) -> TrajectoryBatch:
    """Branches of `episode` from `turn` (`workbench.debug.fork`): `engine` is a Trainer or
    an engine (then `config` is the run's config); `action`/`observation` is the edit."""
    from workbench.debug.fork import fork

    return fork(episode, turn, action=action, observation=observation, n=n, engine=engine, config=config, **options)


def _column(ep: Episode, title: str, part_turn: int | None) -> str:
    from workbench.widgets.conversation import _turn_html  # one renderer for turns

    mark = "✓ success" if ep.success else ("error" if ep.error else "no success")
    head = (f'<div class="wb-head"><b>{esc(title)}</b> · return {ep.outcome:+.3g} · {mark} · '
            f'{ep.num_turns} turns</div>')
    if part_turn is None:
        turns = ep.turns
        body = ""
    else:
        turns = [t for t in ep.turns if t.index >= part_turn]
        body = (f'<div class="wb-legend">turns 0–{part_turn - 1} as in the original</div>' if part_turn else "")
    parts = []
    for t in turns:
        html = _turn_html(t)
        if t.source == "edited":
            html = html.replace("wb-msg wb-assistant", "wb-msg wb-assistant wb-edited", 1)
        parts.append(html)
    cls = "wb-branch wb-original" if part_turn is None else "wb-branch"
    return f'<div class="{cls}">{head}{body}{"".join(parts)}</div>'


def render_branches_html(original: Episode, branches: TrajectoryBatch | list[Episode] | None,
                         style: bool = True) -> str:
    """The original and its branches as side-by-side columns (see the module docstring)."""
    css = (STYLE + BRANCH_STYLE) if style else ""
    branches = list(branches or [])
    if not branches:
        return f'{css}<div class="wb-root wb-branches-none"><i>no branches yet</i></div>'
    where = branches[0].forked_from or {}
    turn = int(where.get("turn", 0))
    edit = where.get("edit")
    what = {"action": "action typed", "observation": "observation edited"}.get(edit, "resampled")
    text = f' “{esc(where.get("text"))}”' if where.get("text") is not None else ""
    summary = (f'<div class="wb-head">{len(branches)} branches part from the original at turn {turn} '
               f'(token {where.get("token_position")}) · {what}{text} · mean return '
               f'{sum(b.outcome for b in branches) / len(branches):+.3g} vs {original.outcome:+.3g}</div>')
    cols = [_column(original, "original", None)]
    cols += [_column(b, f"branch {i} · parts at turn {turn}", turn) for i, b in enumerate(branches)]
    return f'{css}<div class="wb-root">{summary}<div class="wb-branches">{"".join(cols)}</div></div>'
