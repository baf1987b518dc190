"""What a model's chat template can express, found out once when a rollout starts.

    profile = template_profile(tokenizer, {"enable_thinking": False})
    profile.prefix_stable        # False for Qwen3: earlier turns render differently later
    history, note = resolve_history("auto", profile)   # "rendered", and the sentence to say once

Published chat templates differ in ways that matter for token-exact multi-turn rollouts:

* roles: some have no system role (Gemma, Mistral's older ones: the system text goes into the
  first user message), no tool role (tool results go as user messages), or insist that roles
  alternate (consecutive messages of one role are joined);
* prefix stability: ChatML, Llama 3.x and most others render a conversation so that adding
  messages never changes the text before them. Qwen3 does not: the assistant turn after the
  last user message gets a `<think>\\n\\n</think>\\n\\n` block and earlier turns lose their
  reasoning, so the history's text changes as the conversation grows;
* switches passed as template variables (Qwen3's `enable_thinking`), reasoning blocks
  (`<think>...</think>`, opened by the generation prompt itself in DeepSeek-R1's template),
  and tool definitions rendered by the template's own `tools` argument in the family's call
  format (Hermes/Qwen `<tool_call>`, Llama 3.1 JSON, Mistral `[TOOL_CALLS]`).

`template_profile` renders a few small probe conversations with sentinel strings and
records what it saw (cached per tokenizer, template and variables, so every rollout, the
alignment check and the gateway ask once). A template that cannot express a conversation
at all (no generation prompt, fails on a plain exchange, drops the model's reply) raises
`TemplateError` naming the model, the rule and what to do, before any episode starts.

History (`inference.history`, `resolve_history`):

* "sampled": one token sequence per episode; the model sees its earlier turns as it sampled
  them, with only the text around them (observations, template glue) rendered. Works with
  any template that keeps an assistant turn's content when other messages follow it.
* "rendered": each turn's prompt is the template's rendering of the conversation so far
  (what a deployed model sees: Qwen3's earlier reasoning dropped); the episode keeps one
  sequence per turn (`Episode.segments`), sharing the prefix each has with the one before.
* "auto": "sampled" for a prefix-stable template (the two are then the same tokens, and one
  sequence costs less), else "rendered", said once per model.
"""
from __future__ import annotations

import sys
import weakref
from dataclasses import dataclass
from typing import Any

from workbench.config import HISTORY_MODES, TOOL_FORMATS, ConfigError
from workbench.tools.parsers import FunctionCallingParser, get_parser


#: Sentinel strings standing in for message contents while probing (never in real text).
_MARK = "\u2063WB_PROBE_{}\u2063"
_SENT = "\u2063WB_MODEL_TURN_{}\u2063"

REASONING_MARKERS = ("<think>", "</think>")
"""The reasoning block markers of Qwen3 and DeepSeek-R1 style models."""

_PROBE_TOOL = {"type": "function", "function": {
    "name": "wb_probe_tool", "description": "probe",
    "parameters": {"type": "object", "properties": {"x": {"type": "string"}}, "required": ["x"]}}}


class TemplateError(ValueError):
    """The chat template cannot render the conversation the way the rollout needs it."""


def model_name(tokenizer: Any) -> str:
    """The name a message uses for the model: its tokenizer's `name_or_path`, else the class."""
    return str(getattr(tokenizer, "name_or_path", "") or type(tokenizer).__name__)


def refuse(tokenizer: Any, rule: str, fix: str) -> TemplateError:
    """A TemplateError that names the model, the rule its chat template breaks and the fix."""
    return TemplateError(f"model {model_name(tokenizer)}: its chat template {rule}; {fix}")


@dataclass(frozen=True)
class TemplateProfile:
    """What one tokenizer's chat template does with the conversations a rollout builds."""

    model: str
    """The model's name (its tokenizer's `name_or_path`)."""
    system_role: bool
    """A system message is rendered (else its text goes into the first user message)."""
    tool_role: bool
    """A `tool` message after an assistant turn is rendered (else tool results go as user messages)."""
    alternating: bool
    """Two user messages in a row are refused (consecutive messages of one role are then joined)."""
    prefix_stable: bool
    """Adding messages never changes the text rendered before them, and the generation prompt
    is the start of the template's own rendering of the assistant turn it opens."""
    unstable_because: str
    """For a template that is not prefix-stable, what changes (for the note said once)."""
    keeps_history_content: bool
    """An assistant turn's content is still rendered once later messages follow it ("sampled"
    history needs this to find the text after it)."""
    thinking_switch: bool
    """The template reads an `enable_thinking` variable (Qwen3)."""
    reasoning: tuple[str, str] | None
    """Reasoning block markers the template or vocabulary knows (`<think>`, `</think>`), or None."""
    opens_reasoning: bool
    """The generation prompt itself opens a reasoning block (DeepSeek-R1: it ends with `<think>\\n`),
    so a reply holds only the block's end marker."""
    native_tools: bool
    """The template renders tool definitions given as its `tools` argument."""
    tool_call_format: str | None
    """The call format the template teaches: "hermes", "llama3_json", "mistral", or None."""


