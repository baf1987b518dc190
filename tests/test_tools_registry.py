"""Tests for workbench.tools.base, registry and builtin (schema, validation, timeouts, calculator)."""

from __future__ import annotations

import json
import time
from typing import Literal, Optional

import pytest

from workbench.tools import (
    CalculatorTool,
    EnvironmentStepTool,
    FunctionTool,
    Tool,
    ToolDefinition,
    ToolRegistry,
    evaluate_arithmetic,
    schema_from_function,
)


def search_books(query: str, limit: int = 5, max_price: Optional[float] = None, exact: bool = False,
                 tags: list[str] | None = None, filters: dict | None = None) -> list:
    """Search the catalogue for books.

    The search is case-insensitive.

    Args:
        query: Words to look for
            in the title.
        limit (int): Maximum number of results.
        max_price: Highest price to include.

    Returns:
        Matching titles.
    """
    return [query] * limit


def test_schema_from_documented_function():
    d = schema_from_function(search_books)
    assert d.name == "search_books"
    assert d.description == "Search the catalogue for books."
    props = d.parameters["properties"]
    assert props["query"] == {"type": "string", "description": "Words to look for in the title."}
    assert props["limit"] == {"type": "integer", "description": "Maximum number of results.", "default": 5}
    assert props["max_price"] == {"type": "number", "description": "Highest price to include."}
    assert props["exact"] == {"type": "boolean", "default": False}
    assert props["tags"] == {"type": "array", "items": {"type": "string"}}
    assert props["filters"] == {"type": "object"}
    assert d.parameters["required"] == ["query"]
    assert d.parameters["type"] == "object"
    schema = d.to_openai_schema()
    assert schema["type"] == "function"
    assert schema["function"]["name"] == "search_books"
    assert schema["function"]["parameters"] is d.parameters


def test_schema_optional_without_default_literal_and_lambda():
    def pick(color: Literal["red", "blue"], note: Optional[str]):
        """Pick a color."""

    d = schema_from_function(pick)
    assert d.parameters["properties"]["color"] == {"enum": ["red", "blue"], "type": "string"}
    assert d.parameters["required"] == ["color"]
    with pytest.raises(ValueError, match="lambda"):
        schema_from_function(lambda x: x)
    assert Tool.from_function(lambda x: x, name="ident").definition.name == "ident"


