"""Action parsers: turn a model's text into tool calls.

Three formats are supported, each with matching prompt instructions:

* :class:`JSONActionParser` - a JSON object ``{"tool": name, "arguments": {...}}``
  anywhere in the text (``"name"`` and ``"action"``/``"action_input"`` keys are
  accepted too), optionally inside a ```json fence.
* :class:`ReActActionParser` - ``Thought: / Action: / Action Input:`` lines, and
  ``Final Answer:``.
* :class:`FunctionCallingParser` - Hermes/Qwen style
  ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

Llama 3.x JSON calls and Mistral ``[TOOL_CALLS]`` are in :mod:`workbench.tools.family_parsers`
(``"llama3_json"``, ``"mistral"`` in :data:`PARSERS`).

Every parser returns a :class:`ParseResult`. When ``error`` is set the result
holds no tool calls at all, so a broken turn is never half-executed.

Strict mode (``strict=True``, e.g. ``get_parser("json", strict=True)``; a rollout builds
the environment's parser strict when ``environment.strict_format`` is set): only a reply
that *is* the action counts; whitespace around it is allowed, anything else is a parse
error whose message says what to write (the lenient parsers search the text instead).

* json: exactly one JSON object (a call or a final answer) and nothing else: no
  reasoning around it, no code fence, no second object, no plain-text reply.
* react: one ``Action:`` + ``Action Input:`` pair or one ``Final Answer:``, optionally
  after a ``Thought:`` section; nothing before the first label but that ``Thought:``,
  nothing after the input or answer (no invented ``Observation:``, no second action).
* function_calling: exactly one ``<tool_call>...</tool_call>`` block and no text
  around it. A reply without any tool call is, as in lenient mode, plain content (the
  format has no other answer syntax): it goes to the environment, which judges it
  (a strict environment wants its own action there alone, e.g. ``Answer: 14``).

Model output is untrusted: for any ``str`` the parsers return a result (they raise
only TypeError for a non-``str``), in time linear in its length. Text longer than
``max_chars`` (default :data:`~workbench.tools.parser_base.DEFAULT_MAX_CHARS`) is
an error without being scanned; JSON is decoded with a nesting cap
(:func:`~workbench.tools.parser_base.decode_json`), so 10,000 nested brackets are
a parse error the model can read, not a ``RecursionError``; the regular
expressions have no overlapping adjacent quantifiers (no backtracking blow-up),
and the JSON scan stops at the first broken object.

Raw (non-JSON-object) arguments, as in ``Action Input: left``, are stored as
``{"input": value}`` with ``ToolCall.raw_arguments = True``;
:func:`resolve_raw_arguments` maps them onto the tool's single parameter.
"""

from __future__ import annotations

import json
import re
from typing import Any, Iterable

from .base import Tool, ToolDefinition
from .family_parsers import Llama3JSONParser, MistralToolParser
from .parser_base import (
    DEFAULT_MAX_CHARS,
    ActionParser,
    ParseResult,
    ToolCall,
    _coerce_arguments,
    _definitions,
    _first_example,
    _json_error,
    _names,
    _new_call_id,
    _tool_list,
    decode_json,
    example_arguments,
    loads_json,
    outside_text,
    resolve_raw_arguments,
    stripped_span,
)

__all__ = [
    "ToolCall",
    "ParseResult",
    "ActionParser",
    "JSONActionParser",
    "ReActActionParser",
    "FunctionCallingParser",
    "get_parser",
    "example_arguments",
    "resolve_raw_arguments",
    "PARSERS",
]

# ---------------------------------------------------------------------------
# JSON
# ---------------------------------------------------------------------------

_JSON_ATTEMPT_RE = re.compile(r"\{\s*[\"'}]")
_EMPTY_FENCE_RE = re.compile(r"```[A-Za-z]*\s*```")
_FINAL_NAMES = {"final_answer", "final answer", "finalanswer", "answer"}


