"""How many episodes this process runs at once on one OpenEnv server, and what the
server said when it refused one.

    places = ServerPlaces.for_url("http://127.0.0.1:8000")
    if not places.take():            # all places taken: the episode waits (EnvironmentBusy)
        ...
    places.give_back()               # its session closed

An OpenEnv server serves a fixed number of WebSocket sessions at once (`create_app(...,
max_concurrent_envs=N)`; N is 1 when not given) and refuses one more: it sends "Server
at capacity: A/N sessions active. Cannot accept new connections." (code
CAPACITY_REACHED) and closes the socket. openenv-core 0.3.0 says N nowhere else (not in
`/health`, `/metadata` or `/schema`), so `ServerPlaces` learns it from the first refusal
(`refused`), or is told it up front by the env param `max_concurrent`
(`given`). Until then it lets every session try.

One `ServerPlaces` per server URL is shared by every `OpenEnvEnvironment` of this
process: an environment takes a place before it opens its session and gives it back
when the session closes. Other processes (Ray workers, other users) are not counted
here; the server's own refusals cover them (the episode waits, see
`workbench.environments.base.EnvironmentBusy`).

The first refusal prints one notice per server (stderr): the limit, and how to raise it.
"""
from __future__ import annotations

import asyncio
import json
import re
import sys
import threading
from typing import Any

CAPACITY_CODE = "CAPACITY_REACHED"
"""The `code` of an OpenEnv server's refusal of one session too many."""

_SESSIONS = re.compile(r"(\d+)\s*/\s*(\d+) sessions active")


def capacity_limit(words: str | None) -> int | None:
    """The server's session limit if `words` are its capacity refusal (N of "A/N sessions
    active", else 0 when the refusal does not say N); None when they are not a refusal."""
    if not words or (CAPACITY_CODE not in words and "Server at capacity" not in words):
        return None
    match = _SESSIONS.search(words)
    return int(match.group(2)) if match else 0


def server_words(client: Any, exc: BaseException) -> str | None:
    """What the server said about a failed call, in the client's format ("Server error:
    MESSAGE (code: CODE)"), or None when it said nothing.

    The client raises that text itself when the server's error arrives as the reply. When
    the server closed the socket first (its refusal comes before the client's message is
    sent), the client raises a bare `ConnectionClosedOK`; the refusal is then still in
    the socket's buffer, and is read from there (`client` is the `SyncEnvClient`)."""
    text = str(exc)
    if text.startswith("Server error:"):
        return text
    if "ConnectionClosed" not in type(exc).__name__:
        return None
    ws = getattr(getattr(client, "async_client", None), "_ws", None)
    run = getattr(client, "_run", None)  # openenv-core 0.3.0 SyncEnvClient: runs a coroutine on its loop
    if ws is None or run is None:
        return None
    try:
        raw = run(asyncio.wait_for(ws.recv(), timeout=1.0))
        message = json.loads(raw)
    except Exception:  # noqa: BLE001 - nothing buffered, or not JSON: the server said nothing we can read
        return None
    if not isinstance(message, dict) or message.get("type") != "error":
        return None
    data = message.get("data") if isinstance(message.get("data"), dict) else {}
    return f"Server error: {data.get('message', 'Unknown error')} (code: {data.get('code', 'UNKNOWN')})"


class ServerPlaces:
    """Sessions this process has open on one OpenEnv server, and how many it may open.

    Attributes:
        url: the server.
        limit_given: the env param `max_concurrent` (the smallest given), or None.
        limit_learned: the server's session limit from its refusal (or the adapter's own
            server setting), or None before either.
        open: places taken now (sessions open or opening).
        noticed: whether the notice about this server's limit was printed.
    """

    _lock = threading.Lock()
    _by_url: dict[str, "ServerPlaces"] = {}

    def __init__(self, url: str):
        self.url = url
        self.limit_given: int | None = None
        self.limit_learned: int | None = None
        self.open = 0
        self.noticed = False

    @classmethod
    def for_url(cls, url: str) -> "ServerPlaces":
        """The places of server `url` (one object per URL in this process)."""
        key = url.rstrip("/")
        with cls._lock:
            places = cls._by_url.get(key)
            if places is None:
                places = cls._by_url[key] = cls(key)
            return places

    @property
    def limit(self) -> int | None:
        """Sessions this process opens at once on the server (None: no limit known)."""
        known = [n for n in (self.limit_given, self.limit_learned) if n]
        return min(known) if known else None

    def given(self, limit: int) -> None:
        """The env param `max_concurrent`: at most `limit` sessions at once."""
        with self._lock:
            self.limit_given = limit if self.limit_given is None else min(self.limit_given, limit)

    def take(self) -> bool:
        """Take a place for one session; False when all are taken (nothing changes)."""
        with self._lock:
            limit = self.limit
            if limit is not None and self.open >= limit:
                return False
            self.open += 1
            return True

    def give_back(self) -> None:
        """A session taken with `take` closed (or never opened)."""
        with self._lock:
            self.open = max(0, self.open - 1)

    def refused(self, limit: int, words: str) -> None:
        """The server refused a session with `words`, its limit being `limit` (0: it did not
        say). Learns the limit; the first time, prints the notice."""
        with self._lock:
            if limit > 0:
                self.limit_learned = limit
            first, self.noticed = not self.noticed, True
        if first:
            self.notice(f'it refused one more session: "{words}"')

    def learned(self, limit: int, why: str, how: str | None = None) -> None:
        """The limit is known without a refusal (the adapter serves the class itself with
        `limit` sessions, for the reason `why`); prints the notice once when `limit` is 1
        (`how`: how to raise it)."""
        with self._lock:
            self.limit_learned = limit
            first = not self.noticed and limit == 1
            self.noticed = self.noticed or first
        if first:
            self.notice(why, how)

    def notice(self, why: str, how: str | None = None) -> None:
        """Print (stderr) the server's limit, what workbench does about it, and how to raise it."""
        n = self.limit
        count = f"{n} environment{'s' if n != 1 else ''}" if n else "a limited number of environments"
        how = how or ("start the server with create_app(EnvClass, Action, Observation, max_concurrent_envs=N) "
                      "(the environment class must set SUPPORTS_CONCURRENT_SESSIONS = True); the env param "
                      "max_concurrent=N (--env-param max_concurrent=N) tells workbench the limit up front")
        print(f"workbench: the OpenEnv server at {self.url} serves {count} at once ({why}). Episodes on it run "
              f"at most {n or 'that many'} at a time and the others wait their turn, so a batch takes longer. "
              f"To run more at once, {how}.", file=sys.stderr, flush=True)

    def busy_text(self) -> str:
        """Why a session cannot open now (the text of `EnvironmentBusy`)."""
        return (f"all {self.open} places on the OpenEnv server at {self.url} are taken by this process's open "
                f"sessions (it serves {self.limit} at once); the episode waits until one closes "
                "(a rollout resets it then; called directly, end_episode() or close() the environments done with)")


__all__ = ["CAPACITY_CODE", "ServerPlaces", "capacity_limit", "server_words"]
