"""Every request field the gateway knows, what it does with it, and the constraint a request asks for.

    check_fields(body, "chat")                   # a field the gateway would ignore: a 400 naming it
    constraint = request_constraint(body, tools)  # response_format / tool_choice / parallel_tool_calls
    max_tokens, name = max_tokens_of(body)        # max_completion_tokens, else max_tokens

Nothing is accepted and ignored. Each field of `CHAT_FIELDS` / `COMPLETION_FIELDS` is
"supported" (it does what the OpenAI API says), "neutral only" (accepted at the value that
changes nothing, e.g. `frequency_penalty: 0`; any other value is a 400 naming the field, since
the engines cannot honour it), "no effect on the reply" (identifiers: the reply is the same
with or without them) or "refused" (a 400 whenever it is set). A field in neither table is a
400 too (OpenAI: "Unrecognized request argument"). The README's compatibility table lists the
same fields (a test keeps them equal).

Structured outputs and tool choice become one `Constraint` (`workbench.engines.constraints`),
sampled under on the engine (so the reply follows it token by token, as vLLM's OpenAI server
does it): `response_format` json_object / json_schema (enforced whether `strict` is true or
not, as vLLM does), `tool_choice` "required" (one or more calls; one with
`parallel_tool_calls: false`) or a named function (one call of it), and with `tool_choice`
"auto" and `parallel_tool_calls: false` at most one call in a reply that may be text. With
tools and a JSON `response_format` under "auto", a reply is either tool calls or that JSON.
vLLM's own extension `structured_outputs` ({"json": schema} | {"regex"} | {"choice"} |
{"json_object": true}) is read too.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Any

from workbench.engines.constraints import Constraint, ConstraintError
from workbench.gateway.render import RequestError

SUPPORTED, NEUTRAL, NO_EFFECT, REFUSED = "supported", "neutral only", "no effect on the reply", "refused"

#: /v1/chat/completions field -> (treatment, what the gateway does).
CHAT_FIELDS: dict[str, tuple[str, str]] = {
    "model": (SUPPORTED, "any value; the gateway serves one policy (`/v1/models` lists its name)"),
    "messages": (SUPPORTED, "system, developer, user, assistant (with tool_calls), tool; text content"),
    "tools": (SUPPORTED, "function tools (rendered by the chat template or as instructions)"),
    "tool_choice": (SUPPORTED, '"auto", "none", "required", {"type": "function", "function": {"name"}} '
                               "(the last two sampled under a tool-call grammar)"),
    "parallel_tool_calls": (SUPPORTED, "false: at most one call per reply (a grammar)"),
    "response_format": (SUPPORTED, '"text", "json_object", "json_schema" (sampled under the schema, strict or not)'),
    "max_completion_tokens": (SUPPORTED, "reply length limit (wins over max_tokens)"),
    "max_tokens": (SUPPORTED, "reply length limit"),
    "temperature": (SUPPORTED, "0..2"),
    "top_p": (SUPPORTED, "(0, 1]"),
    "top_k": (SUPPORTED, "vLLM's extension: -1 or >= 1"),
    "stop": (SUPPORTED, "a string or a list; the returned text ends before the stop string, the recorded ids "
                        "are as sampled"),
    "seed": (SUPPORTED, "int64"),
    "n": (SUPPORTED, "1 only"),
    "logprobs": (SUPPORTED, "each sampled token's logprob"),
    "top_logprobs": (SUPPORTED, "0 only (the engines return the sampled token's logprob)"),
    "stream": (SUPPORTED, "the finished reply as server-sent chunks"),
    "stream_options": (SUPPORTED, "include_usage"),
    "user": (SUPPORTED, "names the episode when no URL or header does"),
    "structured_outputs": (SUPPORTED, "vLLM's extension: json, regex, choice, json_object"),
    "frequency_penalty": (NEUTRAL, "0 only"),
    "presence_penalty": (NEUTRAL, "0 only"),
    "logit_bias": (NEUTRAL, "empty only"),
    "store": (NEUTRAL, "false only: nothing is stored for OpenAI's stored completions"),
    "metadata": (NEUTRAL, "empty only (kept by OpenAI only with store)"),
    "service_tier": (NEUTRAL, '"auto" or "default" only'),
    "modalities": (NEUTRAL, '["text"] only'),
    "prompt_cache_key": (NO_EFFECT, "accepted; the engine caches prefixes by their ids anyway"),
    "safety_identifier": (NO_EFFECT, "accepted; an identifier only"),
    "reasoning_effort": (REFUSED, "the engines have no reasoning-effort switch"),
    "verbosity": (REFUSED, "no verbosity control"),
    "audio": (REFUSED, "text only"),
    "prediction": (REFUSED, "no predicted outputs"),
    "web_search_options": (REFUSED, "no web search"),
    "functions": (REFUSED, "deprecated; use tools"),
    "function_call": (REFUSED, "deprecated; use tool_choice"),
}

#: /v1/completions field -> (treatment, what the gateway does).
COMPLETION_FIELDS: dict[str, tuple[str, str]] = {
    "model": CHAT_FIELDS["model"],
    "prompt": (SUPPORTED, "one text (tokenised as sent) or one list of token ids"),
    **{k: CHAT_FIELDS[k] for k in ("max_tokens", "temperature", "top_p", "top_k", "stop", "seed", "n", "stream",
                                   "stream_options", "user", "structured_outputs", "frequency_penalty",
                                   "presence_penalty", "logit_bias")},
    "echo": (NEUTRAL, "false only"),
    "best_of": (NEUTRAL, "1 only"),
    "suffix": (REFUSED, "no insertion"),
    "logprobs": (REFUSED, "use /v1/chat/completions with logprobs=true"),
}

#: Neutral fields: the values that change nothing.
_NEUTRAL_VALUES: dict[str, Any] = {
    "frequency_penalty": lambda v: v in (0, 0.0), "presence_penalty": lambda v: v in (0, 0.0),
    "logit_bias": lambda v: v == {}, "store": lambda v: v is False, "metadata": lambda v: v == {},
    "service_tier": lambda v: v in ("auto", "default"), "modalities": lambda v: v == ["text"],
    "echo": lambda v: v is False, "best_of": lambda v: v == 1 and not isinstance(v, bool),
}


def check_fields(body: dict[str, Any], route: str) -> None:
    """A RequestError naming the first field the gateway cannot honour (`route`: "chat" or
    "completions"); a null value is the field left out."""
    table = CHAT_FIELDS if route == "chat" else COMPLETION_FIELDS
    path = "/v1/chat/completions" if route == "chat" else "/v1/completions"
    for name, value in body.items():
        if name not in table:
            raise RequestError(f"unrecognized request field {name!r}: {path} of this gateway does not know it "
                               "(see the README's compatibility table)", name, "unknown_parameter")
        if value is None:
            continue
        treatment, note = table[name]
        if treatment == REFUSED:
            raise RequestError(f"{name} is not supported by this gateway ({note}); leave it out", name,
                               "unsupported_parameter")
        if treatment == NEUTRAL and not _NEUTRAL_VALUES[name](value):
            raise RequestError(f"{name}={value!r} is not supported by this gateway ({note}: the engines cannot "
                               "honour other values); leave it out", name, "unsupported_parameter")


def max_tokens_of(body: dict[str, Any]) -> tuple[Any, str]:
    """(the reply limit the request set, the field that set it): `max_completion_tokens` wins."""
    if body.get("max_completion_tokens") is not None:
        return body["max_completion_tokens"], "max_completion_tokens"
    return body.get("max_tokens"), "max_tokens"


def _schema_format(response_format: Any) -> tuple[str, dict[str, Any] | None]:
    """("text" | "json_object" | "json_schema", its schema) of a `response_format`."""
    if response_format is None:
        return "text", None
    kind = response_format.get("type") if isinstance(response_format, dict) else None
    if kind == "text":
        return "text", None
    if kind == "json_object":
        return "json_object", None
    if kind == "json_schema":
        spec = response_format.get("json_schema")
        schema = spec.get("schema") if isinstance(spec, dict) else None
        if not isinstance(schema, dict):
            raise RequestError("response_format.json_schema.schema must be a JSON schema object",
                               "response_format.json_schema.schema")
        return "json_schema", schema
    raise RequestError(f"response_format.type must be 'text', 'json_object' or 'json_schema', got {kind!r}",
                       "response_format.type")


def _vllm_structured(spec: Any) -> Constraint | None:
    if spec is None:
        return None
    if not isinstance(spec, dict):
        raise RequestError("structured_outputs must be an object", "structured_outputs")
    given = {k: v for k, v in spec.items() if v is not None and v is not False}
    unknown = set(given) - {"json", "regex", "choice", "json_object"}
    if unknown:
        raise RequestError(f"structured_outputs.{sorted(unknown)[0]} is not supported by this gateway (json, regex, "
                           "choice, json_object are)", f"structured_outputs.{sorted(unknown)[0]}",
                           "unsupported_parameter")
    if len(given) != 1:
        raise RequestError("structured_outputs must set exactly one of json, regex, choice, json_object",
                           "structured_outputs")
    (kind, value), = given.items()
    if kind == "json":
        if not isinstance(value, dict):
            raise RequestError("structured_outputs.json must be a JSON schema object", "structured_outputs.json")
        return Constraint.json_schema(value)
    if kind == "regex":
        return Constraint.regex(value) if isinstance(value, str) else _bad("structured_outputs.regex", "a string")
    if kind == "choice":
        return Constraint.choice(value) if isinstance(value, list) else _bad("structured_outputs.choice", "a list")
    return Constraint.json_object()


def structured_outputs(body: dict[str, Any], check: bool = True) -> Constraint | None:
    """The constraint of a request's `structured_outputs` (vLLM's extension), or None
    (`check` as for `request_constraint`)."""
    try:
        constraint = _vllm_structured(body.get("structured_outputs"))
        return constraint.check() if constraint is not None and check else constraint
    except ConstraintError as exc:
        raise RequestError(str(exc), "structured_outputs") from None


def _bad(field: str, what: str) -> None:
    raise RequestError(f"{field} must be {what}", field)


def request_constraint(body: dict[str, Any], tools: list[dict[str, Any]],
                       tool_call_format: str = "function_calling", check: bool = True,
                       marker_token: int | None = None) -> Constraint | None:
    """The grammar a chat request asks its reply to follow (None: free text); `tools` are the
    request's checked tools (`parse_tools`); tool calls are written in `tool_call_format` (the
    name of the parser that reads the model's replies, one of `TOOL_CALL_FORMS`). RequestErrors
    name the field at fault. `check=False` leaves the grammar unbuilt (`Constraint.check`): the
    gateway builds and compiles it on a worker thread, after its size check. `marker_token`: the
    id of the format's call marker where the tokenizer holds it as one control token
    (`workbench.engines.constraints.call_marker_token`), which forced calls then open with."""
    try:
        constraint = _constraint(body, tools)
        if constraint is not None and constraint.kind == "tool_call":
            constraint = replace(constraint, tool_call_format=tool_call_format, marker_token=marker_token)
        return constraint.check() if constraint is not None and check else constraint
    except ConstraintError as exc:
        raise RequestError(str(exc), constraint_field(body)) from None


def constraint_field(body: dict[str, Any]) -> str:
    """The request field a request's grammar comes from, for the errors about it:
    `structured_outputs` or `response_format` when set, else `tools` (tool_choice's calls)."""
    return next((f for f in ("structured_outputs", "response_format") if body.get(f) is not None), "tools")


def _constraint(body: dict[str, Any], tools: list[dict[str, Any]]) -> Constraint | None:
    choice = body.get("tool_choice")
    parallel = body.get("parallel_tool_calls")
    if parallel is not None and not isinstance(parallel, bool):
        raise RequestError(f"parallel_tool_calls must be true or false, got {parallel!r}", "parallel_tool_calls")
    form, schema = _schema_format(body.get("response_format"))
    vllm = _vllm_structured(body.get("structured_outputs"))
    if vllm is not None and form != "text":
        raise RequestError("set response_format or structured_outputs, not both", "structured_outputs")
    reply = vllm if vllm is not None else (Constraint.json_object() if form == "json_object" else
                                           Constraint.json_schema(schema) if form == "json_schema" else None)
    if choice is None or choice == "auto":
        if not tools:
            return reply
        if reply is not None:  # tool calls, or the JSON reply
            return Constraint("tool_call", tools=Constraint.tool_call(tools).tools, required=True,
                              parallel=parallel is not False, reply=reply.to_dict())
        return Constraint.tool_call(tools, required=False) if parallel is False else None
    if choice == "none":
        return reply
    if not tools:
        raise RequestError(f"tool_choice={choice!r} needs tools; the request has none", "tool_choice")
    if choice == "required":
        return Constraint.tool_call(tools, required=True, parallel=parallel is not False)
    fn = choice.get("function") if isinstance(choice, dict) and choice.get("type") == "function" else None
    if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
        raise RequestError("tool_choice must be 'auto', 'none', 'required' or {'type': 'function', 'function': "
                           f"{{'name': ...}}}}, got {choice!r}", "tool_choice")
    names = [t["function"]["name"] for t in tools]
    if fn["name"] not in names:
        raise RequestError(f"tool_choice names the function {fn['name']!r}, which is not among the tools "
                           f"({', '.join(names)})", "tool_choice")
    return Constraint.tool_call(tools, name=fn["name"], required=True, parallel=False)


__all__ = ["CHAT_FIELDS", "COMPLETION_FIELDS", "NEUTRAL", "NO_EFFECT", "REFUSED", "SUPPORTED", "check_fields",
           "constraint_field", "max_tokens_of", "request_constraint", "structured_outputs"]
