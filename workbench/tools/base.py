"""Tool abstractions: :class:`ToolDefinition`, :class:`Tool` and :class:`FunctionTool`.

A tool is something a language model can call by name with a JSON object of
arguments. Every tool carries a :class:`ToolDefinition` whose ``parameters``
field is a JSON-schema object, so the same tool can be shown to a model in
any prompt format (OpenAI function calling, Hermes ``<tool_call>`` tags,
ReAct, plain JSON) and its arguments can be validated before it runs.

Plain Python functions become tools with :meth:`Tool.from_function`; the
schema is derived from the signature and type hints, and the descriptions
from the docstring (first paragraph, plus Google-style ``Args:`` lines).
"""

from __future__ import annotations

import collections.abc
import inspect
import json
import re
import types
from abc import ABC, abstractmethod
from dataclasses import dataclass, field
from typing import Annotated, Any, Callable, Literal, Union, get_args, get_origin, get_type_hints

__all__ = [
    "ToolDefinition",
    "Tool",
    "FunctionTool",
    "schema_from_function",
    "parse_docstring",
]

_NAME_RE = re.compile(r"^[A-Za-z0-9_.\-]{1,64}$")

_PRIMITIVE_TYPES: dict[Any, str] = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    tuple: "array",
    set: "array",
    frozenset: "array",
    dict: "object",
    type(None): "null",
}

_SEQUENCE_ORIGINS = (list, tuple, set, frozenset, collections.abc.Sequence, collections.abc.Iterable)
_MAPPING_ORIGINS = (dict, collections.abc.Mapping, collections.abc.MutableMapping)


def _empty_parameters() -> dict[str, Any]:
    return {"type": "object", "properties": {}, "required": []}


@dataclass
class ToolDefinition:
    """What a model needs to know to call a tool.

    Args:
        name: Tool name the model uses (letters, digits, ``_ . -``; at most 64 chars).
        description: One or two sentences saying what the tool does.
        parameters: JSON-schema object describing the arguments, e.g.
            ``{"type": "object", "properties": {"x": {"type": "integer"}}, "required": ["x"]}``.
    """

    name: str
    description: str = ""
    parameters: dict[str, Any] = field(default_factory=_empty_parameters)

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME_RE.match(self.name):
            raise ValueError(
                f"invalid tool name {self.name!r}: use 1-64 letters, digits, '_', '.' or '-'"
            )
        params = dict(self.parameters or {})
        params.setdefault("type", "object")
        params.setdefault("properties", {})
        params.setdefault("required", [])
        self.parameters = params

    @property
    def properties(self) -> dict[str, dict[str, Any]]:
        """The ``properties`` mapping of the parameter schema."""
        return self.parameters.get("properties", {})

    @property
    def required(self) -> list[str]:
        """Names of the required parameters."""
        return list(self.parameters.get("required", []))

    def to_openai_schema(self) -> dict[str, Any]:
        """Return the OpenAI / Hermes tool schema ``{"type": "function", "function": {...}}``."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            },
        }

    def signature_text(self) -> str:
        """Short human-readable argument list, e.g. ``expression: string (required)``."""
        if not self.properties:
            return "(no arguments)"
        required = set(self.required)
        parts = []
        for pname, pschema in self.properties.items():
            ptype = pschema.get("type", "any")
            if isinstance(ptype, list):
                ptype = " | ".join(ptype)
            flag = "required" if pname in required else "optional"
            parts.append(f"{pname}: {ptype} ({flag})")
        return ", ".join(parts)


class Tool(ABC):
    """Base class of all tools.

    Subclasses either set class attributes ``name``, ``description`` and
    ``parameters`` (a JSON-schema object) or assign a full ``definition``,
    and implement :meth:`execute`. ``timeout`` (seconds, or None) overrides
    the registry's default timeout for this tool.
    """

    name: str = ""
    description: str = ""
    parameters: dict[str, Any] | None = None
    timeout: float | None = None

    def __init_subclass__(cls, **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        definition = cls.__dict__.get("definition")
        if isinstance(definition, ToolDefinition) and not cls.__dict__.get("name"):
            cls.name = definition.name
            cls.description = definition.description
            cls.parameters = definition.parameters

    @property
    def definition(self) -> ToolDefinition:
        """The tool's :class:`ToolDefinition` (built from class attributes if not set)."""
        explicit = self.__dict__.get("_definition")
        if explicit is not None:
            return explicit
        if not self.name:
            raise ValueError(f"{type(self).__name__} must set `name` or `definition`")
        return ToolDefinition(self.name, self.description, dict(self.parameters or _empty_parameters()))

    @definition.setter
    def definition(self, value: ToolDefinition) -> None:
        self.__dict__["_definition"] = value
        self.name = value.name
        self.description = value.description
        self.parameters = value.parameters

    @abstractmethod
    def execute(self, **kwargs: Any) -> Any:
        """Run the tool with keyword arguments matching ``definition.parameters``."""

    def __call__(self, **kwargs: Any) -> Any:
        return self.execute(**kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}(name={self.name!r})"

    @classmethod
    def from_function(
        cls,
        fn: Callable[..., Any],
        name: str | None = None,
        timeout: float | None = None,
        description: str | None = None,
    ) -> "FunctionTool":
        """Wrap a plain function as a tool (see :class:`FunctionTool`).

        Args:
            fn: The function; its signature, type hints and docstring define the schema.
            name: Tool name; defaults to ``fn.__name__``.
            timeout: Per-call timeout in seconds, or None for the registry default.
            description: Overrides the description taken from the docstring.
        """
        return FunctionTool(fn, name=name, timeout=timeout, description=description)


