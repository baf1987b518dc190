"""`OpenEnvEnvironment`: an OpenEnv environment server as a workbench environment.

    env = make_env("openenv:http://127.0.0.1:8000")          # a running OpenEnv server
    env = make_env("openenv:my_pkg.server:EchoEnvironment")  # an OpenEnv `Environment` class,
                                                             # served on 127.0.0.1 by the adapter
    obs = env.reset(seed=0)
    obs, reward, done, info = env.step("hello")

OpenEnv (`openenv-core`, tested with 0.3.0) environments are servers: `create_app(Env,
ActionCls, ObservationCls)` serves reset/step/state, and clients hold one WebSocket session
per episode (`GenericEnvClient(base_url).sync()`, plain dicts in and out). This adapter:

  * action: read from the server's `/schema` when the environment is made (a server that
    cannot be reached yet is asked at the first step), in one of two forms
    (`openenv_actions.ActionFormat`): the reply text as one string field (`action_field`
    param, or the action's only required field when it is a string, else `message`/`text`),
    or the reply as the action's JSON (any other action, or `action_json=True`): then the
    system prompt says the format (fields, types, allowed values), a reply in a ```json fence
    counts, and a reply that is not JSON or does not validate is a format error the model
    reads as its next observation (`info["parse_error"]` names the field; counted in
    `env/parse_error_rate`; the server never sees it). An action the adapter cannot fill
    (`action_field` not a string field, or other required fields beside it) is refused when
    the environment is made. `environment.constrained_decoding` samples every reply under
    the action's JSON schema (`action_constraint()`).
  * observation: the text in `observation_field` (param); by default the first of `text`,
    `message`, `prompt`, `content`, `output`, `observation` the observation has, else a
    ValueError naming the observation's keys and the param to set.
  * reward and done come through as they are (a None reward is 0.0); `info` holds the
    observation's `metadata` when the server sends it (OpenEnv 0.3.0 leaves it out of the
    wire format), the environment's `state()` after each step (`info["state"]`, OpenEnv's
    extra state fields included), and `success` from either when they report one.
  * errors: a failed connection, a server error or an invalid action raise from
    `reset`/`step`, which ends that episode only (the rollout records it), with the
    server's own words ("Server error: ... (code: ...)") also when it closed the socket
    instead of answering. The client waits `step_timeout` for each answer (60 s when that is
    0 or None), so a hung server cannot hold a call longer; a silent server, an answer that
    is not the protocol's JSON and a connection closed without words are errors that name
    the server and the call ("the OpenEnv server at URL did not answer reset within 3 s").
    A session whose call went unanswered (timed out, interrupted) is dropped at once when it
    ends, not closed with a handshake the busy server would not answer.
  * sessions and the server's limit: each episode holds one WebSocket session, opened by
    `reset` and closed by `end_episode()` (the rollout calls it when the episode ends) or
    `close()`. An OpenEnv server serves at most `max_concurrent_envs` sessions at once
    (1 unless its `create_app` call says more) and does not publish that number, so the
    adapter learns it from the server's first refusal ("Server at capacity: 1/1 sessions
    active ... (code: CAPACITY_REACHED)", then one notice on stderr saying how to raise
    it), or from the `max_concurrent` param (a number, the most sessions this process
    opens at once on that server). All environments of this process that use one server
    share its places (`workbench.environments.adapters.openenv_capacity.ServerPlaces`); with every
    place taken, `reset` raises `EnvironmentBusy` and the rollout queues the episode
    until one of its episodes ends. So a batch of 8 on a server of capacity 1 runs its
    episodes one after another.
  * `openenv:module:Class`: the class is served on 127.0.0.1 (a uvicorn thread, a free port)
    the first time an environment needs it; every copy of the environment shares that
    server (one session each, `max_sessions` param, default 64 when the class declares
    `SUPPORTS_CONCURRENT_SESSIONS = True`, else 1, which runs its episodes one at a time),
    and it is stopped when the
    last copy is closed (or garbage-collected). The action and observation classes come
    from the annotations of `Class.step` (or params `action_class` / `observation_class`).
"""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
import typing
import weakref
from typing import Any, Mapping

from workbench.config import EnvironmentConfig
from workbench.config import ConfigError
from workbench.environments.adapters.openenv_actions import ActionFormat
from workbench.environments.adapters.openenv_capacity import ServerPlaces, capacity_limit, server_words
from workbench.environments.base import BaseEnvironment, EnvironmentBusy, StepResult, as_environment_config
from workbench.utils.imports import import_object

