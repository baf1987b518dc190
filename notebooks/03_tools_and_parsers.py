# %% [markdown]
# # Tools, parsers and the multi-turn manager
#
# A model acts by writing text. To use a **tool** (a calculator, a search, the environment itself)
# it writes a *tool call* in a format a **parser** recognises; the **multi-turn manager** runs the
# calls, feeds the results back as messages, and steps the environment. This notebook takes the
# pieces one at a time, then lets the model solve arithmetic word problems with a calculator.

# %%
import os
import warnings

# Idle torch threads sleep instead of spinning: on a busy, shared CPU spinning threads
# fight each other and a forward pass can get up to 15x slower. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch
from transformers.utils import logging as hf_logging

SMOKE = os.environ.get("WORKBENCH_SMOKE") == "1"   # CI: smaller budgets, every cell still runs for real
torch.set_num_threads(int(os.environ.get("WORKBENCH_THREADS", 2)))   # 2 threads suit a 135M model
hf_logging.disable_progress_bar()   # no "Loading weights" bars
warnings.filterwarnings("ignore", category=FutureWarning)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## Tools
#
# `CalculatorTool` evaluates arithmetic safely (a small AST evaluator: no names, no attribute
# access, bounded exponents). A tool has a definition (name, description, JSON schema of its
# arguments) that parsers turn into prompt instructions.

# %%
# NBVAL_CHECK_OUTPUT
from workbench.tools import CalculatorTool, FunctionTool, MultiTurnManager, ToolRegistry, get_parser

calc = CalculatorTool()
print(calc.definition.signature_text())
print(calc(expression="3 * (4 + 5)"))
print(calc(expression="2 ** 10 / 8"))
registry = ToolRegistry([calc])
bad = registry.execute("calculator", {"expression": "__import__('os').getcwd()"})
print(bad.success, "|", bad.result)

# %% [markdown]
# Any typed Python function becomes a tool: the signature gives the schema, the docstring the
# descriptions.

# %%
# NBVAL_CHECK_OUTPUT
import json


def unit_price(total: float, count: int) -> float:
    """Price of one item.

    Args:
        total: price of all items together.
        count: number of items.
    """
    return round(total / count, 2)


tool = FunctionTool(unit_price)
print(json.dumps(tool.definition.to_openai_schema(), indent=1))
registry.register(tool)
print(registry.execute("unit_price", {"total": 10, "count": 4}).result)

# %% [markdown]
# ## Parsers: three tool-call formats
#
# * `function_calling` (alias `hermes`): `<tool_call>{"name": ..., "arguments": {...}}</tool_call>`, what
#   most instruct models are tuned for,
# * `json`: a bare JSON object `{"tool": ..., "arguments": {...}}`,
# * `react`: `Thought:` / `Action:` / `Action Input:` lines.
#
# Each returns a `ParseResult` with the tool calls, or an `error` and no calls at all (a broken
# turn is never half executed).

# %%
# NBVAL_CHECK_OUTPUT
samples = {
    "function_calling": 'Let me compute. <tool_call>{"name": "calculator", "arguments": {"expression": "7 + 3 * 4"}}</tool_call>',
    "json": '{"tool": "calculator", "arguments": {"expression": "7 + 3 * 4"}}',
    "react": 'Thought: I need the total.\nAction: calculator\nAction Input: {"expression": "7 + 3 * 4"}',
}
for name, text in samples.items():
    result = get_parser(name).parse(text)
    print(f"{name:17}", [(c.name, c.arguments) for c in result.tool_calls], "error:", result.error)
broken = get_parser("function_calling").parse('<tool_call>{"name": "calculator", "arguments": </tool_call>')
print("broken call ->", broken.tool_calls, "|", broken.error)

# %% [markdown]
# The parser also writes the format instructions that go into the system prompt:

# %%
# NBVAL_CHECK_OUTPUT
print(get_parser("function_calling").format_instructions(ToolRegistry([CalculatorTool()]).definitions()))

# %% [markdown]
# ## The multi-turn manager
#
# `MultiTurnManager(registry, parser, environment)` handles one assistant turn per `step(text)`:
# parse, run tool calls, or send plain text (here: the final answer) to the environment. Its
# `messages` are what goes back to the model. Here we drive it by hand on the `arithmetic`
# environment (a word problem, calculator allowed): a broken call, a good call, then the answer.

# %%
# NBVAL_CHECK_OUTPUT
from envs import make_env

env = make_env("arithmetic")
manager = MultiTurnManager(ToolRegistry([CalculatorTool()]), "function_calling", env, max_turns=4)
print(manager.reset(seed=0))
call = json.dumps({"name": "calculator", "arguments": {"expression": env.expression}})
for text in ['<tool_call>{"name": "calculator"</tool_call>', f"<tool_call>{call}</tool_call>",
             f"Answer: {env.answer}"]:
    turn = manager.step(text)
    print(f"\n> {text}")
    for m in turn.messages:
        print(f"  [{m['role']}{'/' + m['name'] if m.get('name') else ''}] {m['content']}")
    print(f"  reward={turn.reward:+.2f} done={turn.done} parse_error={turn.parse_error!r}")

# %% [markdown]
# ## The model with a calculator
#
# A `Rollout` builds this manager for every episode (the parser comes from the environment's
# `action_parser`, the tools from its `get_tools()`). A 135M model rarely writes a perfect tool
# call; `ConversationView` shows the calls boxed under the action, and parse errors in red.

# %%
from workbench.engines.hf import HFEngine
from workbench.models import load_model_and_tokenizer
from workbench.rollout import Rollout
from workbench.widgets import ConversationView, TrajectoryTable

model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
engine = HFEngine(model, tokenizer)
rollout = Rollout.from_env(engine, lambda: make_env("arithmetic", difficulty=1), num_groups=2,
                           group_size=2 if SMOKE else 4, max_turns=2 if SMOKE else 3,
                           max_tokens=24 if SMOKE else 48, seed=0)
batch = rollout.run()
{k: round(v, 3) for k, v in batch.summary().items() if k.startswith("env/")}

# %%
batch.to_pandas("turn")[["episode_id", "turn", "tool_calls", "parse_error", "reward", "observation"]].fillna("")

# %%
conv = ConversationView(batch)
table = TrajectoryTable(batch, conversation=conv)
table.sort_by, table.ascending = "tool_calls", False
from ipywidgets import VBox
VBox([table, conv])

# %% [markdown]
# To train a tool user: `Trainer(config, environment=make_env("arithmetic"))`; pass extra tools
# with `tools=[...]` and another format with `parser="react"`.
