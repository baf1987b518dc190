"""The opening prompt of an episode within the context budget (a mixin of `Rollout`).

An opening that leaves room for at least one sampled token is kept as it is. A longer one
has its first observation cut to the longest prefix that leaves a first turn room, with a
visible note appended and the cut recorded in `episode.warnings`; an opening that does not
fit even without the observation raises `NoRoom` (its episode ends with that error). A text
with more characters than the budget's tokens can hold is never tokenized whole, so a 10 MB
observation costs about what a fitting one does. See `Rollout`'s module docstring.
"""
from __future__ import annotations

from typing import Any

from workbench.rollout.chat import ChatRenderer, longest_fitting_prefix
from workbench.trajectory import Episode

__all__ = ["NoRoom", "OpeningBudget"]


class NoRoom(ValueError):
    """An episode's opening prompt does not fit `max_context_tokens` even without its observation."""


class OpeningBudget:
    """`Rollout`'s opening-prompt methods. Uses the rollout's `initial_prompt`,
    `max_context_tokens`, `close_reserve`, `first_turn_room` and `_renderer_of(episode)`."""

    initial_prompt: str | None
    max_context_tokens: int
    close_reserve: int
    first_turn_room: int

    def _opening_messages(self, system: str, observation: str) -> list[dict[str, Any]]:
        opening = observation
        if self.initial_prompt:
            opening = f"{self.initial_prompt}\n\n{opening}" if opening else self.initial_prompt
        return [{"role": "system", "content": system}, {"role": "user", "content": opening}]

    def _opening(self, system: str, obs: str, ep: Episode) -> tuple[str, list[dict[str, Any]], list[int]]:
        """(observation as the model sees it, opening messages, their ids), within the budget.

        An opening that leaves room for at least one sampled token is kept as it is (the
        first turn's budget shrinks, as for any turn near the limit). A longer one has its
        observation cut to the longest prefix that leaves `first_turn_room` tokens (else
        one token), with a note appended; the cut is recorded in `ep.warnings`. Raises
        `NoRoom` when the opening does not fit even without the observation.

        An opening with more characters than the budget's tokens can hold
        (`ChatRenderer.max_chars_per_token`) is never tokenized whole, and the search for
        the cut tokenizes prefixes at most a few times longer than the one it keeps, so a
        10 MB observation costs about what a fitting one does.
        """
        limit_min = self.max_context_tokens - self.close_reserve - 1
        renderer = self._renderer_of(ep)
        messages = self._opening_messages(system, obs)
        chars = len(system or "") + len(messages[1]["content"])
        ids = None
        if chars <= limit_min or chars <= renderer.max_chars_per_token() * limit_min:
            ids = renderer.prompt_ids(messages)
            if len(ids) <= limit_min:
                return obs, messages, ids
        note = (f"\n[... observation cut: {len(obs):,} characters do not fit the context budget of "
                f"{self.max_context_tokens} tokens]")
        best = None
        for limit in (limit_min + 1 - self.first_turn_room, limit_min):
            best = self._longest_fitting_prefix(system, obs, note, limit, renderer)
            if best is not None:
                break
        if best is None:
            bare = len(renderer.prompt_ids(self._opening_messages(system, note)))
            raise NoRoom(
                f"context: the opening prompt takes {bare} tokens even with the observation cut away, "
                f"but max_context_tokens={self.max_context_tokens} leaves {limit_min} for it (after "
                f"1 for the first turn and {self.close_reserve} for its end); raise "
                "max_context_tokens or shorten the system prompt / initial_prompt")
        before = f"{len(ids)}" if ids is not None else f"{chars:,} characters, over {limit_min}"
        ep.warnings.append(
            f"context: first observation cut from {len(obs):,} to {len(best[0]) - len(note):,} characters "
            f"(opening prompt {before} -> {len(best[2])} tokens) to fit max_context_tokens="
            f"{self.max_context_tokens} with room for a "
            f"{self.max_context_tokens - self.close_reserve - len(best[2])}-token turn")
        return best

    def _longest_fitting_prefix(self, system: str, obs: str, note: str, limit: int,
                                renderer: ChatRenderer) -> tuple[str, list[dict[str, Any]], list[int]] | None:
        """(observation prefix + `note`, opening messages, their ids) for the longest prefix of
        `obs` whose opening takes at most `limit` tokens; None if not even the empty one fits
        (`chat.longest_fitting_prefix`: the text tokenized stays within a few times the kept
        prefix, however long `obs` is)."""
        return longest_fitting_prefix(renderer, lambda text: self._opening_messages(system, text), obs, note, limit)
