"""Shared pieces of the example environments: default-aware config handling, lenient
action parsing, and the strict format mode.

A 135M model is sloppy: it writes "I guess 8!" instead of "8", "Go UP." instead of
"up". The parsers here pull the first integer / direction / word out of free text so
the environments reward the decision, not the formatting. Everything is pure
functions on strings, easy to test.

Lenient parsing can be exploited: a policy that answers "You have 4 guesses left." is
read as guessing 4. With `environment.strict_format` (`env.strict_format`) every example
environment takes only a reply that is exactly its action, whitespace around it allowed
(`strict_span`), and answers anything else with `ParamsEnvironment.format_error`: an
observation saying what to write, `invalid_reward`, `info["invalid_action"]` and
`info["parse_error"]`. A format error costs the turn (the step counts toward
`max_steps`, so a babbling policy still ends its episode) and changes nothing else: no
guess is recorded, the agent does not move.
"""
from __future__ import annotations

import re
from typing import Any, Mapping

from workbench.config import EnvironmentConfig
from workbench.environments.base import BaseEnvironment, StepResult

_INT_RE = re.compile(r"-?\d+")
_WORD_RE = re.compile(r"[A-Za-z]+")

#: Direction words and their synonyms, mapped to the canonical action.
DIRECTIONS: dict[str, str] = {
    "up": "up", "north": "up", "n": "up",
    "down": "down", "south": "down", "s": "down",
    "left": "left", "west": "left", "w": "left",
    "right": "right", "east": "right", "e": "right",
}
_LONG_DIRECTION_RE = re.compile(r"\b(up|down|left|right|north|south|east|west)\b", re.IGNORECASE)


def first_int(text: str) -> int | None:
    """The first integer written in `text` ("I guess 8." -> 8), or None."""
    match = _INT_RE.search(text or "")
    return int(match.group()) if match else None


def first_number_span(text: str) -> tuple[int | None, list[int] | None]:
    """(value, [start, end]) of what `first_number` reads in `text`, or (None, None).

    The span is the characters of `text` the number came from, so a caller can put it
    in `info["action_span"]` ("I guess 8." -> (8, [8, 9])).
    """
    text = text or ""
    match = _INT_RE.search(text)
    if match:
        return int(match.group()), [match.start(), match.end()]
    match = _NUMBER_WORD_RE.search(text)
    if match:
        return NUMBER_WORDS[match.group(1).lower()], [match.start(1), match.end(1)]
    return None, None


NUMBER_WORDS = {w: i for i, w in enumerate(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen "
    "fifteen sixteen seventeen eighteen nineteen twenty".split())}
_NUMBER_WORD_RE = re.compile(r"\b(" + "|".join(NUMBER_WORDS) + r")\b", re.IGNORECASE)


def first_number(text: str) -> int | None:
    """Like `first_int`, but a reply without digits may spell the number ("eight" -> 8)."""
    value = first_int(text)
    if value is None:
        match = _NUMBER_WORD_RE.search(text or "")
        value = NUMBER_WORDS[match.group(1).lower()] if match else None
    return value


def find_direction(text: str) -> str | None:
    """The first direction word anywhere in `text`, as up/down/left/right, or None.

    Accepts up/down/left/right and north/south/west/east in any case; a reply that is
    only a single letter (u/d/l/r/n/s/w/e) is accepted too.
    """
    return find_direction_span(text)[0]


def find_direction_span(text: str) -> tuple[str | None, list[int] | None]:
    """(direction, [start, end]) of what `find_direction` reads in `text`, or (None, None)."""
    text = text or ""
    match = _LONG_DIRECTION_RE.search(text)
    if match:
        return DIRECTIONS[match.group(1).lower()], [match.start(1), match.end(1)]
    stripped = text.strip()
    bare = stripped.strip(".!").lower()
    single = {"u": "up", "d": "down", "l": "left", "r": "right"}
    move = single.get(bare) or DIRECTIONS.get(bare)
    if move is None:
        return None, None
    start = text.index(stripped) + (len(stripped) - len(stripped.lstrip(".!")))
    return move, [start, start + len(bare)]


def strict_span(text: str) -> tuple[str, list[int]]:
    """(the reply without the whitespace around it, its [start, end] in `text`): what a
    strict-format environment holds against its action format ("  8\n" -> ("8", [2, 3]))."""
    text = text or ""
    stripped = text.strip()
    start = len(text) - len(text.lstrip()) if stripped else 0
    return stripped, [start, start + len(stripped)]


def word_spans(text: str) -> list[tuple[str, int, int]]:
    """(word, start, end) for each alphabetic word of `text`, in order (what `words` reads)."""
    return [(m.group(), m.start(), m.end()) for m in _WORD_RE.finditer(text or "")]


def words(text: str) -> list[str]:
    """Alphabetic words of `text`, in order, as written (case kept)."""
    return _WORD_RE.findall(text or "")


class ParamsEnvironment(BaseEnvironment):
    """A `BaseEnvironment` with per-class defaults for `max_steps` and `params`.

    Subclasses set `DEFAULT_PARAMS` and `DEFAULT_MAX_STEPS`. When the config does not
    say `max_steps` (config is None, or a dict without the key), the class default is
    used; an `EnvironmentConfig` object is taken as given. Unknown params raise a
    ValueError that lists the valid ones, so typos fail loudly.
    """

    #: Every example environment says `info["success"]` (True or False) on each step it scores.
    reports_success = True

    #: Name the environment is registered under in `envs.ENVIRONMENTS`.
    NAME: str = ""
    #: Default `params`; user params override these keys.
    DEFAULT_PARAMS: dict[str, Any] = {}
    #: `max_steps` used when the config does not set it.
    DEFAULT_MAX_STEPS: int = 10

    def __init__(self, config: EnvironmentConfig | Mapping[str, Any] | None = None):
        if config is None:
            config = EnvironmentConfig(name=self.NAME, max_steps=self.DEFAULT_MAX_STEPS)
        elif isinstance(config, Mapping) and "max_steps" not in config:
            config = {"name": self.NAME, **config, "max_steps": self.DEFAULT_MAX_STEPS}
        super().__init__(config)
        unknown = set(self.config.params) - set(self.DEFAULT_PARAMS)
        if unknown:
            raise ValueError(
                f"{type(self).__name__}: unknown params {sorted(unknown)}; "
                f"valid params: {sorted(self.DEFAULT_PARAMS)}"
            )
        self.params = {**self.DEFAULT_PARAMS, **self.config.params}

    def default_prompt(self) -> str:
        """The environment's own system prompt; override in subclasses."""
        return "You are a helpful assistant."

    def format_error(self, why: str, what_to_write: str, after: str = "") -> StepResult:
        """The step result of a strict-format refusal: observation "Format error: `why`.
        `what_to_write`" (then `after`), reward `params["invalid_reward"]`, not done, info
        `invalid_action` and `parse_error` ("strict format: `why`")."""
        obs = f"Format error: {why}. {what_to_write}{after}"
        return obs, float(self.params["invalid_reward"]), False, {"invalid_action": True,
                                                                   "parse_error": f"strict format: {why}"}

    def get_prompt_prefix(self) -> str:
        """`config.system_prompt` when set, else the environment's own prompt."""
        return self.config.system_prompt or self.default_prompt()
