"""`ConversationView`: one episode as chat bubbles, stepping through a batch.

    view = ConversationView(batch)      # or ConversationView(episode)
    view = ConversationView(run, step=3)  # a reopened run (`load_run`): step 3's batch (default: its last)
    view.index = 3                      # show episode 3 (the dropdown follows)
    view.html                           # the rendered HTML (what tests read)

Bubbles: system (folded), user (environment observation), assistant (model or
human turn, labelled), tool (tool results). Each assistant bubble carries its
turn number and reward; tool calls are boxed under the action with their result;
parse errors and environment errors are shown in red. The episode's ending
(success, truncation, error, score, warnings) closes the transcript, and what each judge said
of it (score, reason, the exact judge prompt: `workbench.widgets.judgments`) follows; the
judges' scores are badges beside the environment's reward in the header.

`render_episode_html(episode)` is the plain function behind the widget. In each reply the
span the environment read as the action (`Turn.info["action_span"]`, reported by the
environment and moved onto the reply by the parser, `workbench.tools.manager`) is
underlined in green, so "I'm afraid I don't have a 5th number" reads as the 5 it was
scored as. Another span of a reply can be highlighted in yellow (`highlight={turn:
[start, end]}`, or `view.highlight`), which is how the run doctor's findings panel
points at the part of a reply that matters. With a batch of groups, the header gives the
episode's score beside its group's mean and std (and its advantage, once computed).

Forking (when the view is given `engine=`: a Trainer, or an engine plus `config=`, the
run's config): pick a turn, edit its action (or the observation before it, or leave it
to be resampled) and press "continue from here"; the branches (`workbench.debug.fork`)
appear beside the original with their returns and the turn where they part
(`render_branches_html`: one column per episode, each headed by its return and the turn
where it parts; the turns before are folded, the edited turn marked). In code: `view.continue_from(turn=1, text="8", n=2)`.
"""
from __future__ import annotations

import json
from typing import Any, Sequence

import ipywidgets as widgets
import traitlets

from workbench.tools.reasoning import DEFAULT_MARKERS, split_reasoning
from workbench.trajectory import Episode, TrajectoryBatch, Turn, success_reported
from workbench.widgets._groups import group_line_html
from workbench.widgets._html import STYLE, esc
from workbench.widgets._runs import batch_of
from workbench.widgets.judgments import judge_badges, judgments_html

__all__ = ["ConversationView", "render_episode_html", "highlight_html", "episode_label", "as_episodes",
           "continue_from", "render_branches_html"]


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


def highlight_html(text: str, span: Sequence[int] | None, cls: str = "wb-span", title: str = "") -> str:
    """`text` escaped, with characters `span` = [start, end] wrapped in `<mark class="{cls}">`."""
    if not _valid_span(span, text):
        return esc(text)
    s, e = span
    tip = f' title="{esc(title)}"' if title else ""
    return f'{esc(text[:s])}<mark class="{cls}"{tip}>{esc(text[s:e])}</mark>{esc(text[e:])}'


def _valid_span(span: Any, text: str) -> bool:
    return (isinstance(span, (list, tuple)) and len(span) == 2 and all(isinstance(x, int) for x in span)
            and 0 <= span[0] <= span[1] <= len(text))


#: Hover text of the action span's mark.
ACTION_TITLE = "the part of the reply the environment read as the action"


def action_span(turn: Turn) -> list[int] | None:
    """The [start, end] of `turn.action` the environment read as the action (None when the
    turn reports no valid span, e.g. a parse error)."""
    span = turn.info.get("action_span")
    return list(span) if _valid_span(span, turn.action) else None


