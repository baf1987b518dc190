"""Constrained decoding: a grammar a sampled reply must follow, per request (xgrammar).

    c = Constraint.json_schema({"type": "object", "properties": {"guess": {"type": "integer"}}})
    engine.generate_ids(prompts, SamplingParams(max_tokens=32, constraint=c))

Kinds: `json_object` (any JSON object), `json_schema` (a JSON schema), `regex`, `choice`
(one of some strings), `tool_call` (tool calls `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
of the given tools, arguments valid for each tool's parameters: only calls, `required=True`,
one or, with `parallel=True`, several separated by newlines; or text with at most one call,
`required=False`, what `parallel_tool_calls=false` asks of a reply that may also be text).

One library: xgrammar (0.2.8 here), because it is vLLM's default structured-output backend
and its *structural tags* express every kind above as one JSON object: the hf engine compiles
`Constraint.structural_tag()` with xgrammar, and the vLLM engine passes the same JSON as
`StructuredOutputsParams(structural_tag=...)`, which vLLM's xgrammar backend compiles with
the same call, so both engines mask with the same grammar. llguidance (vLLM's "guidance"
backend, Lark grammars) would serve as well but is not vLLM's default; outlines-core covers
regex and JSON schema only, not tool-call tags.

JSON whitespace: `max_whitespace` (default 1) bounds the whitespace characters in a row
between JSON tokens: compact or one-space JSON, never an unbounded run of newlines (a small
or untrained model otherwise fills its token budget with them).

Masking on the batched decode path (`HFEngine`, `decode_state.py`): the rows' grammar
matchers run on the host, which already knows every sampled id (the decode loop reads them
back once per step); before a step samples, each constrained live row's allowed ids are
written into a (B, V/32) int32 host bitmask, uploaded without waiting (`non_blocking=True`)
and unpacked on the device, where disallowed logits become -inf. So a constraint adds no
read of a device value per step and no per-row device work.

Logprobs under a constraint: the engines record log q(token), q = softmax of the logits with
the disallowed ids at -inf (temperature 1): the masked distribution the reply was sampled
from (before temperature / top-p), which is also what vLLM's `raw_logprobs` are under
structured outputs (its bitmask is applied to the logits before its sampler). The trainer
computes old, new and reference logprobs under the same masks (`workbench.training.constrained`
replays each turn's grammar over its sampled ids), so the update's ratio q_new/q_old and its
KL compare masked with masked.
"""
from __future__ import annotations

import json
import re
import threading
import weakref
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

KINDS = ("json_object", "json_schema", "regex", "choice", "tool_call")

#: The Hermes / Qwen tool-call text (`FunctionCallingParser` reads it back).
TOOL_CALL_BEGIN, TOOL_CALL_END = "<tool_call>", "</tool_call>"

#: Each tool-call format (`Constraint.tool_call_format`, named as the parser that reads it back,
#: `workbench.tools.get_parser`): (the text before a call's JSON, the key of its arguments, the
#: text after it). Llama 3.x writes a bare `{"name": ..., "parameters": ...}`; Mistral a
#: `[TOOL_CALLS]` list, one call per list here.
TOOL_CALL_FORMS: dict[str, tuple[str, str, str]] = {
    "function_calling": (TOOL_CALL_BEGIN, "arguments", TOOL_CALL_END),
    "llama3_json": ("", "parameters", ""),
    "mistral": ("[TOOL_CALLS][", "arguments", "]"),
}
#: A format's call marker (the start of its "before" text) that a family's tokenizer may hold as
#: one control token (Mistral's `[TOOL_CALLS]`, a special token of its v3 and Tekken
#: tokenizers). A grammar that spelled it in ordinary tokens would train ids the model was never
#: taught; `Constraint.marker_token` names the token instead (`call_marker_token`).
TOOL_CALL_MARKERS: dict[str, str] = {"mistral": "[TOOL_CALLS]"}


