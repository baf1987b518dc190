"""`OpenEnvEnvironment`: an OpenEnv environment server as a workbench environment.

    env = make_env("openenv:http://127.0.0.1:8000")          # a running OpenEnv server
    env = make_env("openenv:my_pkg.server:EchoEnvironment")  # an OpenEnv `Environment` class,
                                                             # served on 127.0.0.1 by the adapter
    obs = env.reset(seed=0)
    obs, reward, done, info = env.step("hello")

OpenEnv (`openenv-core`, tested with 0.3.0) environments are servers: `create_app(Env,
ActionCls, ObservationCls)` serves reset/step/state, and clients hold one WebSocket session
per episode (`GenericEnvClient(base_url).sync()`, plain dicts in and out). This adapter:

  * action: the reply text goes into one field of the action dict, `action_field` (param);
    by default the field is read from the server's `/schema`: the action's only required
    field, else `message` or `text` when the schema has one. `action_json=True` instead
    parses the reply as a JSON object and sends it as the whole action.
  * observation: the text in `observation_field` (param); by default the first of `text`,
    `message`, `prompt`, `content`, `output`, `observation` the observation has, else a
    ValueError naming the observation's keys and the param to set.
  * reward and done come through as they are (a None reward is 0.0); `info` holds the
    observation's `metadata` when the server sends it (OpenEnv 0.3.0 leaves it out of the
    wire format), the environment's `state()` after each step (`info["state"]`, OpenEnv's
    extra state fields included), and `success` from either when they report one.
  * errors: a failed connection, a server error or an invalid action raise from
    `reset`/`step`, which ends that episode only (the rollout records it); the client's
    message timeout is `step_timeout`, so a hung server cannot hold a step longer.
  * `openenv:module:Class`: the class is served on 127.0.0.1 (a uvicorn thread, a free port)
    the first time an environment needs it; every copy of the environment shares that
    server (one session each, `max_sessions` param, default 64; the class must declare
    `SUPPORTS_CONCURRENT_SESSIONS = True` for more than one), and it is stopped when the
    last copy is closed (or garbage-collected). The action and observation classes come
    from the annotations of `Class.step` (or params `action_class` / `observation_class`).
"""
from __future__ import annotations

import json
import socket
import threading
import time
import typing
import weakref
from typing import Any, Mapping

from workbench.config import EnvironmentConfig
from workbench.environment import BaseEnvironment, StepResult
from workbench.imports import import_object

OBSERVATION_FIELDS = ("text", "message", "prompt", "content", "output", "observation")
ACTION_FIELDS = ("message", "text")


def _import_openenv() -> Any:
    try:
        from openenv.core.generic_client import GenericEnvClient
    except ImportError as exc:
        raise ImportError("OpenEnvEnvironment needs openenv-core (tested with 0.3.0): the Makefile installs it "
                          "with `pip install --no-deps openenv-core==0.3.0 fastmcp==4.2.3`") from exc
    return GenericEnvClient


