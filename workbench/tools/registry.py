"""A registry of tools that validates and runs model-issued calls safely.

:class:`ToolRegistry` is the single place where a model's tool call meets
Python code. It never raises for a bad call: every failure (unknown tool,
missing or unexpected argument, wrong JSON type, the tool raising, the tool
exceeding its timeout) becomes ``(False, message)`` where the message tells
the model what to fix. Successful non-string results are JSON-encoded.

Timeouts run the call on a worker thread (`workbench.utils.timeouts.call_with_timeout`).
A call that overruns is interrupted: its thread gets an exception injected and
ends, so timed-out calls do not pile up threads. A call blocked inside C code
cannot be interrupted; its thread is left running as a daemon thread, the error
message says so, and `workbench.utils.timeouts.stuck_threads()` lists it.
"""

from __future__ import annotations

import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable, Iterable

from workbench.utils.timeouts import CallTimeout, call_with_timeout
from .base import FunctionTool, Tool, ToolDefinition

__all__ = ["ToolRegistry", "ToolExecution", "ToolStats", "validate_arguments"]

_JSON_TYPE_NAMES = {
    bool: "boolean",
    int: "integer",
    float: "number",
    str: "string",
    list: "array",
    tuple: "array",
    dict: "object",
    type(None): "null",
}


@dataclass
class ToolExecution:
    """Detailed outcome of one call made through :meth:`ToolRegistry.execute`.

    Args:
        name: Tool name as requested by the model.
        success: Whether the tool ran and returned a result.
        result: Result text (JSON-encoded if not a string) or the error message.
        error_type: None on success, else one of ``"unknown_tool"``,
            ``"invalid_arguments"``, ``"exception"``, ``"timeout"``.
        exception: The exception the tool raised, or the
            :class:`~workbench.utils.timeouts.CallTimeout` of a timed-out call; None on success.
        seconds: Wall time spent waiting for the call.
    """

    name: str
    success: bool
    result: str
    error_type: str | None = None
    exception: BaseException | None = None
    seconds: float = 0.0


@dataclass
class ToolStats:
    """Cumulative call statistics of one tool."""

    calls: int = 0
    successes: int = 0
    failures: int = 0
    timeouts: int = 0
    total_seconds: float = 0.0

    def as_dict(self) -> dict[str, float | int]:
        """Return the statistics plus ``mean_seconds`` as a plain dict."""
        mean = self.total_seconds / self.calls if self.calls else 0.0
        return {
            "calls": self.calls,
            "successes": self.successes,
            "failures": self.failures,
            "timeouts": self.timeouts,
            "total_seconds": self.total_seconds,
            "mean_seconds": mean,
        }


def _json_type_of(value: Any) -> str:
    for py_type, json_name in _JSON_TYPE_NAMES.items():
        if type(value) is py_type:
            return json_name
    return type(value).__name__


def _matches_type(value: Any, json_type: str) -> bool:
    if json_type == "integer":
        return isinstance(value, int) and not isinstance(value, bool)
    if json_type == "number":
        return isinstance(value, (int, float)) and not isinstance(value, bool)
    if json_type == "string":
        return isinstance(value, str)
    if json_type == "boolean":
        return isinstance(value, bool)
    if json_type == "array":
        return isinstance(value, (list, tuple))
    if json_type == "object":
        return isinstance(value, dict)
    if json_type == "null":
        return value is None
    return True  # unknown type names are not enforced


def _check_value(value: Any, schema: dict[str, Any], path: str) -> tuple[Any, str | None]:
    """Validate one value; return (possibly coerced value, error or None)."""
    expected = schema.get("type")
    if expected is not None:
        options = expected if isinstance(expected, list) else [expected]
        # an integral float such as 3.0 is accepted where an integer is expected
        if (
            "integer" in options
            and isinstance(value, float)
            and value.is_integer()
            and not any(_matches_type(value, t) for t in options)
        ):
            value = int(value)
        if not any(_matches_type(value, t) for t in options):
            shown = json.dumps(value, default=str)
            if len(shown) > 60:
                shown = shown[:57] + "..."
            want = " or ".join(options)
            return value, f"argument '{path}' must be {want}, got {_json_type_of(value)} {shown}"
    if "enum" in schema and value not in schema["enum"]:
        allowed = ", ".join(json.dumps(v) for v in schema["enum"])
        return value, f"argument '{path}' must be one of [{allowed}], got {json.dumps(value, default=str)}"
    if isinstance(value, (list, tuple)) and isinstance(schema.get("items"), dict):
        items = list(value)
        for i, item in enumerate(items):
            items[i], err = _check_value(item, schema["items"], f"{path}[{i}]")
            if err:
                return value, err
        value = items
    if isinstance(value, dict) and "properties" in schema:
        value, err = _check_object(value, schema, path + ".")
        if err:
            return value, err
    return value, None


