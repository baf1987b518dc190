"""Wordle: find the secret 5-letter word in 6 guesses from per-letter feedback.

The secret is drawn (with `self.rng`) from the bundled list `envs/data/words.txt`
(about 500 common English 5-letter words). After each guess the observation shows
the guess and one mark per letter:

    CRANE  G Y . . G   (5 guesses left)

G = right letter in the right spot, Y = in the word but elsewhere, . = not in the
word (repeated letters are marked like the real game: greens first, then yellows
up to the number of times the letter occurs in the secret).

Action: any text. The guess is the first 5-letter word of the reply that is in the
word list, preferring a word written in CAPITALS, then one that is not a chat filler
word ("I think the word is CRANE" -> CRANE). `info["action_span"]` is where that word is.

Strict format (`environment.strict_format=true`): the reply must be a single 5-letter
word (letters only, any case, whitespace around it allowed); "I think CRANE" or
"crane." is a format error (`invalid_reward`, `info` has `invalid_action` and
`parse_error`), which, like an invalid guess, uses a step but not a guess.

Invalid guesses (no 5-letter word, or not in the list, unless `allow_any_word`) give
`invalid_reward` (-0.1) and `info["invalid_action"] = True` and do NOT use up one of
the `max_guesses` (6) guesses, but they do use a step of `max_steps` (default 10),
so a model that only babbles still ends its episode.

Rewards: `win_reward` (1.0) for finding the word (`info["success"] = True`), minus
nothing for a valid miss unless `step_penalty` is set (default 0.0).
"""
from __future__ import annotations

import math
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import re

from envs._common import ParamsEnvironment, strict_span, word_spans
from workbench.engines.constraints import Constraint
from workbench.environments.base import StepResult

WORDS_PATH = Path(__file__).parent / "data" / "words.txt"
_FIVE_LETTERS_RE = re.compile(r"[A-Za-z]{5}")

#: Words a chatty model writes around its guess; they are only picked as the guess
#: when nothing else in the reply is a valid word.
FILLER = frozenset(
    "guess think maybe which there their would could about after these those where "
    "while first every right again might other whose start letter".split()
)


@lru_cache(maxsize=None)
def load_words(path: str | None = None) -> tuple[str, ...]:
    """The bundled word list (lower case, one word a line), or another file's."""
    text = Path(path or WORDS_PATH).read_text()
    out = [w.strip().lower() for w in text.split()]
    return tuple(w for w in out if len(w) == 5 and w.isalpha())


def score_guess(guess: str, secret: str) -> str:
    """Feedback marks for `guess` against `secret`, e.g. "GY..G"."""
    marks = ["."] * 5
    left = Counter()
    for i, (g, s) in enumerate(zip(guess, secret)):
        if g == s:
            marks[i] = "G"
        else:
            left[s] += 1
    for i, g in enumerate(guess):
        if marks[i] != "G" and left[g] > 0:
            marks[i] = "Y"
            left[g] -= 1
    return "".join(marks)


