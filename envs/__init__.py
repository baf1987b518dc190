"""Example environments and their registry.

    from envs import make_env, list_envs
    env = make_env("guess_number", high=32, seed=0)   # params and config fields as keywords
    obs = env.reset(seed=0)

| name           | task                                          | reply format            |
|----------------|-----------------------------------------------|-------------------------|
| `guess_number` | find a secret number from higher/lower hints  | a single number         |
| `grid`         | walk A to G on a small text grid              | up / down / left / right|
| `wordle`       | find a 5-letter word from G/Y/. marks         | a single 5-letter word  |
| `arithmetic`   | multi-step word problem, calculator tool      | tool call / "Answer: N" |
| `text_game`    | take key, open door, get weapon, beat monster | a short command         |

Every module also has `expert_action(env) -> str`, a scripted player (`EXPERTS`),
handy for demonstrations, SFT warm-up data and tests.
"""
from __future__ import annotations

from typing import Any, Callable, Mapping

from envs import arithmetic, grid, guess_number, text_game, wordle
from envs.arithmetic import ArithmeticEnv
from envs.grid import GridEnv
from envs.guess_number import GuessNumberEnv
from envs.text_game import TextGameEnv
from envs.wordle import WordleEnv
from workbench.config import EnvironmentConfig
from workbench.environment import BaseEnvironment

#: Registered environments by name.
ENVIRONMENTS: dict[str, type] = {
    "guess_number": GuessNumberEnv,
    "grid": GridEnv,
    "wordle": WordleEnv,
    "arithmetic": ArithmeticEnv,
    "text_game": TextGameEnv,
}

#: Scripted expert players by environment name: `EXPERTS[name](env) -> action`.
EXPERTS: dict[str, Callable[[Any], str]] = {
    "guess_number": guess_number.expert_action,
    "grid": grid.expert_action,
    "wordle": wordle.expert_action,
    "arithmetic": arithmetic.expert_action,
    "text_game": text_game.expert_action,
}

_CONFIG_FIELDS = ("name", "max_steps", "seed", "system_prompt")


def list_envs() -> list[str]:
    """Names of the registered environments, sorted."""
    return sorted(ENVIRONMENTS)


def register_env(name: str, cls: type, expert: Callable[[Any], str] | None = None) -> type:
    """Add an environment class (and optionally its expert) to the registry."""
    if not (isinstance(cls, type) and issubclass(cls, BaseEnvironment)):
        raise TypeError(f"register_env: {cls!r} is not a BaseEnvironment subclass")
    ENVIRONMENTS[name] = cls
    if expert is not None:
        EXPERTS[name] = expert
    return cls


def _lookup(name: str) -> type:
    if name not in ENVIRONMENTS:
        raise ValueError(f"unknown environment {name!r}; registered environments: {list_envs()}")
    return ENVIRONMENTS[name]


def make_env(
    name: str,
    config: EnvironmentConfig | Mapping[str, Any] | None = None,
    **params: Any,
) -> BaseEnvironment:
    """Build a registered environment.

    Args:
        name: a name from `list_envs()`.
        config: an `EnvironmentConfig` or dict (its `params` are the base), or None.
        **params: overrides; `max_steps`, `seed` and `system_prompt` set the config
            fields, everything else goes into `params`.

    When neither `config` nor the keywords set `max_steps`, the environment's own
    default is used (e.g. 6 for guess_number).
    """
    cls = _lookup(name)
    if isinstance(config, EnvironmentConfig):
        data: dict[str, Any] = {"name": config.name, "max_steps": config.max_steps, "seed": config.seed,
                                "system_prompt": config.system_prompt, "params": dict(config.params)}
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
    return cls(data)


def get_expert(name: str) -> Callable[[Any], str]:
    """The scripted expert of a registered environment."""
    _lookup(name)
    if name not in EXPERTS:
        raise ValueError(f"environment {name!r} has no scripted expert")
    return EXPERTS[name]


__all__ = [
    "ENVIRONMENTS", "EXPERTS", "make_env", "list_envs", "register_env", "get_expert",
    "ArithmeticEnv", "GridEnv", "GuessNumberEnv", "TextGameEnv", "WordleEnv",
]
