"""`ConversationView`: one episode as chat bubbles, stepping through a batch.

    view = ConversationView(batch)      # or ConversationView(episode)
    view.index = 3                      # show episode 3 (the dropdown follows)
    view.html                           # the rendered HTML (what tests read)

Bubbles: system (folded), user (environment observation), assistant (model or
human turn, labelled), tool (tool results). Each assistant bubble carries its
turn number and reward; tool calls are boxed under the action with their result;
parse errors and environment errors are shown in red. The episode's ending
(success, truncation, error, score, warnings) closes the transcript.

`render_episode_html(episode)` is the plain function behind the widget. A span of a
reply can be highlighted (`highlight={turn: [start, end]}`, or `view.highlight`), which
is how the run doctor's findings panel points at the part of a reply that matters.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import ipywidgets as widgets
import traitlets

from workbench.trajectory import Episode, TrajectoryBatch, Turn
from workbench.widgets._html import STYLE, esc

__all__ = ["ConversationView", "render_episode_html", "highlight_html", "episode_label", "as_episodes"]


def as_episodes(data: TrajectoryBatch | Episode | Sequence[Episode] | None) -> list[Episode]:
    """Episodes of a batch, a single episode or a list of them."""
    if data is None:
        return []
    if isinstance(data, Episode):
        return [data]
    if isinstance(data, TrajectoryBatch):
        return list(data.episodes)
    return list(data)


def episode_reward(ep: Episode) -> float:
    """The episode's score when scored, else its summed environment reward."""
    return ep.outcome


def episode_label(i: int, ep: Episode) -> str:
    """Short label of an episode for dropdowns and lists."""
    mark = " ✓" if ep.success else (" ✗err" if ep.error else "")
    seed = f" seed {ep.env_seed}" if ep.env_seed is not None else ""
    return f"#{i} · {ep.env_name}{seed} · {ep.num_turns} turns · R {episode_reward(ep):+.3g}{mark}"


def _badge(text: str, kind: str = "") -> str:
    return f'<span class="wb-badge{" wb-" + kind if kind else ""}">{esc(text)}</span>'


def _reward_badge(reward: float) -> str:
    kind = "good" if reward > 0 else ("bad" if reward < 0 else "")
    return _badge(f"reward {reward:+.3g}", kind)


def _bubble(role_cls: str, role_label: str, body: str, extra_cls: str = "", right: str = "") -> str:
    right_html = f'<span class="wb-reward">{right}</span>' if right else ""
    return (f'<div class="wb-msg wb-{role_cls}{" " + extra_cls if extra_cls else ""}">'
            f'<div class="wb-role">{esc(role_label)}{right_html}</div>{body}</div>')


def _args_text(arguments: Any) -> str:
    if isinstance(arguments, (dict, list)):
        return json.dumps(arguments, ensure_ascii=False)
    return str(arguments)


def _tool_calls_html(turn: Turn) -> str:
    parts = []
    for call in turn.tool_calls:
        ok = call.get("success")
        status = _badge("ok", "good") if ok else _badge("failed", "bad")
        result = call.get("result")
        result_html = f"<br>← {esc(result)}" if result is not None else ""
        parts.append(f'<div class="wb-toolcall">→ <b>{esc(call.get("name", "?"))}</b>'
                     f'({esc(_args_text(call.get("arguments", "")))}) {status}{result_html}</div>')
    return "".join(parts)


def highlight_html(text: str, span: Sequence[int] | None) -> str:
    """`text` escaped, with characters `span` = [start, end] wrapped in `<mark class="wb-span">`."""
    if not span or not 0 <= span[0] <= span[1] <= len(text):
        return esc(text)
    s, e = span
    return f'{esc(text[:s])}<mark class="wb-span">{esc(text[s:e])}</mark>{esc(text[e:])}'