def _check_object(args: dict[str, Any], schema: dict[str, Any], prefix: str = "") -> tuple[dict[str, Any], str | None]:
    properties: dict[str, Any] = schema.get("properties", {})
    for req in schema.get("required", []):
        if req not in args:
            ptype = properties.get(req, {}).get("type", "any")
            return args, f"missing required argument '{prefix}{req}' ({ptype})"
    if schema.get("additionalProperties", True) is False:
        for key in args:
            if key not in properties:
                return args, f"unexpected argument '{prefix}{key}'"
    checked = dict(args)
    for key, value in args.items():
        if key in properties:
            checked[key], err = _check_value(value, properties[key], prefix + key)
            if err:
                return args, err
    return checked, None


def validate_arguments(definition: ToolDefinition, arguments: Any) -> tuple[dict[str, Any], str | None]:
    """Check ``arguments`` against a tool's parameter schema.

    Arguments not listed in ``properties`` are rejected unless the schema sets
    ``additionalProperties`` to true. A schema that lists properties and says
    nothing about ``additionalProperties`` is treated as closed, because a
    model inventing argument names is the mistake most worth reporting.

    Args:
        definition: The tool's definition.
        arguments: The arguments the model supplied.

    Returns:
        ``(arguments, None)`` when valid (integral floats coerced to int where an
        integer is expected), else ``(arguments, error message)``.
    """
    if not isinstance(arguments, dict):
        return {}, f"arguments must be a JSON object, got {_json_type_of(arguments)}"
    schema = dict(definition.parameters)
    if "additionalProperties" not in schema and schema.get("properties"):
        schema["additionalProperties"] = False
    return _check_object(arguments, schema)


def _format_result(value: Any) -> str:
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value, ensure_ascii=False, default=str)
    except (TypeError, ValueError):
        return str(value)


