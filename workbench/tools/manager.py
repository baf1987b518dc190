"""Multi-turn manager: turns model outputs into tool calls and environment steps.

One :meth:`MultiTurnManager.step` call handles one assistant turn:

1. without a parser, the whole output is the environment action;
2. with a parser, tool calls run in order through the :class:`ToolRegistry`
   (the environment itself is reached through an :class:`EnvironmentStepTool`,
   registered automatically when an environment is given);
3. without tool calls, plain text (or a final answer) becomes the action when
   ``plain_text_is_action`` is set;
4. parse errors and environment exceptions never propagate: they become chat
   messages telling the model what went wrong;
5. with ``step_timeout`` set, ``environment.reset``/``environment.step`` run under
   that limit (:func:`workbench.utils.timeouts.call_with_timeout`); an overrun is an
   environment error (``CallTimeout: ... did not return within ... s``) that ends
   the episode.

:attr:`TurnResult.messages` holds the new chat messages to append after the
assistant message: ``{"role": "tool", "name", "content", "tool_call_id"}`` per
executed (or skipped) tool call, and ``{"role": "user", "content"}`` for an
environment observation or an error notice.

Action spans: ``TurnResult.info["action_span"] = [start, end]`` says which characters
of the model output became the action, so the run doctor can tell "the reply was the
action" from "a number was pulled out of a sentence". The environment reports the span
it read as ``info["action_span"]`` relative to the action text it received; the
manager moves it by where that text sits in the model output (a parser's final answer,
its content, or the ``action`` argument of an ``environment_step`` call). A turn that
only called tools gets the span of its calls (``ParseResult.span``). No span is set
when the environment reports none or the action text cannot be found in the output.

Reasoning: with ``reasoning`` markers (Qwen3's and DeepSeek-R1's ``<think>``/``</think>``),
the action is read from the text after the reasoning block only
(:func:`workbench.tools.reasoning.split_reasoning`), so a tool call written while
reasoning is not executed; spans still count from the start of the whole output. A
reply that ends inside its reasoning block has no action: it is a parse error
(``TurnResult.reasoning_cut``), the environment is not stepped, and the model reads why.

Native tools: with ``native_tools`` the chat template renders the tool definitions itself
(its ``tools`` argument), so :meth:`MultiTurnManager.system_prompt` leaves the parser's
format instructions out; :meth:`MultiTurnManager.tool_schemas` gives the definitions.

Strict format: with an environment whose ``strict_format`` is set
(``environment.strict_format`` in the config), a parser given by name is built strict
(``get_parser(name, strict=True)``): a reply that is not exactly the call is a parse
error, which the model reads as the next user message, and the environment is not
stepped. A parser *object* that is not strict is refused (``ValueError``) rather than
run leniently. An environment's own format error (``info["parse_error"]``) becomes the
turn's ``parse_error`` too, so both count in ``env/parse_error_rate``.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workbench.utils.timeouts import call_with_timeout
from .builtin import EnvironmentStepTool, normalize_step_output
from .parsers import ActionParser, ParseResult, ToolCall, get_parser, resolve_raw_arguments
from .reasoning import split_reasoning
from .registry import ToolRegistry

__all__ = ["MultiTurnManager", "TurnResult"]


@dataclass
class TurnResult:
    """Outcome of one assistant turn.

    Args:
        model_output: The assistant text that was processed.
        tool_call: The first tool call of the turn, or None.
        tool_calls: All tool calls (with ``result``/``success`` filled in).
        messages: New non-assistant chat messages to append after the assistant message.
        observation: The environment observation (or the joined tool results when
            the environment was not stepped).
        reward: Sum of the environment rewards of this turn (0.0 if not stepped).
        done: Whether the episode ended (environment done, error, final answer or max_turns).
        info: Environment info plus ``invalid_action``/``parse_error``/``truncated`` etc.
        parse_error: The parser's error message, or the environment's format error
            (``info["parse_error"]``, strict format), or None.
        env_error: ``"ExceptionType: message"`` if the environment raised, else None.
        action: The action sent to the environment (last one if several), or None.
        state: The observation the model was responding to.
        turn: 1-based index of the turn in the episode.
        reasoning: The text of the output's reasoning block, or None without one.
        reasoning_cut: The output ended inside its reasoning block (no action was read).
        answer_start: Where the text after the reasoning block starts in the output (0 without one).
    """

    model_output: str
    tool_call: ToolCall | None = None
    tool_calls: list[ToolCall] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    observation: str = ""
    reward: float = 0.0
    done: bool = False
    info: dict[str, Any] = field(default_factory=dict)
    parse_error: str | None = None
    env_error: str | None = None
    action: str | None = None
    state: str | None = None
    turn: int = 0
    reasoning: str | None = None
    reasoning_cut: bool = False
    answer_start: int = 0


def _valid_span(span: Any, length: int) -> bool:
    """True for ``[start, end]`` ints with ``0 <= start <= end <= length``."""
    return (isinstance(span, (list, tuple)) and len(span) == 2
            and all(isinstance(x, int) and not isinstance(x, bool) for x in span)
            and 0 <= span[0] <= span[1] <= length)


def _locate(output: str, action: Any, near: int = 0) -> int | None:
    """Offset of ``action`` in ``output`` (searching from ``near``, then anywhere), or None."""
    if not isinstance(action, str) or not action:
        return None
    at = output.find(action, near)
    if at < 0:
        at = output.find(action)
    return at if at >= 0 else None


def _error_text(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def call_name(env: Any, method: str) -> str:
    """How a timed-out call names itself: `GuessNumberEnv.step`, and for an environment whose
    calls go elsewhere (its `remote`, a str, e.g. "the OpenEnv server at http://...") that too."""
    remote = getattr(env, "remote", None)
    return f"{type(env).__name__}.{method}" + (f" ({remote})" if isinstance(remote, str) and remote else "")


class MultiTurnManager:
    """Runs the model <-> tools <-> environment loop of one episode at a time.

    Args:
        tool_registry: Tools the model may call. Created empty when None and a
            parser or environment is given.
        parser: An :class:`ActionParser` or a parser name (``"json"``, ``"react"``,
            ``"function_calling"``/``"hermes"``). None means the whole model
            output is the environment action.
        environment: Object with ``step(action) -> (obs, reward, done, info)`` and
            optionally ``reset(seed=None) -> obs`` and ``get_tools() -> list[Tool]``.
            When given and the registry has no :class:`EnvironmentStepTool`, one
            named ``environment_step`` is registered, and so are the tools from
            ``get_tools()`` whose names are not taken (the passed registry is modified).
        max_turns: Turns after which the episode is truncated (``done=True``,
            ``info["truncated"]=True``).
        plain_text_is_action: With a parser, send text that contains no tool call
            (its final answer if any, else its content) to ``environment.step``.
        step_timeout: Seconds each ``environment.reset``/``environment.step`` may take
            (None: no limit). It is also the timeout of the ``environment_step`` tool
            registered here; a step tool already in the registry keeps its own.
        reasoning: ``(start, end)`` markers of a reasoning block (e.g. ``("<think>", "</think>")``):
            the action is read from the text after the block. None: the whole output.
        reasoning_opened: The generation prompt opens the reasoning block itself (DeepSeek-R1),
            so an output without the end marker was cut inside it.
        native_tools: The chat template renders the tool definitions (``tool_schemas()``), so
            ``system_prompt()`` leaves the parser's format instructions out.
    """

    def __init__(
        self,
        tool_registry: ToolRegistry | None = None,
        parser: ActionParser | str | None = None,
        environment: Any = None,
        max_turns: int = 10,
        plain_text_is_action: bool = True,
        step_timeout: float | None = None,
        reasoning: tuple[str, str] | None = None,
        reasoning_opened: bool = False,
        native_tools: bool = False,
    ) -> None:
        if max_turns < 1:
            raise ValueError("max_turns must be at least 1")
        self.registry = tool_registry if tool_registry is not None else ToolRegistry()
        self.step_tool = self._find_step_tool()
        if environment is None and self.step_tool is not None:
            environment = self.step_tool.environment
        self.parser = self._make_parser(parser, bool(getattr(environment, "strict_format", False)))
        if environment is not None and self.step_tool is None:
            self.step_tool = EnvironmentStepTool(environment, timeout=step_timeout)
            self.registry.register(self.step_tool)
        get_tools = getattr(environment, "get_tools", None)
        for tool in (get_tools() if callable(get_tools) else None) or ():
            if tool.definition.name not in self.registry:
                self.registry.register(tool)
        if self.parser is None and environment is None:
            raise ValueError("MultiTurnManager needs a parser, an environment, or both")
        self.environment = environment
        self.step_timeout = step_timeout
        self.max_turns = max_turns
        self.plain_text_is_action = plain_text_is_action
        self.reasoning = tuple(reasoning) if reasoning else None
        self.reasoning_opened = bool(reasoning_opened)
        self.native_tools = bool(native_tools)
        self._answer, self._base = "", 0  # the text actions are read from, and where it starts
        self.turns: list[TurnResult] = []
        self.done = False
        self.current_observation: str | None = None

    @staticmethod
    def _make_parser(parser: ActionParser | str | None, strict: bool) -> ActionParser | None:
        """The turn parser: ``parser`` by name (built strict when ``strict``), or the object as given."""
        if parser is None:
            return None
        if isinstance(parser, ActionParser):
            if strict and not parser.strict:
                raise ValueError(
                    f"environment.strict_format is true but the parser object given ({type(parser).__name__}) "
                    f"is not strict; pass the parser by name (e.g. {parser.name or 'json'!r}) or build it "
                    f"with strict=True")
            return parser
        return get_parser(parser, strict=True) if strict else get_parser(parser)

    def _find_step_tool(self) -> EnvironmentStepTool | None:
        for tool in self.registry.tools():
            if isinstance(tool, EnvironmentStepTool):
                return tool
        return None

    # -- episode control --------------------------------------------------------

    def start(self, initial_observation: str | None = None) -> None:
        """Clear the episode state; the environment is not touched.

        Args:
            initial_observation: The observation the first model turn responds to.
        """
        self.turns = []
        self.done = False
        self.current_observation = initial_observation
        if self.step_tool is not None:
            self.step_tool.clear()

    def reset(self, seed: int | None = None) -> str | None:
        """Clear the episode state and reset the environment (if any).

        Args:
            seed: Passed to ``environment.reset(seed=...)`` when not None.

        Returns:
            The initial observation, or None without an environment.

        Raises:
            workbench.utils.timeouts.CallTimeout: ``environment.reset`` overran ``step_timeout``.
        """
        observation = None
        if self.environment is not None and callable(getattr(self.environment, "reset", None)):
            env = self.environment
            result = call_with_timeout(lambda: env.reset(seed=seed) if seed is not None else env.reset(),
                                       self.step_timeout, call_name(env, "reset"))
            observation = result[0] if isinstance(result, tuple) else result
            observation = None if observation is None else str(observation)
        self.start(observation)
        return observation

    def system_prompt(self) -> str:
        """The environment's prompt prefix (if any) followed by the parser's format instructions."""
        parts = []
        prefix = getattr(self.environment, "get_prompt_prefix", None)
        if callable(prefix):
            text = prefix()
            if text:
                parts.append(str(text))
        if self.parser is not None and not self.native_tools:
            instructions = self.parser.format_instructions(self.registry.definitions())
            if instructions:  # a parser with no instructions adds no blank lines to the prompt
                parts.append(instructions)
        return "\n\n".join(parts)

    def tool_schemas(self) -> list[dict[str, Any]]:
        """The tools the model may call as OpenAI function schemas (a chat template's ``tools``)."""
        return [d.to_openai_schema() for d in self.registry.definitions()]

    # -- one turn -------------------------------------------------------------------

    def step(self, model_output: str, state: str | None = None) -> TurnResult:
        """Process one assistant turn.

        Args:
            model_output: The assistant's text for this turn.
            state: The observation the model responded to; defaults to the last
                observation the manager saw. Recorded as ``TurnResult.state``.

        Raises:
            RuntimeError: If the episode is already done (call ``reset()`` or ``start()``).
        """
        if self.done:
            raise RuntimeError("the episode is done; call reset() or start() before stepping again")
        result = TurnResult(
            model_output=model_output,
            state=state if state is not None else self.current_observation,
            turn=len(self.turns) + 1,
        )
        self._answer, self._base = model_output, 0
        if self.reasoning is not None:
            split = split_reasoning(model_output, self.reasoning, self.reasoning_opened)
            result.reasoning, result.reasoning_cut, result.answer_start = split.reasoning, split.cut, split.offset
            self._answer, self._base = split.answer, split.offset
        if result.reasoning_cut:
            result.info["reasoning_cut"] = True
            self._parse_error(result, f"the reply ended inside its reasoning block ({self.reasoning[0]} without "
                                      f"{self.reasoning[1]}), so it has no action; close the reasoning with "
                                      f"{self.reasoning[1]} and answer after it")
        elif self.parser is None:
            self._env_action(result, self._answer, offset=self._base)
        else:
            parsed = self.parser.parse(self._answer)
            if parsed.error is not None:
                self._parse_error(result, parsed.error)
            elif parsed.tool_calls:
                self._run_tool_calls(result, parsed)
            else:
                self._no_tool_call(result, parsed)

        if not result.done and result.turn >= self.max_turns:
            result.done = True
            result.info["truncated"] = True
        self.done = result.done
        if result.observation:
            self.current_observation = result.observation
        self.turns.append(result)
        return result

    def _find(self, action: Any, near: int = 0) -> int | None:
        """Offset in the whole output of ``action`` found in the text actions are read from."""
        at = _locate(self._answer, action, near)
        return None if at is None else self._base + at

    def _env_action(self, result: TurnResult, action: str, offset: int | None) -> None:
        """Send ``action`` straight to the environment and record the outcome.

        ``offset`` is where ``action`` starts in the model output (None: unknown).
        """
        result.action = action
        try:
            env = self.environment
            raw = call_with_timeout(lambda: env.step(action), self.step_timeout, call_name(env, "step"))
            obs, reward, done, info = normalize_step_output(raw)
        except Exception as exc:
            self._env_failure(result, exc)
            return
        result.observation, result.reward, result.done = obs, reward, done
        result.info.update(info)
        self._env_format_error(result, info)
        self._move_span(result, action, offset)
        if obs:
            result.messages.append({"role": "user", "content": obs})

    @staticmethod
    def _env_format_error(result: TurnResult, info: dict[str, Any]) -> None:
        """An environment's format error (``info["parse_error"]``, a str) is the turn's parse error."""
        error = info.get("parse_error")
        if result.parse_error is None and isinstance(error, str) and error:
            result.parse_error = error

    @staticmethod
    def _move_span(result: TurnResult, action: Any, offset: int | None) -> None:
        """Make the environment's ``info["action_span"]`` (relative to ``action``) relative
        to the model output; drop it when it is malformed or ``offset`` is unknown."""
        span = result.info.pop("action_span", None)
        if offset is not None and isinstance(action, str) and _valid_span(span, len(action)):
            result.info["action_span"] = [offset + span[0], offset + span[1]]

    def _env_failure(self, result: TurnResult, exc: BaseException, as_tool: ToolCall | None = None) -> None:
        result.env_error = _error_text(exc)
        result.done = True
        result.info["env_error"] = result.env_error
        notice = f"Environment error: {result.env_error}"
        if as_tool is not None:
            as_tool.result = notice
            result.messages.append(
                {"role": "tool", "name": as_tool.name, "content": notice, "tool_call_id": as_tool.id}
            )
        else:
            result.messages.append({"role": "user", "content": notice})

    def _parse_error(self, result: TurnResult, error: str) -> None:
        result.parse_error = error
        result.info.update({"invalid_action": True, "parse_error": error})
        reminder = self.parser.format_reminder(self.registry.definitions()) if self.parser else ""
        content = f"Your last message could not be parsed: {error}"
        if reminder:
            content += f"\n{reminder}"
        result.messages.append({"role": "user", "content": content})

    def _no_tool_call(self, result: TurnResult, parsed: ParseResult) -> None:
        text = parsed.final_answer if parsed.final_answer is not None else parsed.content
        if parsed.final_answer is not None:
            result.info["final_answer"] = parsed.final_answer
        if self.environment is not None and self.plain_text_is_action:
            near = parsed.span[0] if parsed.span else 0
            self._env_action(result, text, self._find(text, near))
        elif self.environment is None or parsed.final_answer is not None:
            # a plain answer without tools ends a tool-use episode
            result.done = True
            result.info.setdefault("final_answer", text)
        else:
            self._parse_error(result, "no tool call found")

    def _run_tool_calls(self, result: TurnResult, parsed: ParseResult) -> None:
        result.tool_calls = parsed.tool_calls
        result.tool_call = parsed.tool_calls[0]
        observations: list[str] = []
        stepped = False
        failures = 0
        for call in parsed.tool_calls:
            if result.done:
                call.result = "Skipped: the episode ended before this call."
                result.messages.append(
                    {"role": "tool", "name": call.name, "content": call.result, "tool_call_id": call.id}
                )
                continue
            tool = self.registry.get(call.name)
            arguments = resolve_raw_arguments(call, tool.definition if tool is not None else None)
            is_env = tool is not None and tool is self.step_tool
            if is_env:
                self.step_tool.clear()
            outcome = self.registry.execute(call.name, arguments)
            call.success, call.result = outcome.success, outcome.result
            failures += int(not outcome.success)
            if is_env and outcome.error_type in ("exception", "timeout"):
                error = self.step_tool.last_error or outcome.exception or TimeoutError(outcome.result)
                result.action = arguments.get("action")
                self._env_failure(result, error, as_tool=call)
                continue
            result.messages.append(
                {"role": "tool", "name": call.name, "content": outcome.result, "tool_call_id": call.id}
            )
            if is_env and outcome.success and self.step_tool.last_step is not None:
                obs, reward, done, info = self.step_tool.last_step
                stepped = True
                result.action = arguments.get("action")
                result.observation = obs
                result.reward += reward
                result.done = done
                result.info.update(info)
                self._env_format_error(result, info)
                near = call.span[0] if call.span else 0
                self._move_span(result, result.action, self._find(result.action, near))
            else:
                observations.append(outcome.result)
        if not stepped:
            result.observation = "\n".join(observations)
            if parsed.span is not None:
                result.info["action_span"] = [self._base + parsed.span[0], self._base + parsed.span[1]]
        result.info["tool_failures"] = failures

    # -- summary -------------------------------------------------------------------

    def episode_summary(self) -> dict[str, Any]:
        """Statistics of the current episode.

        Returns:
            Dict with num_turns, total_reward, done, truncated, tool_calls,
            tool_calls_by_name, tool_successes, tool_failures, tool_success_rate
            (0.0 when no call was made), parse_errors, env_errors.
            Skipped calls (after the episode ended) are not counted.
        """
        executed = [c for t in self.turns for c in t.tool_calls if c.success is not None]
        successes = sum(1 for c in executed if c.success)
        return {
            "num_turns": len(self.turns),
            "total_reward": float(sum(t.reward for t in self.turns)),
            "done": self.done,
            "truncated": bool(self.turns and self.turns[-1].info.get("truncated", False)),
            "tool_calls": len(executed),
            "tool_calls_by_name": dict(Counter(c.name for c in executed)),
            "tool_successes": successes,
            "tool_failures": len(executed) - successes,
            "tool_success_rate": successes / len(executed) if executed else 0.0,
            "parse_errors": sum(1 for t in self.turns if t.parse_error is not None),
            "env_errors": sum(1 for t in self.turns if t.env_error is not None),
        }