OBSERVATION_FIELDS = ("text", "message", "prompt", "content", "output", "observation")


def _import_openenv() -> Any:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as exc:
        raise ImportError("OpenEnvEnvironment needs openenv-core (tested with 0.3.0): the Makefile installs it "
                          "with `pip install --no-deps openenv-core==0.3.0 fastmcp==4.2.3`") from exc
    return GenericEnvClient


def _quiet_disconnects(app: Any) -> Any:
    """`app` with a client's ordinary goodbye kept quiet: openenv-core 0.3.0's websocket handler
    closes the socket after the client has closed it, which raises `WebSocketDisconnect` out of
    the app under uvicorn's default websocket implementation, and uvicorn then logs "Exception
    in ASGI application" with a 56-line traceback for every episode's session."""
    from starlette.websockets import WebSocketDisconnect

    async def served(scope: Any, receive: Any, send: Any) -> None:
        try:
            await app(scope, receive, send)
        except WebSocketDisconnect:
            if scope.get("type") != "websocket":
                raise

    return served


class _Served:
    """An OpenEnv `Environment` class served on 127.0.0.1 by this process, shared by reference count."""

    _lock = threading.Lock()
    _by_spec: dict[str, "_Served"] = {}

    def __init__(self, spec: str, max_sessions: int | None, action_class: str | None, observation_class: str | None):
        import uvicorn
        from openenv.core.env_server.http_server import create_fastapi_app

        env_cls = import_object(spec)
        concurrent = bool(getattr(env_cls, "SUPPORTS_CONCURRENT_SESSIONS", False))
        self.max_sessions = max_sessions if max_sessions is not None else 64 if concurrent else 1
        hints = typing.get_type_hints(env_cls.step)
        action_cls = import_object(action_class) if action_class else hints.get("action")
        obs_cls = import_object(observation_class) if observation_class else hints.get("return")
        if action_cls is None or obs_cls is None:
            raise ValueError(f"cannot tell the action and observation classes of {spec}: annotate "
                             "`step(self, action: MyAction) -> MyObservation` or set the env params "
                             "action_class / observation_class to 'module:Name'")
        app = _quiet_disconnects(create_fastapi_app(env_cls, action_cls, obs_cls,
                                                    max_concurrent_envs=self.max_sessions))
        sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        sock.bind(("127.0.0.1", 0))
        self.spec, self.port, self.refs = spec, sock.getsockname()[1], 0
        self.server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False, lifespan="off"))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [sock]},
                                       name=f"wb-openenv-{env_cls.__name__}", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise RuntimeError(f"the OpenEnv server for {spec} did not start on 127.0.0.1:{self.port}")
            time.sleep(0.01)
        why = (f"{env_cls.__name__} does not set SUPPORTS_CONCURRENT_SESSIONS = True, so the adapter serves it "
               "one session at a time" if not concurrent else f"the adapter serves {spec} with max_sessions="
               f"{self.max_sessions}")
        ServerPlaces.for_url(self.url).learned(
            self.max_sessions, why, "set the env param max_sessions=N (the class must set "
            "SUPPORTS_CONCURRENT_SESSIONS = True, which it may when its sessions share no state)")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def acquire(cls, spec: str, max_sessions: int | None, action_class: str | None,
                observation_class: str | None) -> "_Served":
        with cls._lock:
            served = cls._by_spec.get(spec)
            if served is None:
                served = cls._by_spec[spec] = cls(spec, max_sessions, action_class, observation_class)
            served.refs += 1
            return served

    def release(self) -> None:
        with self._lock:
            self.refs -= 1
            if self.refs > 0:
                return
            self._by_spec.pop(self.spec, None)
        self.server.should_exit = True
        self.thread.join(10)


class _Session:
    """One environment's WebSocket session and the server place it holds. Holds no
    reference to the environment, so a garbage-collected environment closes it."""

    def __init__(self, places: ServerPlaces):
        self.places = places
        self.client: Any = None
        self.has_place = False
        self.lock = threading.Lock()
        #: A call is (or was left) unanswered on this session: set before each call and cleared
        #: when the server answered, so a call that timed out or was interrupted leaves it set, and
        #: `close` then drops the connection instead of waiting for a closing handshake that a
        #: server still busy with that call does not answer (websockets waits up to 10 s for it).
        self.unanswered = False

    def open(self, make_client: Any) -> Any:
        """The open client; takes a place and connects first when there is none.
        Raises `EnvironmentBusy` (nothing opened) when every place is taken."""
        with self.lock:
            if self.client is not None:
                return self.client
            if not self.has_place:
                if not self.places.take():
                    raise EnvironmentBusy(self.places.busy_text())
                self.has_place = True
            self.client = make_client()  # kept before connecting, so close() also closes a half-open one
        self.client.connect()
        return self.client

    def close(self) -> None:
        """Close the client (if any) and give the place back (if held). After an unanswered
        call the connection is dropped at once (`unanswered`), not closed with a handshake."""
        with self.lock:
            client, self.client = self.client, None
            place, self.has_place = self.has_place, False
            abort, self.unanswered = self.unanswered, False
        if client is not None:
            if abort:
                _drop_connection(client)
            try:
                client.close()
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass
        if place:
            self.places.give_back()