def _reasoning_html(turn: Turn, span: Sequence[int] | None) -> str:
    """A reply's reasoning block collapsed in its own colour, then the answer after it (the
    span, relative to the whole reply, marked in the answer)."""
    split = split_reasoning(turn.action, DEFAULT_MARKERS, opened=turn.reasoning_cut)
    what = f"reasoning · {turn.reasoning_tokens} tokens" + (" · cut off inside it: no action" if split.cut else "")
    out = (f'<details class="wb-reasoning"><summary>{what}</summary>{esc(split.reasoning or "")}</details>')
    if split.answer:
        inside = span is not None and split.offset <= span[0] <= span[1] <= len(turn.action)
        out += highlight_html(split.answer, [span[0] - split.offset, span[1] - split.offset] if inside else None)
    return out


def _turn_html(turn: Turn, span: Sequence[int] | None = None) -> str:
    human = turn.source in ("human", "edited")
    label = f"{turn.source if human else 'assistant'} · turn {turn.index}"
    if human:
        label += " · typed by a person (not trained on)"
    right = [_reward_badge(turn.reward)]
    if turn.finish_reason == "length":
        right.append(_badge("cut at max_tokens", "warn"))
    if turn.done:
        right.append(_badge("done"))
    if not turn.action and not turn.reasoning_cut:
        body = '<i style="color:#888">(empty)</i>'
    elif turn.reasoning_tokens or turn.reasoning_cut:
        body = _reasoning_html(turn, span)
    elif span is not None:
        body = highlight_html(turn.action, span)
    else:
        body = highlight_html(turn.action, action_span(turn), "wb-action", ACTION_TITLE)
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
                        highlight: dict[int, Sequence[int]] | None = None, group: str = "") -> str:
    """The transcript of one episode as HTML (chat bubbles); `highlight` maps a turn index
    to the [start, end] of its reply to mark (instead of its action span); `group` is a line
    of HTML under the header (`group_line_html`)."""
    css = STYLE if style else ""
    if episode is None:
        return f'{css}<div class="wb-root wb-conv-body"><i>no episode</i></div>'
    ep = episode
    head = [f"<b>episode {ep.episode_id}</b>", esc(ep.env_name)]
    if ep.env_seed is not None:
        head.append(f"seed {ep.env_seed}")
    if ep.group_id:
        head.append(f"group {esc(ep.group_id)}")
    head.append(f"{ep.num_turns} turns · " + ("recorded as text, no token ids" if ep.recorded_as_text else
                                             f"{ep.num_tokens} tokens ({ep.response_length} trained)"))
    if ep.weight_version is not None:  # the trainer step whose weights sampled it (async: older than the step)
        head.append(f"weights v{ep.weight_version}")
    badges = [_reward_badge(ep.total_reward).replace("reward", "env reward")]
    if ep.score is not None:
        badges.append(_badge(f"score {ep.score:+.3g}", "good" if ep.score > 0 else ("bad" if ep.score < 0 else "")))
    reported = success_reported([ep])  # an environment (or trainer) that says nothing of it: not reported
    badges += judge_badges(ep)  # what the judges said, beside the environment's reward (widgets/judgments.py)
    badges.append(_badge("success", "good") if ep.success else
                  _badge("no success") if reported or not ep.turns else _badge("success not reported"))
    if ep.truncated:
        badges.append(_badge(f"truncated: {ep.truncation_reason}", "warn"))
    if ep.error:
        badges.append(_badge("error", "bad"))
    if not ep.done:
        badges.append(_badge("in progress", "warn"))
    parts = [f'<div class="wb-head">{" · ".join(head)} {"".join(badges)}</div>', group]
    if any(action_span(t) for t in ep.turns if t.action and t.index not in (highlight or {})):
        parts.append('<div class="wb-legend"><mark class="wb-action">underlined</mark>: '
                     f'{esc(ACTION_TITLE)}</div>')

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
    parts.append(judgments_html(ep))  # each judgment: score, reason, the exact prompt ("" without judges)
    return f'{css}<div class="wb-root wb-conv-body">{"".join(parts)}</div>'


# -- forks beside their original ("continue from here") ------------------------------------
BRANCH_STYLE = """<style>
.wb-branches { display: flex; gap: 8px; align-items: flex-start; overflow-x: auto; }
.wb-branch { flex: 1 1 0; min-width: 260px; border: 1px solid #ddd; border-radius: 8px; padding: 4px 6px; }
.wb-branch.wb-original { border-color: #999; }
.wb-msg.wb-edited { background: #e8f0ff; border-color: #9db8ef; }
</style>"""