_PROFILES: "weakref.WeakKeyDictionary[Any, dict[tuple, TemplateProfile]]" = weakref.WeakKeyDictionary()


def render_text(tokenizer: Any, messages: list[dict[str, Any]], add_generation_prompt: bool,
                template_kwargs: dict[str, Any] | None = None) -> str:
    """`apply_chat_template` as text, with the template variables `template_kwargs`
    (e.g. `enable_thinking`, `tools`); messages as given."""
    return tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt,
                                         **(template_kwargs or {}))


def _freeze(value: Any) -> Any:
    if isinstance(value, dict):
        return tuple(sorted((k, _freeze(v)) for k, v in value.items()))
    if isinstance(value, (list, tuple)):
        return tuple(_freeze(v) for v in value)
    return value


def template_profile(tokenizer: Any, template_kwargs: dict[str, Any] | None = None) -> TemplateProfile:
    """The profile of `tokenizer`'s chat template rendered with `template_kwargs` (cached).

    With a `tools` entry in `template_kwargs` the probes render with those tools (the
    stability of a template can depend on them). Raises `TemplateError` (model, rule, fix)
    for a template that cannot express a conversation at all.
    """
    kwargs = dict(template_kwargs or {})
    key = (getattr(tokenizer, "chat_template", None), _freeze(kwargs))
    try:
        cached = _PROFILES.setdefault(tokenizer, {})
    except TypeError:  # not weak-referenceable: probed again next time
        cached = {}
    if key not in cached:
        cached[key] = _probe(tokenizer, kwargs)
    return cached[key]