class JSONActionParser(ActionParser):
    """Parses ``{"tool": name, "arguments": {...}}`` objects anywhere in the text.

    Also accepted: ``{"name": ..., "arguments": ...}``, ``{"action": ..., "action_input": ...}``
    (LangChain style; ``"action": "Final Answer"`` sets ``final_answer``) and
    ``{"final_answer": "..."}``. Several objects in one output give several calls.
    Broken JSON that starts like an object (``{"``, ``{'`` or ``{}``) gives ``error``
    with the position; the text after it is not scanned.

    Args:
        max_chars: Longest text scanned; longer text is a parse error.
        strict: Only a reply that is exactly one JSON object (whitespace around it
            allowed) counts; see the module docstring.
    """

    name = "json"

    def parse(self, text: str) -> ParseResult:
        refused = self._refuse(text)
        if refused is not None:
            return refused
        calls: list[ToolCall] = []
        spans: list[tuple[int, int]] = []
        final_answer: str | None = None
        answer_span: tuple[int, int] | None = None
        broken: str | None = None
        keyless: str | None = None
        pos = 0
        while True:
            start = text.find("{", pos)
            if start < 0:
                break
            if not _JSON_ATTEMPT_RE.match(text, start):
                pos = start + 1  # "{x", "{{", "{1": no JSON object starts here (decoding would fail at once)
                continue
            try:
                obj, end = decode_json(text, start)
            except json.JSONDecodeError as exc:
                broken = f"Invalid JSON: {_json_error(exc)}"
                break  # the turn is an error now; scanning on could only cost time
            pos = end
            raw = text[start:end]
            call, answer, problem = self._interpret(obj, raw, len(calls) + 1)
            if problem is not None and call is None and answer is None and problem.startswith("!"):
                keyless = keyless or problem[1:]  # a JSON object that is not a call
                continue
            if problem:
                return ParseResult(content=text.strip(), error=problem)
            spans.append((start, end))
            if call is not None:
                call.span = (start, end)
                calls.append(call)
            if answer is not None:
                final_answer, answer_span = answer, (start, end)
        content = self._strip_spans(text, spans)
        if broken is not None:
            return ParseResult(content=content, error=broken)
        if not calls and final_answer is None and keyless is not None:
            return ParseResult(content=content, error=keyless)
        if self.strict:
            problem = self._strict_problem(text, spans)
            if problem:
                return ParseResult(content=text.strip(), error=problem)
        if calls:
            span = (calls[0].span[0], calls[-1].span[1])
        else:
            span = answer_span if answer_span is not None else stripped_span(text)
        return ParseResult(tool_calls=calls, content=content, final_answer=final_answer, span=span)

    @staticmethod
    def _strict_problem(text: str, spans: list[tuple[int, int]]) -> str | None:
        """Why a reply whose JSON calls / answers sit at ``spans`` is not one object alone, or None."""
        if not spans:
            return "strict format: the reply must be one JSON object and nothing else; no JSON call was found"
        if len(spans) > 1:
            return f"strict format: the reply must be one JSON object; it has {len(spans)}"
        where = outside_text(text, spans[0])
        if where:
            return f"strict format: the reply must be the JSON object alone; there is text {where} it"
        return None

    @staticmethod
    def _strip_spans(text: str, spans: list[tuple[int, int]]) -> str:
        pieces, last = [], 0
        for start, end in spans:
            pieces.append(text[last:start])
            last = end
        pieces.append(text[last:])
        return _EMPTY_FENCE_RE.sub("", "".join(pieces)).strip()

    @staticmethod
    def _interpret(obj: Any, raw: str, index: int) -> tuple[ToolCall | None, str | None, str | None]:
        """Return (call, final_answer, error) for one decoded JSON value.

        An error starting with ``!`` marks an object that has no tool key at all;
        it only becomes the parse error when nothing else in the text is a call.
        """
        where = f"JSON call #{index}"
        if not isinstance(obj, dict):
            return None, None, None
        if "final_answer" in obj:
            return None, str(obj["final_answer"]), None
        name = None
        for key in ("tool", "name", "action", "function"):
            if key in obj:
                name = obj[key]
                break
        if name is None:
            keys = ", ".join(obj) or "none"
            return None, None, f"!{where}: JSON object has no 'tool' key (keys: {keys}); use {{\"tool\": ..., \"arguments\": {{...}}}}"
        if isinstance(name, dict) and "name" in name:  # {"function": {"name", "arguments"}}
            obj, name = name, name["name"]
        if not isinstance(name, str) or not name.strip():
            return None, None, f"{where}: the tool name must be a non-empty string"
        args_value = None
        for key in ("arguments", "args", "parameters", "action_input", "input"):
            if key in obj:
                args_value = obj[key]
                break
        if name.strip().lower() in _FINAL_NAMES:
            if isinstance(args_value, dict) and len(args_value) == 1:
                args_value = next(iter(args_value.values()))
            answer = args_value if isinstance(args_value, str) else json.dumps(args_value)
            return None, answer, None
        arguments, is_raw, problem = _coerce_arguments(args_value, where)
        if problem:
            return None, None, problem
        call_id = obj.get("id") if isinstance(obj.get("id"), str) else _new_call_id()
        return ToolCall(name.strip(), arguments or {}, raw, call_id, raw_arguments=is_raw), None, None

    def format_instructions(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        example = json.dumps({"tool": name, "arguments": args})
        return (
            "You have access to these tools:\n"
            f"{_tool_list(defs)}\n\n"
            "To call a tool, reply with a JSON object of this exact form:\n"
            '{"tool": "<tool name>", "arguments": {<argument name>: <value>, ...}}\n\n'
            f"Example:\n{example}\n\n"
            "Use double quotes as JSON requires. "
            + ("Reply with the JSON object only: no other text, no code fence." if self.strict
               else "You may write short reasoning before the JSON object.")
        )

    def format_reminder(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        return (
            'Reply with one JSON object {"tool": "<tool name>", "arguments": {...}}, '
            f"e.g. {json.dumps({'tool': name, 'arguments': args})}"
            + (", and nothing else" if self.strict else "") + f". Available tools: {_names(defs)}."
        )


# ---------------------------------------------------------------------------
# ReAct
# ---------------------------------------------------------------------------

# A label line such as "**Action:**": spaces, tabs and markdown stars around the label and
# its colon. The runs are atomic ("(?>...)"), so a long run of spaces cannot be split two
# ways between adjacent quantifiers (which made the old pattern quadratic).
_LABEL = r"^(?>[ \t*]*){label}(?>[ \t*]*):(?>[ \t*]*)"
_ACTION_RE = re.compile(_LABEL.format(label=r"Action(?:[ \t]*\d+)?") + r"([^\n]*)", re.M | re.I)
_INPUT_RE = re.compile(_LABEL.format(label=r"Action[ \t]*Input(?:[ \t]*\d+)?"), re.M | re.I)
_FINAL_RE = re.compile(_LABEL.format(label=r"Final[ \t]*Answer"), re.M | re.I)
_STOP_RE = re.compile(_LABEL.format(label=r"(?:Observation|Thought|Action|Final[ \t]*Answer)"), re.M | re.I)
_THOUGHT_RE = re.compile(_LABEL.format(label="Thought"), re.M | re.I)
_OBSERVATION_RE = re.compile(r"^[ \t]*Observation[ \t]*:", re.M | re.I)
_FENCE_OPEN_RE = re.compile(r"```[A-Za-z]*\s*")


class ReActActionParser(ActionParser):
    """Parses ``Thought: ... / Action: tool / Action Input: {...}`` and ``Final Answer: ...``.

    Only the first action of a turn is used, and the text is cut at the first
    ``Observation:`` the model may have invented. ``Action Input`` may be a
    JSON object or a bare value; a bare value is stored as ``{"input": value}``
    with ``raw_arguments=True`` (see :func:`resolve_raw_arguments`). Input that
    starts with ``{`` but is not valid JSON is a parse error. ``content`` is the
    thought text before the action (without the ``Thought:`` label).

    Args:
        max_chars: Longest text scanned; longer text is a parse error.
        strict: Only a reply in the format and nothing else counts (an optional
            ``Thought:``, then one action or final answer); see the module docstring.
    """

    name = "react"

    def parse(self, text: str) -> ParseResult:
        refused = self._refuse(text)
        if refused is not None:
            return refused
        action = _ACTION_RE.search(text)
        final = _FINAL_RE.search(text)
        if final is not None and (action is None or final.start() < action.start()):
            answer = text[final.end():]
            if self.strict:
                problem = self._strict_prefix(text[: final.start()]) or (
                    "strict format: nothing may follow the Final Answer (no Observation, Thought or Action)"
                    if _STOP_RE.search(answer) else None)
                if problem:
                    return ParseResult(content=text.strip(), error=problem)
            observation = _OBSERVATION_RE.search(answer)
            if observation:
                answer = answer[: observation.start()]
            span = stripped_span(text, final.end(), final.end() + len(answer))
            return ParseResult(content=self._thought(text[: final.start()]), final_answer=answer.strip(), span=span)
        if action is None:
            if self.strict:
                return ParseResult(content=text.strip(), error=(
                    "strict format: no 'Action:' or 'Final Answer:' line; reply with 'Action: <tool>' and "
                    "'Action Input: <JSON>', or 'Final Answer: <answer>'"))
            return ParseResult(content=self._thought(text), span=stripped_span(text))
        content = self._thought(text[: action.start()])
        if self.strict:
            problem = self._strict_prefix(text[: action.start()])
            if problem:
                return ParseResult(content=content, error=problem)
        name = action.group(1).strip().strip("`'\"*[]").strip()
        if not name:
            return ParseResult(content=content, error="'Action:' is empty; write the tool name after 'Action:'")
        after = text[action.end():]
        input_match = _INPUT_RE.search(after)
        if input_match is None or after[: input_match.start()].strip():
            return ParseResult(content=content, error=f"'Action: {name}' must be followed by an 'Action Input:' line")
        rest = after[input_match.end():]
        stop = _STOP_RE.search(rest)
        if self.strict and stop is not None:
            return ParseResult(content=content, error=(
                "strict format: the reply must end after the Action Input (one action per reply; the "
                "Observation comes back from the environment)"))
        raw_input = (rest[: stop.start()] if stop else rest).strip()
        raw_input = self._strip_fence(raw_input)
        arguments, is_raw, problem = self._decode_input(raw_input)
        if problem:
            return ParseResult(content=content, error=problem)
        consumed = len(rest[: stop.start()] if stop else rest)
        span = stripped_span(text, action.start(), action.end() + input_match.end() + consumed)
        call = ToolCall(name, arguments, text[span[0]:span[1]], raw_arguments=is_raw, span=span)
        return ParseResult(tool_calls=[call], content=content, span=span)

    @staticmethod
    def _thought(text: str) -> str:
        return _THOUGHT_RE.sub("", text).strip()

    @staticmethod
    def _strict_prefix(prefix: str) -> str | None:
        """Why the text before the first Action / Final Answer label is not an (optional)
        ``Thought:`` section, or None."""
        stripped = prefix.strip()
        if not stripped:
            return None
        if not _THOUGHT_RE.match(stripped):
            return "strict format: the reply must start with 'Thought:', 'Action:' or 'Final Answer:'"
        if _OBSERVATION_RE.search(stripped):
            return "strict format: do not write an Observation; it comes back from the environment"
        return None

    @staticmethod
    def _strip_fence(value: str) -> str:
        if value.startswith("```"):
            value = value[_FENCE_OPEN_RE.match(value).end():].rstrip()
            if value.endswith("```"):
                value = value[:-3]
        elif len(value) >= 2 and value[0] == value[-1] == "`":
            value = value[1:-1]
        return value.strip()

    @staticmethod
    def _decode_input(raw_input: str) -> tuple[dict[str, Any], bool, str | None]:
        if raw_input.startswith(("{", "[", '"')):
            try:
                value, _ = decode_json(raw_input)
            except json.JSONDecodeError as exc:
                return {}, False, f"Invalid JSON in Action Input: {_json_error(exc)}"
            if isinstance(value, dict):
                return value, False, None
            if isinstance(value, list):
                return {}, False, "Action Input must be a JSON object (or a single value), not an array"
            return {"input": value}, True, None
        return {"input": raw_input}, True, None

    def format_instructions(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        return (
            "You have access to these tools:\n"
            f"{_tool_list(defs)}\n\n"
            "Use exactly this format:\n"
            "Thought: <your reasoning>\n"
            f"Action: <one of: {_names(defs)}>\n"
            "Action Input: <the arguments as a JSON object>\n\n"
            "Then stop; the result comes back to you as an Observation. When you are finished, write:\n"
            "Thought: <your reasoning>\n"
            "Final Answer: <your answer>\n\n"
            "Example:\n"
            "Thought: I should use a tool.\n"
            f"Action: {name}\n"
            f"Action Input: {json.dumps(args)}"
            + ("\n\nWrite nothing else: no text before 'Thought:' and nothing after the Action Input or the "
               "Final Answer." if self.strict else "")
        )

    def format_reminder(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        return (
            "Use the format:\nThought: <reasoning>\nAction: <tool name>\nAction Input: <JSON object>\n"
            f"e.g. Action: {name}\nAction Input: {json.dumps(args)}\n"
            f"or 'Final Answer: <answer>'"
            + (", and nothing else (no text before 'Thought:', nothing after the input or answer)" if self.strict
               else "") + f". Available tools: {_names(defs)}."
        )


# ---------------------------------------------------------------------------
# Hermes / Qwen function calling
# ---------------------------------------------------------------------------

_OPEN_TAG = "<tool_call>"
_CLOSE_TAG = "</tool_call>"


class FunctionCallingParser(ActionParser):
    """Parses Hermes/Qwen ``<tool_call>{"name": ..., "arguments": {...}}</tool_call>`` blocks.

    Several blocks in one output give several calls. ``arguments`` may be an
    object or a JSON-encoded string. An unclosed tag or invalid JSON gives an
    ``error`` naming the call (``tool call #2 ...``).

    Args:
        allow_unclosed: Accept a final ``<tool_call>`` without ``</tool_call>``
            (useful when the closing tag is a generation stop string that the
            engine strips). Off by default.
        max_chars: Longest text scanned; longer text is a parse error.
        strict: A reply with a tool call must be exactly one ``<tool_call>`` block
            (whitespace around it allowed); see the module docstring.
    """

    name = "function_calling"

    def __init__(self, allow_unclosed: bool = False, max_chars: int = DEFAULT_MAX_CHARS,
                 strict: bool = False) -> None:
        super().__init__(max_chars, strict)
        self.allow_unclosed = allow_unclosed

    def parse(self, text: str) -> ParseResult:
        refused = self._refuse(text)
        if refused is not None:
            return refused
        calls: list[ToolCall] = []
        outside: list[str] = []
        pos = 0
        index = 0
        while True:
            open_at = text.find(_OPEN_TAG, pos)
            stray_close = text.find(_CLOSE_TAG, pos)
            if stray_close >= 0 and (open_at < 0 or stray_close < open_at):
                return ParseResult(content=text.strip(), error=f"found {_CLOSE_TAG} without a matching {_OPEN_TAG}")
            if open_at < 0:
                outside.append(text[pos:])
                break
            index += 1
            outside.append(text[pos:open_at])
            body_start = open_at + len(_OPEN_TAG)
            close_at = text.find(_CLOSE_TAG, body_start)
            next_open = text.find(_OPEN_TAG, body_start)
            if close_at < 0 or (0 <= next_open < close_at):
                if self.allow_unclosed and close_at < 0 and next_open < 0:
                    close_at, end = len(text), len(text)
                else:
                    return ParseResult(
                        content="".join(outside).strip(),
                        error=f"tool call #{index}: {_OPEN_TAG} is not closed with {_CLOSE_TAG}",
                    )
            else:
                end = close_at + len(_CLOSE_TAG)
            call, problem = self._decode(text[body_start:close_at], text[open_at:end], index)
            if problem:
                return ParseResult(content="".join(outside).strip(), error=problem)
            call.span = (open_at, end)
            calls.append(call)
            pos = end
        if self.strict and calls:
            where = outside_text(text, calls[0].span) if len(calls) == 1 else ""
            if len(calls) > 1 or where:
                problem = (f"strict format: one tool call per reply; it has {len(calls)}" if len(calls) > 1 else
                           f"strict format: the reply must be the {_OPEN_TAG} block alone; there is text {where} it")
                return ParseResult(content=text.strip(), error=problem)
        span = (calls[0].span[0], calls[-1].span[1]) if calls else stripped_span(text)
        return ParseResult(tool_calls=calls, content="".join(outside).strip(), span=span)

    @staticmethod
    def _decode(body: str, raw: str, index: int) -> tuple[ToolCall | None, str | None]:
        where = f"tool call #{index}"
        body = body.strip()
        if not body:
            return None, f"{where} is empty"
        try:
            obj = loads_json(body)
        except json.JSONDecodeError as exc:
            return None, f"{where} is not valid JSON: {_json_error(exc)}"
        if not isinstance(obj, dict):
            return None, f"{where} must be a JSON object with 'name' and 'arguments'"
        if isinstance(obj.get("function"), dict):
            obj = {**obj, **obj["function"]}
        name = obj.get("name")
        if not isinstance(name, str) or not name.strip():
            return None, f"{where} has no 'name' string"
        args_value = obj.get("arguments", obj.get("parameters"))
        arguments, is_raw, problem = _coerce_arguments(args_value, where)
        if problem:
            return None, problem
        call_id = obj.get("id") if isinstance(obj.get("id"), str) else _new_call_id()
        return ToolCall(name.strip(), arguments or {}, raw, call_id, raw_arguments=is_raw), None

    def format_instructions(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        schemas = "\n".join(json.dumps(d.to_openai_schema()) for d in defs)
        return (
            "You may call one or more tools. Their signatures are given inside <tools></tools>:\n"
            f"<tools>\n{schemas}\n</tools>\n\n"
            "For each call, write a JSON object with the tool name and its arguments inside "
            f"{_OPEN_TAG}{_CLOSE_TAG} tags:\n"
            f'{_OPEN_TAG}\n{{"name": <tool-name>, "arguments": <arguments-json-object>}}\n{_CLOSE_TAG}\n\n'
            f"Example:\n{_OPEN_TAG}\n{json.dumps({'name': name, 'arguments': args})}\n{_CLOSE_TAG}"
            + (f"\n\nA reply with a call is one {_OPEN_TAG} block and no other text." if self.strict else "")
        )

    def format_reminder(self, tools: Iterable[ToolDefinition | Tool] | None = None) -> str:
        defs = _definitions(tools)
        name, args = _first_example(defs)
        return (
            f'Write each call as {_OPEN_TAG}{{"name": "<tool name>", "arguments": {{...}}}}{_CLOSE_TAG}, '
            f"e.g. {_OPEN_TAG}{json.dumps({'name': name, 'arguments': args})}{_CLOSE_TAG}"
            + (", one call per reply and no other text" if self.strict else "") + ". "
            f"Available tools: {_names(defs)}."
        )


PARSERS: dict[str, type[ActionParser]] = {
    "json": JSONActionParser,
    "react": ReActActionParser,
    "function_calling": FunctionCallingParser,
    "hermes": FunctionCallingParser,
    "llama3_json": Llama3JSONParser,
    "mistral": MistralToolParser,
}


def get_parser(name: str | ActionParser, **kwargs: Any) -> ActionParser:
    """Create a parser by name: ``"json"``, ``"react"``, ``"function_calling"``/``"hermes"``,
    ``"llama3_json"`` or ``"mistral"`` (`workbench.tools.family_parsers`).

    Args:
        name: Parser name (case-insensitive; ``-`` and ``_`` are equivalent), or
            an :class:`ActionParser` instance, which is returned unchanged.
        **kwargs: Passed to the parser's constructor.

    Raises:
        ValueError: For an unknown name; the message lists the known names.
    """
    if isinstance(name, ActionParser):
        return name
    key = str(name).strip().lower().replace("-", "_")
    if key not in PARSERS:
        raise ValueError(f"unknown parser {name!r}; choose one of: {', '.join(PARSERS)}")
    return PARSERS[key](**kwargs)