def continue_from(episode: Episode, turn: int, engine: Any, config: Any = None, action: str | None = None,
                  observation: str | None = None, n: int = 2, **options: Any) -> TrajectoryBatch:
    """Branches of `episode` from `turn` (`workbench.debug.fork`): `engine` is a Trainer or
    an engine (then `config` is the run's config); `action`/`observation` is the edit."""
    from workbench.debug.forking import fork

    return fork(episode, turn, action=action, observation=observation, n=n, engine=engine, config=config, **options)


def _column(ep: Episode, title: str, part_turn: int | None, edit: str | None = None) -> str:
    """One episode's column: its head, then its turns from `part_turn` on (all for the original).
    With an observation edit the changed observation is shown too (the opening one for turn 0,
    else turn `part_turn - 1`'s reply), marked as edited."""
    mark = "✓ success" if ep.success else ("error" if ep.error else "no success")
    head = (f'<div class="wb-head"><b>{esc(title)}</b> · return {ep.outcome:+.3g} · {mark} · '
            f'{ep.num_turns} turns</div>')
    parts = []
    if part_turn is None:
        turns = ep.turns
    else:
        first = part_turn - 1 if edit == "observation" and part_turn else part_turn
        turns = [t for t in ep.turns if t.index >= first]
        if first:
            parts.append(f'<div class="wb-legend">turns 0–{first - 1} as in the original</div>')
        if edit == "observation" and part_turn == 0:
            parts.append(_bubble("user", "environment · edited first observation", esc((ep.states or [""])[0]),
                                 "wb-edited"))
    for t in turns:
        html = _turn_html(t)
        if t.source == "edited":
            html = html.replace("wb-msg wb-assistant", "wb-msg wb-assistant wb-edited", 1)
        elif edit == "observation" and part_turn and t.index == part_turn - 1:
            html = html.replace("wb-msg wb-user", "wb-msg wb-user wb-edited", 1).replace(
                '<div class="wb-role">environment<', '<div class="wb-role">environment · edited<', 1)
        parts.append(html)
    cls = "wb-branch wb-original" if part_turn is None else "wb-branch"
    return f'<div class="{cls}">{head}{"".join(parts)}</div>'


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
    cols += [_column(b, f"branch {i} · parts at turn {turn}", turn, edit) for i, b in enumerate(branches)]
    return f'{css}<div class="wb-root">{summary}<div class="wb-branches">{"".join(cols)}</div></div>'