class FunctionTool(Tool):
    """A tool backed by a Python function.

    Args:
        fn: Function to call with the model's arguments as keywords.
        name: Tool name; defaults to ``fn.__name__``.
        timeout: Per-call timeout in seconds, or None for the registry default.
        description: Overrides the description taken from the docstring.
    """

    def __init__(
        self,
        fn: Callable[..., Any],
        name: str | None = None,
        timeout: float | None = None,
        description: str | None = None,
    ) -> None:
        if not callable(fn):
            raise TypeError(f"expected a callable, got {type(fn).__name__}")
        if inspect.iscoroutinefunction(fn):
            raise TypeError("async functions are not supported as tools; wrap them in a sync function")
        self.fn = fn
        self.timeout = timeout
        self.definition = schema_from_function(fn, name=name, description=description)

    def execute(self, **kwargs: Any) -> Any:
        """Call the wrapped function with ``kwargs``."""
        return self.fn(**kwargs)


# ---------------------------------------------------------------------------
# Schema derivation
# ---------------------------------------------------------------------------


def _type_to_schema(tp: Any) -> tuple[dict[str, Any], bool]:
    """Map a type hint to a JSON schema; the flag says whether None is allowed."""
    if tp is inspect.Parameter.empty or tp is Any:
        return {}, False
    origin = get_origin(tp)
    args = get_args(tp)
    if origin is Annotated:
        schema, optional = _type_to_schema(args[0])
        notes = [a for a in args[1:] if isinstance(a, str)]
        if notes:
            schema = {**schema, "description": notes[0]}
        return schema, optional
    if origin is Union or (hasattr(types, "UnionType") and origin is types.UnionType):
        members = [a for a in args if a is not type(None)]
        optional = len(members) < len(args)
        schemas = [_type_to_schema(a)[0] for a in members]
        if len(schemas) == 1:
            return schemas[0], optional
        if any(not s for s in schemas):
            return {}, optional
        if all(set(s) == {"type"} and isinstance(s["type"], str) for s in schemas):
            return {"type": [s["type"] for s in schemas]}, optional
        return {"anyOf": schemas}, optional
    if origin is Literal:
        values = list(args)
        schema: dict[str, Any] = {"enum": values}
        kinds = {_PRIMITIVE_TYPES.get(type(v)) for v in values}
        if len(kinds) == 1 and None not in kinds:
            schema["type"] = kinds.pop()
        return schema, None in values
    if origin in _SEQUENCE_ORIGINS:
        schema = {"type": "array"}
        if args and args[0] is not Ellipsis:
            item_schema = _type_to_schema(args[0])[0]
            if item_schema and (origin is not tuple or len(args) == 1 or args[-1] is Ellipsis):
                schema["items"] = item_schema
        return schema, False
    if origin in _MAPPING_ORIGINS:
        return {"type": "object"}, False
    if tp in _PRIMITIVE_TYPES:
        return {"type": _PRIMITIVE_TYPES[tp]}, tp is type(None)
    return {}, False


