"""Tools for language-model agents: definitions, a safe registry, action parsers and a multi-turn manager.

    base.py         ToolDefinition, Tool, schema from a function's signature and docstring
    registry.py     ToolRegistry: validation, timeouts, errors the model can read
    builtin.py      CalculatorTool (AST whitelist, never eval), EnvironmentStepTool
    parser_base.py  ToolCall, ParseResult, ActionParser, bounded JSON decoding
    parsers.py      JSON, ReAct and Hermes/Qwen <tool_call> parsers (linear time)
    manager.py      MultiTurnManager: parse -> tools/env -> messages, episode summary

Typical use::

    from workbench.tools import ToolRegistry, CalculatorTool, MultiTurnManager

    registry = ToolRegistry([CalculatorTool()], default_timeout=5)
    manager = MultiTurnManager(registry, "hermes", env)   # env: reset/step
    obs = manager.reset(seed=0)
    turn = manager.step(model_text)   # -> TurnResult(messages=..., reward=..., done=...)
"""

from .base import FunctionTool, Tool, ToolDefinition, parse_docstring, schema_from_function
from .builtin import CalculatorTool, EnvironmentStepTool, evaluate_arithmetic, normalize_step_output
from .manager import MultiTurnManager, TurnResult
from .parsers import (
    PARSERS,
    ActionParser,
    FunctionCallingParser,
    JSONActionParser,
    ParseResult,
    ReActActionParser,
    ToolCall,
    get_parser,
    resolve_raw_arguments,
)
from .registry import ToolExecution, ToolRegistry, ToolStats, validate_arguments

__all__ = [
    "ToolDefinition",
    "Tool",
    "FunctionTool",
    "schema_from_function",
    "parse_docstring",
    "ToolRegistry",
    "ToolExecution",
    "ToolStats",
    "validate_arguments",
    "CalculatorTool",
    "EnvironmentStepTool",
    "evaluate_arithmetic",
    "normalize_step_output",
    "ToolCall",
    "ParseResult",
    "ActionParser",
    "JSONActionParser",
    "ReActActionParser",
    "FunctionCallingParser",
    "PARSERS",
    "get_parser",
    "resolve_raw_arguments",
    "MultiTurnManager",
    "TurnResult",
]
