"""Shared parser types: :class:`ToolCall`, :class:`ParseResult` and the :class:`ActionParser` base.

Also holds the helpers the concrete parsers in :mod:`workbench.tools.parsers`
share (argument normalisation, example arguments for prompts, JSON error
text, bounded JSON decoding) and :func:`resolve_raw_arguments`, which maps a
bare argument value onto a tool's single parameter.

Model output is untrusted input. Every JSON value the parsers decode goes through
:func:`decode_json` / :func:`loads_json`: an iterative pre-scan refuses nesting
deeper than :data:`MAX_JSON_DEPTH` before the (recursive) standard decoder runs,
and every decoding failure -- including numbers too long for ``int`` -- is a
:class:`json.JSONDecodeError` with a position, never a ``RecursionError`` or a
bare ``ValueError``. Text longer than a parser's ``max_chars`` is not scanned at
all; it is a parse error that tells the model to write less.
"""

from __future__ import annotations

import json
import re
import uuid
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Any, Iterable

from .base import Tool, ToolDefinition

__all__ = ["ToolCall", "ParseResult", "ActionParser", "example_arguments", "resolve_raw_arguments",
           "decode_json", "loads_json", "stripped_span", "outside_text", "MAX_JSON_DEPTH", "DEFAULT_MAX_CHARS"]

MAX_JSON_DEPTH = 64
"""Deepest JSON nesting (objects and arrays) a parser decodes; deeper is a parse error."""

DEFAULT_MAX_CHARS = 1_000_000
"""Longest model output a parser scans; longer output is a parse error (no scanning)."""

_DECODER = json.JSONDecoder()
# One token of a JSON-ish scan: a string (closing quote optional, so an unterminated
# string ends the scan instead of backtracking) or a bracket. Linear: the string
# pattern is the unrolled loop "[^"\\]*(\\.[^"\\]*)*", whose pieces cannot overlap.
_SCAN_RE = re.compile(r'"[^"\\]*(?:\\.[^"\\]*)*"?|[\[\]{}]', re.S)
_WS_RE = re.compile(r"[ \t\n\r]*")


def _too_deep_at(text: str, start: int, max_depth: int = MAX_JSON_DEPTH) -> int:
    """Position where the JSON value at ``start`` nests deeper than ``max_depth``, or -1.

    Iterative and linear: stops at the bracket that closes the value at ``start`` (or
    the end of the text). Brackets inside strings are not counted.
    """
    depth = 0
    for m in _SCAN_RE.finditer(text, start):
        c = text[m.start()]
        if c == '"':
            if depth == 0:
                return -1  # a bare string value
            continue
        if c in "{[":
            depth += 1
            if depth > max_depth:
                return m.start()
        else:
            depth -= 1
            if depth <= 0:
                return -1
    return -1


def decode_json(text: str, start: int = 0) -> tuple[Any, int]:
    """``json.JSONDecoder().raw_decode(text, start)`` made safe for untrusted text.

    Returns (value, end). Raises :class:`json.JSONDecodeError` (with a position) for
    invalid JSON, nesting deeper than :data:`MAX_JSON_DEPTH`, and numbers too long
    to convert; nothing else.
    """
    deep = _too_deep_at(text, start) if text[start:start + 1] in ("{", "[") else -1
    if deep >= 0:
        raise json.JSONDecodeError(f"JSON nested deeper than {MAX_JSON_DEPTH} levels", text, deep)
    try:
        return _DECODER.raw_decode(text, start)
    except json.JSONDecodeError:
        raise
    except RecursionError:  # the caller's own stack was already deep
        raise json.JSONDecodeError("JSON nested too deeply", text, start) from None
    except ValueError as exc:  # e.g. an integer of more than 4300 digits
        raise json.JSONDecodeError(f"JSON value cannot be converted ({str(exc)[:80]})", text, start) from None


def loads_json(text: str) -> Any:
    """``json.loads`` for untrusted text, with the guarantees of :func:`decode_json`."""
    begin = _WS_RE.match(text).end()
    value, end = decode_json(text, begin)
    end = _WS_RE.match(text, end).end()
    if end != len(text):
        raise json.JSONDecodeError("Extra data", text, end)
    return value


def stripped_span(text: str, start: int = 0, end: int | None = None) -> tuple[int, int]:
    """``(start, end)`` of ``text[start:end].strip()`` inside ``text`` (whitespace trimmed)."""
    end = len(text) if end is None else end
    while start < end and text[start].isspace():
        start += 1
    while end > start and text[end - 1].isspace():
        end -= 1
    return start, end


def outside_text(text: str, span: tuple[int, int]) -> str:
    """Where ``text`` has more than whitespace outside ``span``: "before", "after",
    "before and after", or "" when the span is the whole reply (whitespace trimmed)."""
    before, after = bool(text[:span[0]].strip()), bool(text[span[1]:].strip())
    return " and ".join(w for w, has in (("before", before), ("after", after)) if has)


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
        span: ``(start, end)`` character offsets of ``raw`` in the parsed text, or None
            (a call built by hand).
    """

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str = ""
    id: str = field(default_factory=_new_call_id)
    raw_arguments: bool = False
    result: str | None = None
    success: bool | None = None
    span: tuple[int, int] | None = None

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
        span: ``(start, end)`` character offsets of the parsed text that the result was
            read from: the tool calls (first call's start to last call's end), else the
            final answer, else the stripped content; None with ``error`` set. Lets the
            run doctor tell "the reply was the action" from "the action was a small
            part of the reply".
    """

    tool_calls: list[ToolCall] = field(default_factory=list)
    content: str = ""
    error: str | None = None
    final_answer: str | None = None
    span: tuple[int, int] | None = None

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
                decoded = loads_json(stripped)
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
            value = loads_json(value)
        except json.JSONDecodeError:
            pass
    elif not isinstance(value, str) and target_type == "string":
        value = json.dumps(value) if isinstance(value, (dict, list)) else str(value)
    return {target: value}


class ActionParser(ABC):
    """Base class: ``parse(text) -> ParseResult`` plus prompt instructions for the format."""

    name: str = ""
    max_chars: int = DEFAULT_MAX_CHARS
    """Longest text :meth:`parse` scans; longer text is a parse error."""
    strict: bool = False
    """Strict format: a reply that is not exactly the action (surrounding text, several
    actions) is a parse error instead of being searched for one. The built-in parsers take
    it as a constructor argument; a parser that has no strict mode leaves it False."""

    def __init__(self, max_chars: int = DEFAULT_MAX_CHARS, strict: bool = False) -> None:
        self.max_chars = int(max_chars)
        self.strict = bool(strict)

    @abstractmethod
    def parse(self, text: str) -> ParseResult:
        """Extract tool calls, free text and a final answer from ``text``.

        Never raises for any ``str``: format problems (including text longer than
        ``max_chars`` and JSON nested deeper than :data:`MAX_JSON_DEPTH`) are
        ``ParseResult.error``. Raises TypeError when ``text`` is not a ``str``.
        """

    def _refuse(self, text: Any) -> ParseResult | None:
        """The parse error for text that must not be scanned (too long), else None."""
        if not isinstance(text, str):
            raise TypeError(f"{type(self).__name__}.parse expects the model output as str, got {type(text).__name__}")
        if len(text) > self.max_chars:
            return ParseResult(
                content=text,
                error=(f"the reply is {len(text)} characters long; at most {self.max_chars} are read. "
                       "Write a shorter reply with just the call"),
            )
        return None

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
