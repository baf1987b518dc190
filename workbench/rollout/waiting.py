"""Episodes that wait for room on their environment's server before they start.

An environment whose server serves a limited number of episodes at once (an OpenEnv
server at its `max_concurrent_envs`) raises `EnvironmentBusy` from `reset` when every
place is taken. `Rollout` (through `EpisodeQueue`) does not end such an episode: it
waits in `rollout.waiting`, in order, and is reset again -- joining the next turn --
after one of the rollout's own episodes has ended, since each ended episode's
`env.end_episode()` gives its place back.

The wait and `step_timeout`: waiting is not a hung call. While episodes of the rollout
are running, the wait has no limit of its own: those episodes free the places, and each
of their calls is bounded by its own `step_timeout` (and their turns by `max_turns`).
When none is running, the places are held outside the rollout (another process, another
rollout, another user of the server): the rollout retries the waiting episodes (every
0.05 s, backing off to 1 s) for up to each one's `step_timeout`, or `ROOM_WAIT_S` (60 s)
when that is 0 or None (no limit on a call is not a licence to wait forever for a server
that refuses every session), then ends it with the environment's own words ("environment
reset raised EnvironmentBusy: Server error: Server at capacity: 1/1 sessions active ...
(code: CAPACITY_REACHED) ...").
"""
from __future__ import annotations

import time
from typing import Any

from workbench.environments.base import EnvironmentBusy

__all__ = ["EnvironmentBusy", "EpisodeQueue", "ROOM_WAIT_S"]

#: Seconds a waiting episode waits for room, with no episode of its rollout running, when its
#: `step_timeout` is 0 or None (with a `step_timeout`, that is the wait).
ROOM_WAIT_S = 60.0


class EpisodeQueue:
    """The waiting episodes of a rollout (mixed into `Rollout`).

    It uses the rollout's `slots`, `live` (started, not ended; never a waiting episode),
    `step_timeouts`, `_start(i)` (reset episode i: True when it started or ended, False
    when it waits again) and `_fail(slot, error)`.

    Attributes:
        waiting: indices of the episodes waiting for room, in order.
        queued: indices of every episode that waited at some point
            (`rollout/queued_episodes` counts them).
    """

    waiting: list[int]
    queued: set[int]
    slots: list[Any]
    step_timeouts: list[float | None]

    def _clear_queue(self) -> None:
        self.waiting, self.queued, self._busy = [], set(), {}
        self._ended = self._tried_at = 0  # episodes ended; that count when the waiting were last tried

    def _wait(self, i: int, exc: EnvironmentBusy) -> None:
        """Episode `i`'s reset found no room (`exc`): it waits."""
        self._busy[i] = str(exc)
        self.queued.add(i)
        if i not in self.waiting:
            self.waiting.append(i)

    def waiting_reason(self, i: int) -> str:
        """Why waiting episode `i` found no room (its last `EnvironmentBusy` text)."""
        return self._busy.get(i, "")

    def _episode_ended(self, slot: Any) -> None:
        """Give back what an ended episode held (`env.end_episode()`), so a waiting one can start."""
        self._ended += 1
        end = getattr(slot.env, "end_episode", None)
        if callable(end):
            try:
                end()
            except Exception as exc:  # noqa: BLE001 - the episode has ended either way
                slot.episode.warnings.append(f"{type(slot.env).__name__}.end_episode raised "
                                             f"{type(exc).__name__}: {exc}")

    def admit_waiting(self) -> list[int]:
        """Reset the waiting episodes that find room now, in order; returns those now live.

        Tried only after one of this rollout's episodes has ended since the last try. With
        none of this rollout's episodes live, waits for room as the module docstring says."""
        if not self.waiting or (self.live and self._ended == self._tried_at):
            return []
        self._tried_at = self._ended
        started = self._try_waiting()
        if started or not self.waiting or self.live:
            return started
        begin, delay = time.monotonic(), 0.05
        while self.waiting:
            waited = time.monotonic() - begin
            for i in list(self.waiting):
                limit = self.step_timeouts[i] or ROOM_WAIT_S
                if waited >= limit:
                    self.waiting.remove(i)
                    why = (f"step_timeout={limit:g}" if self.step_timeouts[i]
                           else f"step_timeout is {self.step_timeouts[i]!r}, so the wait for room is {ROOM_WAIT_S:g} s")
                    self._fail(self.slots[i], f"environment reset raised EnvironmentBusy: {self.waiting_reason(i)} "
                                              f"(waited {waited:.1f} s with no episode of this rollout running; "
                                              f"{why})")
            if not self.waiting:
                break
            time.sleep(delay)
            delay = min(1.0, delay * 2)
            started = self._try_waiting()
            if started:
                return started
        return []

    def _try_waiting(self) -> list[int]:
        """One reset try of every waiting episode, in order; the ones now live."""
        started = []
        for i in list(self.waiting):
            self.waiting.remove(i)
            if self._start(i) and not self.slots[i].episode.done:
                started.append(i)
        return started