def call_marker_token(tokenizer: Any, tool_call_format: str) -> int | None:
    """The id of the format's call marker when `tokenizer` holds it as one token of its own
    (what `Constraint.marker_token` takes), else None (the tokenizer spells it, and so does the
    grammar)."""
    marker = TOOL_CALL_MARKERS.get(tool_call_format)
    if marker is None or tokenizer is None:
        return None
    try:
        tid = tokenizer.convert_tokens_to_ids(marker)
        ids = tokenizer.encode(marker, add_special_tokens=False)
    except Exception:  # noqa: BLE001 - a tokenizer without these methods spells it
        return None
    unk = getattr(tokenizer, "unk_token_id", None)
    return tid if isinstance(tid, int) and tid != unk and list(ids) == [tid] else None



class ConstraintError(ValueError):
    """A constraint that cannot be compiled (bad regex, unsupported JSON schema); the message
    says which part."""


#: xgrammar's log prefix on its messages: "[20:50:28] /project/cpp/json_schema_converter.cc:4944: ".
_LIBRARY_PREFIX = re.compile(r"\[\d\d:\d\d:\d\d\] \S+?:\d+: ")
_CHECK_FAILED = re.compile(r"Check failed: \((?P<what>.*?)\) is false:?\s*")


def library_reason(exc: BaseException) -> str:
    """What the grammar library said, in a sentence a client can read: its log prefix (time,
    source file and line) dropped, and an internal assertion ("Check failed: (...) is false")
    said as such, since it names no part of the schema."""
    text = " ".join(_LIBRARY_PREFIX.sub("", str(exc)).split())
    failed = _CHECK_FAILED.search(text)
    if failed:
        rest = text[failed.end():].strip()
        return ("the grammar library (xgrammar) failed an internal check while compiling it; simplify the "
                "schema (long repetition counts such as {200} in a pattern, deep nesting)"
                + (f": {rest}" if rest else ""))
    return text or type(exc).__name__


