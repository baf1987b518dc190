"""Arithmetic word problems with a calculator tool.

Each seed draws a short story with `difficulty` operations (default 2), e.g.

    Mia has 7 apples. She buys 3 bags with 4 apples in each. She gives 5 apples to
    a friend. How many apples does Mia have now?

The model may call the `calculator` tool any number of times (within `max_steps`,
default 4) and then answers. `get_tools()` returns `[CalculatorTool()]` and
`action_parser = "function_calling"`.

Action (any of these, first one in the reply wins):
  * a calculator call, as a Hermes/OpenAI function call
    `<tool_call>{"name": "calculator", "arguments": {"expression": "7 + 3*4 - 5"}}</tool_call>`
    (also bare JSON, `calculator(7 + 3*4 - 5)`, or ReAct `Action: calculator` /
    `Action Input: ...`); the observation is the result, reward 0, episode goes on.
  * the final answer: `Answer: 14` (also "the answer is 14"), an `answer` call
    (`{"name": "answer", "arguments": {"answer": 14}}` or `answer(14)`), or a reply
    that is only a number. This ends the episode.

Strict format (`environment.strict_format=true`): a reply must be exactly one of
  * one calculator (or `answer`) call as a single `<tool_call>...</tool_call>` block, or
  * `Answer: N` alone (the label in any case, whitespace around the reply allowed).
Anything else ("The answer is 14", a bare "14", text around a call, two calls) is a
format error: `invalid_reward`, `info` has `invalid_action` and `parse_error`, the
episode goes on and the turn counts toward `max_steps`. In a rollout the tool call is
run by the strict function-calling parser before the environment sees the reply, and a
call with text around it is that parser's error.

Rewards: correct answer `correct_reward` (1.0, `info["success"] = True`), wrong answer
`wrong_reward` (0.0); a reply that is neither is `invalid_reward` (-0.1) with
`info["invalid_action"] = True` and the episode goes on.

The env executes calculator calls found in the text itself, so it works whether or
not a tool-calling loop (MultiTurnManager) intercepts them first.
"""
from __future__ import annotations

import json
import re
from typing import Any

from envs._common import ParamsEnvironment, strict_span
from workbench.environments.base import StepResult
from workbench.tools.parsers import FunctionCallingParser

NAMES = [("Mia", "She"), ("Tom", "He"), ("Ana", "She"), ("Leo", "He"), ("Sara", "She"), ("Ben", "He")]
ITEMS = ["apples", "marbles", "stickers", "books", "coins", "pencils", "cookies", "shells"]

