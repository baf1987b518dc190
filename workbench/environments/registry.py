"""The environment registry: turn a name into an environment, and an environment back
into the name that rebuilds it.

    from workbench import make_env
    make_env("guess_number", high=32)                 # a registered name
    make_env("my_project.envs:MazeEnv", size=7)       # module:Class, no registration needed
    make_env("textarena:GuessTheNumber-v0")           # a single-player TextArena game
    make_env("reasoning_gym:chain_sum", size=1000)    # a reasoning-gym task, scored by its dataset

What a spec can be (first match wins):
  1. `scheme:rest` for a registered scheme: `textarena:<env id>` builds a
     `TextArenaEnvironment`, `reasoning_gym:<dataset>` a `VerifierEnvironment`,
     `openenv:http://HOST:PORT` or `openenv:module:Class` an `OpenEnvEnvironment` (all need
     their optional package). `register_scheme` adds more.
  2. `module:attr` (anything else with a colon): the attribute is imported; a class is
     built with `cls.from_config(config)` when it has one, else `cls(config)`; a function
     is called with the config.
  3. a plain name: one registered with `register_env` in this process, else a
     `workbench.envs` entry point of an installed distribution (this project's example
     games in `envs/` are found this way: `pip install -e .` registers them), else a name
     that `fallback_modules` (none by default) register when imported. A package
     publishes its environments like this in its pyproject.toml:

         [project.entry-points."workbench.envs"]
         maze = "my_project.envs:MazeEnv"

Keyword arguments of `make_env` named like an `EnvironmentConfig` field (`max_steps`,
`seed`, `system_prompt`, ...) set that field; all others go into `config.params`.

`describe_env(env)` is the way back: the `EnvironmentConfig` a run records (the
`Trainer` stores it in `config.environment`), whose `name` rebuilds the environment with
`make_env(config.name, config)` and whose `import_path` says which class it was.
"""
from __future__ import annotations

import copy
import dataclasses
import importlib
import importlib.metadata
from pathlib import Path
from typing import Any, Callable, Mapping

from workbench.config import ConfigError, EnvironmentConfig
from workbench.utils.imports import EnvNotFoundError, import_object, import_path  # noqa: F401 - public here too

#: The entry-point group installed distributions register environments under.
ENTRY_POINT_GROUP = "workbench.envs"

#: Modules imported when a plain name is not found (environments that register themselves
#: on import). None by default: the library never imports an example package by name; the
#: examples in `envs/` are found through their entry points.
FALLBACK_MODULES: tuple[str, ...] = ()

Factory = Callable[..., Any]

_CONFIG_FIELDS = tuple(f.name for f in dataclasses.fields(EnvironmentConfig) if f.name != "params")


def _config_dict(name: str, config: EnvironmentConfig | Mapping[str, Any] | None,
                 params: Mapping[str, Any]) -> dict[str, Any]:
    """Merge `config` and keyword overrides into one dict: config fields + `params`."""
    if isinstance(config, EnvironmentConfig):
        data = dataclasses.asdict(config)
    else:
        data = dict(config or {})
    data["params"] = dict(data.get("params") or {})
    for key in list(data):
        if key not in _CONFIG_FIELDS and key != "params":
            data["params"][key] = data.pop(key)
    for key, value in params.items():
        if key in _CONFIG_FIELDS:
            data[key] = value
        else:
            data["params"][key] = value
    data["name"] = name
    return data


def _build(target: Any, data: dict[str, Any]) -> Any:
    """Build an environment from a class (`from_config` when it has one) or a factory. A
    ValueError or TypeError its constructor raises over the settings it was given (e.g.
    `--env-param high=abc`) becomes an `EnvironmentSettingsError` naming the environment, the
    settings, the error and where it was raised (the original chained as its cause)."""
    try:
        if isinstance(target, type) and callable(getattr(target, "from_config", None)):
            return target.from_config(data)
        return target(data)
    except ConfigError:
        raise
    except (ValueError, TypeError) as exc:
        raise EnvironmentSettingsError(_settings_line(data, exc)) from exc


class EnvironmentSettingsError(ConfigError, TypeError):
    """An environment refused the settings it was built with (its constructor raised a
    ValueError or TypeError, so it is both, and `except` clauses for either still catch it); the
    message names the environment, the settings and the error."""


def _settings_line(data: dict[str, Any], exc: BaseException) -> str:
    import traceback

    frames = traceback.extract_tb(exc.__traceback__)
    where = f" (at {Path(frames[-1].filename).name}:{frames[-1].lineno})" if frames else ""
    given = ", ".join(f"{k}={v!r}" for k, v in (data.get("params") or {}).items()) or "none"
    return (f"environment {data.get('name')!r} refused its settings: {type(exc).__name__}: {exc}{where}; its "
            f"params were {given}: fix --env-param / environment.params")


