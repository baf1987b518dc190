"""OpenAI chat requests to prompt ids, and sampled ids back to OpenAI messages.

The gateway never decodes and re-encodes a model turn. An assistant message that the
harness re-sends, and that equals a reply this gateway gave in the same episode, is
put back into the next prompt as the ids the engine sampled (`PromptBuilder.prompt_ids`);
only the text around those replies (system, user and tool messages, template glue,
the generation prompt) is rendered with the chat template and tokenised, segment by
segment, exactly as `workbench.rollout.chat.ChatRenderer` renders observation deltas.
So a harness that keeps its history as the gateway returned it gets prompts that
extend the previous call's prompt + sampled ids token for token; one that rewrites
history (edits a reply, re-renders tool calls its own way, sends text to
`/v1/completions`) gets its text tokenised as sent, and the assembled episode says
where the ids stopped matching (`workbench.gateway.assemble`).

Tools: when the tokenizer's chat template renders a `tools` argument, the OpenAI tool
definitions go to the template and replies are parsed in the format it teaches (Hermes/Qwen
`<tool_call>`, Llama 3.1 JSON, Mistral `[TOOL_CALLS]`; `tool_format` as in
`inference.tool_format`); otherwise the function-calling parser's instructions
(`FunctionCallingParser.format_instructions`) are added to the system message and replies
are parsed with it. Calls become OpenAI `tool_calls`, the text outside them the message content.

Chat settings (`workbench.rollout.configured.chat_settings`: `history`, `enable_thinking`,
`tool_format`) are those of a rollout. With history "rendered" (what "auto" picks for a
template that is not prefix-stable) no reply is put back as its sampled ids: every prompt is
the template's render of the messages as sent, as a deployed model gets it, and the assembled
episode holds one sequence per call (`workbench.gateway.assemble`). Reasoning (`<think>...
</think>`) is returned apart as the message's `reasoning_content` (as vLLM's reasoning parsers
do), tool calls are read from the text after it, and an assistant message sent back with
`reasoning_content` gives it to the template (Qwen3's renders or drops it by its own rules).
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from workbench.engines.constraints import call_marker_token
from workbench.rollout.chat import SENTINEL, encode, stop_token_ids
from workbench.rollout.template import TOOL_FORMATS, normalize_messages, resolve_history, say_once, template_profile
from workbench.tools.base import ToolDefinition
from workbench.tools.parsers import FunctionCallingParser, get_parser
from workbench.tools.reasoning import split_reasoning

ROLES = ("system", "developer", "user", "assistant", "tool")


class RequestError(ValueError):
    """A request the gateway refuses with an OpenAI-style 400 error.

    Args:
        message: what is wrong and how to fix it.
        param: the request field at fault (None when it is the whole request).
        code: a short machine-readable code (OpenAI's `error.code`).
    """

    def __init__(self, message: str, param: str | None = None, code: str = "invalid_request"):
        super().__init__(message)
        self.message, self.param, self.code = message, param, code


@dataclass
class Reply:
    """One reply the gateway gave: the ids the engine sampled and the message built from them."""

    token_ids: list[int]
    """Sampled ids as the engine returned them (stop id included when it stopped on one)."""
    logprobs: list[float]
    """Raw-model logprob of each sampled id."""
    text: str
    """The reply's text (sampled ids decoded, trailing end-of-turn id dropped)."""
    content: str | None
    """The OpenAI message content: the text outside tool calls (None when empty and there are calls)."""
    tool_calls: list[dict[str, Any]] = field(default_factory=list)
    """OpenAI tool calls: {"id", "type": "function", "function": {"name", "arguments" (a JSON string)}}."""
    parse_error: str | None = None
    """Why tool calls in the text could not be parsed (the text is then returned as content)."""
    reasoning: str | None = None
    """The reply's reasoning block (returned as `reasoning_content`), or None without one."""
    reasoning_cut: bool = False
    """The reply ended inside its reasoning block: it has no content and no tool calls."""

    def key(self) -> tuple:
        """What an assistant message must hold to count as this reply when re-sent (its
        `reasoning_content`, when it sends one, must be the reply's too: `matches`)."""
        return _message_key({"content": self.content, "tool_calls": self.tool_calls})

    def matches(self, message: dict[str, Any]) -> bool:
        """`message` (an assistant message sent back) is this reply: same content and tool calls,
        and the same reasoning if it carries `reasoning_content` (a harness may drop it)."""
        sent = message.get("reasoning_content")
        return _message_key(message) == self.key() and (sent is None or sent == (self.reasoning or ""))


def _message_key(message: dict[str, Any]) -> tuple:
    calls = []
    for call in message.get("tool_calls") or []:
        fn = call.get("function") or {}
        args = fn.get("arguments")
        try:
            args = json.loads(args) if isinstance(args, str) else args
        except json.JSONDecodeError:
            pass
        calls.append((fn.get("name"), json.dumps(args, sort_keys=True)))
    return (_text_content(message.get("content"), "content") or "", tuple(calls))


def _text_content(content: Any, where: str) -> str | None:
    """A message's content as text: a string, None, or a list of {"type": "text"} parts."""
    if content is None or isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for i, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"{where}[{i}] must be a {{'type': 'text', 'text': str}} part; only text "
                                   "content is supported", where)
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"{where} must be a string, null or a list of text parts, got {type(content).__name__}", where)


