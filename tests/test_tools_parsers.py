"""Tests for workbench.tools.parsers: JSON, ReAct and Hermes function-calling formats."""

from __future__ import annotations

import pytest

from workbench.tools import (
    CalculatorTool,
    FunctionCallingParser,
    JSONActionParser,
    ReActActionParser,
    ToolCall,
    ToolDefinition,
    get_parser,
    resolve_raw_arguments,
)

CALC = CalculatorTool().definition
MOVE = ToolDefinition(
    "move",
    "Move the player.",
    {"type": "object", "properties": {"steps": {"type": "integer"}}, "required": ["steps"]},
)


# -- JSON -----------------------------------------------------------------------


def test_json_plain_object_with_surrounding_text():
    r = JSONActionParser().parse('I will add.\n{"tool": "calculator", "arguments": {"expression": "1+1"}}\nDone.')
    assert r.error is None
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("calculator", {"expression": "1+1"})]
    assert r.content == "I will add.\n\nDone."
    assert r.tool_calls[0].raw == '{"tool": "calculator", "arguments": {"expression": "1+1"}}'


def test_json_in_fence_and_alternative_keys():
    text = 'Thinking.\n```json\n{"name": "move", "arguments": "{\\"steps\\": 2}"}\n```'
    r = JSONActionParser().parse(text)
    assert r.error is None
    assert r.tool_calls[0].name == "move" and r.tool_calls[0].arguments == {"steps": 2}
    assert r.content == "Thinking."

    r = JSONActionParser().parse('{"action": "environment_step", "action_input": "go north"}')
    call = r.tool_calls[0]
    assert (call.name, call.arguments, call.raw_arguments) == ("environment_step", {"input": "go north"}, True)


def test_json_several_calls_and_final_answer():
    r = JSONActionParser().parse('{"tool": "a", "arguments": {}} then {"tool": "b", "arguments": {"x": 1}}')
    assert [c.name for c in r.tool_calls] == ["a", "b"]
    assert r.tool_calls[0].id != r.tool_calls[1].id

    r = JSONActionParser().parse('{"action": "Final Answer", "action_input": "42"}')
    assert r.tool_calls == [] and r.final_answer == "42"
    assert JSONActionParser().parse('{"final_answer": "yes"}').final_answer == "yes"


def test_json_broken_reports_position_and_no_calls():
    r = JSONActionParser().parse('{"tool": "calculator", "arguments": {"expression": "1+1"}')
    assert r.tool_calls == []
    assert r.error is not None and r.error.startswith("Invalid JSON: ")
    assert "line 1 column" in r.error

    r = JSONActionParser().parse("{'tool': 'calculator'}")
    assert r.tool_calls == [] and "double quotes" in r.error


def test_json_object_without_tool_key_and_plain_text():
    r = JSONActionParser().parse('{"expression": "1+1"}')
    assert r.tool_calls == [] and "no 'tool' key" in r.error
    r = JSONActionParser().parse("go north")
    assert r.error is None and r.tool_calls == [] and r.content == "go north"
    # prose braces are not an attempt at JSON
    assert JSONActionParser().parse("use the {x} slot").error is None


def test_json_format_instructions_show_example():
    text = JSONActionParser().format_instructions([CALC, MOVE])
    assert '{"tool": "calculator", "arguments": {"expression": "<expression>"}}' in text
    assert "- move: Move the player. Arguments: steps: integer (required)" in text
    assert JSONActionParser().parse(text.split("Example:\n")[1]).tool_calls[0].name == "calculator"


# -- ReAct ------------------------------------------------------------------------


def test_react_json_input():
    text = 'Thought: I need to add.\nAction: calculator\nAction Input: {"expression": "2+2"}'
    r = ReActActionParser().parse(text)
    assert r.error is None and r.final_answer is None
    assert (r.tool_calls[0].name, r.tool_calls[0].arguments) == ("calculator", {"expression": "2+2"})
    assert r.content == "I need to add."


def test_react_raw_input_and_invented_observation():
    text = "Thought: go\nAction: move\nAction Input: 3\nObservation: you moved\nThought: again"
    r = ReActActionParser().parse(text)
    call = r.tool_calls[0]
    assert call.raw_arguments is True and call.arguments == {"input": "3"}
    assert "Observation" not in call.raw
    assert resolve_raw_arguments(call, MOVE) == {"steps": 3}
    assert resolve_raw_arguments(call, CALC) == {"expression": "3"}


