"""Property-based tests of the three action parsers (hypothesis).

For any string -- random unicode, nested brackets, unbalanced quotes, huge runs,
near-valid tool calls -- `parse` returns a `ParseResult` (it raises only TypeError,
for a non-str), an error never comes with tool calls, and a well-formed call
embedded in arbitrary prose is found. Parse time grows linearly with the input
(t(8n)/t(n) on worst-case patterns, medians, well below the quadratic 64).
"""
from __future__ import annotations

import json
import statistics
import time

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.tools.parser_base import MAX_JSON_DEPTH, ParseResult, ToolCall
from workbench.tools.parsers import FunctionCallingParser, JSONActionParser, ReActActionParser

PARSERS = {
    "json": JSONActionParser(),
    "react": ReActActionParser(),
    "function_calling": FunctionCallingParser(),
    "function_calling_unclosed": FunctionCallingParser(allow_unclosed=True),
}
SETTINGS = settings(max_examples=1000, deadline=None, suppress_health_check=list(HealthCheck))

# -- strategies ---------------------------------------------------------------------------

FRAGMENTS = ["{", "}", "[", "]", '"', "'", "\\", ":", ",", "\n", " ", "\t", "*", "`", "```", "```json",
             "<tool_call>", "</tool_call>", "Action:", "Action Input:", "Thought:", "Final Answer:",
             "Observation:", '"tool"', '"name"', '"arguments"', '"final_answer"', "null", "true", "1e999",
             "-", "0", "1" * 30, "\\u00", "\ud800", "\x00", "é", "𝄞"]

names = st.text(st.characters(codec="utf-8", exclude_characters='"\\<>\n'), min_size=1, max_size=12)
json_scalars = st.none() | st.booleans() | st.integers(-10**6, 10**6) | st.text(max_size=12)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=6), inner, max_size=3), max_leaves=8)
arguments = st.dictionaries(st.text(min_size=1, max_size=8), json_values, max_size=3)


@st.composite
def nested(draw):
    """Deep or unbalanced brackets, possibly mixed and inside a call."""
    depth = draw(st.integers(1, 3000))
    opener = draw(st.sampled_from(["[", "{", '{"a":', '{"a": [', "[{\"b\": "]))
    closer = draw(st.sampled_from(["", "]", "}", "]}", "}]"]))
    body = opener * depth + draw(st.sampled_from(["", "1", '"x"', "null"])) + closer * draw(st.integers(0, depth))
    wrap = draw(st.sampled_from(["{}", '{{"tool": "t", "arguments": {}}}', "<tool_call>{}</tool_call>",
                                 '<tool_call>{{"name": "t", "arguments": {}}}</tool_call>',
                                 "Action: t\nAction Input: {}", "Thought: x\n{}"]))
    return wrap.format(body)


@st.composite
def unbalanced_quotes(draw):
    quotes = draw(st.lists(st.sampled_from(['"', "'", '\\"', "\\\\", "`", '{"', '"}', '": "']), max_size=60))
    return draw(st.sampled_from(["", '{"tool": ', "<tool_call>", "Action: a\nAction Input: "])) + "".join(quotes)


