"""Token-exact chat rendering: the token-in/token-out rule.

The model's sampled ids are appended to an episode as they are, never decoded and
re-encoded. Only new non-model messages (observation, tool result) are rendered with
the chat template, as a *delta*: the text the template adds after the assistant
message's content (e.g. `<|im_end|>\\n`), plus the new messages, plus the generation
prompt. Deltas are found by rendering with a sentinel in place of the assistant's
content and taking string differences, so any prefix-stable template works.

`check_token_alignment` verifies an episode afterwards: it renders the final
conversation in one go and compares it with the accumulated ids, position by
position, reporting the first difference. Two views:

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

SENTINEL = "\u2063WB_MODEL_TURN_{}\u2063"


class TemplateError(ValueError):
    """The chat template cannot be rendered incrementally."""


def _render(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    return tokenizer.apply_chat_template(
        [{"role": m["role"], "content": m["content"]} for m in messages],
        tokenize=False, add_generation_prompt=add_generation_prompt,
    )


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
    """Renders the prompt and the per-turn deltas of one tokenizer's chat template."""

    def __init__(self, tokenizer: Any):
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer)

    def max_chars_per_token(self) -> int:
        """`max_chars_per_token(self.tokenizer)`: more characters than this many per token
        left cannot fit."""
        return max_chars_per_token(self.tokenizer)

    def prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids of the opening messages plus the generation prompt."""
        return encode(self.tokenizer, _render(self.tokenizer, messages, add_generation_prompt=True))

    def delta_ids(
        self,
        history: list[dict[str, Any]],
        last_action_ids: list[int],
        new_messages: list[dict[str, Any]],
        add_generation_prompt: bool,
    ) -> list[int]:
        """Ids to append after an assistant turn: closing glue + new messages (+ gen prompt).

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
        before = _render(self.tokenizer, base, add_generation_prompt=False)
        after = _render(self.tokenizer, base + list(new_messages), add_generation_prompt=add_generation_prompt)
        if not after.startswith(before):
            raise TemplateError(
                "the chat template renders earlier turns differently once new messages follow, "
                "so turns cannot be appended token-exactly; use a prefix-stable template"
            )
        if before.count(sentinel) != 1:
            raise TemplateError("the chat template dropped or repeated the assistant content")
        tail = before[before.index(sentinel) + len(sentinel):]  # e.g. "<|im_end|>\n"
        glue = tail + after[len(before):]
        return encode(self.tokenizer, self._strip_sampled_stop(glue, last_action_ids))

    def generation_prompt_ids(self, messages: list[dict[str, Any]]) -> list[int]:
        """Ids the generation prompt adds after `messages` (e.g. `<|im_start|>assistant\n`)."""
        closed = _render(self.tokenizer, messages, add_generation_prompt=False)
        opened = _render(self.tokenizer, messages, add_generation_prompt=True)
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
    """Compare `episode.token_ids` with a one-shot render of `episode.messages`."""
    msgs = episode.messages
    if not msgs:  # e.g. an episode whose reset failed: nothing was rendered
        ok = not episode.token_ids
        return AlignmentReport(ok, None if ok else 0, "no messages and no tokens" if ok else
                               f"{len(episode.token_ids)} tokens but no messages", None, False)
    renderer = ChatRenderer(tokenizer)
    turns = [t for t in episode.turns]
    assistant_positions = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    if len(assistant_positions) != len(turns):
        return AlignmentReport(False, 0, f"{len(assistant_positions)} assistant messages but {len(turns)} turns", None, False)
    ends_open = not episode.done  # a live episode ends with an open generation prompt
    # Template view: sentinel per model turn, fresh tokens between, sampled ids inside.
    sentinel_msgs = [dict(m) for m in msgs]
    for k, i in enumerate(assistant_positions):
        sentinel_msgs[i]["content"] = SENTINEL.format(k)
    text = _render(tokenizer, sentinel_msgs, add_generation_prompt=ends_open)
    expected: list[int] = []
    rest = text
    missing = ""
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
    actual = list(episode.token_ids)
    mismatch = _first_difference(expected, actual)
    if missing and mismatch is None:
        mismatch = turns[k].token_start
    # Full re-encode view.
    full = encode(tokenizer, _render(tokenizer, msgs, add_generation_prompt=ends_open))
    re_mm = _first_difference(full, actual)
    # A re-encode difference inside (or right at the end of) a model turn means the model
    # sampled a non-canonical tokenisation of its own text.
    in_model = re_mm is not None and any(t.token_start <= re_mm <= t.token_end for t in turns)
    if mismatch is None:
        msg = "token ids match the rendered conversation"
        if re_mm is not None:
            msg += f"; re-encoding the text would differ from position {re_mm} (model sampled a non-canonical tokenisation)"
        return AlignmentReport(True, None, msg, re_mm, in_model)
    exp_tok = expected[mismatch] if mismatch < len(expected) else None
    act_tok = actual[mismatch] if mismatch < len(actual) else None
    msg = (f"{missing}token mismatch at position {mismatch}: rendered conversation has "
           f"{_show(tokenizer, exp_tok)}, episode has {_show(tokenizer, act_tok)} "
           f"(lengths {len(expected)} vs {len(actual)})")
    return AlignmentReport(False, mismatch, msg, re_mm, in_model)


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