def test_react_multiline_json_and_final_answer():
    text = 'Action: calculator\nAction Input: {\n  "expression": "6*7"\n}\n'
    assert ReActActionParser().parse(text).tool_calls[0].arguments == {"expression": "6*7"}

    r = ReActActionParser().parse("Thought: I know it.\nFinal Answer: 42\n")
    assert r.tool_calls == [] and r.final_answer == "42" and r.content == "I know it."


def test_react_errors():
    r = ReActActionParser().parse('Action: calculator\nAction Input: {"expression": "2+2"')
    assert r.tool_calls == [] and r.error.startswith("Invalid JSON in Action Input:")
    r = ReActActionParser().parse("Thought: hmm\nAction: calculator\n")
    assert r.tool_calls == [] and "must be followed by an 'Action Input:'" in r.error
    r = ReActActionParser().parse("just some text")
    assert r.error is None and r.tool_calls == [] and r.content == "just some text"


def test_react_instructions():
    text = ReActActionParser().format_instructions([CALC])
    assert "Action: calculator\nAction Input: {\"expression\": \"<expression>\"}" in text
    assert "Final Answer:" in text


# -- Hermes / function calling ---------------------------------------------------------


def test_hermes_single_and_several_calls():
    text = (
        "Let me check.\n"
        '<tool_call>\n{"name": "calculator", "arguments": {"expression": "1+2"}}\n</tool_call>\n'
        '<tool_call>{"name": "move", "arguments": "{\\"steps\\": 4}"}</tool_call>'
    )
    r = FunctionCallingParser().parse(text)
    assert r.error is None
    assert [(c.name, c.arguments) for c in r.tool_calls] == [
        ("calculator", {"expression": "1+2"}),
        ("move", {"steps": 4}),
    ]
    assert r.content == "Let me check."
    assert r.tool_calls[1].raw.startswith("<tool_call>") and r.tool_calls[1].raw.endswith("</tool_call>")


def test_hermes_bad_json_names_the_call():
    text = '<tool_call>{"name": "a", "arguments": {}}</tool_call><tool_call>{"name": "b", "arguments": {</tool_call>'
    r = FunctionCallingParser().parse(text)
    assert r.tool_calls == []
    assert r.error.startswith("tool call #2 is not valid JSON")


def test_hermes_unclosed_tag():
    text = '<tool_call>{"name": "move", "arguments": {"steps": 1}}'
    r = FunctionCallingParser().parse(text)
    assert r.tool_calls == [] and r.error == "tool call #1: <tool_call> is not closed with </tool_call>"
    lenient = FunctionCallingParser(allow_unclosed=True).parse(text)
    assert lenient.error is None and lenient.tool_calls[0].arguments == {"steps": 1}
    r = FunctionCallingParser().parse('<tool_call>{"name": "a"}<tool_call>{"name": "b"}</tool_call>')
    assert r.error == "tool call #1: <tool_call> is not closed with </tool_call>"


def test_hermes_missing_name_and_plain_text():
    r = FunctionCallingParser().parse('<tool_call>{"arguments": {}}</tool_call>')
    assert r.error == "tool call #1 has no 'name' string"
    r = FunctionCallingParser().parse("The answer is 4.")
    assert r.error is None and r.tool_calls == [] and r.content == "The answer is 4."


def test_hermes_instructions_roundtrip():
    parser = FunctionCallingParser()
    text = parser.format_instructions([CALC, MOVE])
    assert '"name": "calculator"' in text and "<tools>" in text
    example = text.split("Example:\n")[1]
    assert parser.parse(example).tool_calls[0].arguments == {"expression": "<expression>"}


# -- registry of parsers ------------------------------------------------------------------


def test_get_parser():
    assert isinstance(get_parser("json"), JSONActionParser)
    assert isinstance(get_parser("ReAct"), ReActActionParser)
    assert isinstance(get_parser("hermes"), FunctionCallingParser)
    assert isinstance(get_parser("function-calling"), FunctionCallingParser)
    parser = JSONActionParser()
    assert get_parser(parser) is parser
    with pytest.raises(ValueError, match="json, react, function_calling, hermes"):
        get_parser("xml")


def test_tool_call_defaults():
    call = ToolCall("x", {"a": 1})
    assert call.id.startswith("call_") and call.result is None and call.success is None
    assert call.to_dict()["arguments"] == {"a": 1}


# -- bounded JSON decoding ---------------------------------------------------------