def _drop_connection(client: Any) -> None:
    """Abort the TCP connection under an openenv-core 0.3.0 `SyncEnvClient` (on its event
    loop's thread), so its `close()` returns at once; nothing when the client has no open one."""
    ws = getattr(getattr(client, "async_client", None), "_ws", None)
    transport = getattr(ws, "transport", None)
    loop = getattr(client, "_loop", None)
    if transport is None or loop is None or not loop.is_running():
        return
    try:
        loop.call_soon_threadsafe(transport.abort)
    except RuntimeError:  # the loop closed meanwhile
        pass


class OpenEnvEnvironment(BaseEnvironment):
    """An OpenEnv server (URL) or `Environment` class (`module:Class`) behind the workbench API.

    Args:
        target: "http://HOST:PORT" of a running server, or "module:Class" to serve in-process.
        config: `EnvironmentConfig` or dict; params: `action_field`, `action_json`,
            `observation_field`, `max_concurrent`, `max_sessions`, `action_class`,
            `observation_class` (see the module docstring).
    """

    def __init__(self, target: str, config: EnvironmentConfig | Mapping[str, Any] | None = None, **params: Any):
        cfg = as_environment_config(config)
        cfg = EnvironmentConfig(**{**cfg.__dict__, "name": f"openenv:{target}",
                                   "params": {**cfg.params, **params, "target": target}})
        super().__init__(cfg)
        _import_openenv()
        self.target = target
        self.action_field: str | None = self.params.get("action_field")
        self.action_json = bool(self.params.get("action_json", False))
        self.observation_field: str | None = self.params.get("observation_field")
        self._served: _Served | None = None
        self._finalizer: Any = None
        self.last_info: dict[str, Any] = {}
        max_concurrent = self._count_param("max_concurrent")
        if not target.startswith(("http://", "https://")):
            if ":" not in target:
                raise ValueError(f"openenv:{target} is neither a URL (http://HOST:PORT) nor module:Class")
            self._served = _Served.acquire(target, self._count_param("max_sessions"),
                                           self.params.get("action_class"), self.params.get("observation_class"))
            self._finalizer = weakref.finalize(self, _Served.release, self._served)
        self.places = ServerPlaces.for_url(self.url)
        if max_concurrent is not None:
            self.places.given(max_concurrent)
        self._session = _Session(self.places)
        weakref.finalize(self, self._session.close).atexit = False  # a dropped environment gives its place back
        self.action_format: ActionFormat | None = None  # read from /schema (openenv_actions.py)
        self._read_action_format(startup=True)

    def _count_param(self, name: str) -> int | None:
        """The env param `name` as a whole number >= 1, or None when not set."""
        value = self.params.get(name)
        if value is None:
            return None
        try:
            number = int(value)
        except (TypeError, ValueError):
            number = 0
        if isinstance(value, bool) or number < 1 or number != float(value):
            raise ValueError(f"environment.params.{name} must be a whole number >= 1 (sessions at once on the "
                             f"OpenEnv server), got {value!r}")
        return number

    @classmethod
    def from_config(cls, config: EnvironmentConfig | Mapping[str, Any]) -> "OpenEnvEnvironment":
        """Rebuild from a recorded config: `params["target"]` names the server or class."""
        data = as_environment_config(config)
        if "target" not in data.params:
            raise ValueError("OpenEnvEnvironment.from_config needs params['target']; or use "
                             "make_env('openenv:http://HOST:PORT')")
        return cls(data.params["target"], config)

    @property
    def url(self) -> str:
        """The server this environment talks to."""
        return self._served.url if self._served is not None else self.target

    # -- copies share the served class, never a client ----------------------------------
    def __deepcopy__(self, memo: dict) -> "OpenEnvEnvironment":
        return type(self)(self.target, EnvironmentConfig(**{**self.config.__dict__,
                                                            "params": dict(self.config.params)}))

    def __getstate__(self) -> dict[str, Any]:
        raise TypeError("an OpenEnvEnvironment holds a live connection; rebuild it from its config "
                        "(OpenEnvEnvironment.from_config(env.config)) instead of pickling it")

    def end_episode(self) -> None:
        """Close this episode's session and give its place on the server back (the rollout
        calls it when the episode ends); the next `reset` opens a new one."""
        self._session.close()

    def close(self) -> None:
        """Close this environment's session; the last copy of a served class stops its server."""
        self._session.close()
        if self._finalizer is not None:
            self._finalizer()  # releases the server once, whether here or at garbage collection

    # -- the environment API ------------------------------------------------------------------
    def _make_client(self) -> Any:
        client_cls = _import_openenv()
        return client_cls(base_url=self.url, message_timeout_s=self._timeout).sync()

    def _connect(self) -> Any:
        """The open session's client (a place is taken and a session opened when there is none)."""
        return self._session.open(self._make_client)

    def _with_words(self, exc: Exception, words: str) -> RuntimeError:
        """The error to raise for `exc` when the server said `words` that `exc` does not show
        (read from a socket it closed)."""
        return RuntimeError(f"{words} [the OpenEnv server at {self.url} closed the connection: {type(exc).__name__}]")

    _schemas: dict[str, dict[str, Any]] = {}  # url -> the action's JSON schema (read once per process)

    def _read_action_format(self, startup: bool = False) -> ActionFormat | None:
        """The action's form (read from the server's /schema once); at startup None when the
        server cannot be reached yet (asked again at the first step). Raises ValueError for an
        action the adapter cannot fill, ConfigError for `constrained_decoding` with nothing to
        constrain."""
        if self.action_format is not None:
            return self.action_format
        schema = self._schemas.get(self.url)
        if schema is None:
            import httpx

            try:
                answer = httpx.get(f"{self.url}/schema", timeout=10)
                answer.raise_for_status()
                schema = answer.json().get("action", {})
            except Exception as exc:  # noqa: BLE001
                if self.action_field is not None and not self.action_json:
                    # a server without a readable /schema: the field the user named carries the text
                    schema = {"properties": {self.action_field: {"type": "string"}}, "required": [self.action_field]}
                elif startup:
                    return None
                else:
                    raise ValueError(f"cannot read the action schema of {self.url}/schema ({exc}); set the env param "
                                     "action_field") from exc
            else:
                self._schemas[self.url] = schema
        form = ActionFormat.from_schema(schema, self.action_field, self.action_json or None)
        if self.constrained_decoding and form.constraint() is None:
            raise ConfigError(f"environment.constrained_decoding is true, but the action of {self.url} is the free "
                              f"text of its field {form.text_field!r}: there is no format to constrain; set it to "
                              "false, or action_json=true to sample the action's JSON")
        self.action_format, self.action_field = form, form.text_field
        return form

    def get_prompt_prefix(self) -> str:
        """The system prompt, and the action's format when the reply is its JSON."""
        base = super().get_prompt_prefix()
        form = self._read_action_format()
        return f"{base}\n\n{form.instructions()}" if form is not None and form.is_json else base

    def action_constraint(self) -> Any:
        """The action's JSON schema (or a text field's allowed values) as a grammar."""
        form = self._read_action_format()
        return form.constraint() if form is not None else None

    def _text(self, observation: Any) -> str:
        if isinstance(observation, str):
            return observation
        if not isinstance(observation, Mapping):
            raise ValueError(f"the OpenEnv observation is a {type(observation).__name__}, not a dict")
        if self.observation_field is not None:
            if self.observation_field not in observation:
                raise ValueError(f"the observation has no field {self.observation_field!r}; its keys are "
                                 f"{sorted(observation)}")
            value = observation[self.observation_field]
            return value if isinstance(value, str) else json.dumps(value)
        for name in OBSERVATION_FIELDS:
            if isinstance(observation.get(name), str):
                return observation[name]
        raise ValueError(f"cannot tell which field of the OpenEnv observation is its text: its keys are "
                         f"{sorted(observation)}; set the env param observation_field (e.g. "
                         "--env-param observation_field=NAME)")

    @property
    def remote(self) -> str:
        """What this environment's calls go to, for messages (a rollout's timeouts name it)."""
        return f"the OpenEnv server at {self.url}"

    @property
    def _timeout(self) -> float:
        """The client's wait for each answer: `step_timeout`, or 60 s when that is 0 or None."""
        return float(self.config.step_timeout or 60.0)

    def _call(self, client: Any, what: str, fn: Any) -> Any:
        """`fn()`, a call of `client` named `what` ("reset", "step", "state"), with what the
        client raises for a silent or broken server turned into errors that name the server and
        the call: `TimeoutError` (the client's own is bare), `ValueError` for an answer that is
        not the protocol's JSON. An error the server sent ("Server error: ...") and a closed
        connection (whose words `server_words` may still read) stay as the client raised them."""
        self._session.unanswered = True
        try:
            result = fn()
        except (TimeoutError, asyncio.TimeoutError):
            raise TimeoutError(f"{self.remote} did not answer {what} within {self._timeout:g} s "
                               "(environment.step_timeout)") from None
        except json.JSONDecodeError as exc:
            raise ValueError(f"{self.remote} answered {what} with text that is not JSON ({exc}): is it an OpenEnv "
                             "server?") from None
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"{self.remote} answered {what} with a message the OpenEnv protocol does not have "
                             f"({type(exc).__name__}: {exc})") from None
        self._session.unanswered = False
        return result

    def _closed_without_words(self, exc: Exception, what: str) -> Exception:
        """The error for a connection the server closed during `what` without words of its own."""
        if "ConnectionClosed" not in type(exc).__name__:
            return exc
        return ConnectionError(f"{self.remote} closed the connection during {what} without saying why "
                               f"({type(exc).__name__}: {exc})")

    def reset(self) -> str:
        """Open a session (or reuse this environment's open one) and reset it. Raises
        `EnvironmentBusy` when the server has no room for it (every place of this process
        taken, or the server refused with its capacity error; nothing stays open), and errors
        that name the server and the call when it does not answer in time (`step_timeout`) or
        answers outside the protocol."""
        seed = self._seed if self._seed is not None else self.rng.getrandbits(31)
        client = None
        try:
            client = self._connect()
            result = self._call(client, "reset", lambda: client.reset(seed=seed))
        except EnvironmentBusy:
            raise
        except Exception as exc:
            words = server_words(client, exc) if client is not None else None
            self._session.close()  # a failed reset holds nothing
            limit = capacity_limit(words or str(exc))
            if limit is not None:
                self.places.refused(limit, words or str(exc))
                raise EnvironmentBusy(f"{words or exc} [the OpenEnv server at {self.url}; this process has "
                                      f"{self.places.open} session(s) open on it]") from None
            if words is not None and words != str(exc):
                raise self._with_words(exc, words) from exc
            if words is None and self._closed_without_words(exc, "reset") is not exc:
                raise self._closed_without_words(exc, "reset") from exc
            raise
        self.last_info = {}
        return self._text(result.observation)

    def step(self, action: str) -> StepResult:
        if self._session.client is None:
            raise RuntimeError(f"the OpenEnv environment at {self.url} has no open session: reset() first "
                               "(end_episode() or close() ended the last one)")
        payload, error = self._read_action_format().parse(action)
        if error is not None:  # a format error: the model reads it, the server never sees the reply
            form = self.action_format
            return (f"That is not a valid action: {error}. {form.instructions()}", 0.0, False,
                    {"invalid_action": True, "parse_error": error})
        client = self._connect()
        try:
            result = self._call(client, "step", lambda: client.step(payload))
        except Exception as exc:
            words = server_words(client, exc)
            if words is not None and words != str(exc):
                raise self._with_words(exc, words) from exc
            if words is None and self._closed_without_words(exc, "step") is not exc:
                raise self._closed_without_words(exc, "step") from exc
            raise
        info: dict[str, Any] = {}
        observation = result.observation
        metadata = observation.get("metadata") if isinstance(observation, Mapping) else None
        if isinstance(metadata, Mapping):
            info.update(metadata)
        try:
            state = self._call(client, "state", client.state)
            info["state"] = state if isinstance(state, dict) else getattr(state, "__dict__", state)
        except Exception as exc:  # noqa: BLE001 - state is extra; the step itself succeeded
            info["state_error"] = f"{type(exc).__name__}: {exc}"
        if "success" not in info and isinstance(info.get("state"), Mapping) and "success" in info["state"]:
            info["success"] = bool(info["state"]["success"])
        self.last_info = info
        reward = 0.0 if result.reward is None else float(result.reward)
        return self._text(observation), reward, bool(result.done), info

    def get_state_description(self) -> str:
        return self.last_observation

    def __repr__(self) -> str:
        return f"OpenEnvEnvironment({self.target!r}, url={self.url!r})"