class WordleEnv(ParamsEnvironment):
    """Guess a secret 5-letter word with G/Y/. feedback."""

    NAME = "wordle"
    DEFAULT_MAX_STEPS = 10
    supports_strict_format = True
    DEFAULT_PARAMS: dict[str, Any] = {
        "max_guesses": 6,         # valid guesses allowed
        "win_reward": 1.0,        # reward for finding the word
        "step_penalty": 0.0,      # subtracted for each valid wrong guess
        "invalid_reward": -0.1,   # reward for an unusable reply
        "allow_any_word": False,  # accept any 5 letters, not only listed words
        "word_list": None,        # path of another word list (one word a line)
    }

    def __init__(self, config=None):
        super().__init__(config)
        self.words = load_words(self.params["word_list"])
        self._word_set = frozenset(self.words)
        self.max_guesses = int(self.params["max_guesses"])
        self.secret = self.words[0]
        self.history: list[tuple[str, str]] = []  # (guess, marks)

    def default_prompt(self) -> str:
        return (
            "You are playing Wordle. Guess the secret 5-letter English word. After each "
            "guess you get one mark per letter: G = right letter in the right spot, "
            "Y = letter is in the word but in another spot, . = letter is not in the word. "
            "Reply with a single 5-letter word" + (", and nothing else." if self.strict_format else ".")
        )

    def reset(self) -> str:
        """Draw a new secret word."""
        self.secret = self.rng.choice(self.words)
        self.history = []
        return (
            f"Guess the secret 5-letter word. You have {self.max_guesses} guesses. "
            "Marks: G = right spot, Y = wrong spot, . = not in word."
        )

    def parse_guess(self, action: str) -> tuple[str | None, str]:
        """(guess, "") or (None, reason) for a reply; see the module docstring."""
        guess, reason, _ = self.parse_guess_span(action)
        return guess, reason

    def parse_guess_span(self, action: str) -> tuple[str | None, str, list[int] | None]:
        """`parse_guess` plus the [start, end] of the word that became the guess (None if none)."""
        five = [(w, a, b) for w, a, b in word_spans(action) if len(w) == 5]
        listed = [x for x in five if x[0].lower() in self._word_set]
        for pool in ([x for x in listed if x[0].isupper()],
                     [x for x in listed if x[0].lower() not in FILLER],
                     listed):
            if pool:
                return pool[0][0].lower(), "", [pool[0][1], pool[0][2]]
        if five and self.params["allow_any_word"]:
            return five[0][0].lower(), "", [five[0][1], five[0][2]]
        if five:
            return None, f"{five[0][0].upper()} is not in the word list.", None
        return None, "No 5-letter word found.", None

    def action_constraint(self) -> Constraint:
        """One 5-letter word as a grammar (`environment.constrained_decoding`)."""
        return Constraint.regex("[A-Za-z]{5}")

    def step(self, action: str) -> StepResult:
        """Score one guess; see the module docstring for the rewards."""
        left = self.max_guesses - len(self.history)
        if self.strict_format and not _FIVE_LETTERS_RE.fullmatch(strict_span(action)[0]):
            return self.format_error("the reply is not a single 5-letter word",
                                     f"Reply with only the 5-letter word. No guess was counted. "
                                     f"({left} guesses left)")
        guess, reason, span = self.parse_guess_span(action)
        if guess is None:
            obs = f"{reason} Reply with a single 5-letter word. ({left} guesses left)"
            return obs, float(self.params["invalid_reward"]), False, {"invalid_action": True}
        marks = score_guess(guess, self.secret)
        self.history.append((guess, marks))
        left -= 1
        line = f"{guess.upper()}  {' '.join(marks)}"
        info: dict[str, Any] = {"guess": guess, "marks": marks, "success": False, "action_span": span}
        if guess == self.secret:
            info["success"] = True
            self._done = True
            return f"{line}  Solved! The word was {self.secret.upper()}.", float(self.params["win_reward"]), True, info
        reward = -float(self.params["step_penalty"]) or 0.0
        if left <= 0:
            self._done = True
            return f"{line}  Out of guesses. The word was {self.secret.upper()}.", reward, True, info
        return f"{line}   ({left} guesses left)", reward, False, info

    def get_state_description(self) -> str:
        """The board so far, one guess per line."""
        lines = [f"{g.upper()}  {' '.join(m)}" for g, m in self.history]
        lines.append(f"{self.max_guesses - len(self.history)} guesses left.")
        return "\n".join(lines)


def _best_guess(candidates: list[str], pool: list[str]) -> str:
    """The guess from `pool` whose feedback splits `candidates` most evenly (max entropy)."""
    best, best_key = candidates[0], None
    n = len(candidates)
    cand_set = set(candidates)
    for guess in pool:
        counts = Counter(score_guess(guess, secret) for secret in candidates)
        entropy = -sum(c / n * math.log(c / n) for c in counts.values())
        key = (entropy, guess in cand_set)
        if best_key is None or key > best_key:
            best, best_key = guess, key
    return best

    def expert_action(self) -> str:
        """The scripted expert's reply in the current state (`expert_action` below): what
        SFT warm-up learns from (`workbench.training.sft`)."""
        return expert_action(self)


def expert_action(env: WordleEnv) -> str:
    """Constraint filtering: keep the words consistent with every mark so far, then
    play the guess that splits them best (an entropy heuristic; "slate" opens)."""
    candidates = [w for w in env.words
                  if all(score_guess(g, w) == m for g, m in env.history)]
    if not env.history and "slate" in env._word_set:
        return "SLATE"
    if not candidates:  # only possible with allow_any_word and a secret off the list
        return env.words[0].upper()
    if len(candidates) <= 2:
        return candidates[0].upper()
    pool = list(env.words) if len(candidates) <= 20 else candidates
    return _best_guess(candidates, pool).upper()
