"""Shared parser types: :class:`ToolCall`, :class:`ParseResult` and the :class:`ActionParser` base.

Also holds the helpers the concrete parsers in :mod:`workbench.tools.parsers`
share (argument normalisation, example arguments for prompts, JSON error
text) and :func:`resolve_raw_arguments`, which maps a bare argument value onto
a tool's single parameter.
"""

from __future__ import annotations

import json
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable

from .base import Tool, ToolDefinition

__all__ = ["ToolCall", "ParseResult", "ActionParser", "example_arguments", "resolve_raw_arguments"]


def _new_call_id() -> str:
    return f"call_{uuid.uuid4().hex[:12]}"


@dataclass
class ToolCall:
    """One tool call requested by the model.

    Args:
        name: Tool name.
        arguments: Keyword arguments for the tool.
        raw: The exact text the call was parsed from.
        id: Call id (taken from the model output when present, else generated).
        raw_arguments: True when the model gave a bare value instead of a JSON
            object; the value is then stored as ``arguments["input"]``.
        result: Filled in after execution with the tool's output or error message.
        success: Filled in after execution; None while not executed.
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    id: str = field(default_factory=_new_call_id)
    raw_arguments: bool = False
    result: str | None = None
    success: bool | None = None

    def to_dict(self) -> dict[str, Any]:
        """Plain-dict view (for logging and JSON)."""
        return {
            "id": self.id,
            "name": self.name,
            "arguments": self.arguments,
            "result": self.result,
            "success": self.success,
        }


@dataclass
class ParseResult:
    """What a parser found in one model output.

    Args:
        tool_calls: Calls in the order they appear (empty when ``error`` is set).
        content: Text outside the calls (e.g. the model's reasoning or a plain answer).
        error: Description of the format problem, or None.
        final_answer: Text after ``Final Answer:`` (or a JSON final answer), or None.
    """

    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    error: str | None = None
    final_answer: str | None = None

    @property
    def ok(self) -> bool:
        """True when there is no parse error."""
        return self.error is None


def _definitions(tools: Iterable[ToolDefinition | Tool] | None) -> list[ToolDefinition]:
    out = []
    for tool in tools or ():
        out.append(tool.definition if isinstance(tool, Tool) else tool)
    return out


def _example_value(pname: str, schema: dict[str, Any]) -> Any:
    if "enum" in schema and schema["enum"]:
        return schema["enum"][0]
    if "default" in schema:
        return schema["default"]
    kind = schema.get("type")
    kind = kind[0] if isinstance(kind, list) and kind else kind
    return {"integer": 1, "number": 1.5, "boolean": True, "array": [], "object": {}}.get(kind, f"<{pname}>")


def example_arguments(definition: ToolDefinition) -> dict[str, Any]:
    """Placeholder arguments for a tool, used in format examples.

    Args:
        definition: The tool whose required (or, if none, all) parameters are filled.
    """
    names = definition.required or list(definition.properties)
    return {n: _example_value(n, definition.properties.get(n, {})) for n in names}


def _tool_list(defs: list[ToolDefinition]) -> str:
    lines = []
    for d in defs:
        desc = f": {d.description}" if d.description else ""
        lines.append(f"- {d.name}{desc} Arguments: {d.signature_text()}")
    return "\n".join(lines)


def _json_error(exc: json.JSONDecodeError) -> str:
    return f"{exc.msg} at line {exc.lineno} column {exc.colno} (char {exc.pos})"


def _coerce_arguments(value: Any, where: str) -> tuple[dict[str, Any] | None, bool, str | None]:
    """Normalise an ``arguments`` value; returns (arguments, is_raw, error)."""
    if value is None:
        return {}, False, None
    if isinstance(value, dict):
        return value, False, None
    if isinstance(value, str):
        stripped = value.strip()
        if stripped.startswith("{"):
            try:
                decoded = json.loads(stripped)
            except json.JSONDecodeError as exc:
                return None, False, f"{where}: 'arguments' string is not valid JSON: {_json_error(exc)}"
            if isinstance(decoded, dict):
                return decoded, False, None
        return {"input": value}, True, None
    if isinstance(value, list):
        return None, False, f"{where}: 'arguments' must be a JSON object, got an array"
    return {"input": value}, True, None


def resolve_raw_arguments(call: ToolCall, definition: ToolDefinition | None) -> dict[str, Any]:
    """Map a bare argument value onto the tool's single parameter.

    When ``call.raw_arguments`` is set and the tool has exactly one required
    parameter (or exactly one parameter), returns ``{that_name: value}``; a
    string value is JSON-decoded first when that parameter is not a string.
    Otherwise returns ``call.arguments`` unchanged.

    Args:
        call: The parsed call.
        definition: The tool's definition (None if the tool is unknown).
    """
    if not call.raw_arguments or definition is None or "input" in definition.properties:
        return call.arguments
    required = definition.required
    candidates = required if len(required) == 1 else list(definition.properties)
    if len(candidates) != 1:
        return call.arguments
    target = candidates[0]
    value = call.arguments.get("input")
    target_type = definition.properties.get(target, {}).get("type")
    if isinstance(value, str) and target_type not in (None, "string"):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            pass
    elif not isinstance(value, str) and target_type == "string":
        value = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return {target: value}


class ActionParser(ABC):
    """Base class: ``parse(text) -> ParseResult`` plus prompt instructions for the format."""

    name: str = ""

    @abstractmethod
    def parse(self, text: str) -> ParseResult:
        """Extract tool calls, free text and a final answer from ``text``."""

    @abstractmethod
    def format_instructions(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        """System-prompt text describing the tools and the exact call format, with an example.

        Args:
            tools: The tools the model may call (definitions or Tool objects).
        """

    def format_reminder(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        """A short version of the format instructions, used after a parse error.

        Args:
            tools: The tools the model may call.
        """
        return self.format_instructions(tools)


def _names(defs: list[ToolDefinition]) -> str:
    return ", ".join(d.name for d in defs) or "(none)"


def _first_example(defs: list[ToolDefinition]) -> tuple[str, dict[str, Any]]:
    if not defs:
        return "tool_name", {"argument": "value"}
    return defs[0].name, example_arguments(defs[0])