class ToolRegistry:
    """Named collection of tools with validation, timeouts and statistics.

    Args:
        tools: Tools or plain functions to register right away.
        default_timeout: Seconds a call may take when neither the registration
            nor the tool sets a timeout; None disables the timeout.
    """

    def __init__(self, tools: Iterable[Tool | Callable[..., Any]] | None = None, default_timeout: float | None = 10.0) -> None:
        self.default_timeout = default_timeout
        self._tools: dict[str, Tool] = {}
        self._timeouts: dict[str, float | None] = {}
        self._stats: dict[str, ToolStats] = {}
        self._lock = threading.Lock()
        for tool in tools or ():
            self.register(tool)

    # -- registration -----------------------------------------------------

    def register(
        self,
        tool_or_function: Tool | Callable[..., Any] | None = None,
        name: str | None = None,
        timeout: float | None = None,
        replace: bool = True,
    ) -> Any:
        """Register a tool or a function (also usable as ``@registry.register`` or ``@registry.register(name=...)``).

        Args:
            tool_or_function: A :class:`Tool` or a plain function (wrapped in a :class:`FunctionTool`).
            name: Name to register under; defaults to the tool's own name.
            timeout: Per-call timeout in seconds for this tool; overrides ``tool.timeout``.
            replace: If False, registering an existing name raises ValueError.
                Defaults to True so that re-running a notebook cell just works.

        Returns:
            The object passed in (so decorated functions stay callable), or a
            decorator when called without ``tool_or_function``.
        """
        if tool_or_function is None:
            def decorator(obj: Any) -> Any:
                return self.register(obj, name=name, timeout=timeout, replace=replace)

            return decorator
        if isinstance(tool_or_function, Tool):
            tool = tool_or_function
            if name is not None and name != tool.definition.name:
                d = tool.definition
                raise ValueError(
                    f"tool {d.name!r} cannot be registered as {name!r}; set the name on the tool itself"
                )
        elif callable(tool_or_function):
            tool = FunctionTool(tool_or_function, name=name)
        else:
            raise TypeError(f"cannot register {type(tool_or_function).__name__}: expected a Tool or a function")
        tool_name = tool.definition.name
        if not replace and tool_name in self._tools:
            raise ValueError(f"a tool named {tool_name!r} is already registered")
        self._tools[tool_name] = tool
        self._timeouts[tool_name] = timeout if timeout is not None else tool.timeout
        self._stats.setdefault(tool_name, ToolStats())
        return tool_or_function

    def unregister(self, name: str) -> None:
        """Remove a tool; unknown names raise KeyError."""
        if name not in self._tools:
            raise KeyError(name)
        del self._tools[name]
        del self._timeouts[name]

    # -- lookup -------------------------------------------------------------

    def get(self, name: str, default: Tool | None = None) -> Tool | None:
        """Return the tool called ``name`` or ``default``."""
        return self._tools.get(name, default)

    def __getitem__(self, name: str) -> Tool:
        return self._tools[name]

    def __contains__(self, name: object) -> bool:
        return name in self._tools

    def __len__(self) -> int:
        return len(self._tools)

    def __repr__(self) -> str:
        return f"ToolRegistry({self.names()})"

    def names(self) -> list[str]:
        """Registered tool names, in registration order."""
        return list(self._tools)

    def tools(self) -> list[Tool]:
        """Registered tool objects, in registration order."""
        return list(self._tools.values())

    def definitions(self) -> list[ToolDefinition]:
        """The tools' :class:`ToolDefinition` objects."""
        return [tool.definition for tool in self._tools.values()]

    def schemas(self) -> list[dict[str, Any]]:
        """OpenAI-style ``{"type": "function", ...}`` schemas, e.g. for ``apply_chat_template(tools=...)``."""
        return [d.to_openai_schema() for d in self.definitions()]

    def timeout_for(self, name: str) -> float | None:
        """Effective timeout of a registered tool in seconds (None = no limit)."""
        own = self._timeouts.get(name)
        return own if own is not None else self.default_timeout

    # -- execution ------------------------------------------------------------

    def execute_tool(self, name: str, /, **kwargs: Any) -> tuple[bool, str]:
        """Validate and run a tool call; never raises.

        Args:
            name: Tool name.
            **kwargs: The call's arguments.

        Returns:
            ``(success, result)`` where ``result`` is the tool's output (JSON-encoded
            if not a string) or an error message telling the model what to fix.
        """
        outcome = self.execute(name, kwargs)
        return outcome.success, outcome.result

    def execute(self, name: str, arguments: Any) -> ToolExecution:
        """Like :meth:`execute_tool` but takes an arguments dict and returns a :class:`ToolExecution`."""
        tool = self._tools.get(name)
        if tool is None:
            available = ", ".join(self._tools) or "(none)"
            return ToolExecution(name, False, f"Unknown tool '{name}'. Available tools: {available}.", "unknown_tool")
        definition = tool.definition
        arguments, problem = validate_arguments(definition, arguments)
        if problem is not None:
            message = f"Tool '{name}': {problem}. Expected arguments: {definition.signature_text()}."
            self._record(name, False, False, 0.0)
            return ToolExecution(name, False, message, "invalid_arguments")

        timeout = self.timeout_for(name)
        start = time.perf_counter()
        try:
            value = call_with_timeout(lambda: tool.execute(**arguments), timeout, f"tool-{name}")
        except CallTimeout as exc:
            seconds = time.perf_counter() - start
            self._record(name, False, True, seconds)
            message = f"Tool '{name}' timed out after {timeout:g} s"  # thread details: exc, warning
            return ToolExecution(name, False, message, "timeout", exception=exc, seconds=seconds)
        except KeyboardInterrupt:
            raise
        except BaseException as exc:  # the tool's own failure, reported to the model
            seconds = time.perf_counter() - start
            self._record(name, False, False, seconds)
            detail = f": {exc}" if str(exc) else ""
            message = f"Tool '{name}' raised {type(exc).__name__}{detail}"
            return ToolExecution(name, False, message, "exception", exception=exc, seconds=seconds)
        seconds = time.perf_counter() - start
        self._record(name, True, False, seconds)
        return ToolExecution(name, True, _format_result(value), seconds=seconds)

    # -- statistics -------------------------------------------------------------

    def _record(self, name: str, success: bool, timed_out: bool, seconds: float) -> None:
        with self._lock:
            stats = self._stats.setdefault(name, ToolStats())
            stats.calls += 1
            stats.successes += int(success)
            stats.failures += int(not success)
            stats.timeouts += int(timed_out)
            stats.total_seconds += seconds

    def stats(self) -> dict[str, dict[str, float | int]]:
        """Per-tool statistics: calls, successes, failures, timeouts, total_seconds, mean_seconds."""
        with self._lock:
            return {name: s.as_dict() for name, s in self._stats.items()}

    def reset_stats(self) -> None:
        """Zero all call statistics."""
        with self._lock:
            self._stats = {name: ToolStats() for name in self._tools}
