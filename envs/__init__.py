"""Example environments. Importing this package registers them in the workbench
environment registry (`workbench.environments.registry`), which also finds them through the
`workbench.envs` entry points when the project is installed.

    from envs import make_env, list_envs              # = workbench.make_env / list_envs
    env = make_env("guess_number", high=32, seed=0)   # params and config fields as keywords
    obs = env.reset(seed=0)

| name           | task                                          | reply format            |
|----------------|-----------------------------------------------|-------------------------|
| `guess_number` | find a secret number from higher/lower hints  | a single number         |
| `grid`         | walk A to G on a small text grid              | up / down / left / right|
| `wordle`       | find a 5-letter word from G/Y/. marks         | a single 5-letter word  |
| `arithmetic`   | multi-step word problem, calculator tool      | tool call / "Answer: N" |
| `text_game`    | take key, open door, get weapon, beat monster | a short command         |

The reply formats are read leniently by default ("I guess 8" is a guess of 8). With
`strict_format=True` (`make_env("guess_number", strict_format=True)`, or
`environment.strict_format: true` in a run's config) only a reply that is exactly the
format counts (whitespace around it allowed): anything else is a format error the model
reads as the observation, costing the turn but no guess or move (see `envs/_common.py`
and each module's docstring).

Every module also has `expert_action(env) -> str`, a scripted player (`EXPERTS`),
handy for demonstrations, SFT warm-up data and tests. The experts' replies are exactly
the format, so they play strict environments without a format error.
"""
from __future__ import annotations

from typing import Any, Callable

from envs import arithmetic, grid, guess_number, text_game, wordle
from envs.arithmetic import ArithmeticEnv
from envs.grid import GridEnv
from envs.guess_number import GuessNumberEnv
from envs.text_game import TextGameEnv
from envs.wordle import WordleEnv
from workbench.environments.base import BaseEnvironment
from workbench.environments.registry import list_envs, make_env
from workbench.environments.registry import register_env as _register

#: The example environments by name (each also registered in `workbench.environments.registry`).
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

for _name, _cls in ENVIRONMENTS.items():
    _register(_name, _cls)


def register_env(name: str, cls: type, expert: Callable[[Any], str] | None = None) -> type:
    """Register an environment class (and optionally its scripted expert) under `name`,
    here and in the workbench registry (so `make_env`, `--env name` and the Trainer find it)."""
    if not (isinstance(cls, type) and issubclass(cls, BaseEnvironment)):
        raise TypeError(f"register_env: {cls!r} is not a BaseEnvironment subclass")
    _register(name, cls)
    ENVIRONMENTS[name] = cls
    if expert is not None:
        EXPERTS[name] = expert
    return cls


def get_expert(name: str) -> Callable[[Any], str]:
    """The scripted expert of an example environment."""
    if name not in EXPERTS:
        raise ValueError(f"environment {name!r} has no scripted expert")
    return EXPERTS[name]


__all__ = [
    "ENVIRONMENTS", "EXPERTS", "make_env", "list_envs", "register_env", "get_expert",
    "ArithmeticEnv", "GridEnv", "GuessNumberEnv", "TextGameEnv", "WordleEnv",
]