def parse_tools(tools: Any) -> list[dict[str, Any]]:
    """Check OpenAI `tools` ([{"type": "function", "function": {"name", "description", "parameters"}}])."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise RequestError("tools must be a list of {'type': 'function', 'function': {...}} objects", "tools")
    out = []
    for i, tool in enumerate(tools):
        fn = tool.get("function") if isinstance(tool, dict) else None
        if not isinstance(tool, dict) or tool.get("type", "function") != "function" or not isinstance(fn, dict):
            raise RequestError(f"tools[{i}] must be {{'type': 'function', 'function': {{'name': ...}}}}", f"tools[{i}]")
        _check_parameters(fn.get("parameters"), f"tools[{i}].function.parameters")
        try:
            ToolDefinition(fn.get("name"), str(fn.get("description") or ""), dict(fn.get("parameters") or {}))
        except (ValueError, TypeError) as exc:
            raise RequestError(f"tools[{i}].function: {exc}", f"tools[{i}].function") from None
        if any(t["function"]["name"] == fn.get("name") for t in out):
            first = next(j for j, t in enumerate(out) if t["function"]["name"] == fn.get("name"))
            raise RequestError(f"tools[{i}].function.name {fn.get('name')!r} is the name of tools[{first}] too; "
                               "each tool needs its own name (a call names the tool it calls)",
                               f"tools[{i}].function.name")
        out.append({"type": "function", "function": fn})
    return out


def _check_parameters(params: Any, where: str) -> None:
    """A tool's JSON-schema `parameters`: an object whose `properties` (when given) map names to
    schema objects and whose `required` (when given) is a list of names. The tool instructions
    and chat templates read these shapes; anything else is the caller's error, named."""
    if params is None:
        return
    if not isinstance(params, dict):
        raise RequestError(f"{where} must be a JSON-schema object, got {type(params).__name__}", where)
    props = params.get("properties")
    if props is not None:
        if not isinstance(props, dict):
            raise RequestError(f"{where}.properties must be an object mapping argument names to their schemas, "
                               f"got {type(props).__name__}", f"{where}.properties")
        for name, schema in props.items():
            if not isinstance(schema, dict):
                raise RequestError(f"{where}.properties.{name} must be a schema object such as "
                                   f"{{'type': 'string'}}, got {type(schema).__name__}", f"{where}.properties.{name}")
    required = params.get("required")
    if required is not None and (not isinstance(required, list) or not all(isinstance(r, str) for r in required)):
        raise RequestError(f"{where}.required must be a list of argument names", f"{where}.required")