@dataclass
class Constraint:
    """A grammar one reply must follow; see the module docstring. Build with the class
    methods (`json_object`, `json_schema`, `regex`, `choice`, `tool_call`)."""

    kind: str
    """One of `KINDS`."""
    schema: dict[str, Any] | None = None
    """`json_schema`: the JSON schema of the reply."""
    pattern: str | None = None
    """`regex`: the pattern the whole reply matches."""
    choices: list[str] | None = None
    """`choice`: the replies allowed."""
    tools: list[dict[str, Any]] | None = None
    """`tool_call`: the callable tools, each {"name", "parameters" (a JSON schema)}."""
    required: bool = True
    """`tool_call`: the reply is tool calls only (True), or text with at most one call (False)."""
    parallel: bool = False
    """`tool_call` with `required`: one call (False) or one or more, newline-separated (True)."""
    max_whitespace: int | None = 1
    """JSON kinds and tool-call arguments: most whitespace characters in a row (None: any)."""
    tool_call_format: str = "function_calling"
    """`tool_call`: how a call is written, one of `TOOL_CALL_FORMS` (the gateway sets the
    format its model's parser reads: Hermes/Qwen `<tool_call>`, Llama 3.x JSON, Mistral)."""
    reply: dict[str, Any] | None = None
    """`tool_call` with `required`: another constraint (its `to_dict()`) a reply may follow
    instead of being calls, e.g. the JSON schema of a final answer."""
    marker_token: int | None = None
    """`tool_call`: the id of the format's call marker (`TOOL_CALL_MARKERS`, e.g. Mistral's
    `[TOOL_CALLS]`) when the model's tokenizer holds it as one control token: the grammar then
    requires that token (xgrammar's token format) instead of spelling the marker in ordinary
    tokens, which never gives the control token's id. None: the marker is spelled
    (`call_marker_token` decides, from the tokenizer)."""

    def __post_init__(self) -> None:
        if self.kind not in KINDS:
            raise ConstraintError(f"constraint kind must be one of {', '.join(KINDS)}, got {self.kind!r}")
        need = {"json_schema": "schema", "regex": "pattern", "choice": "choices", "tool_call": "tools"}.get(self.kind)
        if need is not None and not getattr(self, need):
            raise ConstraintError(f"a {self.kind} constraint needs a non-empty {need}")
        if self.kind == "json_schema" and not isinstance(self.schema, dict):
            raise ConstraintError(f"a json_schema constraint's schema must be a dict, got {type(self.schema).__name__}")
        if self.kind == "choice" and not all(isinstance(c, str) and c for c in self.choices or []):
            raise ConstraintError(f"choices must be non-empty strings, got {self.choices!r}")
        if self.kind == "tool_call":
            for i, tool in enumerate(self.tools or []):
                if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
                    raise ConstraintError(f"tools[{i}] must be {{'name': str, 'parameters': dict}}, got {tool!r}")
        if self.tool_call_format not in TOOL_CALL_FORMS:
            raise ConstraintError(f"tool_call_format must be one of {', '.join(TOOL_CALL_FORMS)}, got "
                                  f"{self.tool_call_format!r}")

    # -- builders ---------------------------------------------------------------------------
    @classmethod
    def json_object(cls) -> "Constraint":
        return cls("json_object")

    @classmethod
    def json_schema(cls, schema: dict[str, Any]) -> "Constraint":
        return cls("json_schema", schema=schema)

    @classmethod
    def regex(cls, pattern: str) -> "Constraint":
        return cls("regex", pattern=pattern)

    @classmethod
    def choice(cls, choices: list[str]) -> "Constraint":
        return cls("choice", choices=list(choices))

    @classmethod
    def tool_call(cls, tools: list[dict[str, Any]], name: str | None = None, required: bool = True,
                  parallel: bool = False) -> "Constraint":
        """Calls of `tools` ({"name", "parameters"} or OpenAI's {"type": "function", "function": {...}});
        `name`: only that tool."""
        plain = [_plain_tool(t) for t in tools]
        if name is not None:
            plain = [t for t in plain if t["name"] == name]
            if not plain:
                raise ConstraintError(f"no tool is named {name!r}; the tools are {[_plain_tool(t)['name'] for t in tools]}")
        return cls("tool_call", tools=plain, required=required, parallel=parallel)

    # -- forms ------------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """A JSON-able dict (`from_dict` reads it back); what a trajectory turn records."""
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Constraint":
        data = dict(data)
        data.pop("tool_call_tags", None)  # recorded before tool_call_format: always the Hermes tags
        return cls(**data)

    def key(self) -> str:
        """The constraint as canonical JSON (equal constraints, equal keys)."""
        return json.dumps(self.to_dict(), sort_keys=True)

    def structural_tag(self) -> dict[str, Any]:
        """The constraint as an xgrammar structural tag (what both engines compile)."""
        return {"type": "structural_tag", "format": self._format()}

    def _json(self, schema: Any) -> dict[str, Any]:
        out: dict[str, Any] = {"type": "json_schema", "json_schema": schema}
        if self.max_whitespace is not None:
            out["max_whitespace_cnt"] = self.max_whitespace
        return out

    def _format(self) -> dict[str, Any]:
        if self.kind == "json_object":
            return self._json({"type": "object"})
        if self.kind == "json_schema":
            return self._json(self.schema)
        if self.kind == "regex":
            return {"type": "regex", "pattern": self.pattern}
        if self.kind == "choice":
            return {"type": "or", "elements": [{"type": "const_string", "value": c} for c in self.choices or []]}
        before, key, after = TOOL_CALL_FORMS[self.tool_call_format]
        text = TOOL_CALL_MARKERS.get(self.tool_call_format)
        marker = self.marker_token if self.marker_token is not None and text and before.startswith(text) else None
        if marker is not None:  # the marker is one control token: the tag opens with that token
            rest = before[len(text):]
            tags = [{"type": "tag", "begin": {"type": "token", "token": marker},
                     "content": {"type": "sequence", "elements": [
                         {"type": "const_string", "value": f'{rest}{{"name": {json.dumps(t["name"])}, "{key}": '},
                         self._json(t.get("parameters") or {"type": "object"})]},
                     "end": f"}}{after}"} for t in self.tools or []]
        else:
            tags = [{"type": "tag", "begin": f'{before}{{"name": {json.dumps(t["name"])}, "{key}": ',
                     "content": self._json(t.get("parameters") or {"type": "object"}), "end": f"}}{after}"}
                    for t in self.tools or []]
        if not self.required:  # text, and at most one call in it
            if marker is not None:
                return {"type": "token_triggered_tags", "trigger_tokens": [marker], "tags": tags,
                        "stop_after_first": True}
            return {"type": "triggered_tags", "triggers": [before or '{"name": '], "tags": tags,
                    "stop_after_first": True}
        calls = ({"type": "tags_with_separator", "tags": tags, "separator": "\n", "at_least_one": True}
                 if self.parallel else {"type": "or", "elements": tags})
        if self.reply is not None:
            return {"type": "or", "elements": [Constraint.from_dict(self.reply)._format(), calls]}
        return calls

    def check(self) -> "Constraint":
        """Raise ConstraintError (with xgrammar's reason) unless the grammar builds: an invalid
        regex or an unsupported schema, found before any engine compiles it. Returns self."""
        import xgrammar as xgr

        try:
            xgr.Grammar.from_structural_tag(json.dumps(self.structural_tag()))
        except Exception as exc:  # xgrammar's own words
            raise ConstraintError(f"the {self.kind} constraint is not a valid grammar: {library_reason(exc)}") from None
        return self

    def vllm_params(self) -> dict[str, Any]:
        """Keyword arguments of vLLM's `StructuredOutputsParams` for this constraint."""
        return {"structural_tag": json.dumps(self.structural_tag())}