_ANSWER_RE = re.compile(r"answer\W{0,12}(?:is\W{0,3})?(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
_NUMBER_ONLY_RE = re.compile(r"^\s*(-?\d[\d,]*(?:\.\d+)?)\s*\.?\s*$")
_CALL_RE = re.compile(r"\b(calculator|calculate|calc|answer)\s*\(", re.IGNORECASE)
_REACT_RE = re.compile(r"Action:\s*(calculator|answer)\s*\n\s*Action Input:\s*(.+)", re.IGNORECASE)
_STRICT_ANSWER_RE = re.compile(r"Answer:[ \t]*(-?\d[\d,]*(?:\.\d+)?)", re.IGNORECASE)
_STRICT_CALLS = FunctionCallingParser(strict=True)


def _json_objects(text: str) -> list[tuple[int, int, dict]]:
    """(start, end, object) for every top-level JSON object embedded in `text`."""
    found, decoder, i = [], json.JSONDecoder(), text.find("{")
    while i != -1:
        try:
            obj, end = decoder.raw_decode(text, i)
        except ValueError:
            i = text.find("{", i + 1)
            continue
        if isinstance(obj, dict):
            found.append((i, end, obj))
        i = text.find("{", end)
    return found


def _balanced(text: str, start: int) -> str | None:
    """The text from `start` up to the parenthesis that closes the one before it."""
    depth = 1
    for i in range(start, len(text)):
        depth += {"(": 1, ")": -1}.get(text[i], 0)
        if depth == 0:
            return text[start:i]
    return None


def _call_from_json(obj: dict) -> tuple[str, dict] | None:
    """(name, arguments) of a function-call dict in any common layout, or None."""
    if isinstance(obj.get("function"), dict):
        obj = obj["function"]
    name = obj.get("name") or obj.get("tool") or obj.get("tool_name")
    args = obj.get("arguments", obj.get("parameters", obj.get("args", obj.get("input", {}))))
    if isinstance(args, str):
        try:
            args = json.loads(args)
        except ValueError:
            args = {"expression": args}
    if not isinstance(name, str) or not isinstance(args, dict):
        return None
    return name.lower(), args


def parse_action(text: str) -> tuple[str, Any] | None:
    """The first calculator call or answer in `text`: ("calculator", expr) or
    ("answer", value_text), or None when there is neither."""
    found = parse_action_span(text)
    return None if found is None else found[:2]


def parse_action_span(text: str) -> tuple[str, Any, list[int]] | None:
    """`parse_action` plus the [start, end] of the call or answer it read in `text`."""
    events: list[tuple[int, int, str, Any]] = []
    for start, end, obj in _json_objects(text):
        call = _call_from_json(obj)
        if call and call[0] in ("calculator", "calculate", "calc"):
            expr = call[1].get("expression", next(iter(call[1].values()), ""))
            events.append((start, end, "calculator", str(expr)))
        elif call and call[0] == "answer":
            events.append((start, end, "answer", str(call[1].get("answer", next(iter(call[1].values()), "")))))
    for m in _CALL_RE.finditer(text):
        raw = _balanced(text, m.end())
        if raw is None:
            continue
        kind = "answer" if m.group(1).lower() == "answer" else "calculator"
        arg = re.sub(r"^\s*\w+\s*=\s*", "", raw).strip().strip("'\"")
        events.append((m.start(), m.end() + len(raw) + 1, kind, arg))
    for m in _REACT_RE.finditer(text):
        events.append((m.start(), m.end(), m.group(1).lower(), m.group(2).strip().strip("'\"")))
    m = _ANSWER_RE.search(text)
    if m:
        events.append((m.start(), m.end(), "answer", m.group(1)))
    m = _NUMBER_ONLY_RE.match(text)
    if m:
        events.append((m.start(1), m.end(1), "answer", m.group(1)))
    if not events:
        return None
    start, end, kind, arg = min(events, key=lambda e: e[0])
    return kind, arg, [start, end]


def parse_strict_action(text: str) -> tuple[str, Any, list[int]] | str:
    """(kind, arg, [start, end]) as `parse_action_span` when `text` is exactly one
    `<tool_call>` block or `Answer: N` (whitespace around it allowed), else why it is not."""
    bare, (start, end) = strict_span(text)
    answer = _STRICT_ANSWER_RE.fullmatch(bare)
    if answer:
        return "answer", answer.group(1), [start, end]
    if not bare.startswith("<tool_call>"):
        return "the reply is not one <tool_call> block or 'Answer: <number>' alone"
    parsed = _STRICT_CALLS.parse(bare)
    if parsed.error or not parsed.tool_calls:
        return parsed.error or "the reply is not one <tool_call> block"
    call = parsed.tool_calls[0]
    name, args = call.name.lower(), call.arguments
    first = str(args.get("input", next(iter(args.values()), ""))) if args else ""
    if name in ("calculator", "calculate", "calc"):
        return "calculator", str(args.get("expression", first)), [start, end]
    if name == "answer":
        return "answer", str(args.get("answer", first)), [start, end]
    return f"unknown tool {call.name!r}; call calculator, or reply 'Answer: <number>'"


def _group(expr: str) -> str:
    """`expr` in parentheses unless it is a single number."""
    return expr if expr.isdigit() else f"({expr})"


def _to_number(text: str) -> float | None:
    m = re.search(r"-?\d[\d,]*(?:\.\d+)?", str(text))
    return float(m.group().replace(",", "")) if m else None


class ArithmeticEnv(ParamsEnvironment):
    """Solve a seeded multi-step word problem, optionally with a calculator."""

    NAME = "arithmetic"
    DEFAULT_MAX_STEPS = 4
    supports_strict_format = True
    action_parser = "function_calling"
    DEFAULT_PARAMS: dict[str, Any] = {
        "difficulty": 2,         # operations in the story (1-5)
        "max_number": 20,        # largest starting amount / added amount
        "correct_reward": 1.0,   # reward for the right final answer
        "wrong_reward": 0.0,     # reward for a wrong final answer
        "invalid_reward": -0.1,  # reward for a reply with no call and no answer
        "instruction": "",       # text put on a new line after each problem ("": none)
    }

    def __init__(self, config=None):
        super().__init__(config)
        self.difficulty = int(self.params["difficulty"])
        if not 1 <= self.difficulty <= 5:
            raise ValueError(f"arithmetic: params difficulty must be in 1..5, got {self.difficulty}")
        self.problem = ""
        self.expression = "0"
        self.answer = 0
        self.calls: list[tuple[str, str]] = []  # (expression, result)

    def default_prompt(self) -> str:
        return (
            "Solve the math word problem. You can use the calculator tool: "
            '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3 * 4"}}</tool_call> '
            "and you get the result back. When you know the result, reply with "
            "'Answer: <number>'." + (" Each reply is one tool call or the answer, and nothing else."
                                     if self.strict_format else "")
        )

    def get_tools(self) -> list:
        """`[CalculatorTool()]` from `workbench.tools`."""
        from workbench.tools import CalculatorTool

        return [CalculatorTool()]

    # -- problem generation ------------------------------------------------------
    def _make_problem(self) -> None:
        rng, top = self.rng, max(int(self.params["max_number"]), 5)
        name, pron = rng.choice(NAMES)
        item = rng.choice(ITEMS)
        total = rng.randint(3, top)
        expr = str(total)
        sentences = [f"{name} has {total} {item}."]
        for _ in range(self.difficulty):
            options = ["add", "bags", "times"] + (["give"] if total > 1 else [])
            divisors = [k for k in (2, 3, 4, 5) if total % k == 0 and total >= 2 * k]
            options += ["share"] * bool(divisors)
            op = rng.choice(options)
            if op == "add":
                b = rng.randint(2, top)
                total, expr = total + b, f"{expr} + {b}"
                sentences.append(f"{pron} finds {b} more {item}.")
            elif op == "give":
                b = rng.randint(1, total - 1)
                total, expr = total - b, f"{expr} - {b}"
                sentences.append(f"{pron} gives {b} {item} to a friend.")
            elif op == "bags":
                k, m = rng.randint(2, 5), rng.randint(2, max(top // 2, 2))
                total, expr = total + k * m, f"{expr} + {k} * {m}"
                sentences.append(f"{pron} buys {k} bags with {m} {item} in each.")
            elif op == "times":
                k = rng.choice([2, 3])
                total, expr = total * k, f"{_group(expr)} * {k}"
                sentences.append(f"Then the number of {item} {'doubles' if k == 2 else 'triples'}.")
            else:
                k = rng.choice(divisors)
                total, expr = total // k, f"{_group(expr)} / {k}"
                sentences.append(f"{pron} splits the {item} into {k} equal piles and keeps one pile.")
        sentences.append(f"How many {item} does {name} have now?")
        self.problem, self.expression, self.answer = " ".join(sentences), expr, total

    # -- episode -----------------------------------------------------------------
    def reset(self) -> str:
        """Draw a new word problem; the observation is the problem, then `instruction` if set."""
        self._make_problem()
        self.calls = []
        instruction = str(self.params["instruction"] or "")
        return f"{self.problem}\n{instruction}" if instruction else self.problem

    def step(self, action: str) -> StepResult:
        """Run a calculator call or grade an answer; see the module docstring."""
        last = self.step_count + 1 >= self.max_steps
        if self.strict_format:
            parsed = parse_strict_action(action or "")
            if isinstance(parsed, str):
                out = f" Out of steps. The answer was {self.answer}." if last else ""
                return self.format_error(parsed, "Reply with one calculator call or 'Answer: <number>' alone.", out)
        else:
            parsed = parse_action_span(action or "")
        if parsed is None:
            obs = "Call the calculator or reply 'Answer: <number>'."
            if last:
                obs += f" Out of steps. The answer was {self.answer}."
            return obs, float(self.params["invalid_reward"]), False, {"invalid_action": True}
        kind, arg, span = parsed
        if kind == "calculator":
            try:
                result = str(self.get_tools()[0].execute(expression=arg))
                info: dict[str, Any] = {"tool": "calculator", "tool_result": result, "action_span": span}
            except Exception as exc:  # the calculator rejects bad expressions with ValueError
                result = f"error: {exc}"
                info = {"tool": "calculator", "tool_error": str(exc), "action_span": span}
            self.calls.append((arg, result))
            obs = f"calculator({arg}) = {result}"
            if last:
                obs += f" Out of steps. The answer was {self.answer}."
            return obs, 0.0, False, info
        value = _to_number(arg)
        if value is None:
            return ("The answer must be a number.", float(self.params["invalid_reward"]), False,
                    {"invalid_action": True, "action_span": span})
        self._done = True
        if abs(value - self.answer) < 1e-6:
            return (f"Correct! The answer is {self.answer}.", float(self.params["correct_reward"]), True,
                    {"success": True, "action_span": span})
        return (f"Wrong. The answer was {self.answer}.", float(self.params["wrong_reward"]), True,
                {"success": False, "given": value, "action_span": span})

    def get_state_description(self) -> str:
        """The problem and the calculator calls so far."""
        lines = [self.problem] + [f"calculator({e}) = {r}" for e, r in self.calls]
        return "\n".join(lines)

    def expert_action(self) -> str:
        """The scripted expert's reply in the current state (`expert_action` below): what
        SFT warm-up learns from (`workbench.training.sft`)."""
        return expert_action(self)


def expert_action(env: ArithmeticEnv) -> str:
    """Compute the whole story with one calculator call, then give the answer."""
    if not env.calls and env.step_count + 1 < env.max_steps:
        call = {"name": "calculator", "arguments": {"expression": env.expression}}
        return f"<tool_call>{json.dumps(call)}</tool_call>"
    return f"Answer: {env.answer}"