class _Served:
    """An OpenEnv `Environment` class served on 127.0.0.1 by this process, shared by reference count."""

    _lock = threading.Lock()
    _by_spec: dict[str, "_Served"] = {}

    def __init__(self, spec: str, max_sessions: int, action_class: str | None, observation_class: str | None):
        import uvicorn
        from openenv.core.env_server.http_server import create_fastapi_app

        env_cls = import_object(spec)
        hints = typing.get_type_hints(env_cls.step)
        action_cls = import_object(action_class) if action_class else hints.get("action")
        obs_cls = import_object(observation_class) if observation_class else hints.get("return")
        if action_cls is None or obs_cls is None:
            raise ValueError(f"cannot tell the action and observation classes of {spec}: annotate "
                             "`step(self, action: MyAction) -> MyObservation` or set the env params "
                             "action_class / observation_class to 'module:Name'")
        app = create_fastapi_app(env_cls, action_cls, obs_cls, max_concurrent_envs=max_sessions)
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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @classmethod
    def acquire(cls, spec: str, max_sessions: int, action_class: str | None,
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


class OpenEnvEnvironment(BaseEnvironment):
    """An OpenEnv server (URL) or `Environment` class (`module:Class`) behind the workbench API.

    Args:
        target: "http://HOST:PORT" of a running server, or "module:Class" to serve in-process.
        config: `EnvironmentConfig` or dict; params: `action_field`, `action_json`,
            `observation_field`, `max_sessions`, `action_class`, `observation_class`
            (see the module docstring).
    """

    def __init__(self, target: str, config: EnvironmentConfig | Mapping[str, Any] | None = None, **params: Any):
        cfg = EnvironmentConfig.from_dict(dict(config)) if isinstance(config, Mapping) else config
        cfg = cfg if cfg is not None else EnvironmentConfig()
        cfg = EnvironmentConfig(**{**cfg.__dict__, "name": f"openenv:{target}",
                                   "params": {**cfg.params, **params, "target": target}})
        super().__init__(cfg)
        _import_openenv()
        self.target = target
        self.action_field: str | None = self.params.get("action_field")
        self.action_json = bool(self.params.get("action_json", False))
        self.observation_field: str | None = self.params.get("observation_field")
        self._served: _Served | None = None
        self._client: Any = None
        self._finalizer: Any = None
        self.last_info: dict[str, Any] = {}
        if not target.startswith(("http://", "https://")):
            if ":" not in target:
                raise ValueError(f"openenv:{target} is neither a URL (http://HOST:PORT) nor module:Class")
            self._served = _Served.acquire(target, int(self.params.get("max_sessions", 64)),
                                           self.params.get("action_class"), self.params.get("observation_class"))
            self._finalizer = weakref.finalize(self, _Served.release, self._served)

    @classmethod
    def from_config(cls, config: EnvironmentConfig | Mapping[str, Any]) -> "OpenEnvEnvironment":
        """Rebuild from a recorded config: `params["target"]` names the server or class."""
        data = EnvironmentConfig.from_dict(dict(config)) if isinstance(config, Mapping) else config
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

    def close(self) -> None:
        """Close this environment's session; the last copy of a served class stops its server."""
        if self._client is not None:
            try:
                self._client.close()
            except Exception:  # noqa: BLE001 - the server may be gone already
                pass
            self._client = None
        if self._finalizer is not None:
            self._finalizer()  # releases the server once, whether here or at garbage collection

    # -- the environment API ------------------------------------------------------------------
    def _connect(self) -> Any:
        if self._client is None:
            client_cls = _import_openenv()
            timeout = self.config.step_timeout or 60.0
            self._client = client_cls(base_url=self.url, message_timeout_s=float(timeout)).sync()
            self._client.connect()
        return self._client

    def _schema_action_field(self) -> str:
        import httpx

        try:
            schema = httpx.get(f"{self.url}/schema", timeout=10).json().get("action", {})
        except Exception as exc:  # noqa: BLE001
            raise ValueError(f"cannot read the action schema of {self.url}/schema ({exc}); set the env param "
                             "action_field") from exc
        props = [p for p in schema.get("properties", {}) if p != "metadata"]
        required = [p for p in schema.get("required", []) if p != "metadata"]
        if len(required) == 1:
            return required[0]
        for name in ACTION_FIELDS:
            if name in props:
                return name
        raise ValueError(f"cannot tell which action field takes the reply: the action has fields {props}; "
                         "set the env param action_field (e.g. --env-param action_field=NAME) or action_json=true")

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

    def reset(self) -> str:
        client = self._connect()
        seed = self._seed if self._seed is not None else self.rng.getrandbits(31)
        result = client.reset(seed=seed)
        self.last_info = {}
        return self._text(result.observation)

    def _action(self, text: str) -> dict[str, Any]:
        if self.action_json:
            try:
                action = json.loads(text)
            except json.JSONDecodeError as exc:
                raise ValueError(f"action_json is set but the reply is not JSON: {exc}") from None
            if not isinstance(action, dict):
                raise ValueError("action_json is set but the reply is not a JSON object")
            return action
        if self.action_field is None:
            self.action_field = self._schema_action_field()
        return {self.action_field: text}

    def step(self, action: str) -> StepResult:
        client = self._connect()
        result = client.step(self._action(action))
        info: dict[str, Any] = {}
        observation = result.observation
        metadata = observation.get("metadata") if isinstance(observation, Mapping) else None
        if isinstance(metadata, Mapping):
            info.update(metadata)
        try:
            state = client.state()
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