def _turn_html(turn: Turn, span: Sequence[int] | None = None) -> str:
    human = turn.source == "human"
    label = f"{'human' if human else 'assistant'} · turn {turn.index}"
    if human:
        label += " · typed by a person (not trained on)"
    right = [_reward_badge(turn.reward)]
    if turn.finish_reason == "length":
        right.append(_badge("cut at max_tokens", "warn"))
    if turn.done:
        right.append(_badge("done"))
    body = highlight_html(turn.action, span) if turn.action else '<i style="color:#888">(empty)</i>'
    body += _tool_calls_html(turn)
    extra = "wb-human" if human else ""
    if turn.parse_error:
        body += f'<div class="wb-errline">parse error: {esc(turn.parse_error)}</div>'
        extra += " wb-error"
    out = [_bubble("assistant", label, body, extra.strip(), "".join(right))]
    msgs = turn.messages or ([{"role": "user", "content": turn.observation}] if turn.observation else [])
    for msg in msgs:
        role = msg.get("role", "user")
        if role == "tool":
            name = msg.get("name") or "tool"
            out.append(_bubble("tool", f"tool result · {name}", esc(msg.get("content", ""))))
        else:
            out.append(_bubble("user", "environment", esc(msg.get("content", ""))))
    if turn.env_error:
        out.append(_bubble("user", "environment error", f'<div class="wb-errline">{esc(turn.env_error)}</div>',
                           "wb-error"))
    return "".join(out)


def render_episode_html(episode: Episode | None, show_system: bool = True, style: bool = True,
                        highlight: dict[int, Sequence[int]] | None = None) -> str:
    """The transcript of one episode as HTML (chat bubbles); `highlight` maps a turn index
    to the [start, end] of its reply to mark."""
    css = STYLE if style else ""
    if episode is None:
        return f'{css}<div class="wb-root wb-conv-body"><i>no episode</i></div>'
    ep = episode
    head = [f"<b>episode {ep.episode_id}</b>", esc(ep.env_name)]
    if ep.env_seed is not None:
        head.append(f"seed {ep.env_seed}")
    if ep.group_id:
        head.append(f"group {esc(ep.group_id)}")
    head.append(f"{ep.num_turns} turns · {ep.num_tokens} tokens ({ep.response_length} trained)")
    badges = [_reward_badge(ep.total_reward).replace("reward", "env reward")]
    if ep.score is not None:
        badges.append(_badge(f"score {ep.score:+.3g}", "good" if ep.score > 0 else ("bad" if ep.score < 0 else "")))
    badges.append(_badge("success", "good") if ep.success else _badge("no success"))
    if ep.truncated:
        badges.append(_badge(f"truncated: {ep.truncation_reason}", "warn"))
    if ep.error:
        badges.append(_badge("error", "bad"))
    if not ep.done:
        badges.append(_badge("in progress", "warn"))
    parts = [f'<div class="wb-head">{" · ".join(head)} {"".join(badges)}</div>']

    msgs = list(ep.messages)
    first_assistant = next((k for k, m in enumerate(msgs) if m.get("role") == "assistant"), len(msgs))
    for m in msgs[:first_assistant]:
        role = m.get("role")
        if role == "system":
            if show_system:
                parts.append(f'<details class="wb-msg wb-system"><summary class="wb-role">system prompt</summary>'
                             f'{esc(m.get("content", ""))}</details>')
        else:
            parts.append(_bubble("user", "environment" if role == "user" else str(role), esc(m.get("content", ""))))
    for turn in ep.turns:
        parts.append(_turn_html(turn, (highlight or {}).get(turn.index)))
    end = []
    if ep.error:
        end.append(f'<div class="wb-errline">episode error: {esc(ep.error)}</div>')
    if ep.done:
        end.append("ended: " + ("success" if ep.success else
                                ("truncated (" + str(ep.truncation_reason) + ")" if ep.truncated else
                                 ("error" if ep.error else "done"))))
        end.append(f" · total env reward {ep.total_reward:+.3g}")
        if ep.score is not None:
            end.append(f" · score {ep.score:+.3g}")
    for w in ep.warnings:
        end.append(f'<div class="wb-legend">⚠ {esc(w)}</div>')
    if end:
        parts.append(f'<div class="wb-end">{"".join(end)}</div>')
    return f'{css}<div class="wb-root wb-conv-body">{"".join(parts)}</div>'