@st.composite
def huge(draw):
    """Long runs (up to ~100k characters) of the characters regexes and scanners stall on."""
    unit = draw(st.sampled_from([" ", "{", '{"', "[", "*", "\n", "`", "\\", "a", " \t", "{ ", "Action:",
                                 "<tool_call>", "</tool_call>", '"a":', "1"]))
    count = draw(st.integers(1, 100_000 // len(unit)))
    head = draw(st.sampled_from(["", "Action: x\nAction Input: ", '{"tool": "x", "arguments": ', "<tool_call>",
                                 "```", "Final Answer:"]))
    tail = draw(st.sampled_from(["", "x", "}", "\n", "```", "</tool_call>", '"']))
    return head + unit * count + tail


@st.composite
def near_valid(draw):
    """A real call in one of the formats, then damaged: cut, spliced, or a character changed."""
    name, args = draw(names), draw(arguments)
    fmt = draw(st.sampled_from(["json", "react", "fc"]))
    if fmt == "json":
        text = json.dumps({draw(st.sampled_from(["tool", "name", "action"])): name, "arguments": args})
    elif fmt == "react":
        text = f"Thought: t\nAction: {name}\nAction Input: {json.dumps(args)}"
    else:
        text = f"<tool_call>{json.dumps({'name': name, 'arguments': args})}</tool_call>"
    how = draw(st.sampled_from(["cut", "splice", "change", "repeat", "as-is"]))
    i = draw(st.integers(0, len(text)))
    if how == "cut":
        text = text[:i]
    elif how == "splice":
        text = text[:i] + draw(st.sampled_from(FRAGMENTS)) + text[i:]
    elif how == "change" and text:
        i = min(i, len(text) - 1)
        text = text[:i] + draw(st.characters()) + text[i + 1:]
    elif how == "repeat":
        text = text * draw(st.integers(2, 5))
    return text


fragments = st.lists(st.sampled_from(FRAGMENTS) | st.text(max_size=8), max_size=40).map("".join)
hostile = st.one_of(st.text(), fragments, nested(), unbalanced_quotes(), huge(), near_valid())


def check_result(result):
    assert isinstance(result, ParseResult)
    assert isinstance(result.content, str)
    if result.error is not None:
        assert isinstance(result.error, str) and result.error
        assert result.tool_calls == []  # a broken turn is never half-executed
    for call in result.tool_calls:
        assert isinstance(call, ToolCall) and isinstance(call.arguments, dict)
        assert isinstance(call.name, str) and call.name == call.name.strip() and call.name
    assert result.final_answer is None or isinstance(result.final_answer, str)


# -- never an exception ---------------------------------------------------------------------


@SETTINGS
@given(hostile)
def test_json_parser_never_raises(text):
    check_result(PARSERS["json"].parse(text))


@SETTINGS
@given(hostile)
def test_react_parser_never_raises(text):
    check_result(PARSERS["react"].parse(text))


@SETTINGS
@given(hostile)
def test_function_calling_parser_never_raises(text):
    check_result(PARSERS["function_calling"].parse(text))
    check_result(PARSERS["function_calling_unclosed"].parse(text))


@pytest.mark.parametrize("kind", list(PARSERS))
@pytest.mark.parametrize("value", [None, b"bytes", 42, ["a"]])
def test_non_str_is_a_type_error_that_says_so(kind, value):
    with pytest.raises(TypeError, match=r"parse expects the model output as str, got "):
        PARSERS[kind].parse(value)


# -- well-formed calls are found ------------------------------------------------------------

identifiers = st.from_regex(r"[A-Za-z_][A-Za-z0-9_.-]{0,15}", fullmatch=True)  # ReAct strips quotes and stars
prose = st.text(st.characters(exclude_characters="{}<>`\n"), max_size=40).filter(
    lambda s: ":" not in s and "Action" not in s and "Final" not in s)


@settings(max_examples=200, deadline=None)
@given(prose, identifiers, arguments, prose)
def test_wellformed_calls_round_trip(before, name, args, after):
    fc = PARSERS["function_calling"].parse(f"{before}<tool_call>{json.dumps({'name': name, 'arguments': args})}"
                                           f"</tool_call>{after}")
    js = PARSERS["json"].parse(f"{before} {json.dumps({'tool': name, 'arguments': args})} {after}")
    react = PARSERS["react"].parse(f"Thought: {before}\nAction: {name}\nAction Input: {json.dumps(args)}")
    for result in (fc, js, react):
        assert result.error is None, result.error
        (call,) = result.tool_calls
        assert (call.name, call.arguments) == (name, args)


# -- linear time ------------------------------------------------------------------------------


def _median_time(parse, text, repeats):
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        parse(text)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


WORST = {  # patterns that make a naive scanner, regex or recursive decoder slow
    "json": [lambda n: '{"' * (n // 2), lambda n: "{" * n, lambda n: '{"a":' * (n // 5),
             lambda n: '{"tool": "t"} ' * (n // 14), lambda n: '{"tool": "t", "arguments": "' + "\\\\" * (n // 2)],
    "react": [lambda n: " " * n + "x", lambda n: "Action:" + " " * n + "x\nAction Input: 1",
              lambda n: "Action: t\nAction Input: ```" + " \n" * (n // 2) + "x",
              lambda n: "Action: t\nAction Input: " + "[" * n, lambda n: "*" * n + "Action x",
              lambda n: "Thought: \n" * (n // 10)],
    "function_calling": [lambda n: "<tool_call>" * (n // 11), lambda n: '<tool_call>{"name": "t"}</tool_call>' * (n // 35),
                         lambda n: "<tool_call>" + "[" * n + "</tool_call>",
                         lambda n: "</tool_call" * (n // 11) + "<tool_call>"],
}


@pytest.mark.parametrize("kind", list(WORST))
def test_parse_time_grows_linearly(kind):
    """t(8n) / t(n) with n = 4,000 (JSON: 20,000) characters: linear ~8, quadratic ~64; bound 24.

    Medians of 15 (small) and 5 (large) runs, and up to three attempts, so a busy
    moment on a shared machine does not fail it; a quadratic pattern fails every attempt.
    """
    parser, n = PARSERS[kind], 20_000 if kind == "json" else 4000
    for pattern in WORST[kind]:
        small, large = pattern(n), pattern(8 * n)
        ratios = []
        for _ in range(3):
            ratios.append(_median_time(parser.parse, large, 5) / max(_median_time(parser.parse, small, 15), 1e-7))
            if ratios[-1] < 24:
                break
        assert min(ratios) < 24, f"{kind}: {large[:40]!r}... grew {min(ratios):.1f}x for 8x the input"


def test_depth_cap_constant_is_documented_value():
    """The nesting cap the error messages quote is the one the decoder enforces."""
    depth = MAX_JSON_DEPTH + 1
    result = PARSERS["function_calling"].parse("<tool_call>" + "[" * depth + "]" * depth + "</tool_call>")
    assert f"nested deeper than {MAX_JSON_DEPTH} levels" in result.error
