"""Action parsers against hostile model output: deep nesting, huge input, quadratic patterns.

Why (the issue): 10,000 nested brackets raised RecursionError out of all three parsers,
so the episode ended as an error instead of the model reading a parse error; and
parse time grew with the square of the input.
"""
from __future__ import annotations

import statistics
import time

import pytest

from envs.guess_number import GuessNumberEnv
from workbench.rollout.rollout import Rollout
from workbench.tools.manager import MultiTurnManager
from workbench.tools.parser_base import DEFAULT_MAX_CHARS, MAX_JSON_DEPTH
from workbench.tools.parsers import FunctionCallingParser, JSONActionParser, ReActActionParser
from workbench.tools.registry import ToolRegistry

N = 10_000
NESTED = {  # 10,000 levels, in the place each format reads JSON from
    "json": '{"tool": "guess", "arguments": ' + "[" * N + "]" * N + "}",
    "react": "Thought: hm\nAction: guess\nAction Input: " + "{\"a\": " * N + "1" + "}" * N,
    "function_calling": '<tool_call>{"name": "guess", "arguments": ' + "[" * N + "]" * N + "}</tool_call>",
}
PARSERS = {"json": JSONActionParser, "react": ReActActionParser, "function_calling": FunctionCallingParser}


class RecordingGuessEnv(GuessNumberEnv):
    """Guess-the-number that records every action it is stepped with."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.actions: list[str] = []

    def step(self, action):
        self.actions.append(action)
        return super().step(action)


@pytest.mark.parametrize("kind", list(PARSERS))
def test_deep_nesting_is_a_parse_error_with_a_position(kind):
    result = PARSERS[kind]().parse(NESTED[kind])
    assert result.tool_calls == []
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in result.error, result.error
    assert "(char " in result.error  # where, so the model can see what to fix


@pytest.mark.parametrize("kind", list(PARSERS))
def test_nesting_up_to_the_cap_still_parses(kind):
    """Exactly MAX_JSON_DEPTH levels parse; one more is refused."""
    outer = 1 if kind == "react" else 2  # the decoded value: (call object,) arguments object, then arrays
    template = {"json": '{"tool": "guess", "arguments": {"x": %s}}',
                "react": "Action: guess\nAction Input: {\"x\": %s}",
                "function_calling": '<tool_call>{"name": "guess", "arguments": {"x": %s}}</tool_call>'}[kind]
    depth = MAX_JSON_DEPTH - outer
    result = PARSERS[kind]().parse(template % ("[" * depth + "7" + "]" * depth))
    assert result.error is None, result.error
    (call,) = result.tool_calls
    inner = call.arguments["x"]
    for _ in range(depth - 1):
        (inner,) = inner
    assert (call.name, inner) == ("guess", [7])
    deeper = PARSERS[kind]().parse(template % ("[" * (depth + 1) + "7" + "]" * (depth + 1)))
    assert deeper.tool_calls == [] and f"nested deeper than {MAX_JSON_DEPTH} levels" in deeper.error


@pytest.mark.parametrize("kind", list(PARSERS))
def test_deep_nesting_reaches_the_model_as_an_observation(kind):
    """The manager turns it into a message for the model; the environment is not stepped."""
    env = RecordingGuessEnv()
    manager = MultiTurnManager(ToolRegistry(), PARSERS[kind](), env, max_turns=5)
    manager.reset(seed=0)
    result = manager.step(NESTED[kind])
    assert result.env_error is None and not result.done
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in result.parse_error
    (message,) = result.messages
    assert message["role"] == "user"
    assert message["content"].startswith("Your last message could not be parsed: ")
    assert env.actions == []


def test_deep_nesting_in_a_rollout_is_a_turn_not_an_episode_error(tiny_engine):
    """A whole Rollout (tiny model): the nested reply is a parse-error turn and the episode goes on."""
    rollout = Rollout(tiny_engine, [GuessNumberEnv()], seeds=[0], max_turns=3, max_tokens=4,
                      max_context_tokens=60_000, parser="function_calling")
    rollout.reset()
    rollout.step(human_actions={0: NESTED["function_calling"]})
    ep = rollout.slots[0].episode
    assert ep.error is None and not ep.done
    (turn,) = ep.turns
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in turn.parse_error
    assert ep.messages[-1]["role"] == "user" and "could not be parsed" in ep.messages[-1]["content"]
    rollout.step()  # the model gets its next turn
    assert len(ep.turns) == 2 and ep.error is None


@pytest.mark.parametrize("kind", list(PARSERS))
def test_input_longer_than_max_chars_is_refused_whole(kind):
    """Bounded input: not scanned (fast), a readable error, and the text kept in content."""
    text = "x" * DEFAULT_MAX_CHARS + NESTED[kind]
    start = time.perf_counter()
    result = PARSERS[kind]().parse(text)
    elapsed = time.perf_counter() - start
    assert result.tool_calls == [] and result.content == text
    assert result.error == (f"the reply is {len(text)} characters long; at most {DEFAULT_MAX_CHARS} are read. "
                            "Write a shorter reply with just the call")
    assert elapsed < 0.5
    small = PARSERS[kind](max_chars=10)
    assert small.parse("0123456789").error is None and "at most 10 are read" in small.parse("0123456789!").error


def _median_time(parse, text, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        parse(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def assert_linear(parse, pattern, n, factor=8, limit=24.0, attempts=3):
    """t(factor*n) / t(n) stays well below factor**2 (64 for 8x); medians, a few attempts.

    Linear growth gives about `factor` (8); `limit` leaves 3x room for a noisy shared
    machine, and a quadratic parser (ratio ~64) still fails every attempt.
    """
    small, large = pattern(n), pattern(factor * n)
    ratios = []
    for _ in range(attempts):
        t_small = _median_time(parse, small, 15)
        t_large = _median_time(parse, large, 5)
        ratios.append(t_large / max(t_small, 1e-7))
        if ratios[-1] < limit:
            return
    pytest.fail(f"parse time of {factor * n} vs {n} characters grew {min(ratios):.1f}x (linear: {factor}x)")


# The patterns that were quadratic at 49a37c7: each "{" was decoded again from
# scratch (and every failure counted the lines before it), and the ReAct label
# pattern split a run of spaces two ways between adjacent quantifiers.
# (n is large enough that the old JSON scan's quadratic term dominates its linear one.)
@pytest.mark.parametrize("name,kind,pattern,n", [
    ("open-quote run", "json", lambda n: '{"' * (n // 2), 20_000),
    ("brace run", "json", lambda n: "{" * n, 20_000),
    ("spaces then text", "react", lambda n: " " * n + "x", 4000),
])
def test_parse_time_is_linear(name, kind, pattern, n):
    assert_linear(PARSERS[kind]().parse, pattern, n)