_SECTION_RE = re.compile(r"^\s*([A-Z][A-Za-z ]*):\s*$")
_ARGS_HEADERS = {"args", "arguments", "parameters", "params", "keyword args", "keyword arguments"}
_ARG_LINE_RE = re.compile(r"^\*{0,2}(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$")
_SPHINX_PARAM_RE = re.compile(r"^\s*:param\s+(?:[^:]*\s)?(\w+)\s*:\s*(.*)$")


def parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    """Split a docstring into a description and per-parameter descriptions.

    Args:
        doc: The raw docstring (may be None).

    Returns:
        ``(description, {param: description})``. The description is the
        first paragraph joined into one line; parameter descriptions come from
        a Google-style ``Args:`` section (or Sphinx ``:param x:`` lines).
    """
    text = inspect.cleandoc(doc or "")
    if not text:
        return "", {}
    lines = text.splitlines()

    first: list[str] = []
    for line in lines:
        if not line.strip() or _SECTION_RE.match(line) or line.lstrip().startswith(":"):
            break
        first.append(line.strip())
    description = " ".join(first)

    params: dict[str, str] = {}
    in_args = False
    entry_indent: int | None = None
    current: str | None = None
    for line in lines:
        sphinx = _SPHINX_PARAM_RE.match(line)
        if sphinx:
            params[sphinx.group(1)] = sphinx.group(2).strip()
            continue
        header = _SECTION_RE.match(line)
        if header and (len(line) - len(line.lstrip())) == 0:
            in_args = header.group(1).strip().lower() in _ARGS_HEADERS
            entry_indent, current = None, None
            continue
        if not in_args or not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        if indent == 0:
            in_args = False
            continue
        if entry_indent is None:
            entry_indent = indent
        stripped = line.strip()
        match = _ARG_LINE_RE.match(stripped)
        if indent <= entry_indent and match:
            current = match.group(1)
            params[current] = match.group(2).strip()
        elif current is not None:
            params[current] = (params[current] + " " + stripped).strip()
    return description, params


def _json_default(value: Any) -> tuple[bool, Any]:
    try:
        json.dumps(value)
    except (TypeError, ValueError):
        return False, None
    return True, value


def schema_from_function(
    fn: Callable[..., Any], name: str | None = None, description: str | None = None
) -> ToolDefinition:
    """Build a :class:`ToolDefinition` from a function's signature and docstring.

    Type hints map to JSON types (int -> integer, float -> number, str -> string,
    bool -> boolean, list -> array, dict -> object); parameters with a default
    or an ``Optional[...]`` hint are not required. ``*args`` is skipped and
    ``**kwargs`` allows extra properties.

    Args:
        fn: The function to describe.
        name: Tool name; defaults to ``fn.__name__`` (lambdas need an explicit name).
        description: Overrides the docstring's first paragraph.
    """
    tool_name = name or getattr(fn, "__name__", None) or type(fn).__name__
    if tool_name == "<lambda>":
        raise ValueError("cannot derive a tool name from a lambda; pass name=...")
    doc_description, doc_params = parse_docstring(inspect.getdoc(fn))
    try:
        hints = get_type_hints(fn, include_extras=True)
    except Exception:  # unresolved forward references, partials, builtins
        hints = {}
    signature = inspect.signature(fn)

    properties: dict[str, dict[str, Any]] = {}
    required: list[str] = []
    extra_allowed = False
    for pname, param in signature.parameters.items():
        if param.kind is inspect.Parameter.VAR_POSITIONAL:
            continue
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            extra_allowed = True
            continue
        hint = hints.get(pname, param.annotation)
        if isinstance(hint, str):  # unresolved string annotation
            hint = inspect.Parameter.empty
        schema, optional = _type_to_schema(hint)
        schema = dict(schema)
        if pname in doc_params and doc_params[pname]:
            schema.setdefault("description", doc_params[pname])
        has_default = param.default is not inspect.Parameter.empty
        if has_default and param.default is not None:
            ok, value = _json_default(param.default)
            if ok:
                schema["default"] = value
        if not has_default and not optional:
            required.append(pname)
        properties[pname] = schema

    parameters: dict[str, Any] = {"type": "object", "properties": properties, "required": required}
    if not extra_allowed:
        parameters["additionalProperties"] = False
    return ToolDefinition(
        name=tool_name,
        description=description if description is not None else doc_description,
        parameters=parameters,
    )