class EnvRegistry:
    """Names and schemes -> environment factories (see the module docstring).

    Args:
        entry_point_group: entry-point group read for names not registered here.
        fallback_modules: modules imported (once) when a name is not found.
    """

    def __init__(self, entry_point_group: str | None = ENTRY_POINT_GROUP,
                 fallback_modules: tuple[str, ...] = FALLBACK_MODULES):
        self.entry_point_group = entry_point_group
        self.fallback_modules = tuple(fallback_modules)
        self._targets: dict[str, Any] = {}
        self._schemes: dict[str, Factory] = {}
        self._fallbacks_done = False

    # -- registering ------------------------------------------------------------
    def register(self, name: str, target: Any, overwrite: bool = True) -> Any:
        """Register `target` (a class, a factory `fn(config) -> env`, or a
        `module:attr` string imported on first use) under `name`; returns `target`."""
        if not name or ":" in name:
            raise ValueError(f"environment names must be non-empty and without ':' (got {name!r}); "
                             "a colon means module:Class or scheme:id")
        if not (callable(target) or isinstance(target, str)):
            raise TypeError(f"register_env({name!r}, ...): target must be a class, a function or a "
                            f"'module:attr' string, got {type(target).__name__}")
        if not overwrite and name in self._targets and self._targets[name] is not target:
            raise ValueError(f"environment {name!r} is already registered ({self._targets[name]!r})")
        self._targets[name] = target
        return target

    def unregister(self, name: str) -> None:
        """Remove a name registered with `register` (entry points stay)."""
        self._targets.pop(name, None)

    def register_scheme(self, scheme: str, factory: Factory) -> Factory:
        """Make `scheme:rest` specs call `factory(rest, config_dict) -> env`."""
        self._schemes[scheme] = factory
        return factory

    @property
    def schemes(self) -> list[str]:
        """Registered scheme prefixes, sorted."""
        return sorted(self._schemes)

    # -- looking up ---------------------------------------------------------------
    def _entry_points(self) -> dict[str, importlib.metadata.EntryPoint]:
        if not self.entry_point_group:
            return {}
        return {ep.name: ep for ep in importlib.metadata.entry_points(group=self.entry_point_group)}

    def _import_fallbacks(self) -> None:
        if self._fallbacks_done:
            return
        self._fallbacks_done = True
        for module in self.fallback_modules:
            try:
                importlib.import_module(module)
            except ImportError:
                pass  # not in this checkout / installation: nothing to register

    def list(self) -> list[str]:
        """Every plain name: registered, from entry points, from the fallback modules."""
        self._import_fallbacks()
        return sorted(set(self._targets) | set(self._entry_points()))

    def _named(self, name: str) -> Any:
        for attempt in range(2):
            if name in self._targets:
                target = self._targets[name]
                if isinstance(target, str):
                    target = self._targets[name] = import_object(target)
                return target
            eps = self._entry_points()
            if name in eps:
                try:
                    return eps[name].load()
                except Exception as exc:
                    dist = getattr(eps[name].dist, "name", "?")
                    raise EnvNotFoundError(f"entry point {name!r} = {eps[name].value!r} of the installed "
                                           f"package {dist!r} failed to load: {exc}") from exc
            if attempt == 0:
                self._import_fallbacks()
        raise EnvNotFoundError(
            f"unknown environment {name!r}; registered environments: {self.list()}. Other forms: "
            f"module:Class (e.g. my_envs:MazeEnv), or {', '.join(s + ':<id>' for s in self.schemes)}.")

    def resolve(self, spec: str) -> Any:
        """What `spec` builds: the class or factory (for a scheme, the factory)."""
        if not isinstance(spec, str) or not spec:
            raise EnvNotFoundError(f"an environment spec is a non-empty str, got {spec!r}")
        scheme, sep, rest = spec.partition(":")
        if sep and scheme in self._schemes:
            return self._schemes[scheme]
        if sep:
            return import_object(spec)
        return self._named(spec)

    def make(self, spec: str, config: EnvironmentConfig | Mapping[str, Any] | None = None,
             **params: Any) -> Any:
        """Build the environment `spec` names (see the module docstring).

        Args:
            spec: a registered name, `module:Class`, or `scheme:id`.
            config: an `EnvironmentConfig` or dict (its `params` are the base), or None.
            **params: overrides; config field names set the field, the rest go to `params`.
        """
        data = _config_dict(spec, config, params)
        scheme, sep, rest = spec.partition(":") if isinstance(spec, str) else ("", "", "")
        if sep and scheme in self._schemes:
            return self._schemes[scheme](rest, data)
        target = self.resolve(spec)
        if not callable(target):
            raise EnvNotFoundError(f"{spec!r} is a {type(target).__name__}, not an environment class "
                                   "or factory")
        return _build(target, data)

    # -- the way back -------------------------------------------------------------
    def spec_of(self, env: Any) -> str:
        """The spec that rebuilds `env`: its `config.name` when that names `type(env)`
        (or a factory / scheme), else `module:Class` of its type."""
        name = getattr(getattr(env, "config", None), "name", None)
        if isinstance(name, str) and name:
            try:
                target = self.resolve(name)
            except Exception:  # not resolvable here: record the class instead
                target = None
            if target is type(env) or (target is not None and not isinstance(target, type)):
                return name
        return import_path(type(env))

    def describe(self, env: Any) -> EnvironmentConfig:
        """The `EnvironmentConfig` that records `env`: `name` = `spec_of(env)`,
        `import_path` = its class, and its own config's fields and params."""
        own = getattr(env, "config", None)
        fields = {f: getattr(own, f) for f in _CONFIG_FIELDS if own is not None and hasattr(own, f)}
        fields.update(name=self.spec_of(env), import_path=import_path(type(env)))
        if getattr(env, "max_steps", None):
            fields["max_steps"] = int(env.max_steps)
        params = dict(getattr(own, "params", None) or {})
        return EnvironmentConfig(**fields, params=params)


