"""Tool-call formats of model families whose chat templates teach their own.

* :class:`Llama3JSONParser` (``"llama3_json"``) - Llama 3.1/3.2's custom tool calls: a JSON
  object ``{"name": ..., "parameters": {...}}`` (``"arguments"`` accepted too), optionally
  after ``<|python_tag|>``; several calls may follow one another (``;`` between them).
* :class:`MistralToolParser` (``"mistral"``) - ``[TOOL_CALLS]`` followed either by a JSON
  list ``[{"name": ..., "arguments": {...}}, ...]`` (Mistral v0.3 / v7 tokenizers) or by
  ``name[ARGS]{...}`` (v11 and later), one ``[TOOL_CALLS]`` per call.

The Hermes/Qwen ``<tool_call>`` format is :class:`workbench.tools.parsers.FunctionCallingParser`.
`workbench.rollout.template` reads which of these a chat template teaches, and a rollout
with ``inference.tool_format`` "auto" uses that family's parser and passes the tool
definitions to the template's ``tools`` argument. Like every parser here they never raise
for a ``str`` and have a strict mode (one call, nothing around it).
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from .base import Tool, ToolDefinition
from .parser_base import (
    ActionParser, ParseResult, ToolCall, _coerce_arguments, _definitions, _first_example,
    _json_error, _names, _new_call_id, decode_json, outside_text, stripped_span,
)

#: Where a Llama call starts: an object whose first key is "name".
_CALL_START = re.compile(r'\{\s*"name"\s*:')

__all__ = ["Llama3JSONParser", "MistralToolParser"]

PYTHON_TAG = "<|python_tag|>"
TOOL_CALLS = "[TOOL_CALLS]"
ARGS = "[ARGS]"


class Llama3JSONParser(ActionParser):
    """Llama 3.x JSON tool calls: ``{"name": ..., "parameters": {...}}`` (see the module docstring).

    Every JSON object that starts with a ``"name"`` key, anywhere in the reply, is a call (in
    the order written); other text is content. A reply without one is plain content.

    Args:
        max_chars: Longest text scanned; longer text is a parse error.
        strict: Only a reply that is exactly one call (after an optional ``<|python_tag|>``,
            whitespace around it allowed) counts.
    """

    name = "llama3_json"

    def parse(self, text: str) -> ParseResult:
        refused = self._refuse(text)
        if refused is not None:
            return refused
        tag = text.find(PYTHON_TAG)
        pos = 0 if tag < 0 else tag + len(PYTHON_TAG)
        calls: list[ToolCall] = []
        while True:
            start = _CALL_START.search(text, pos)
            if start is None:
                break
            at = start.start()
            try:
                obj, end = decode_json(text, at)
            except json.JSONDecodeError as exc:
                return ParseResult(content=text.strip(), error=f"tool call #{len(calls) + 1} is not valid JSON: "
                                                               f"{_json_error(exc)}")
            call, problem = _named_call(obj, text[at:end], len(calls) + 1)
            if problem:
                return ParseResult(content=text.strip(), error=problem)
            call.span = (at, end)
            calls.append(call)
            pos = end
        if not calls:
            return ParseResult(content=text.strip(), span=stripped_span(text))
        span = (calls[0].span[0], calls[-1].span[1])
        if self.strict:
            lead = text[:span[0]].replace(PYTHON_TAG, "", 1) if tag >= 0 and tag < span[0] else text[:span[0]]
            after = text[span[1]:]
            if len(calls) > 1 or lead.strip() or after.strip():
                where = " and ".join(w for w, has in (("before", lead.strip()), ("after", after.strip())) if has)
                problem = (f"strict format: one tool call per reply; it has {len(calls)}" if len(calls) > 1 else
                           f"strict format: the reply must be the JSON call alone; there is text {where} it")
                return ParseResult(content=text.strip(), error=problem)
        pieces, last = [], 0
        for call in calls:
            pieces.append(text[last:call.span[0]])
            last = call.span[1]
        pieces.append(text[last:])
        content = "".join(pieces).replace(PYTHON_TAG, "").replace(";", "").strip()
        return ParseResult(tool_calls=calls, content=content, span=span)

    def format_instructions(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        schemas = "\n\n".join(json.dumps(d.to_openai_schema(), indent=4) for d in defs)
        return (
            "Given the following functions, please respond with a JSON for a function call with its proper arguments "
            "that best answers the given prompt.\n\n"
            'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}. '
            f"Do not use variables.\n\n{schemas}\n\n"
            f"Example: {json.dumps({'name': name, 'parameters': args})}"
            + ("\n\nA reply with a call is that JSON object and nothing else." if self.strict else "")
        )

    def format_reminder(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        return (f'Write a call as {{"name": "<tool name>", "parameters": {{...}}}}, e.g. '
                f"{json.dumps({'name': name, 'parameters': args})}"
                + (", and nothing else" if self.strict else "") + f". Available tools: {_names(defs)}.")


def _named_call(obj: Any, raw: str, index: int) -> tuple[ToolCall | None, str | None]:
    """A call from ``{"name": ..., "parameters" or "arguments": {...}}``, or the problem with it."""
    where = f"tool call #{index}"
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"].strip():
        return None, f"{where} must be an object with a 'name' string and its arguments"
    arguments, is_raw, problem = _coerce_arguments(obj.get("parameters", obj.get("arguments")), where)
    if problem:
        return None, problem
    call_id = obj.get("id") if isinstance(obj.get("id"), str) else _new_call_id()
    return ToolCall(obj["name"].strip(), arguments or {}, raw, call_id, raw_arguments=is_raw), None


class MistralToolParser(ActionParser):
    """Mistral ``[TOOL_CALLS]`` tool calls (see the module docstring).

    Args:
        max_chars: Longest text scanned; longer text is a parse error.
        strict: A reply with a call must be one ``[TOOL_CALLS]`` call and no other text.
    """

    name = "mistral"

    def parse(self, text: str) -> ParseResult:
        refused = self._refuse(text)
        if refused is not None:
            return refused
        first = text.find(TOOL_CALLS)
        if first < 0:
            return ParseResult(content=text.strip(), span=stripped_span(text))
        calls: list[ToolCall] = []
        pos, index = first, 0
        while pos < len(text) and text.startswith(TOOL_CALLS, pos):
            start = pos
            pos += len(TOOL_CALLS)
            while pos < len(text) and text[pos].isspace():
                pos += 1
            if text.startswith("[", pos):  # v0.3 / v7: a JSON list of calls
                try:
                    value, end = decode_json(text, pos)
                except json.JSONDecodeError as exc:
                    return ParseResult(content=text[:first].strip(),
                                       error=f"{TOOL_CALLS} list is not valid JSON: {_json_error(exc)}")
                if not isinstance(value, list) or not value:
                    return ParseResult(content=text[:first].strip(), error=f"{TOOL_CALLS} must be followed by a "
                                       "non-empty list of {\"name\", \"arguments\"} objects")
                for obj in value:
                    index += 1
                    call, problem = self._call(obj, text[start:end], index)
                    if problem:
                        return ParseResult(content=text[:first].strip(), error=problem)
                    call.span = (start, end)
                    calls.append(call)
                pos = end
            else:  # v11+: name[ARGS]{...}
                index += 1
                args_at = text.find(ARGS, pos)
                name = text[pos:args_at].strip() if args_at >= 0 else ""
                if args_at < 0 or not name or any(c.isspace() for c in name):
                    return ParseResult(content=text[:first].strip(), error=f"tool call #{index}: write "
                                       f"{TOOL_CALLS}<tool name>{ARGS}{{...arguments...}}")
                body = args_at + len(ARGS)
                try:
                    value, end = decode_json(text, body)
                except json.JSONDecodeError as exc:
                    return ParseResult(content=text[:first].strip(),
                                       error=f"tool call #{index}: arguments are not valid JSON: {_json_error(exc)}")
                call, problem = self._call({"name": name, "arguments": value}, text[start:end], index)
                if problem:
                    return ParseResult(content=text[:first].strip(), error=problem)
                call.span = (start, end)
                calls.append(call)
                pos = end
            while pos < len(text) and text[pos].isspace():
                pos += 1
        span = (calls[0].span[0], calls[-1].span[1])
        content = (text[:first] + text[span[1]:]).strip()
        if self.strict:
            where = outside_text(text, span)
            if len(calls) > 1 or where:
                problem = (f"strict format: one tool call per reply; it has {len(calls)}" if len(calls) > 1 else
                           f"strict format: the reply must be the {TOOL_CALLS} call alone; there is text {where} it")
                return ParseResult(content=text.strip(), error=problem)
        return ParseResult(tool_calls=calls, content=content, span=span)

    @staticmethod
    def _call(obj: Any, raw: str, index: int) -> tuple[ToolCall | None, str | None]:
        return _named_call(obj, raw, index)

    def format_instructions(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        schemas = json.dumps([d.to_openai_schema() for d in defs])
        return (
            f"[AVAILABLE_TOOLS]{schemas}[/AVAILABLE_TOOLS]\n"
            f"To call a tool, write {TOOL_CALLS} followed by a JSON list of calls, each "
            '{"name": <tool-name>, "arguments": <arguments-json-object>}.\n'
            f"Example: {TOOL_CALLS}{json.dumps([{'name': name, 'arguments': args}])}"
            + ("\n\nA reply with a call is that call and no other text." if self.strict else "")
        )

    def format_reminder(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        return (f"Write a call as {TOOL_CALLS}{json.dumps([{'name': name, 'arguments': args}])}"
                + (" and nothing else" if self.strict else "") + f". Available tools: {_names(defs)}.")
