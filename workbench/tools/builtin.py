"""Built-in tools: a safe arithmetic :class:`CalculatorTool` and :class:`EnvironmentStepTool`.

The calculator never hands text to ``eval``/``exec``: it parses the
expression with :mod:`ast` and walks the tree, accepting only number
literals, ``+ - * / // % **``, unary plus/minus and parentheses. Anything
else (names, calls, attributes, subscripts, strings) is rejected with an
error message a model can act on.

:class:`EnvironmentStepTool` exposes an environment's ``step(action)`` as a
tool so that tool-calling models act in the environment the same way they
call any other tool.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any, Callable

from .base import Tool, ToolDefinition

__all__ = ["CalculatorTool", "EnvironmentStepTool", "evaluate_arithmetic", "normalize_step_output"]

_BINARY_OPS: dict[type, Callable[[Any, Any], Any]] = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNARY_OPS: dict[type, Callable[[Any], Any]] = {ast.UAdd: operator.pos, ast.USub: operator.neg}

_REJECTED_NODES: dict[type, str] = {
    ast.Name: "names/variables are not allowed (found '{name}')",
    ast.Call: "function calls are not allowed",
    ast.Attribute: "attribute access is not allowed",
    ast.Subscript: "indexing is not allowed",
    ast.Compare: "comparisons are not allowed",
    ast.BoolOp: "boolean operators are not allowed",
    ast.Lambda: "lambdas are not allowed",
}


def _reject(node: ast.AST) -> ValueError:
    for node_type, template in _REJECTED_NODES.items():
        if isinstance(node, node_type):
            return ValueError(template.format(name=getattr(node, "id", "")))
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        return ValueError("'^' is not supported; use ** for powers")
    if isinstance(node, (ast.BinOp, ast.UnaryOp)):
        return ValueError(f"operator {type(node.op).__name__} is not allowed; use + - * / // % **")
    if isinstance(node, ast.Constant):
        return ValueError(f"only numbers are allowed, found {type(node.value).__name__} {node.value!r}")
    return ValueError(f"{type(node).__name__} is not allowed in an arithmetic expression")


class _Evaluator:
    """Walks a parsed expression, evaluating only whitelisted nodes."""

    def __init__(self, max_exponent: float, max_bits: int) -> None:
        self.max_exponent = max_exponent
        self.max_bits = max_bits

    def visit(self, node: ast.AST) -> int | float:
        if isinstance(node, ast.Expression):
            return self.visit(node.body)
        if isinstance(node, ast.Constant):
            if isinstance(node.value, (int, float)) and not isinstance(node.value, bool):
                return node.value
            raise _reject(node)
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY_OPS:
            return _UNARY_OPS[type(node.op)](self.visit(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINARY_OPS:
            left = self.visit(node.left)
            right = self.visit(node.right)
            if isinstance(node.op, ast.Pow):
                self._check_power(left, right)
            result = _BINARY_OPS[type(node.op)](left, right)
            return self._check_result(result)
        raise _reject(node)

    def _check_power(self, base: int | float, exponent: int | float) -> None:
        if abs(exponent) > self.max_exponent:
            raise ValueError(f"exponent {exponent} is too large (limit {self.max_exponent:g})")
        if isinstance(base, int) and isinstance(exponent, int) and exponent > 0:
            if base.bit_length() * exponent > self.max_bits:
                raise ValueError("result is too large")

    def _check_result(self, value: Any) -> int | float:
        if isinstance(value, complex):
            raise ValueError("result is not a real number")
        if isinstance(value, int) and value.bit_length() > self.max_bits:
            raise ValueError("result is too large")
        if isinstance(value, float) and not math.isfinite(value):
            raise ValueError("result is too large (not finite)")
        return value


def evaluate_arithmetic(
    expression: str, max_length: int = 200, max_exponent: float = 100, max_bits: int = 4096
) -> int | float:
    """Safely evaluate an arithmetic expression.

    Args:
        expression: Text such as ``"(2 + 3) * -4 ** 2 / 7"``.
        max_length: Longest accepted expression in characters.
        max_exponent: Largest accepted absolute value of an exponent.
        max_bits: Largest accepted integer size (in bits) of any intermediate result.

    Returns:
        The value as int or float.

    Raises:
        ValueError: With a readable message for any rejected or failing expression.
    """
    if not isinstance(expression, str):
        raise ValueError(f"expression must be a string, got {type(expression).__name__}")
    text = expression.strip()
    if not text:
        raise ValueError("expression is empty")
    if len(text) > max_length:
        raise ValueError(f"expression is too long ({len(text)} characters, limit {max_length})")
    try:
        tree = ast.parse(text, mode="eval")
    except SyntaxError as exc:
        column = f" at column {exc.offset}" if exc.offset else ""
        raise ValueError(f"invalid syntax{column}: {exc.msg}") from None
    try:
        return _Evaluator(max_exponent, max_bits).visit(tree)
    except ZeroDivisionError:
        raise ValueError("division by zero") from None
    except OverflowError:
        raise ValueError("result is too large") from None


def _format_number(value: int | float) -> str:
    if isinstance(value, float) and value.is_integer() and abs(value) < 1e16:
        return str(int(value))
    return repr(value) if isinstance(value, float) else str(value)


class CalculatorTool(Tool):
    """Evaluates arithmetic expressions (``+ - * / // % **``, parentheses, ints and floats).

    Args:
        max_length: Longest accepted expression in characters.
        max_exponent: Largest accepted absolute exponent.
        timeout: Per-call timeout in seconds, or None for the registry default.
    """

    def __init__(self, max_length: int = 200, max_exponent: float = 100, timeout: float | None = None) -> None:
        self.max_length = max_length
        self.max_exponent = max_exponent
        self.timeout = timeout
        self.definition = ToolDefinition(
            name="calculator",
            description="Evaluate an arithmetic expression with + - * / // % ** and parentheses.",
            parameters={
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "The expression, e.g. '(3 + 4) * 2'."}
                },
                "required": ["expression"],
                "additionalProperties": False,
            },
        )

    def execute(self, expression: str) -> str:  # type: ignore[override]
        """Return the value of ``expression`` as a string (integers without ``.0``)."""
        value = evaluate_arithmetic(expression, self.max_length, self.max_exponent)
        return _format_number(value)


def normalize_step_output(output: Any) -> tuple[str, float, bool, dict[str, Any]]:
    """Turn an environment's ``step`` return value into ``(obs, reward, done, info)``.

    Accepts the 4-tuple of ``BaseEnvironment`` and the gymnasium-style 5-tuple
    ``(obs, reward, terminated, truncated, info)``.

    Args:
        output: What ``environment.step(action)`` returned.
    """
    if not isinstance(output, tuple) or len(output) not in (4, 5):
        raise TypeError("environment.step must return (observation, reward, done, info)")
    if len(output) == 5:
        obs, reward, terminated, truncated, info = output
        done = bool(terminated) or bool(truncated)
        info = dict(info or {})
        if truncated:
            info.setdefault("truncated", True)
    else:
        obs, reward, done, info = output
        info = dict(info or {})
    return str(obs), float(reward), bool(done), info


class EnvironmentStepTool(Tool):
    """Exposes ``environment.step(action)`` as a tool with one string parameter ``action``.

    The latest ``(obs, reward, done, info)`` is kept in :attr:`last_step` and
    the latest exception raised by the environment in :attr:`last_error`, so
    a manager can read reward/done after the registry has run the call.

    Args:
        environment: Any object with ``step(action: str) -> (obs, reward, done, info)``.
        name: Tool name shown to the model.
        description: Tool description shown to the model.
        timeout: Per-call timeout in seconds, or None for the registry default.
    """

    def __init__(
        self,
        environment: Any,
        name: str = "environment_step",
        description: str | None = None,
        timeout: float | None = None,
    ) -> None:
        if not callable(getattr(environment, "step", None)):
            raise TypeError("environment must have a step(action) method")
        self.environment = environment
        self.timeout = timeout
        self.last_step: tuple[str, float, bool, dict[str, Any]] | None = None
        self.last_error: BaseException | None = None
        self.definition = ToolDefinition(
            name=name,
            description=description
            or "Take an action in the environment. Returns the next observation.",
            parameters={
                "type": "object",
                "properties": {"action": {"type": "string", "description": "The action to take."}},
                "required": ["action"],
                "additionalProperties": False,
            },
        )

    def clear(self) -> None:
        """Forget the last step and error (called by the manager at each turn)."""
        self.last_step = None
        self.last_error = None

    def execute(self, action: str) -> str:  # type: ignore[override]
        """Step the environment with ``action`` and return the observation."""
        try:
            step = normalize_step_output(self.environment.step(action))
        except Exception as exc:
            self.last_error = exc
            raise
        self.last_step = step
        return step[0]