def check_messages(messages: Any) -> list[dict[str, Any]]:
    """Check OpenAI chat `messages`; returns them with text content (parts joined)."""
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages must be a non-empty list of {'role', 'content'} objects", "messages")
    out = []
    for i, m in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(m, dict):
            raise RequestError(f"{where} must be an object with 'role' and 'content'", where)
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"{where}.role must be one of {', '.join(ROLES)}, got {role!r}", f"{where}.role")
        content = _text_content(m.get("content"), f"{where}.content")
        if role != "assistant" and content is None:
            raise RequestError(f"{where}.content is missing", f"{where}.content")
        calls = m.get("tool_calls") or []
        if not isinstance(calls, list) or any(
                not isinstance(c, dict) or not isinstance((c.get("function") or {}).get("name"), str) for c in calls):
            raise RequestError(f"{where}.tool_calls must be a list of {{'function': {{'name', 'arguments'}}}}",
                               f"{where}.tool_calls")
        if role == "assistant" and content is None and not calls:
            raise RequestError(f"{where} (assistant) has neither content nor tool_calls", f"{where}.content")
        out.append({**m, "content": content or ""})
    return out


class PromptBuilder:
    """Prompt ids for chat requests, reusing the sampled ids of replies re-sent as they were given
    ("sampled" history) or rendering every prompt whole ("rendered").

    Args:
        tokenizer: the policy's tokenizer with a chat template.
        history, enable_thinking, tool_format: the chat settings of `inference` (module docstring).

    Raises:
        TemplateError: the template cannot express a conversation (naming the model, the rule, the fix).
    """

    def __init__(self, tokenizer: Any, history: str = "auto", enable_thinking: bool | None = None,
                 tool_format: str = "auto"):
        self.tokenizer = tokenizer
        self.stop_ids = stop_token_ids(tokenizer)
        #: The longest vocabulary entry in characters (byte-level BPE entries hold one character
        #: per byte), so a text of N characters is at least N / max_token_chars tokens.
        self.max_token_chars = max((len(t) for t in tokenizer.get_vocab()), default=1) or 1
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, got {tool_format!r}")
        #: Template variables every render gets (`enable_thinking`).
        self.template_kwargs = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
        self.profile = template_profile(tokenizer, self.template_kwargs)
        self.history, note = resolve_history(history, self.profile)
        say_once(note)
        #: True when the chat template itself renders `tools` (else the parser's instructions are used).
        self.native_tools = self.profile.native_tools and tool_format != "prompt"
        fmt = tool_format if tool_format not in ("auto", "prompt") else (
            self.profile.tool_call_format if self.native_tools and self.profile.tool_call_format else "hermes")
        #: The parser that reads tool calls from replies (and, without native tools, writes the instructions).
        self.parser = get_parser(fmt)
        #: The id of the parser's call marker where the tokenizer holds it as one control token
        #: (Mistral's `[TOOL_CALLS]`): forced calls open with it, and replies keep it in their text.
        self.marker_id = call_marker_token(tokenizer, self.parser.name)

    # -- requests ------------------------------------------------------------------------
    def template_messages(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """The messages as the chat template gets them (tool calls and tool definitions as text
        when the template does not render them itself; `reasoning_content` passed on; the role
        rules of the template applied, `workbench.rollout.template.normalize_messages`)."""
        p = self.profile
        if self.native_tools:
            out = []
            for m in messages:
                msg = {"role": "system" if m["role"] == "developer" else m["role"], "content": m["content"]}
                if m.get("tool_calls"):
                    msg["tool_calls"] = [{"type": "function", "id": c.get("id"), "function": {
                        "name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))}}
                        for c in m["tool_calls"]]
                for k in ("tool_call_id", "name", "reasoning_content"):
                    if m.get(k) is not None:
                        msg[k] = m[k]
                out.append(msg)
            return normalize_messages(out, p.system_role, p.tool_role, p.alternating, keep_keys=True)
        out = []
        for m in messages:
            role = "system" if m["role"] == "developer" else m["role"]
            content = m["content"]
            if m.get("tool_calls"):
                blocks = [f'<tool_call>{json.dumps({"name": c["function"]["name"], "arguments": _arguments(c["function"].get("arguments"))})}</tool_call>'
                          for c in m["tool_calls"]]
                content = "\n".join(([content] if content else []) + blocks)
            msg = {"role": role, "content": content}
            for k in ("tool_call_id", "name"):  # kept for the episode's view; ChatML templates ignore them
                if role == "tool" and m.get(k) is not None:
                    msg[k] = m[k]
            if role == "assistant" and m.get("reasoning_content") is not None:
                msg["reasoning_content"] = m["reasoning_content"]
            out.append(msg)
        if tools:
            defs = [ToolDefinition(t["function"]["name"], str(t["function"].get("description") or ""),
                                   dict(t["function"].get("parameters") or {})) for t in tools]
            instructions = self.parser.format_instructions(defs)
            if out and out[0]["role"] == "system":
                out[0] = {"role": "system", "content": f"{out[0]['content']}\n\n{instructions}"}
            else:
                out.insert(0, {"role": "system", "content": instructions})
        return normalize_messages(out, p.system_role, p.tool_role, p.alternating, keep_keys=True)

    def render(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]], add_generation_prompt: bool) -> str:
        kwargs = {**self.template_kwargs, **({"tools": tools} if (self.native_tools and tools) else {})}
        try:
            return self.tokenizer.apply_chat_template(messages, tokenize=False,
                                                      add_generation_prompt=add_generation_prompt, **kwargs)
        except Exception as exc:  # noqa: BLE001 - the template's own complaint goes back to the caller
            raise RequestError(f"the chat template cannot render these messages: {exc}", "messages") from None

    def prompt_ids(self, messages: list[dict[str, Any]], tools: list[dict[str, Any]],
                   replies: list[Reply]) -> tuple[list[int], list[dict[str, Any]], int]:
        """(prompt ids, the template messages, how many replies were reused as sampled ids).

        "sampled" history: assistant messages equal to one of `replies` (`Reply.matches`, in
        order; an earlier reply is never matched after a later one) are rendered as a sentinel,
        and the sentinel replaced by that reply's sampled ids; the text between sentinels is
        tokenised piece by piece, with a reply's sampled end-of-turn id standing in for the
        template's own. "rendered": the messages are rendered and tokenised whole."""
        msgs = self.template_messages(messages, tools)
        if self.history == "rendered":
            return encode(self.tokenizer, self.render(msgs, tools, msgs[-1]["role"] != "assistant")), msgs, 0
        assistants = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
        sent = [m for m in messages if m["role"] == "assistant"]
        used: list[Reply] = []
        nxt = 0
        for i, m in zip(assistants, sent):  # the template's messages keep every assistant message, in order
            for j in range(nxt, len(replies)):
                if replies[j].matches(m):
                    msgs[i] = {"role": "assistant", "content": SENTINEL.format(len(used))}
                    used.append(replies[j])
                    nxt = j + 1
                    break
        text = self.render(msgs, tools, add_generation_prompt=msgs[-1]["role"] != "assistant")
        ids: list[int] = []
        prev: Reply | None = None
        for k, reply in enumerate(used):
            marker = SENTINEL.format(k)
            if text.count(marker) != 1:
                raise RequestError("the chat template dropped or repeated an assistant message", "messages")
            seg, text = text.split(marker, 1)
            ids += encode(self.tokenizer, self._strip_stop(seg, prev)) + list(reply.token_ids)
            prev = reply
        ids += encode(self.tokenizer, self._strip_stop(text, prev))
        for k, reply in enumerate(used):  # the episode's own view: reply text in place of the sentinel
            for m in msgs:
                if m["content"] == SENTINEL.format(k):
                    m["content"] = reply.text
        return ids, msgs, len(used)

    def closing_ids(self, msgs: list[dict[str, Any]], tools: list[dict[str, Any]], reply: Reply) -> list[int]:
        """Template glue after a last reply (e.g. "\\n" after a sampled `<|im_end|>`), so an
        episode's ids are a finished conversation, as `Rollout` leaves them."""
        closed = self.render(msgs + [{"role": "assistant", "content": SENTINEL.format(0)}], tools, False)
        return encode(self.tokenizer, self._strip_stop(closed.split(SENTINEL.format(0), 1)[1], reply))

    def _strip_stop(self, seg: str, reply: Reply | None) -> str:
        if reply is not None and reply.token_ids and reply.token_ids[-1] in self.stop_ids:
            stop_text = self.tokenizer.decode([reply.token_ids[-1]], skip_special_tokens=False)
            if seg.startswith(stop_text):
                return seg[len(stop_text):]
        return seg

    # -- replies ---------------------------------------------------------------------------
    def _text(self, ids: list[int]) -> str:
        """The reply's text without special tokens, except a control-token call marker, which the
        parser reads (`marker_id`: decoding skips special tokens, and would drop it)."""
        if self.marker_id is None or self.marker_id not in ids:
            return self.tokenizer.decode(ids, skip_special_tokens=True)
        marker = self.tokenizer.convert_ids_to_tokens(self.marker_id)
        parts, part = [], []
        for t in ids:
            if t == self.marker_id:
                parts.append(part)
                part = []
            else:
                part.append(t)
        parts.append(part)
        return marker.join(self.tokenizer.decode(p, skip_special_tokens=True) for p in parts)

    def reply(self, token_ids: list[int], logprobs: list[float], parse_tools: bool,
              stop: list[str] | None = None) -> Reply:
        """The OpenAI message for sampled ids: reasoning apart, tool calls parsed from the text
        after it when the request had tools; the content ends before the first of the `stop`
        strings, as OpenAI's does (`text` and the ids stay as sampled)."""
        ids = token_ids[:-1] if token_ids and token_ids[-1] in self.stop_ids else token_ids
        text = self._text(ids)
        answer, reasoning, cut = text, None, False
        if self.profile.reasoning is not None:
            split = split_reasoning(text, self.profile.reasoning, self.profile.opens_reasoning)
            answer, reasoning, cut = split.answer.lstrip("\n") if split.reasoning is not None else text, \
                split.reasoning, split.cut
        answer = cut_at_stop(answer, stop or [])
        out = dict(reasoning=reasoning, reasoning_cut=cut)
        parsed = self.parser.parse(answer) if parse_tools else None
        if parsed is None or not (parsed.tool_calls or parsed.error) or (parsed.error and not _looks_like_call(answer)):
            return Reply(list(token_ids), list(logprobs), text, answer, **out)
        if parsed.error:
            return Reply(list(token_ids), list(logprobs), text, answer, parse_error=parsed.error, **out)
        calls = [{"id": c.id, "type": "function",
                  "function": {"name": c.name, "arguments": json.dumps(c.arguments)}} for c in parsed.tool_calls]
        return Reply(list(token_ids), list(logprobs), text, parsed.content or None, calls, **out)


def _looks_like_call(text: str) -> bool:
    """The text tries a tool call in one of the families' formats (a parse error of text that
    does not is no call at all: plain content)."""
    return any(marker in text for marker in ("<tool_call>", "[TOOL_CALLS]", "<|python_tag|>", '{"name"'))


def cut_at_stop(text: str, stops: list[str]) -> str:
    """`text` up to (not including) the first occurrence of any of `stops`."""
    at = min((i for i in (text.find(s) for s in stops if s) if i >= 0), default=len(text))
    return text[:at]


def _arguments(value: Any) -> Any:
    """Tool-call arguments as an object (OpenAI sends a JSON string)."""
    if isinstance(value, str):
        try:
            return json.loads(value)
        except json.JSONDecodeError:
            return value
    return value if value is not None else {}