def _probe(tok: Any, kwargs: dict[str, Any]) -> TemplateProfile:
    name = model_name(tok)
    source = str(getattr(tok, "chat_template", None) or "")
    if not source:
        raise refuse(tok, "is missing (the tokenizer has no chat_template)",
                     "set tokenizer.chat_template (or tokenizer_config.json's \"chat_template\") to the template "
                     "the model was trained with")
    if "enable_thinking" in kwargs and "enable_thinking" not in source:
        raise refuse(tok, "has no enable_thinking switch", "leave inference.enable_thinking unset (null) for this "
                     "model; it only reaches templates that read it (Qwen3's)")

    def render(msgs: list[dict[str, Any]], gen: bool) -> str:
        return render_text(tok, msgs, gen, kwargs)

    def renders(msgs: list[dict[str, Any]], gen: bool) -> str | None:
        try:
            return render(msgs, gen)
        except Exception:  # noqa: BLE001 - a template's own refusal (raise_exception) is an answer
            return None

    user = {"role": "user", "content": _MARK.format("u0")}
    try:
        opened = render([user], True)
    except Exception as exc:  # noqa: BLE001
        raise refuse(tok, f"fails on a single user message ({type(exc).__name__}: {exc})",
                     "use a chat template that renders plain user/assistant conversations") from None
    if _MARK.format("u0") not in opened:
        raise refuse(tok, "drops the user message's content", "use a chat template that renders message contents")
    closed = renders([user], False)
    if closed is None or closed == opened:
        raise refuse(tok, "adds no generation prompt after the conversation (add_generation_prompt=True renders "
                     "nothing that opens the assistant's turn)",
                     "use the model's chat template with a generation prompt (an instruct/chat model's)")
    with_system = renders([{"role": "system", "content": _MARK.format("s")}, user], True)
    system_role = with_system is not None and _MARK.format("s") in with_system
    alternating = renders([user, {"role": "user", "content": _MARK.format("u1")}], True) is None
    probe_tool = renders([user, {"role": "assistant", "content": _SENT.format(0)},
                          {"role": "tool", "content": _MARK.format("t")}], True)
    tool_role = probe_tool is not None and _MARK.format("t") in probe_tool

    def normalized(msgs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        return normalize_messages(msgs, system_role, tool_role, alternating)

    one_turn = normalized([{"role": "system", "content": _MARK.format("s")}, user,
                           {"role": "assistant", "content": _SENT.format(0)}])
    text = renders(one_turn, False)
    if text is None:
        raise refuse(tok, "fails on a system + user + assistant exchange",
                     "use a chat template that renders plain user/assistant conversations")
    if text.count(_SENT.format(0)) != 1:
        raise refuse(tok, "drops or repeats the assistant's reply in a conversation that ends with it",
                     "use the model's own chat template (the reply must appear once where the model wrote it)")
    convo = normalized([
        {"role": "system", "content": _MARK.format("s")}, user, {"role": "assistant", "content": _SENT.format(0)},
        {"role": "user", "content": _MARK.format("u1")}, {"role": "assistant", "content": _SENT.format(1)},
        {"role": "tool", "content": _MARK.format("t2")}, {"role": "assistant", "content": _SENT.format(2)},
        {"role": "user", "content": _MARK.format("u3")},
    ])
    if renders(convo, True) is None:
        raise refuse(tok, f"fails on a multi-turn conversation ({_error(render, convo)})",
                     "use a chat template that renders several user/assistant turns")
    stable, because, keeps = _stability(render, convo)
    common = next((k for k, (a, b) in enumerate(zip(opened, closed)) if a != b), min(len(opened), len(closed)))
    gen_text = opened[common:]  # what the generation prompt adds (Phi-3 ends a closed one with eos instead)
    reasoning = None
    vocab_has = all(_single_token(tok, m) for m in REASONING_MARKERS)
    if REASONING_MARKERS[1] in source or vocab_has:
        reasoning = REASONING_MARKERS
    opens = reasoning is not None and gen_text.rfind(reasoning[0]) > gen_text.rfind(reasoning[1])
    with_tools = renders_with_tools(tok, {k: v for k, v in kwargs.items() if k != "tools"})
    native = with_tools is not None and "wb_probe_tool" in with_tools
    return TemplateProfile(
        model=name, system_role=system_role, tool_role=tool_role, alternating=alternating, prefix_stable=stable,
        unstable_because=because, keeps_history_content=keeps, thinking_switch="enable_thinking" in source,
        reasoning=reasoning, opens_reasoning=opens, native_tools=native,
        tool_call_format=_tool_call_format(source),
    )


def renders_with_tools(tok: Any, kwargs: dict[str, Any]) -> str | None:
    """The render of one user message with a probe tool given as `tools` (None if it fails)."""
    try:
        return render_text(tok, [{"role": "user", "content": "hi"}], True, {**kwargs, "tools": [_PROBE_TOOL]})
    except Exception:  # noqa: BLE001 - a template that fails on tools does not render them
        return None


def _error(render: Any, msgs: list[dict[str, Any]]) -> str:
    try:
        render(msgs, True)
    except Exception as exc:  # noqa: BLE001
        return f"{type(exc).__name__}: {exc}"
    return "no error"


def _stability(render: Any, convo: list[dict[str, Any]]) -> tuple[bool, str, bool]:
    """(prefix-stable, what changes if not, assistant content kept once followed)."""
    follows, prompt_differs, keeps = "", "", True
    for i, m in enumerate(convo):
        if m["role"] != "assistant":
            continue
        sentinel = m["content"]
        bare = render(convo[:i], False)
        prompt = render(convo[:i], True)
        closed = render(convo[:i + 1], False)
        if not prompt_differs and not (closed.startswith(prompt) and closed[len(prompt):].startswith(sentinel)):
            shown = closed[:closed.find(sentinel)] if sentinel in closed else closed
            prompt_differs = (f"its generation prompt {prompt[len(bare):]!r} is not how it renders the start of "
                              f"the assistant turn it opens, {shown[len(bare):]!r}" if prompt.startswith(bare)
                              else "its generation prompt changes the text before it")
        j = i + 1
        while j < len(convo) and convo[j]["role"] != "assistant":
            j += 1
        after = render(convo[:j], j < len(convo))
        if sentinel not in after:
            keeps = False
        if not follows and not after.startswith(closed):
            role = convo[i + 1]["role"] if i + 1 < len(convo) else "user"
            follows = f"it renders an assistant turn differently once a {role} message follows it"
    because = follows or prompt_differs
    return not because, because, keeps


def _single_token(tok: Any, text: str) -> bool:
    try:
        tid = tok.convert_tokens_to_ids(text)
        return isinstance(tid, int) and tok.convert_ids_to_tokens(tid) == text
    except Exception:  # noqa: BLE001
        return False


def _tool_call_format(source: str) -> str | None:
    if "<tool_call>" in source:
        return "hermes"
    if "[TOOL_CALLS]" in source:
        return "mistral"
    if '"parameters"' in source and ("ipython" in source or "python_tag" in source):
        return "llama3_json"
    return None


def normalize_messages(messages: list[dict[str, Any]], system_role: bool, tool_role: bool,
                       alternating: bool, keep_keys: bool = False) -> list[dict[str, Any]]:
    """Messages as a template with these role rules accepts them: without a system role the
    system text opens the first user message; without a tool role tool results are user
    messages; with strict alternation consecutive messages of one role are joined with a
    blank line. Each message keeps only "role" and "content" (with `keep_keys`, its other
    keys too: tool calls, `reasoning_content`, ...). Unchanged for a template that has every
    role and no alternation rule."""
    out: list[dict[str, Any]] = []
    system: str | None = None
    for m in messages:
        role, content = m["role"], m.get("content") or ""
        extra = {k: v for k, v in m.items() if k not in ("role", "content")} if keep_keys else {}
        if role == "system" and not system_role:
            system = content if system is None else f"{system}\n\n{content}"
            continue
        if role == "tool" and not tool_role:
            role, extra = "user", {}
        if system is not None and role == "user":
            content = f"{system}\n\n{content}" if system else content
            system = None
        if alternating and out and out[-1]["role"] == role and role != "assistant":
            out[-1] = {**out[-1], "content": f"{out[-1]['content']}\n\n{content}"}
            continue
        out.append({"role": role, "content": content, **extra})
    if system:  # only a system message: it stays a user message
        out.append({"role": "user", "content": system})
    return out


def tool_parser(parser: Any, env_name: str, tool_format: str, profile: TemplateProfile) -> tuple[Any, bool]:
    """(the parser an episode uses, whether the template renders its tools) under
    `inference.tool_format`. Only the function-calling parser (by name or object) takes a
    family's format: "auto" swaps it for the family's parser when the template renders tools
    in a format it names, "prompt" keeps it, a named format replaces it; a named format with
    an environment whose parser reads no tool calls raises ValueError."""
    calls = (isinstance(parser, FunctionCallingParser)
             or (isinstance(parser, str) and parser.strip().lower().replace("-", "_") in ("function_calling", "hermes")))
    if tool_format == "prompt" or (tool_format == "auto" and not calls):
        return parser, False
    if not calls:
        how = ("reads the reply itself (it has no action parser)" if parser is None else
               f"reads its actions with the {getattr(parser, 'name', parser)!r} parser")
        raise ConfigError(f"inference.tool_format={tool_format!r} sets how tool calls are written, but {env_name} "
                          f"{how}, not tool calls; leave inference.tool_format \"auto\" for this environment")
    fmt = tool_format
    if fmt == "auto":
        if not (profile.native_tools and profile.tool_call_format):
            return parser, False
        fmt = profile.tool_call_format
    if isinstance(parser, str) or not getattr(parser, "strict", False):
        return fmt, profile.native_tools  # by name: MultiTurnManager builds it strict for a strict environment
    return get_parser(fmt, strict=True), profile.native_tools


_SAID: set[tuple[str, str]] = set()


def resolve_history(setting: str, profile: TemplateProfile) -> tuple[str, str | None]:
    """("sampled" or "rendered", a note to say once or None) for `inference.history = setting`.

    "auto" is "sampled" for a prefix-stable template and "rendered" otherwise (with a note);
    "sampled" with a template that drops an assistant turn's content once later messages
    follow it raises TemplateError (there is no text after the turn to append to its ids)."""
    if setting not in HISTORY_MODES:
        raise ValueError(f"inference.history must be one of {', '.join(HISTORY_MODES)}, got {setting!r}")
    if setting == "auto":
        if profile.prefix_stable:
            return "sampled", None
        return "rendered", (
            f"model {profile.model}: its chat template is not prefix-stable ({profile.unstable_because}), so "
            "inference.history \"auto\" -> \"rendered\": each turn's prompt is the template's rendering of the "
            "conversation so far (what the deployed model sees), and each turn trains as its own sequence. "
            "inference.history=sampled keeps one sequence per episode instead (less compute; the model then sees "
            "its earlier turns as it sampled them)")
    if setting == "sampled" and not profile.keeps_history_content:
        raise TemplateError(
            f"model {profile.model}: its chat template drops an assistant turn's content once later messages "
            "follow it, so inference.history=sampled cannot append the next turn after the sampled ids; set "
            "inference.history to \"rendered\" (or \"auto\")")
    return setting, None


def say_once(note: str | None) -> None:
    """Print `note` to stderr the first time this process sees it (the history choice)."""
    if note and ("history", note) not in _SAID:
        _SAID.add(("history", note))
        print(f"workbench: {note}", file=sys.stderr)


__all__ = ["HISTORY_MODES", "TOOL_FORMATS", "REASONING_MARKERS", "TemplateError", "TemplateProfile",
           "template_profile", "resolve_history", "normalize_messages", "render_text", "say_once", "refuse",
           "model_name", "renders_with_tools", "tool_parser"]
