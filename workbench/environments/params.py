"""Settings written as KEY=VALUE on a command line (`--env-param`, `--reward-param`), and
the environment fields they may set.

    parse_key_values(["high=32", "name=x"], "--env-param", "high=32")  # {"high": 32, "name": "x"}
    apply_env_params(config, ["high=32", "max_steps=6"])  # params["high"] = 32, max_steps = 6

Each value is read as YAML (32 -> int, true -> bool). The CLI and `workbench export-verl`
use these, so a flag means the same on both.
"""
from __future__ import annotations

import dataclasses
from typing import Any, Sequence

from workbench.config import ConfigError, ConfigStore


def parse_key_values(pairs: Sequence[str], flag: str, example: str) -> dict[str, Any]:
    """`["a=1", "b=x"]` -> {"a": 1, "b": "x"}: each value is read as YAML."""
    import yaml

    values: dict[str, Any] = {}
    for pair in pairs:
        key, sep, value = pair.partition("=")
        if not sep or not key.strip():
            raise ConfigError(f"{flag} {pair!r}: write it as KEY=VALUE, e.g. {flag} {example}")
        try:
            values[key.strip()] = yaml.safe_load(value) if value.strip() else ""
        except yaml.YAMLError:
            values[key.strip()] = value
    return values


def parse_env_params(pairs: Sequence[str]) -> dict[str, Any]:
    """`["high=32", "name=x"]` -> {"high": 32, "name": "x"}: each value is read as YAML."""
    return parse_key_values(pairs, "--env-param", "high=32")


def apply_env_params(config: ConfigStore, env_params: Sequence[str]) -> ConfigStore:
    """Add `--env-param`s to `config.environment.params` and check that every
    comma-separated `--env` spec resolves (ConfigError saying what is wrong otherwise)."""
    from workbench.environments.registry import REGISTRY

    params = parse_env_params(env_params)
    fields = {f.name for f in dataclasses.fields(config.environment)} - {"name", "params", "import_path"}
    for key in sorted(fields & set(params)):  # max_steps, system_prompt, seed, ...: EnvironmentConfig fields
        setattr(config.environment, key, params.pop(key))
    config.environment.params = {**config.environment.params, **params}
    for spec in config.environment.name.split(","):
        try:
            REGISTRY.resolve(spec.strip())
        except ValueError as exc:
            raise ConfigError(f"--env {spec.strip()}: {exc}") from exc
    return config


#: The older name of `apply_env_params`.
resolve_env_args = apply_env_params