def _plain_tool(tool: dict[str, Any]) -> dict[str, Any]:
    fn = tool.get("function") if tool.get("type") == "function" and isinstance(tool.get("function"), dict) else tool
    return {"name": fn.get("name"), "parameters": fn.get("parameters") or {"type": "object"}}


# -- compiling -------------------------------------------------------------------------------

class Grammars:
    """Compiled grammars of one tokenizer and vocabulary size (cached by constraint), and
    matchers for them. `grammars_for(tokenizer, vocab_size)` keeps one per tokenizer."""

    def __init__(self, tokenizer: Any, vocab_size: int):
        import xgrammar as xgr

        self.vocab_size = int(vocab_size)
        self.info = xgr.TokenizerInfo.from_huggingface(tokenizer, vocab_size=self.vocab_size)
        self.compiler = xgr.GrammarCompiler(self.info)
        self._compiled: dict[str, Any] = {}
        self._lock = threading.Lock()

    @property
    def words(self) -> int:
        """Int32 words per bitmask row: ceil(V / 32)."""
        return (self.vocab_size + 31) // 32

    def compiled(self, constraint: Constraint) -> Any:
        key = constraint.key()
        with self._lock:
            found = self._compiled.get(key)
        if found is not None:
            return found
        try:
            grammar = self.compiler.compile_structural_tag(json.dumps(constraint.structural_tag()))
        except Exception as exc:  # xgrammar's own words: which schema feature or regex it refused
            raise ConstraintError(f"cannot compile the {constraint.kind} constraint: {library_reason(exc)}") from None
        with self._lock:
            self._compiled[key] = grammar
        return grammar

    def matcher(self, constraint: Constraint, stop_ids: list[int]) -> Any:
        """A fresh matcher; it accepts one of `stop_ids` once the grammar is complete (the
        tokenizer's end-of-sequence when empty), as vLLM's matchers take the request's stop ids."""
        import xgrammar as xgr

        return xgr.GrammarMatcher(self.compiled(constraint), override_stop_tokens=list(stop_ids) or None)


_GRAMMARS: "weakref.WeakKeyDictionary[Any, dict[int, Grammars]]" = weakref.WeakKeyDictionary()
_GRAMMARS_LOCK = threading.Lock()


