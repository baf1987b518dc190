"""Token-exact chat rendering: the token-in/token-out rule.

The model's sampled ids are appended to an episode as they are, never decoded and
re-encoded. Only new non-model messages (observation, tool result) are rendered with
the chat template, as a *delta*: the text the template adds after the assistant
message's content (e.g. `<|im_end|>\\n`), plus the new messages, plus the generation
prompt. Deltas are found by rendering with a sentinel in place of the assistant's
content and taking string differences, so any prefix-stable template works.

What the template can express is probed once (`workbench.rollout.template`): messages
go through `normalize_messages` for templates without a system or tool role or with
strict alternation, every render gets the rollout's template variables (Qwen3's
`enable_thinking`, native `tools`), and the history setting decides how a turn's prompt
is made: "sampled" appends the text after the model's sampled ids (the delta above, taken
from a render of the whole conversation so far, so it also holds for templates that
re-render earlier turns), "rendered" renders each turn's prompt afresh (`prompt_ids`) and
the episode keeps one sequence per turn (`Episode.segments`).

`check_token_alignment` verifies an episode afterwards: it renders the final
conversation in one go and compares it with the accumulated ids, position by
position, reporting the first difference (a template that is not prefix-stable is
checked turn by turn: each turn's glue against a render of the conversation up to
it; a "rendered" episode has every turn's prompt checked against the template). Two views:

* template view: non-model text tokenised fresh, model turns as sampled. Any
  difference is a real bug (template not prefix-stable, glue dropped or doubled).
* full re-encode: the whole conversation text tokenised fresh. Differences inside
  model turns only mean the model sampled a non-canonical tokenisation of its
  text; harmless for training (we keep the sampled ids) but worth knowing, since a
  pipeline that re-encodes would silently train on different tokens.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass
from typing import Any

from workbench.rollout.template import (  # noqa: F401 - TemplateError: public here too
    TemplateError, TemplateProfile, normalize_messages, refuse, render_text, resolve_history, template_profile,
)

SENTINEL = "\u2063WB_MODEL_TURN_{}\u2063"


def _render(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
            template_kwargs: dict[str, Any] | None = None) -> str:
    """The template's text for `messages` as the profile's role rules need them."""
    profile = template_profile(tokenizer, template_kwargs)
    msgs = normalize_messages(messages, profile.system_role, profile.tool_role, profile.alternating)
    return render_text(tokenizer, msgs, add_generation_prompt, template_kwargs)


def encode(tokenizer: Any, text: str) -> list[int]:
    """Tokenise template text (special tokens in the text are parsed, none added)."""
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


def stop_token_ids(tokenizer: Any) -> list[int]:
    """Ids that end a model turn: eos plus the usual end-of-turn markers in the vocab."""
    ids = set()
    if tokenizer.eos_token_id is not None:
        ids.add(tokenizer.eos_token_id)
    # (not get_vocab(): it builds the whole vocabulary dict, ~60 ms for a 49k vocab, and this
    # runs for every alignment check)
    for tok in ("<|im_end|>", "<|eot_id|>", "<|end|>", "<end_of_turn>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tokenizer.convert_ids_to_tokens(tid) == tok:
            ids.add(tid)
    return sorted(ids)


_TOKEN_CHARS: "weakref.WeakKeyDictionary[Any, int]" = weakref.WeakKeyDictionary()


def max_chars_per_token(tokenizer: Any) -> int:
    """An upper bound on the characters of text that one token stands for: twice the
    longest entry of the tokenizer's vocabulary (added tokens included), at least 8.

    A byte-level BPE entry has one character per byte of the text it decodes to, and a
    SentencePiece entry is as long as its text ("\u2581" for a space) or longer ("<0x0A>"),
    so no token decodes to more characters than its entry; the factor 2 covers
    normalizers that shrink text (NFKC, accent stripping). A text longer than
    `max_chars_per_token * n` characters therefore takes more than `n` tokens, which
    lets a context check refuse it without tokenizing it (a 10 MB observation takes
    minutes and gigabytes to tokenize). Computed once per tokenizer (~30 ms for 49k entries).
    """
    try:
        return _TOKEN_CHARS[tokenizer]
    except (KeyError, TypeError):
        pass
    try:
        longest = max((len(t) for t in tokenizer.get_vocab()), default=0)
    except Exception:  # noqa: BLE001 - a tokenizer without a readable vocabulary
        longest = 64
    bound = max(8, 2 * longest)
    try:
        _TOKEN_CHARS[tokenizer] = bound
    except TypeError:  # not weak-referenceable: computed again next time
        pass
    return bound


def typed_action_ids(tokenizer: Any, text: str) -> list[int]:
    """Ids for a reply typed by a person (a human turn, a fork's edited action): the text plus
    the tokenizer's eos, which ends the turn as a sampled reply would."""
    ids = encode(tokenizer, text)
    if tokenizer.eos_token_id is not None:
        ids.append(tokenizer.eos_token_id)
    return ids


class ChatRenderer:
    """Renders the prompt and the per-turn deltas of one tokenizer's chat template.

    Args:
        tokenizer: the model's tokenizer (with its chat template).
        template_kwargs: template variables every render gets (`{"enable_thinking": False}`,
            `{"tools": [...]}` for a template that renders tool definitions itself).
        history: "auto", "sampled" or "rendered" (`workbench.rollout.template.resolve_history`);
            `self.history` is the mode it resolved to, `self.history_note` what "auto" chose and why.

    Raises:
        TemplateError: the template cannot express a conversation (naming the model, the rule
            and the fix), or cannot run with the history asked for.
    """

    def __init__(self, tokenizer: Any, template_kwargs: dict[str, Any] | None = None, history: str = "auto"):
        self.tokenizer = tokenizer
        self.template_kwargs = dict(template_kwargs or {})
        self.profile: TemplateProfile = template_profile(tokenizer, self.template_kwargs)
        self.history, self.history_note = resolve_history(history, self.profile)
        self.stop_ids = stop_token_ids(tokenizer)

    def with_kwargs(self, template_kwargs: dict[str, Any]) -> "ChatRenderer":
        """This renderer with other template variables (an episode's own `tools`); the same
        history mode."""
        if template_kwargs == self.template_kwargs:
            return self
        return ChatRenderer(self.tokenizer, template_kwargs, self.history)

    def max_chars_per_token(self) -> int:
        """`max_chars_per_token(self.tokenizer)`: more characters than this many per token
        left cannot fit."""
        return max_chars_per_token(self.tokenizer)

    def render(self, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        """The template's text for `messages` (role rules and template variables applied)."""
        return _render(self.tokenizer, messages, add_generation_prompt, self.template_kwargs)

    def prompt_ids(self, messages: list[dict[str, Any]], add_generation_prompt: bool = True) -> list[int]:
        """Ids of `messages` rendered whole, plus the generation prompt (by default)."""
        return encode(self.tokenizer, self.render(messages, add_generation_prompt))

    def delta_ids(
        self,
        history: list[dict[str, Any]],
        last_action_ids: list[int],
        new_messages: list[dict[str, Any]],
        add_generation_prompt: bool,
    ) -> list[int]:
        """Ids to append after an assistant turn: closing glue + new messages (+ gen prompt).

        The glue is the text the template renders after the assistant's content when the
        conversation goes on with `new_messages`: the last assistant message is rendered as a
        sentinel and everything after it is taken. For a prefix-stable template that is exactly
        the text a one-shot render adds; for one that re-renders earlier turns (Qwen3) it is
        the text the template puts after this turn now, appended to the sampled ids ("sampled"
        history).

        Args:
            history: conversation so far, ending with the assistant message just produced.
            last_action_ids: that assistant turn's ids as appended (sampled or typed).
            new_messages: observation / tool messages to add now.
            add_generation_prompt: open the next assistant turn (False when the episode ended).
        """
        if not history or history[-1]["role"] != "assistant":
            raise TemplateError("delta_ids needs a history that ends with the assistant message")
        sentinel = SENTINEL.format(0)
        base = history[:-1] + [{"role": "assistant", "content": sentinel}]
        after = self.render(base + list(new_messages), add_generation_prompt)
        if after.count(sentinel) != 1:
            raise refuse(self.tokenizer, "dropped or repeated the assistant content once later messages follow it",
                         "use inference.history=rendered (or auto)")
        glue = after[after.index(sentinel) + len(sentinel):]  # e.g. "<|im_end|>\n<|im_start|>user\n..."
        return encode(self.tokenizer, self._strip_sampled_stop(glue, last_action_ids))

    def generation_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids the generation prompt adds after `messages` (e.g. `<|im_start|>assistant\n`)."""
        closed = self.render(messages, add_generation_prompt=False)
        opened = self.render(messages, add_generation_prompt=True)
        if not opened.startswith(closed):
            raise TemplateError("the chat template's generation prompt changes the earlier text")
        return encode(self.tokenizer, opened[len(closed):])

    def _strip_sampled_stop(self, glue: str, action_ids: list[int]) -> str:
        """Drop the end-of-turn text from the glue when the action already ends with it."""
        if action_ids and action_ids[-1] in self.stop_ids:
            stop_text = self.tokenizer.decode([action_ids[-1]], skip_special_tokens=False)
            if glue.startswith(stop_text):
                return glue[len(stop_text):]
        return glue

    def action_text(self, action_ids: list[int]) -> str:
        """The assistant message content for sampled ids (trailing stop id removed)."""
        ids = action_ids[:-1] if action_ids and action_ids[-1] in self.stop_ids else action_ids
        return self.tokenizer.decode(ids, skip_special_tokens=False)

    def human_action_ids(self, text: str) -> list[int]:
        """Ids for a typed action: the text plus the end-of-turn id the template expects."""
        return typed_action_ids(self.tokenizer, text)

    def reasoning_tokens(self, action_ids: list[int], answer_start: int, cut: bool) -> int:
        """`reasoning_token_count` with this renderer's tokenizer and stop ids."""
        return reasoning_token_count(self.tokenizer, action_ids, self.stop_ids, answer_start, cut)


def reasoning_token_count(tokenizer: Any, action_ids: list[int], stop_ids: list[int], answer_start: int,
                          cut: bool) -> int:
    """How many of `action_ids` make up the reasoning block: all of them but a trailing stop
    id when the reply was `cut` inside it, else the fewest whose text reaches `answer_start`
    (the character where the answer starts in the ids' text, decoded with special tokens)."""
    ids = action_ids[:-1] if action_ids and action_ids[-1] in stop_ids else action_ids
    if cut:
        return len(ids)
    lo, hi = 0, len(ids)
    while lo < hi:  # the decoded prefix grows with k: bisect for the first k reaching answer_start
        mid = (lo + hi) // 2
        if len(tokenizer.decode(ids[:mid], skip_special_tokens=False)) >= answer_start:
            hi = mid
        else:
            lo = mid + 1
    return lo


@dataclass
class AlignmentReport:
    """Result of comparing an episode's ids with a fresh render of its conversation."""

    ok: bool
    """Template view matches at every position."""
    first_mismatch: int | None
    """First differing position in the template view, if any."""
    message: str
    """What differs and where, for a warning."""
    reencode_mismatch: int | None
    """First differing position when the whole text is re-encoded (None = identical)."""
    reencode_in_model_turn: bool
    """The re-encode difference lies inside a model turn (non-canonical sampling)."""


def check_token_alignment(episode: Any, tokenizer: Any) -> AlignmentReport:
    """Compare `episode.token_ids` with a render of `episode.messages` (with the episode's
    `template_kwargs`): one render of the whole conversation for a prefix-stable template,
    turn by turn for one that is not, and every turn's prompt for a "rendered" episode."""
    msgs = episode.messages
    if not msgs:  # e.g. an episode whose reset failed: nothing was rendered
        ok = not episode.token_ids
        return AlignmentReport(ok, None if ok else 0, "no messages and no tokens" if ok else
                               f"{len(episode.token_ids)} tokens but no messages", None, False)
    kwargs = dict(getattr(episode, "template_kwargs", None) or {})
    profile = template_profile(tokenizer, kwargs)
    renderer = ChatRenderer(tokenizer, kwargs, history="rendered")  # the profile's renders; history unused here
    turns = [t for t in episode.turns]
    assistant_positions = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if len(assistant_positions) != len(turns):
        return AlignmentReport(False, 0, f"{len(assistant_positions)} assistant messages but {len(turns)} turns", None, False)
    ends_open = not episode.done  # a live episode ends with an open generation prompt
    if getattr(episode, "history", "sampled") == "rendered":
        return _check_rendered(episode, renderer, assistant_positions, ends_open)
    if profile.prefix_stable:
        expected, mismatch_turn, missing = _expected_one_shot(episode, renderer, assistant_positions, ends_open)
    else:
        expected, mismatch_turn, missing = _expected_turn_by_turn(episode, renderer, assistant_positions, ends_open)
    actual = list(episode.token_ids)
    mismatch = _first_difference(expected, actual)
    if missing and mismatch is None:
        mismatch = turns[mismatch_turn].token_start
    # Full re-encode view.
    full = encode(tokenizer, renderer.render(msgs, ends_open))
    re_mm = _first_difference(full, actual)
    # A re-encode difference inside (or right at the end of) a model turn means the model
    # sampled a non-canonical tokenisation of its own text.
    in_model = re_mm is not None and any(t.token_start <= re_mm <= t.token_end for t in turns)
    if mismatch is None:
        msg = "token ids match the rendered conversation"
        if re_mm is not None:
            what = ("re-encoding the text would differ" if profile.prefix_stable else
                    "the template's one-shot render of the conversation differs (it re-renders earlier turns)")
            msg += f"; {what} from position {re_mm}" + (" (model sampled a non-canonical tokenisation)"
                                                         if profile.prefix_stable else "")
        return AlignmentReport(True, None, msg, re_mm, in_model)
    return AlignmentReport(False, mismatch, _mismatch_message(tokenizer, missing, mismatch, expected, actual),
                           re_mm, in_model)


def _mismatch_message(tokenizer: Any, missing: str, mismatch: int, expected: list[int], actual: list[int]) -> str:
    exp_tok = expected[mismatch] if mismatch < len(expected) else None
    act_tok = actual[mismatch] if mismatch < len(actual) else None
    return (f"{missing}token mismatch at position {mismatch}: rendered conversation has "
            f"{_show(tokenizer, exp_tok)}, episode has {_show(tokenizer, act_tok)} "
            f"(lengths {len(expected)} vs {len(actual)})")


def _expected_one_shot(episode: Any, renderer: ChatRenderer, assistant_positions: list[int],
                       ends_open: bool) -> tuple[list[int], int, str]:
    """Template view: one render with a sentinel per model turn, fresh tokens between,
    sampled ids inside. Returns (expected ids, turn whose content is missing, note)."""
    tokenizer, turns = renderer.tokenizer, episode.turns
    sentinel_msgs = [dict(m) for m in episode.messages]
    for k, i in enumerate(assistant_positions):
        sentinel_msgs[i]["content"] = SENTINEL.format(k)
    rest = renderer.render(sentinel_msgs, ends_open)
    expected: list[int] = []
    missing, k = "", 0
    prev = None  # last turn whose content was found in the render
    for k, turn in enumerate(turns):
        marker = SENTINEL.format(k)
        if marker not in rest:
            # Still compare what the template did render, so the report has a real position.
            missing = f"turn {k} content missing from the rendered template; "
            break
        seg, rest = rest.split(marker, 1)
        if prev is not None:
            seg = renderer._strip_sampled_stop(seg, episode.token_ids[prev.token_start:prev.token_end])
        expected += encode(tokenizer, seg) + episode.token_ids[turn.token_start:turn.token_end]
        prev = turn
    if prev is not None:
        rest = renderer._strip_sampled_stop(rest, episode.token_ids[prev.token_start:prev.token_end])
    expected += encode(tokenizer, rest)
    return expected, k, missing


def _expected_turn_by_turn(episode: Any, renderer: ChatRenderer, assistant_positions: list[int],
                           ends_open: bool) -> tuple[list[int], int, str]:
    """"sampled" history with a template that re-renders earlier turns: the opening as the
    template renders it, each turn's sampled ids, then the text the template puts after that
    turn when the conversation is rendered up to the next turn (what `delta_ids` appended)."""
    tokenizer, msgs, turns = renderer.tokenizer, episode.messages, episode.turns
    first = assistant_positions[0] if assistant_positions else len(msgs)
    expected = encode(tokenizer, renderer.render(msgs[:first], bool(assistant_positions) or ends_open))
    for k, (turn, i) in enumerate(zip(turns, assistant_positions)):
        ids = episode.token_ids[turn.token_start:turn.token_end]
        expected += ids
        nxt = assistant_positions[k + 1] if k + 1 < len(assistant_positions) else len(msgs)
        marker = SENTINEL.format(0)
        text = renderer.render(msgs[:i] + [{"role": "assistant", "content": marker}] + msgs[i + 1:nxt],
                               nxt < len(msgs) or ends_open)
        if text.count(marker) != 1:
            return expected[:turn.token_start], k, f"turn {k} content missing from the rendered template; "
        expected += encode(tokenizer, renderer._strip_sampled_stop(text.split(marker, 1)[1], ids))
    return expected, 0, ""


def _check_rendered(episode: Any, renderer: ChatRenderer, assistant_positions: list[int],
                    ends_open: bool) -> AlignmentReport:
    """A "rendered" episode: each turn's prompt (the ids of its sequence before its first
    token) must be the template's render of the messages before it, and nothing may follow
    the last turn but the next turn's prompt of a live episode."""
    tokenizer, msgs, turns = renderer.tokenizer, episode.messages, episode.turns
    points = [(t.token_start, msgs[:i], f"turn {k}'s prompt") for k, (t, i) in enumerate(zip(turns, assistant_positions))]
    if ends_open or not turns:
        points.append((episode.num_tokens, msgs, "the next turn's prompt"))
    for start, before, what in points:
        context = episode.sequence_indices(start)  # flat positions of the sequence that leads to `start`
        have = [episode.token_ids[p] for p in context]
        want = encode(tokenizer, renderer.render(before, True))
        at = _first_difference(want, have)
        if at is not None:
            flat = context[at] if at < len(context) else start
            return AlignmentReport(
                False, flat, f"{what}: token mismatch at position {flat}: the template renders "
                f"{_show(tokenizer, want[at] if at < len(want) else None)}, episode has "
                f"{_show(tokenizer, have[at] if at < len(have) else None)} (prompt lengths {len(want)} vs {len(have)})",
                None, False)
    if turns and not ends_open and episode.num_tokens != turns[-1].token_end:
        extra = turns[-1].token_end
        return AlignmentReport(False, extra, f"{episode.num_tokens - extra} tokens follow the last turn of a finished "
                               f"\"rendered\" episode (position {extra} on)", None, False)
    return AlignmentReport(True, None, "every turn's prompt matches the template's render of the conversation before it",
                           None, False)


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def _show(tokenizer: Any, tok: int | None) -> str:
    if tok is None:
        return "<end>"
    return f"{tok} ({tokenizer.decode([tok], skip_special_tokens=False)!r})"


def longest_fitting_prefix(renderer: "ChatRenderer", opening: Any, obs: str, note: str,
                           limit: int) -> tuple[str, list[dict[str, Any]], list[int]] | None:
    """(observation prefix + `note`, the messages `opening(text)` makes of it, their ids) for
    the longest prefix of `obs` whose messages take at most `limit` tokens; None if not even
    the empty one fits.

    The prefix length doubles from `limit` characters until an opening does not fit
    (or the prefix reaches `max_chars_per_token * limit` characters, beyond which none
    can fit), then is bisected between the last two lengths: the text tokenized stays
    within a few times the kept prefix, however long `obs` is.
    """
    def attempt(n: int) -> tuple[str, list[dict[str, Any]], list[int]] | None:
        text = obs[:n] + note
        cand = opening(text)
        cand_ids = renderer.prompt_ids(cand)
        return (text, cand, cand_ids) if len(cand_ids) <= limit else None

    best = attempt(0)
    if best is None:
        return None
    cap = min(len(obs), renderer.max_chars_per_token() * max(limit, 1))
    lo, hi, n = 0, cap, min(cap, max(limit, 1))
    while n > lo:  # doubling: lo fits, find an n that does not
        got = attempt(n)
        if got is None:
            hi = n - 1
            break
        best, lo = got, n
        n = min(cap, 2 * n)
    while lo < hi:  # bisecting: lo fits, hi + 1 does not
        mid = (lo + hi + 1) // 2
        got = attempt(mid)
        if got is None:
            hi = mid - 1
        else:
            best, lo = got, mid
    return best


def invalid_text(text: Any, what: str) -> str | None:
    """An episode error if `text` is a str that is not valid Unicode text (lone surrogates,
    as `bytes.decode(..., errors="surrogateescape")` leaves for invalid UTF-8), else None."""
    if not isinstance(text, str):
        return None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        return (f"{what} is not valid UTF-8 text: {exc.object[exc.start:exc.end]!r} at character {exc.start}; "
                "decode bytes with errors='replace' (or 'ignore') before returning them")
    return None