def test_loads_json_errors_are_json_decode_errors_with_a_position():
    import json

    from workbench.tools.parser_base import MAX_JSON_DEPTH, decode_json, loads_json

    assert loads_json(' {"a": [1, {"b": null}]} \n') == {"a": [1, {"b": None}]}
    assert decode_json('xx{"a": 1} tail', 2) == ({"a": 1}, 10)
    cases = {
        '{"a": 1} extra': "Extra data",  # as json.loads
        "[" * (MAX_JSON_DEPTH + 1): f"JSON nested deeper than {MAX_JSON_DEPTH} levels",
        "1" * 5000: "JSON value cannot be converted",  # int() digit limit: ValueError in json.loads
        '{"a": ': "Expecting value",
    }
    for text, message in cases.items():
        with pytest.raises(json.JSONDecodeError) as err:
            loads_json(text)
        assert err.value.msg.startswith(message), (text[:20], err.value.msg)
    # brackets inside strings do not count towards the depth
    deep_string = '{"a": "' + "[" * 1000 + '"}'
    assert loads_json(deep_string) == {"a": "[" * 1000}


def test_huge_integer_argument_is_a_parse_error_not_a_crash():
    text = '{"tool": "move", "arguments": {"steps": ' + "9" * 5000 + "}}"
    result = JSONActionParser().parse(text)
    assert result.tool_calls == [] and "JSON value cannot be converted" in result.error
    call = ToolCall("move", {"input": "9" * 5000}, raw_arguments=True)
    assert resolve_raw_arguments(call, MOVE) == {"steps": "9" * 5000}  # left as text, not a ValueError


# -- family formats: Llama 3.x JSON, Mistral [TOOL_CALLS] -------------------------------
def test_llama3_json_calls_with_and_without_python_tag():
    p = get_parser("llama3_json")
    r = p.parse('{"name": "calc", "parameters": {"x": "1;2"}}')
    assert [(c.name, c.arguments, c.span) for c in r.tool_calls] == [("calc", {"x": "1;2"}, (0, 44))]
    text = '<|python_tag|>{"name": "a", "parameters": {}}; {"name": "b", "arguments": {"y": 1}}'
    r = p.parse(text)
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("a", {}), ("b", {"y": 1})] and r.content == ""
    assert text[r.span[0]:r.span[1]].startswith('{"name": "a"') and text[r.span[0]:r.span[1]].endswith("1}}")
    assert p.parse("I would say 6").tool_calls == [] and p.parse("I would say 6").error is None
    assert "not valid JSON" in p.parse('{"name": "c", "parameters": {"x": }').error


def test_llama3_json_strict():
    p = get_parser("llama3_json", strict=True)
    assert p.parse('  <|python_tag|>{"name": "a", "parameters": {}} ').error is None
    assert "text before it" in p.parse('x {"name": "a", "parameters": {}}').error
    assert "one tool call per reply" in p.parse('{"name": "a", "parameters": {}} {"name": "b", "parameters": {}}').error
    assert '"parameters"' in p.format_instructions([]) and "nothing else" in p.format_instructions([])


def test_mistral_both_call_forms():
    p = get_parser("mistral")
    r = p.parse('[TOOL_CALLS] [{"name": "calc", "arguments": {"x": 1}}, {"name": "d", "arguments": "{\\"y\\": 2}"}]')
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("calc", {"x": 1}), ("d", {"y": 2})]
    r = p.parse('Sure. [TOOL_CALLS]calc[ARGS]{"x": 1}[TOOL_CALLS]d[ARGS]{}')
    assert [(c.name, c.arguments) for c in r.tool_calls] == [("calc", {"x": 1}), ("d", {})] and r.content == "Sure."
    assert p.parse("plain answer").tool_calls == [] and p.parse("plain answer").content == "plain answer"
    assert "write [TOOL_CALLS]<tool name>[ARGS]" in p.parse('[TOOL_CALLS]calc{"x": 1}').error
    assert "must be an object with a 'name'" in p.parse('[TOOL_CALLS][{"name": 1}]').error
    assert "alone" in get_parser("mistral", strict=True).parse("ok [TOOL_CALLS]calc[ARGS]{}").error


def test_reasoning_split():
    from workbench.tools.reasoning import split_reasoning

    s = split_reasoning("<think>\nmaybe 5\n</think>\n\n6")
    assert (s.reasoning, s.answer, s.offset, s.cut) == ("maybe 5", "\n\n6", 24, False)
    assert split_reasoning("a</think>b</think>c").answer == "c"  # the last end marker, as Qwen3's template
    assert split_reasoning("plain") == split_reasoning("plain", opened=False)
    assert split_reasoning("plain").reasoning is None and split_reasoning("plain").answer == "plain"
    assert split_reasoning("<think>\nno end").cut and split_reasoning("no end", opened=True).cut
    assert split_reasoning("done</think> 4", opened=True).answer == " 4"
