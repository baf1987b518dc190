"""Action spans: parsers, example environments and adapters say which characters of a
reply became the action, and the tool manager makes them relative to the reply."""
from __future__ import annotations

import json

import pytest

from envs import make_env
from workbench.environments.adapters.verifier import VerifierEnvironment
from workbench.tools import MultiTurnManager
from workbench.tools.parsers import FunctionCallingParser, JSONActionParser, ReActActionParser


def _cut(text, span):
    return text[span[0]:span[1]]


# -- parsers ---------------------------------------------------------------------------
def test_json_parser_span_covers_the_calls():
    text = 'I will add. {"tool": "calculator", "arguments": {"expression": "2+3"}} done'
    result = JSONActionParser().parse(text)
    assert _cut(text, result.span) == '{"tool": "calculator", "arguments": {"expression": "2+3"}}'
    assert result.tool_calls[0].span == result.span


def test_json_parser_span_of_final_answer_and_plain_text():
    text = 'so {"final_answer": "42"}'
    assert _cut(text, JSONActionParser().parse(text).span) == '{"final_answer": "42"}'
    assert _cut("  just words \n", JSONActionParser().parse("  just words \n").span) == "just words"


def test_react_parser_spans():
    text = "Thought: add them\nAction: calculator\nAction Input: {\"expression\": \"1+1\"}\n"
    result = ReActActionParser().parse(text)
    assert _cut(text, result.span) == 'Action: calculator\nAction Input: {"expression": "1+1"}'
    text = "Thought: easy\nFinal Answer:  7 \nObservation: x"
    assert _cut(text, ReActActionParser().parse(text).span) == "7"


def test_function_calling_parser_span_spans_first_to_last_call():
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2"}}</tool_call>'
    text = f"hm {call} and {call} end"
    result = FunctionCallingParser().parse(text)
    assert result.span == (3, len(text) - 4)
    assert [c.span for c in result.tool_calls] == [(3, 3 + len(call)), (len(text) - 4 - len(call), len(text) - 4)]


def test_parse_error_has_no_span():
    assert FunctionCallingParser().parse("<tool_call>{oops</tool_call>").span is None


# -- environments ------------------------------------------------------------------------
@pytest.mark.parametrize("name, reply, expected", [
    ("guess_number", "You have 4 guesses left, so", "4"),
    ("guess_number", "eight", "eight"),
    ("grid", "I would go LEFT now.", "LEFT"),
    ("grid", " r ", "r"),
    ("wordle", "I think the word is CRANE.", "CRANE"),
    ("text_game", "Well, take the key please", "take the key"),
    ("arithmetic", "The total is clear. Answer: 12 I think", "Answer: 12"),
])
def test_environment_reports_the_span_it_read(name, reply, expected):
    env = make_env(name, seed=0)
    env.reset(seed=0)
    _, _, _, info = env.step(reply)
    assert _cut(reply, info["action_span"]) == expected


def test_environment_without_a_usable_action_reports_no_span():
    env = make_env("grid", seed=0)
    env.reset(seed=0)
    assert "action_span" not in env.step("hello there")[3]


def test_verifier_span_is_inside_the_last_answer_tag():
    env = VerifierEnvironment(lambda rng: {"question": "2+2?", "answer": "4"},
                              lambda answer, sample: float(answer == sample["answer"]))
    env.reset(seed=0)
    reply = "think <answer>3</answer> no, <answer> 4 </answer>"
    info = env.step(reply)[3]
    assert info["success"] and _cut(reply, info["action_span"]) == "4"


# -- the manager composes them relative to the reply ----------------------------------
def test_manager_without_parser_keeps_the_environment_span():
    env = make_env("guess_number", seed=0)
    manager = MultiTurnManager(environment=env)
    manager.reset(seed=0)
    reply = "You have 4 guesses left, so"
    assert manager.step(reply).info["action_span"] == [9, 10]


def test_manager_moves_span_by_where_the_plain_answer_sits():
    env = make_env("arithmetic", seed=0, difficulty=1)
    manager = MultiTurnManager(parser="function_calling", environment=env)
    manager.reset(seed=0)
    reply = "\n  Let me see.\nAnswer: 7"
    info = manager.step(reply).info
    assert _cut(reply, info["action_span"]) == "Answer: 7"


def test_manager_tool_only_turn_gets_the_call_span():
    env = make_env("arithmetic", seed=0, difficulty=1)
    manager = MultiTurnManager(parser="function_calling", environment=env)
    manager.reset(seed=0)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'
    reply = "First compute. " + call
    result = manager.step(reply)
    assert result.tool_calls[0].result == "5"
    assert _cut(reply, result.info["action_span"]) == call


def test_manager_moves_span_into_an_environment_step_call():
    env = make_env("guess_number", seed=0)
    manager = MultiTurnManager(parser="json", environment=env)
    manager.reset(seed=0)
    reply = "ok " + json.dumps({"tool": "environment_step", "arguments": {"action": "I guess 8"}})
    info = manager.step(reply).info
    assert info["guess"] == 8 and _cut(reply, info["action_span"]) == "8"


def test_manager_drops_a_malformed_environment_span():
    class Lying:
        def reset(self, seed=None):
            return "go"

        def step(self, action):
            return "ok", 0.0, False, {"action_span": [0, 999]}

    manager = MultiTurnManager(environment=Lying())
    manager.reset()
    assert "action_span" not in manager.step("short").info