#: The process-wide registry that `make_env`, the CLI and the Trainer use.
REGISTRY = EnvRegistry()


def register_env(name: str, target: Any, overwrite: bool = True) -> Any:
    """Register an environment class / factory / 'module:attr' under `name` (see `EnvRegistry.register`)."""
    return REGISTRY.register(name, target, overwrite=overwrite)


def make_env(spec: str, config: EnvironmentConfig | Mapping[str, Any] | None = None, **params: Any) -> Any:
    """Build an environment from a name, `module:Class` or `scheme:id` (see the module docstring)."""
    return REGISTRY.make(spec, config, **params)


def list_envs() -> list[str]:
    """Plain environment names known to this process (registered, entry points, fallbacks)."""
    return REGISTRY.list()


def describe_env(env: Any) -> EnvironmentConfig:
    """The `EnvironmentConfig` that records and rebuilds `env` (see `EnvRegistry.describe`)."""
    return REGISTRY.describe(env)


def make_environment(environment: Any) -> Any:
    """One episode's environment from what a run was given: `environment()` for a
    zero-argument factory, else a deep copy of the prototype instance."""
    if callable(environment) and not hasattr(environment, "step"):
        return environment()
    return copy.deepcopy(environment)


#: `EnvironmentConfig` fields that belong to the run, not to the environment object: the
#: config's value is what runs, whatever the environment object's own config says.
RUN_LEVEL_FIELDS = ("step_timeout",)


class ConfigOverrideWarning(UserWarning):
    """A setting written in the config differs from the environment object the run was given."""


def record_environment(config: EnvironmentConfig, env: Any) -> EnvironmentConfig:
    """The `environment` config section of a run that plays `env`: what `describe_env(env)`
    records (the name that rebuilds it, its class, its own settings and params), with the
    run-level fields (`RUN_LEVEL_FIELDS`, e.g. `step_timeout`) kept from `config`.

    A field that `config` set (differs from the `EnvironmentConfig` default) to a value the
    environment object contradicts is not replaced in silence: a `ConfigOverrideWarning`
    names both values and says which one runs (the environment's: it was built with it).
    """
    import warnings

    recorded = describe_env(env)
    default = EnvironmentConfig()
    for f in dataclasses.fields(EnvironmentConfig):
        if f.name in ("import_path",):
            continue
        mine, theirs = getattr(config, f.name), getattr(recorded, f.name)
        if f.name in RUN_LEVEL_FIELDS:
            setattr(recorded, f.name, mine)
        elif mine != getattr(default, f.name) and _conflict(f.name, mine, theirs, env):
            warnings.warn(f"config.environment.{f.name} is {mine!r} but the environment object given to the "
                          f"trainer ({type(env).__name__}) has {theirs!r}; the environment's value runs and is "
                          f"recorded. Build the environment from the config (make_env(config.environment.name, "
                          f"config.environment)) or change the config to match.", ConfigOverrideWarning,
                          stacklevel=3)
    return recorded


def _conflict(name: str, mine: Any, theirs: Any, env: Any) -> bool:
    """Whether the config's value `mine` of field `name` contradicts the environment's."""
    if name == "params":  # the environment may add params of its own (defaults, an env id)
        return any(key not in theirs or theirs[key] != value for key, value in mine.items())
    if name == "name":  # "guess_number" may be recorded as itself or as its module:Class
        return mine != theirs and not _same_target(mine, env)
    return mine != theirs


def _same_target(spec: str, env: Any) -> bool:
    """Whether `spec` names the class of `env` (so recording its module:Class changes nothing)."""
    try:
        return REGISTRY.resolve(spec) is type(env)
    except Exception:  # noqa: BLE001 - an unresolvable name is simply not the same
        return False


def _textarena(env_id: str, data: dict[str, Any]) -> Any:
    from workbench.environments.adapters.textarena import TextArenaEnvironment

    return TextArenaEnvironment.from_config({**data, "params": {**data["params"], "env_id": env_id}})


def _reasoning_gym(dataset: str, data: dict[str, Any]) -> Any:
    from workbench.environments.adapters.verifier import VerifierEnvironment

    return VerifierEnvironment.from_reasoning_gym(dataset, config=data)


def _openenv(target: str, data: dict[str, Any]) -> Any:
    from workbench.environments.adapters.openenv_env import OpenEnvEnvironment

    return OpenEnvEnvironment(target, data)


REGISTRY.register_scheme("textarena", _textarena)
REGISTRY.register_scheme("openenv", _openenv)
REGISTRY.register_scheme("reasoning_gym", _reasoning_gym)