def test_tool_subclass_with_class_attributes():
    class Echo(Tool):
        name = "echo"
        description = "Echo text."
        parameters = {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"]}

        def execute(self, text):
            return text

    tool = Echo()
    assert tool.definition == ToolDefinition("echo", "Echo text.", Echo.parameters)
    assert ToolRegistry([tool]).execute_tool("echo", text="hi") == (True, "hi")


def test_register_decorator_names_and_schemas():
    reg = ToolRegistry()

    @reg.register
    def add(a: int, b: int) -> int:
        """Add two integers."""
        return a + b

    @reg.register(name="mul", timeout=1.5)
    def multiply(a: int, b: int) -> int:
        """Multiply."""
        return a * b

    assert add(2, 3) == 5  # the decorator returns the function unchanged
    assert reg.names() == ["add", "mul"]
    assert "mul" in reg and "multiply" not in reg and len(reg) == 2
    assert isinstance(reg.get("add"), FunctionTool)
    assert reg.get("nope") is None
    assert [s["function"]["name"] for s in reg.schemas()] == ["add", "mul"]
    assert reg.timeout_for("mul") == 1.5 and reg.timeout_for("add") == 10.0
    reg.unregister("add")
    assert reg.names() == ["mul"]


def _make_registry() -> ToolRegistry:
    reg = ToolRegistry(default_timeout=5.0)

    def add(a: int, b: int) -> dict:
        """Add two integers."""
        return {"sum": a + b}

    def fail(x: str) -> str:
        """Always fails."""
        raise ValueError(f"bad value {x}")

    def sleepy(seconds: float = 2.0) -> str:
        """Sleeps."""
        time.sleep(seconds)
        return "awake"

    reg.register(add)
    reg.register(fail)
    reg.register(sleepy, timeout=0.2)
    reg.register(CalculatorTool())
    return reg


def test_execute_success_json_encodes_non_strings():
    reg = _make_registry()
    ok, result = reg.execute_tool("add", a=2, b=3)
    assert ok is True
    assert json.loads(result) == {"sum": 5}
    assert reg.execute_tool("calculator", expression="2+3*4") == (True, "14")
    # integral floats are accepted where an integer is expected
    assert json.loads(reg.execute_tool("add", a=2.0, b=1)[1]) == {"sum": 3}


def test_unknown_tool_lists_available():
    ok, msg = _make_registry().execute_tool("divide", a=1)
    assert ok is False
    assert msg == "Unknown tool 'divide'. Available tools: add, fail, sleepy, calculator."


def test_missing_unexpected_and_wrong_type_arguments():
    reg = _make_registry()
    ok, msg = reg.execute_tool("add", a=1)
    assert not ok
    assert "missing required argument 'b' (integer)" in msg
    assert "Expected arguments: a: integer (required), b: integer (required)" in msg

    ok, msg = reg.execute_tool("add", a=1, b=2, c=3)
    assert not ok and "unexpected argument 'c'" in msg

    ok, msg = reg.execute_tool("add", a="1", b=2)
    assert not ok and "argument 'a' must be integer, got string \"1\"" in msg

    ok, msg = reg.execute_tool("add", a=True, b=2)
    assert not ok and "must be integer, got boolean" in msg

    outcome = reg.execute("add", ["not", "a", "dict"])
    assert not outcome.success and outcome.error_type == "invalid_arguments"
    assert "arguments must be a JSON object, got array" in outcome.result


def test_raising_tool_is_reported():
    ok, msg = _make_registry().execute_tool("fail", x="q")
    assert ok is False
    assert msg == "Tool 'fail' raised ValueError: bad value q"


def test_timeout_returns_quickly():
    reg = _make_registry()
    start = time.perf_counter()
    ok, msg = reg.execute_tool("sleepy", seconds=2.0)
    elapsed = time.perf_counter() - start
    assert ok is False
    assert msg == "Tool 'sleepy' timed out after 0.2 s"
    assert elapsed < 1.0
    assert reg.stats()["sleepy"]["timeouts"] == 1


def test_stats_count_calls():
    reg = _make_registry()
    reg.execute_tool("add", a=1, b=2)
    reg.execute_tool("add", a=1)
    reg.execute_tool("fail", x="1")
    stats = reg.stats()
    assert stats["add"]["calls"] == 2 and stats["add"]["successes"] == 1 and stats["add"]["failures"] == 1
    assert stats["fail"] == {**stats["fail"], "calls": 1, "successes": 0, "failures": 1}
    assert stats["add"]["total_seconds"] >= 0.0
    reg.reset_stats()
    assert reg.stats()["add"]["calls"] == 0


@pytest.mark.parametrize(
    "expression, expected",
    [
        ("2+3*4", "14"),
        ("(2+3)*4", "20"),
        ("-3 + 5", "2"),
        ("--4", "4"),
        ("7 / 2", "3.5"),
        ("8 / 2", "4"),
        ("7 // 2", "3"),
        ("-7 // 2", "-4"),
        ("7 % 3", "1"),
        ("2 ** 10", "1024"),
        ("2 ** -1", "0.5"),
        ("1.5 * 4", "6"),
        ("0.1 + 0.2", "0.30000000000000004"),
        ("10 ** 20", "100000000000000000000"),
        ("-(2 ** 2)", "-4"),
        ("3 * (4 - (1 + 1)) / 4", "1.5"),
    ],
)
def test_calculator_table(expression, expected):
    assert CalculatorTool().execute(expression=expression) == expected


@pytest.mark.parametrize(
    "expression, message",
    [
        ("__import__('os')", "function calls are not allowed"),
        ("2**10000", "exponent 10000 is too large"),
        ("x + 1", "names/variables are not allowed (found 'x')"),
        ("(1).real", "attribute access is not allowed"),
        ("'a' * 3", "only numbers are allowed"),
        ("2 ^ 3", "use ** for powers"),
        ("1 / 0", "division by zero"),
        ("2 +", "invalid syntax"),
        ("1" * 201, "too long"),
        ("(10**90)**90", "too large"),
        ("(-8) ** 0.5", "not a real number"),
        ("", "empty"),
    ],
)
def test_calculator_rejections(expression, message):
    with pytest.raises(ValueError) as excinfo:
        evaluate_arithmetic(expression)
    assert message in str(excinfo.value)


def test_calculator_errors_through_registry():
    ok, msg = _make_registry().execute_tool("calculator", expression="__import__('os').system('ls')")
    assert ok is False
    assert msg.startswith("Tool 'calculator' raised ValueError: ")


class CounterGame:
    """Counts 'inc' actions; done (reward 1) at 3."""

    def __init__(self):
        self.count = 0

    def reset(self, seed=None):
        self.count = 0
        return "count=0"

    def step(self, action):
        if action == "inc":
            self.count += 1
        done = self.count >= 3
        return f"count={self.count}", float(done), done, {"success": done, "invalid_action": action != "inc"}


def test_environment_step_tool_records_last_step():
    env = CounterGame()
    tool = EnvironmentStepTool(env)
    reg = ToolRegistry([tool])
    assert reg.execute_tool("environment_step", action="inc") == (True, "count=1")
    assert tool.last_step == ("count=1", 0.0, False, {"success": False, "invalid_action": False})
    reg.execute_tool("environment_step", action="inc")
    reg.execute_tool("environment_step", action="inc")
    assert tool.last_step[1:3] == (1.0, True)
    assert tool.definition.required == ["action"]