class ConversationView(widgets.VBox):
    """One episode as chat bubbles, with prev/next buttons and a dropdown over the batch.

    Args:
        data: a `TrajectoryBatch`, one `Episode`, a list of episodes, or a `Run`
            (`workbench.debug.load_run`).
        index: episode shown first.
        show_system: include the (folded) system prompt.
        step: with a `Run`, the saved step whose batch is shown (default: the last).
        engine: what forks run with: a Trainer, or a generation engine (with `config`);
            None hides the fork controls.
        config: the run's ConfigStore (environment, limits), with an engine; default, for
            a `Run`, its own config.
        fork_options: more arguments of `workbench.debug.fork` (environment, parser,
            tools, temperature, seed, ...).
    """

    index = traitlets.Int(0, help="position of the shown episode in the batch")
    fork_turn = traitlets.Int(0, help="turn where the next fork parts from the shown episode")
    fork_edit = traitlets.Unicode("action", help='what is changed at fork_turn: "action", "observation" or "resample"')
    fork_text = traitlets.Unicode("", help="the edited action or observation")
    fork_n = traitlets.Int(2, help="branches per fork")
    fork_status = traitlets.Unicode("", help="outcome of the last fork (or its error)")
    highlight = traitlets.Dict({}, help="turn index -> [start, end] of its reply to mark (shown episode)")

    def __init__(self, data: TrajectoryBatch | Episode | Sequence[Episode] | Any = None, index: int = 0,
                 show_system: bool = True, *, step: int | None = None, engine: Any = None, config: Any = None,
                 fork_options: dict[str, Any] | None = None, **kwargs: Any):
        self._set_source(batch_of(data, step))
        if config is None and hasattr(data, "batch") and hasattr(data, "config"):  # a reopened Run
            config = data.config
        self.show_system = show_system
        self.fork_engine, self.fork_config, self.fork_options = engine, config, dict(fork_options or {})
        self.branches: TrajectoryBatch | None = None
        self._fork_shown: Episode | None | bool = False  # the episode the fork controls were filled for
        self._branches = widgets.HTML()
        self._branches.add_class("wb-branches-html")
        self._prev = widgets.Button(description="◀ prev", layout=widgets.Layout(width="auto", min_width="80px"))
        self._next = widgets.Button(description="next ▶", layout=widgets.Layout(width="auto", min_width="80px"))
        self._pick = widgets.Dropdown(options=[], layout=widgets.Layout(width="auto", min_width="200px",
                                                                        max_width="520px", flex="1 1 430px"))
        self._body = widgets.HTML()
        self._body.add_class("wb-conversation-html")
        nav = widgets.HBox([self._prev, self._pick, self._next])
        children = [nav, self._body]
        if engine is not None:
            fit = {"description_width": "initial"}  # the description takes its text's width, the box the rest
            self._fork_pick = widgets.Dropdown(options=[], description="turn", style=fit,
                                               layout=widgets.Layout(width="140px"))
            self._fork_kind = widgets.ToggleButtons(
                options=["action", "observation", "resample"], value="action", style={"button_width": "auto"},
                tooltips=["type the reply of this turn", "edit the observation before this turn",
                          "let the policy sample this turn again"])
            self._fork_box = widgets.Textarea(placeholder="edited text", rows=2,
                                              layout=widgets.Layout(width="100%", max_width="640px"))
            self._fork_count = widgets.BoundedIntText(value=2, min=1, max=64, description="branches", style=fit,
                                                      layout=widgets.Layout(width="140px"))
            self._fork_go = widgets.Button(description="continue from here", button_style="primary", icon="code-fork",
                                           layout=widgets.Layout(width="auto", min_width="180px"))
            for w, name in ((self._fork_kind, "fork_edit"), (self._fork_box, "fork_text"),
                            (self._fork_count, "fork_n")):
                widgets.link((w, "value"), (self, name))
            self._fork_pick.observe(lambda c: c["new"] is not None and setattr(self, "fork_turn", c["new"]),
                                    names="value")
            self._fork_go.on_click(lambda _: self.continue_from())
            row = widgets.HBox([self._fork_pick, self._fork_kind, self._fork_count, self._fork_go],
                               layout=widgets.Layout(flex_flow="row wrap", align_items="center"))
            controls = widgets.VBox([row, self._fork_box])
            controls.add_class("wb-fork-controls")
            children += [controls, self._branches]
        super().__init__(children, **kwargs)
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

    def set_batch(self, data: TrajectoryBatch | Episode | Sequence[Episode] | Any, index: int = 0,
                  step: int | None = None) -> None:
        """Show another batch (e.g. the newest rollout, or a `Run`'s step `step`)."""
        self._set_source(batch_of(data, step))
        self._refresh_options()
        n = len(self._episodes)
        new = max(0, min(index, n - 1)) if n else 0
        if new == self.index:
            self._render()
        else:
            self.index = new

    @property
    def branches_html(self) -> str:
        """The rendered branches of the last fork (beside their original)."""
        return self._branches.value

    def continue_from(self, turn: int | None = None, text: str | None = None, edit: str | None = None,
                      n: int | None = None) -> TrajectoryBatch | None:
        """Fork the shown episode at `turn` (default: the traits `fork_turn`, `fork_text`,
        `fork_edit`, `fork_n`, which the controls set) and show the branches; None, with
        `fork_status` saying why, when it fails (e.g. a `ReplayMismatch`)."""
        if self.fork_engine is None:
            self.fork_status = "no engine: pass engine= (a Trainer, or an engine and config=) to fork"
            return None
        # turn and edit first: picking them fills the edit box, which a given text then replaces
        for name, value in (("fork_turn", turn), ("fork_edit", edit), ("fork_text", text), ("fork_n", n)):
            if value is not None:
                setattr(self, name, value)
        edit_kind, ep = self.fork_edit, self.episode
        kwargs = {edit_kind: self.fork_text} if edit_kind in ("action", "observation") else {}
        try:
            self.branches = continue_from(ep, self.fork_turn, self.fork_engine, self.fork_config, n=self.fork_n,
                                          **kwargs, **self.fork_options)
        except Exception as exc:  # shown in the view; the notebook keeps going
            self.fork_status = f"fork failed: {type(exc).__name__}: {exc}"
            self._branches.value = f'{STYLE}<div class="wb-root wb-errline">{esc(self.fork_status)}</div>'
            return None
        returns = ", ".join(f"{b.outcome:+.3g}" for b in self.branches)
        self.fork_status = f"{len(self.branches)} branches from turn {self.fork_turn}: returns {returns}"
        self._branches.value = render_branches_html(ep, self.branches)
        return self.branches

    @traitlets.observe("fork_turn", "fork_edit")
    def _on_fork_turn(self, change: dict) -> None:
        """Fill the edit box with what the picked turn shows (its action, or the observation before it)."""
        pick = getattr(self, "_fork_pick", None)
        if pick is not None and self.fork_turn in dict(pick.options).values():
            pick.value = self.fork_turn
        ep = self.episode
        if ep is None or not 0 <= self.fork_turn < ep.num_turns:
            return
        if self.fork_edit == "action":
            self.fork_text = ep.turns[self.fork_turn].action
        elif self.fork_edit == "observation":
            self.fork_text = ep.turns[self.fork_turn - 1].observation if self.fork_turn else (ep.states or [""])[0]

    def show(self, index: int) -> None:
        """Show episode `index` (clamped to the batch), with no span highlighted."""
        self.highlight = {}
        n = len(self._episodes)
        self.index = max(0, min(index, n - 1)) if n else 0

    def refresh(self) -> None:
        """Re-render the shown episode (after it changed in place, e.g. a live play)."""
        self._fork_shown = False
        self._refresh_options()
        self._render()

    # -- internals ------------------------------------------------------------------
    def _set_source(self, data: Any) -> None:
        self._episodes = as_episodes(data)
        # the batch itself when there is one: its advantages go beside the group's numbers
        self._source = data if isinstance(data, TrajectoryBatch) else self._episodes

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
        group = group_line_html(self._source, self.index) if n else ""
        self._body.value = render_episode_html(self.episode, self.show_system, highlight=self.highlight, group=group)
        if self.fork_engine is not None and self._fork_shown is not self.episode:  # another episode
            ep = self._fork_shown = self.episode
            turns = [t.index for t in ep.turns] if ep is not None else []
            self._fork_pick.options = [(f"turn {t}", t) for t in turns]
            self.branches, self._branches.value = None, ""
            if turns:  # the turn picked, its text in the box: the controls show what a press would fork
                turn = self.fork_turn if self.fork_turn in turns else turns[0]
                self._fork_pick.value = turn
                if self.fork_turn == turn:
                    self._on_fork_turn({})
                else:
                    self.fork_turn = turn
        if n and self._pick.value != self.index:
            self._pick.value = self.index
        self._prev.disabled = self.index <= 0
        self._next.disabled = self.index >= n - 1

    def __repr__(self) -> str:
        n = len(self._episodes)
        ep = self.episode
        shown = f"episode {self.index}/{n}, turns={ep.num_turns}" if ep is not None else "empty"
        return f"ConversationView({shown})"
