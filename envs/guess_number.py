"""Guess the number: the main learning environment.

The environment picks a secret integer in [low, high] (default 1..16) and the model
guesses; after each guess it answers "higher" or "lower". Binary search needs at most
ceil(log2(16)) + 1 = 5 guesses, and the default budget is 6, so a policy that learns
to halve the range always wins. Observations are one short line each and the reply
format is "a single number", so a 135M model can start learning at once.

Action: any text; the first integer in it is the guess ("I guess 8" -> 8); a reply
without digits may spell it ("eight"). `info["action_span"]` is the [start, end] of the
characters the guess was read from.

Strict format (`environment.strict_format=true`): the reply must be a bare integer
("8", whitespace around it allowed). Anything else ("I guess 8", "8.", "eight", "You
have 4 guesses left.") is a format error: the observation says to reply with the number
alone, the reward is `invalid_reward`, `info` has `invalid_action` and `parse_error`. It
costs the turn (one of the `max_steps` guesses' steps) but records no guess and leaves
the range as it was.

Constrained decoding (`environment.constrained_decoding=true`): every reply is sampled under
the bare-number grammar (`action_constraint`: an optional minus when `low` < 0, then at most as
many digits as the widest bound), so even the untrained model replies in the strict format.

Rewards (defaults in `GuessNumberEnv.DEFAULT_PARAMS`):
  * correct guess: `success_reward` (1.0). With `scale_by_remaining=True` it is
    scaled by the share of the budget left, `success_reward * (max_steps - steps_used
    + 1) / max_steps`, so a first-guess win earns 1.0 and a last-guess win
    1/max_steps.
  * wrong guess: `-step_penalty` (-0.05).
  * no number, or a number outside [low, high]: `invalid_reward` (-0.1),
    `info["invalid_action"] = True`; the episode goes on (the step still counts).

Example:
    >>> env = GuessNumberEnv(); env.reset(seed=0)
    'Guess the secret number between 1 and 16. You have 6 guesses.'
"""
from __future__ import annotations

from typing import Any

import re

from envs._common import ParamsEnvironment, first_number_span, strict_span
from workbench.engines.constraints import Constraint
from workbench.environments.base import StepResult

_BARE_INT_RE = re.compile(r"-?\d+")


class GuessNumberEnv(ParamsEnvironment):
    """Guess a secret integer in [low, high] from "higher"/"lower" feedback.

    Public state (what the model can know): `lo`, `hi`, the range still possible
    given the feedback so far, and `guesses`. Hidden state: `secret`.
    """

    NAME = "guess_number"
    DEFAULT_MAX_STEPS = 6
    supports_strict_format = True
    DEFAULT_PARAMS: dict[str, Any] = {
        "low": 1,                     # smallest possible secret
        "high": 16,                   # largest possible secret
        "success_reward": 1.0,        # reward for the correct guess
        "step_penalty": 0.05,         # subtracted for each wrong guess
        "invalid_reward": -0.1,       # reward for a reply with no usable number
        "scale_by_remaining": False,  # scale success_reward by the budget left
    }

    def __init__(self, config=None):
        super().__init__(config)
        low, high = int(self.params["low"]), int(self.params["high"])
        if low > high:
            raise ValueError(f"guess_number: params low ({low}) must be <= high ({high})")
        self.low, self.high = low, high
        self.secret = low
        self.lo, self.hi = low, high
        self.guesses: list[int] = []

    def default_prompt(self) -> str:
        return (
            f"You are playing a number guessing game. I picked a secret whole number "
            f"between {self.low} and {self.high}. After each guess I tell you if the "
            f"secret is higher or lower. "
            + ("Reply with the number only, nothing else." if self.strict_format else "Reply with a single number.")
        )

    def reset(self) -> str:
        """Draw a new secret from `self.rng` and return the opening line."""
        self.secret = self.rng.randint(self.low, self.high)
        self.lo, self.hi = self.low, self.high
        self.guesses = []
        return (
            f"Guess the secret number between {self.low} and {self.high}. "
            f"You have {self.max_steps} guesses."
        )

    def step(self, action: str) -> StepResult:
        """Score one guess; see the module docstring for the rewards."""
        left = self.max_steps - self.step_count - 1  # guesses left after this one
        reveal = f" Out of guesses. The number was {self.secret}." if left <= 0 else ""
        if self.strict_format:
            bare, span = strict_span(action)
            if not _BARE_INT_RE.fullmatch(bare):
                return self.format_error(
                    "the reply is not a bare number",
                    f"Reply with only a number between {self.low} and {self.high}, and nothing else. "
                    "No guess was counted.", reveal)
            guess: int | None = int(bare)
        else:
            guess, span = first_number_span(action)
        if guess is None or not self.low <= guess <= self.high:
            why = "No number found" if guess is None else f"{guess} is out of range"
            obs = f"{why}. Reply with a single number between {self.low} and {self.high}.{reveal}"
            info = {"invalid_action": True} if span is None else {"invalid_action": True, "action_span": span}
            return obs, float(self.params["invalid_reward"]), False, info

        self.guesses.append(guess)
        info: dict[str, Any] = {"guess": guess, "success": False, "action_span": span}
        if guess == self.secret:
            reward = float(self.params["success_reward"])
            if self.params["scale_by_remaining"]:
                reward *= (left + 1) / self.max_steps
            info["success"] = True
            self._done = True
            return f"Correct! The number was {self.secret}.", reward, True, info
        if guess < self.secret:
            self.lo = max(self.lo, guess + 1)
            hint = f"{guess} is too low. Guess higher."
        else:
            self.hi = min(self.hi, guess - 1)
            hint = f"{guess} is too high. Guess lower."
        return hint + reveal, -float(self.params["step_penalty"]), False, info

    def action_constraint(self) -> Constraint:
        """The bare-number reply as a grammar (`environment.constrained_decoding`): an optional
        minus and at most as many digits as the range's widest bound, what the strict format
        takes (the range itself is the game's to judge)."""
        digits = max(len(str(abs(self.low))), len(str(abs(self.high))))
        return Constraint.regex(("-?" if self.low < 0 else "") + f"[0-9]{{1,{digits}}}")

    def get_state_description(self) -> str:
        """The public state: range, guesses so far, guesses left."""
        tried = ", ".join(map(str, self.guesses)) or "none"
        return (
            f"Secret between {self.low} and {self.high}. Guesses so far: {tried}. "
            f"Guesses left: {max(self.max_steps - self.step_count, 0)}."
        )

    def expert_action(self) -> str:
        """The scripted expert's reply in the current state (`expert_action` below): what
        SFT warm-up learns from (`workbench.training.sft`)."""
        return expert_action(self)


def expert_action(env: GuessNumberEnv) -> str:
    """Binary search over the range the feedback still allows (never peeks at the secret)."""
    return str((env.lo + env.hi) // 2)