def grammars_for(tokenizer: Any, vocab_size: int) -> Grammars:
    """The `Grammars` of `tokenizer` at `vocab_size` (the model's logits width), built once."""
    with _GRAMMARS_LOCK:
        per = _GRAMMARS.setdefault(tokenizer, {})
        if vocab_size not in per:
            per[vocab_size] = Grammars(tokenizer, vocab_size)
        return per[vocab_size]


def unpack(bitmask: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """(N, W) int32 packed masks -> (N, V) bool, True where the id is allowed (bit i of word w: id 32w+i)."""
    shifts = torch.arange(32, device=bitmask.device, dtype=torch.int32)  # (32,)
    bits = (bitmask[:, :, None] >> shifts) & 1  # (N, W, 32)
    return bits.reshape(bitmask.shape[0], -1)[:, :vocab_size].bool()  # (N, V)


class DecodeMasks:
    """Grammar state of one decode chunk: a matcher per chunk row that has a constraint.

    `apply(logits, rows, live)` masks (B', V) logits in place before a step samples;
    `accept(rows, ids, live)` advances the matchers with the ids the step sampled (host values).
    """

    def __init__(self, grammars: Grammars, constraints: list[Constraint | None], stop_ids: list[int],
                 device: torch.device):
        self.grammars, self.device = grammars, device
        self.matchers = [grammars.matcher(c, stop_ids) if c is not None else None for c in constraints]
        self.host = torch.full((len(constraints), grammars.words), -1, dtype=torch.int32)  # (B, W) all allowed
        self.rejected: dict[int, int] = {}  # chunk row -> step whose sampled id its grammar refused

    def apply(self, logits: torch.Tensor, rows: torch.Tensor, live: torch.Tensor) -> None:
        """Mask the (B', V) logits of batch rows holding chunk rows `rows` (B',) that are `live` (B',)."""
        todo = [(j, r) for j, r in enumerate(rows.tolist()) if live[j] and self.matchers[r] is not None
                and not self.matchers[r].is_terminated()]
        if not todo:
            return
        for j, r in todo:
            self.matchers[r].fill_next_token_bitmask(self.host, j)
        idx = torch.tensor([j for j, _ in todo], dtype=torch.long)  # (N,) host
        packed = self.host[idx].to(self.device, non_blocking=True)  # (N, W): an upload, no read
        allowed = unpack(packed, logits.shape[-1])  # (N, V)
        sub = logits.index_select(0, idx.to(self.device, non_blocking=True))  # (N, V)
        logits.index_copy_(0, idx.to(self.device, non_blocking=True), sub.masked_fill_(~allowed, float("-inf")))

    def accept(self, rows: torch.Tensor, ids: torch.Tensor, live: torch.Tensor) -> None:
        """Advance each live constrained row's matcher by its sampled id (`ids`: (B',) host)."""
        for j, r in enumerate(rows.tolist()):
            m = self.matchers[r]
            if m is None or not live[j] or m.is_terminated():
                continue
            if not m.accept_token(int(ids[j])) and r not in self.rejected:
                self.rejected[r] = int(ids[j])


def replay(grammars: Grammars, constraint: Constraint, ids: list[int],
           stop_ids: list[int]) -> tuple[torch.Tensor, int | None]:
    """The packed allowed-id masks a constrained reply `ids` was sampled under: (n, W) int32,
    row i the mask before id i; and the position of the first id the grammar refuses (None
    when it takes them all), after which no masks are given (n = that position)."""
    matcher = grammars.matcher(constraint, stop_ids)
    out = torch.full((len(ids), grammars.words), -1, dtype=torch.int32)  # (n, W)
    for i, t in enumerate(ids):
        if matcher.is_terminated():
            return out[:i], i
        matcher.fill_next_token_bitmask(out, i)
        if not matcher.accept_token(int(t)):
            return out[:i], i
    return out, None


__all__ = ["Constraint", "ConstraintError", "DecodeMasks", "Grammars", "KINDS", "grammars_for", "replay", "unpack"]
