"""Reasoning blocks: the `<think>...</think>` part of a reply is not the action.

    split = split_reasoning("<think>\\nmaybe 5\\n</think>\\n\\n6")
    split.answer, split.offset, split.reasoning, split.cut   # "\\n\\n6", 24, "maybe 5", False

Qwen3 (thinking on) and DeepSeek-R1 style models reason inside a block before they answer.
The reasoning was sampled, so it is trained on like every sampled token; but the action is
read from the text after the block only, so a tool call written while reasoning is never
executed. `MultiTurnManager(reasoning=...)` parses `answer` and moves the action spans by
`offset`.

The block ends at the *last* end marker (as Qwen3's template splits it). A reply with an
opening marker and no end marker, or with none when the generation prompt itself opened
the block (`opened`, DeepSeek-R1's `<think>\\n`), was cut inside its reasoning: `cut` is
True and there is no answer.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ReasoningSplit", "split_reasoning", "DEFAULT_MARKERS"]

DEFAULT_MARKERS = ("<think>", "</think>")
"""Qwen3's and DeepSeek-R1's reasoning markers."""


@dataclass(frozen=True)
class ReasoningSplit:
    """A reply split at its reasoning block."""

    reasoning: str | None
    """The text inside the block (markers and the newlines next to them removed); None when
    the reply has no block."""
    answer: str
    """The text after the block (the whole reply without one; "" when cut inside it)."""
    offset: int
    """Where `answer` starts in the reply (0 without a block)."""
    cut: bool
    """The reply ended inside its reasoning block: no end marker."""


def split_reasoning(reply: str, markers: tuple[str, str] = DEFAULT_MARKERS, opened: bool = False) -> ReasoningSplit:
    """Split `reply` at its reasoning block (see the module docstring).

    Args:
        reply: the model's reply text.
        markers: (start, end) markers of the block.
        opened: the generation prompt already opened a block, so the reply starts inside it.
    """
    start, end = markers
    close = reply.rfind(end)
    if close >= 0:
        inside = reply[:close]
        at = inside.find(start)
        if at >= 0:
            inside = inside[at + len(start):]
        offset = close + len(end)
        return ReasoningSplit(inside.strip("\n"), reply[offset:], offset, False)
    at = reply.find(start)
    if at >= 0 or opened:
        inside = reply[at + len(start):] if at >= 0 else reply
        return ReasoningSplit(inside.strip("\n"), "", len(reply), True)
    return ReasoningSplit(None, reply, 0, False)