class ConversationView(widgets.VBox):
    """One episode as chat bubbles, with prev/next buttons and a dropdown over the batch.

    Args:
        data: a `TrajectoryBatch`, one `Episode`, or a list of episodes.
        index: episode shown first.
        show_system: include the (folded) system prompt.
    """

    index = traitlets.Int(0, help="position of the shown episode in the batch")
    highlight = traitlets.Dict({}, help="turn index -> [start, end] of its reply to mark (shown episode)")

    def __init__(self, data: TrajectoryBatch | Episode | Sequence[Episode] | None = None, index: int = 0,
                 show_system: bool = True, **kwargs: Any):
        self._episodes: list[Episode] = as_episodes(data)
        self.show_system = show_system
        self._prev = widgets.Button(description="◀ prev", layout=widgets.Layout(width="80px"))
        self._next = widgets.Button(description="next ▶", layout=widgets.Layout(width="80px"))
        self._pick = widgets.Dropdown(options=[], layout=widgets.Layout(width="430px"))
        self._body = widgets.HTML()
        self._body.add_class("wb-conversation-html")
        nav = widgets.HBox([self._prev, self._pick, self._next])
        super().__init__([nav, self._body], **kwargs)
        self.add_class("wb-conversation")
        self._prev.on_click(lambda _: self.show(self.index - 1))
        self._next.on_click(lambda _: self.show(self.index + 1))
        self._pick.observe(self._on_pick, names="value")
        self._refresh_options()
        self.show(index)
        self._render()

    # -- public -------------------------------------------------------------------
    @property
    def episodes(self) -> list[Episode]:
        return self._episodes

    @property
    def episode(self) -> Episode | None:
        """The episode on screen."""
        return self._episodes[self.index] if self._episodes else None

    @property
    def html(self) -> str:
        """The rendered HTML of the shown episode."""
        return self._body.value

    def set_batch(self, data: TrajectoryBatch | Episode | Sequence[Episode] | None, index: int = 0) -> None:
        """Show another batch (e.g. the newest rollout)."""
        self._episodes = as_episodes(data)
        self._refresh_options()
        n = len(self._episodes)
        new = max(0, min(index, n - 1)) if n else 0
        if new == self.index:
            self._render()
        else:
            self.index = new

    def show(self, index: int) -> None:
        """Show episode `index` (clamped to the batch), with no span highlighted."""
        self.highlight = {}
        n = len(self._episodes)
        self.index = max(0, min(index, n - 1)) if n else 0

    def refresh(self) -> None:
        """Re-render the shown episode (after it changed in place, e.g. a live play)."""
        self._refresh_options()
        self._render()

    # -- internals ------------------------------------------------------------------
    @traitlets.observe("highlight")
    def _on_highlight(self, change: dict) -> None:
        self._render()

    @traitlets.observe("index")
    def _on_index(self, change: dict) -> None:
        self._render()

    def _on_pick(self, change: dict) -> None:
        if change["new"] is not None and change["new"] != self.index:
            self.show(change["new"])

    def _refresh_options(self) -> None:
        opts = [(episode_label(i, ep), i) for i, ep in enumerate(self._episodes)]
        with self.hold_trait_notifications():
            self._pick.options = opts

    def _render(self) -> None:
        n = len(self._episodes)
        self._body.value = render_episode_html(self.episode, self.show_system, highlight=self.highlight)
        if n and self._pick.value != self.index:
            self._pick.value = self.index
        self._prev.disabled = self.index <= 0
        self._next.disabled = self.index >= n - 1

    def __repr__(self) -> str:
        n = len(self._episodes)
        ep = self.episode
        shown = f"episode {self.index}/{n}, turns={ep.num_turns}" if ep is not None else "empty"
        return f"ConversationView({shown})"
