"""End-to-end tests of MultiTurnManager with a small real counter game."""

from __future__ import annotations

import pytest

from workbench.tools import CalculatorTool, EnvironmentStepTool, MultiTurnManager, ToolRegistry


class CounterGame:
    """Say 'inc' to add one; the game is won (reward 1, done) when the count reaches 3."""

    def __init__(self, target: int = 3):
        self.target = target
        self.count = 0
        self.step_count = 0
        self.max_steps = 10

    def reset(self, seed=None):
        self.count = 0
        self.step_count = 0
        return "count=0"

    def step(self, action):
        self.step_count += 1
        action = action.strip().lower()
        invalid = action != "inc"
        if not invalid:
            self.count += 1
        done = self.count >= self.target
        reward = 1.0 if done else (-0.1 if invalid else 0.0)
        return f"count={self.count}", reward, done, {"success": done, "invalid_action": invalid}

    def get_prompt_prefix(self):
        return "Reach 3 by saying inc."


class ExplodingGame(CounterGame):
    def step(self, action):
        if action == "boom":
            raise ValueError("the board caught fire")
        return super().step(action)


def hermes(name: str, args: str) -> str:
    return f'<tool_call>{{"name": "{name}", "arguments": {args}}}</tool_call>'


def test_no_parser_plain_text_actions():
    env = CounterGame()
    manager = MultiTurnManager(environment=env)
    assert manager.reset() == "count=0"
    first = manager.step("inc")
    assert (first.observation, first.reward, first.done) == ("count=1", 0.0, False)
    assert first.messages == [{"role": "user", "content": "count=1"}]
    assert first.action == "inc" and first.state == "count=0" and first.turn == 1
    bad = manager.step("dec")
    assert bad.reward == pytest.approx(-0.1) and bad.info["invalid_action"] is True
    manager.step("inc")
    last = manager.step("inc")
    assert last.done is True and last.reward == 1.0 and last.info["success"] is True
    with pytest.raises(RuntimeError):
        manager.step("inc")


def test_tool_calls_step_environment_and_finish():
    env = CounterGame()
    registry = ToolRegistry([CalculatorTool()])
    manager = MultiTurnManager(registry, "hermes", env)
    assert "environment_step" in registry  # registered automatically
    assert "Reach 3 by saying inc." in manager.system_prompt()
    assert '"name": "environment_step"' in manager.system_prompt()
    manager.reset()

    turn = manager.step("I'll compute first. " + hermes("calculator", '{"expression": "1+2"}'))
    assert turn.tool_call.name == "calculator" and turn.tool_call.success is True
    assert turn.messages == [
        {"role": "tool", "name": "calculator", "content": "3", "tool_call_id": turn.tool_call.id}
    ]
    assert (turn.observation, turn.reward, turn.done) == ("3", 0.0, False)
    assert env.count == 0

    turn = manager.step(hermes("environment_step", '{"action": "inc"}') + hermes("environment_step", '{"action": "inc"}'))
    assert [m["content"] for m in turn.messages] == ["count=1", "count=2"]
    assert all(m["role"] == "tool" for m in turn.messages)
    assert (turn.observation, turn.reward, turn.done, turn.action) == ("count=2", 0.0, False, "inc")

    # the third call in the same turn is skipped because the game ends on the second
    turn = manager.step(
        hermes("environment_step", '{"action": "inc"}') + hermes("calculator", '{"expression": "2*2"}')
    )
    assert (turn.observation, turn.reward, turn.done) == ("count=3", 1.0, True)
    assert turn.info["success"] is True
    assert turn.tool_calls[1].success is None
    assert turn.messages[1]["content"] == "Skipped: the episode ended before this call."

    summary = manager.episode_summary()
    assert summary == {
        "num_turns": 3,
        "total_reward": 1.0,
        "done": True,
        "truncated": False,
        "tool_calls": 4,
        "tool_calls_by_name": {"calculator": 1, "environment_step": 3},
        "tool_successes": 4,
        "tool_failures": 0,
        "tool_success_rate": 1.0,
        "parse_errors": 0,
        "env_errors": 0,
    }


def test_parse_error_gives_instructions_and_invalid_action():
    env = CounterGame()
    manager = MultiTurnManager(ToolRegistry(), "hermes", env)
    manager.reset()
    turn = manager.step('<tool_call>{"name": "environment_step", "arguments": {"action": "inc"}')
    assert turn.parse_error == "tool call #1: <tool_call> is not closed with </tool_call>"
    assert turn.info["invalid_action"] is True and turn.info["parse_error"] == turn.parse_error
    assert turn.reward == 0.0 and turn.done is False and env.step_count == 0
    assert len(turn.messages) == 1 and turn.messages[0]["role"] == "user"
    content = turn.messages[0]["content"]
    assert content.startswith("Your last message could not be parsed: tool call #1")
    assert "<tool_call>" in content and "Available tools: environment_step" in content
    assert manager.episode_summary()["parse_errors"] == 1


def test_failed_tool_call_is_reported_to_model():
    env = CounterGame()
    manager = MultiTurnManager(None, "json", env)
    manager.reset()
    turn = manager.step('{"tool": "environment_step", "arguments": {"act": "inc"}}')
    assert turn.tool_call.success is False
    assert turn.messages[0]["role"] == "tool"
    assert "missing required argument 'action'" in turn.messages[0]["content"]
    assert turn.done is False and turn.env_error is None and turn.info["tool_failures"] == 1
    summary = manager.episode_summary()
    assert (summary["tool_calls"], summary["tool_failures"], summary["tool_success_rate"]) == (1, 1, 0.0)


def test_react_plain_text_and_raw_input():
    env = CounterGame()
    manager = MultiTurnManager(None, "react", env)
    manager.reset()
    turn = manager.step("Thought: go up\nAction: environment_step\nAction Input: inc")
    assert turn.observation == "count=1" and turn.tool_call.arguments == {"input": "inc"}
    turn = manager.step("Final Answer: inc")  # plain text goes to the environment
    assert turn.action == "inc" and turn.observation == "count=2"
    assert turn.messages == [{"role": "user", "content": "count=2"}]


def test_environment_error_ends_episode_without_raising():
    env = ExplodingGame()
    manager = MultiTurnManager(environment=env)
    manager.reset()
    turn = manager.step("boom")
    assert turn.done is True
    assert turn.env_error == "ValueError: the board caught fire"
    assert turn.messages == [{"role": "user", "content": "Environment error: ValueError: the board caught fire"}]

    manager = MultiTurnManager(None, "hermes", ExplodingGame())
    manager.reset()
    turn = manager.step(hermes("environment_step", '{"action": "boom"}'))
    assert turn.done is True and turn.env_error == "ValueError: the board caught fire"
    assert turn.messages[0]["role"] == "tool"
    assert turn.messages[0]["content"] == "Environment error: ValueError: the board caught fire"
    summary = manager.episode_summary()
    assert summary["env_errors"] == 1 and summary["tool_failures"] == 1 and summary["done"] is True


def test_max_turns_truncates():
    manager = MultiTurnManager(environment=CounterGame(target=100), max_turns=2)
    manager.reset()
    assert manager.step("inc").done is False
    turn = manager.step("inc")
    assert turn.done is True and turn.info["truncated"] is True
    assert manager.episode_summary()["truncated"] is True
    manager.reset()
    assert manager.turns == [] and manager.done is False


def test_existing_step_tool_and_no_environment_answer():
    env = CounterGame()
    registry = ToolRegistry([EnvironmentStepTool(env, name="act")])
    manager = MultiTurnManager(registry, "json", plain_text_is_action=False)
    assert manager.environment is env and registry.names() == ["act"]
    manager.start("count=0")
    turn = manager.step("no call here")
    assert turn.parse_error == "no tool call found" and turn.info["invalid_action"] is True

    tools_only = MultiTurnManager(ToolRegistry([CalculatorTool()]), "json")
    turn = tools_only.step('{"tool": "calculator", "arguments": {"expression": "6*7"}}')
    assert turn.observation == "42" and turn.done is False
    turn = tools_only.step("The answer is 42.")
    assert turn.done is True and turn.info["final_answer"] == "The answer is 42."
    with pytest.raises(ValueError):
        MultiTurnManager()


def test_parser_without_instructions_adds_nothing_to_the_system_prompt():
    from workbench.tools.parsers import FunctionCallingParser

    class Quiet(FunctionCallingParser):
        def format_instructions(self, tools):
            return ""

    manager = MultiTurnManager(ToolRegistry([CalculatorTool()]), Quiet(), CounterGame())
    assert manager.system_prompt() == "Reach 3 by saying inc."  # no trailing blank lines


# -- reasoning blocks and native tools -------------------------------------------------
class SpanGame(CounterGame):
    """Reports which characters of the action it read (`info["action_span"]`)."""

    def step(self, action):
        obs, reward, done, info = super().step(action)
        at = action.find("inc")
        return obs, reward, done, {**info, "action_span": [at, at + 3]} if at >= 0 else info


def test_the_action_is_read_after_the_reasoning_block_and_spans_count_from_the_whole_reply():
    manager = MultiTurnManager(ToolRegistry([CalculatorTool()]), "hermes", SpanGame(target=1),
                               reasoning=("<think>", "</think>"))
    manager.reset()
    reply = ("<think>\nI could call " + hermes("calculator", '{"expression": "1+1"}') + " or inc twice, but no.\n"
             "</think>\n\ninc")
    turn = manager.step(reply)
    assert turn.tool_calls == [] and turn.action == "inc" and turn.done and turn.reward == 1.0
    assert turn.reasoning.startswith("I could call <tool_call>") and not turn.reasoning_cut
    assert turn.answer_start == reply.index("</think>") + len("</think>")
    span = turn.info["action_span"]  # the "inc" after the block, not a word inside the reasoning
    assert reply[span[0]:span[1]] == "inc" and span[0] > turn.answer_start


def test_a_reply_cut_inside_its_reasoning_has_no_action():
    game = CounterGame()
    for opened, reply in ((False, "<think>\nstill going"), (True, "no end marker after an opened block")):
        manager = MultiTurnManager(None, None, game, reasoning=("<think>", "</think>"), reasoning_opened=opened)
        manager.reset()
        turn = manager.step(reply)
        assert turn.reasoning_cut and turn.action is None and game.step_count == 0
        assert "ended inside its reasoning block (<think> without </think>)" in turn.parse_error
        assert turn.info["reasoning_cut"] and turn.messages[0]["role"] == "user"


def test_native_tools_leave_the_instructions_to_the_template():
    prompts = [MultiTurnManager(ToolRegistry([CalculatorTool()]), "hermes", CounterGame(), native_tools=native)
               for native in (False, True)]
    assert "<tools>" in prompts[0].system_prompt() and prompts[1].system_prompt() == "Reach 3 by saying inc."
    schemas = prompts[1].tool_schemas()
    assert {s["function"]["name"] for s in schemas} == {"calculator", "environment_step"}
    assert all(s["type"] == "function" and "parameters" in s["function"] for s in schemas)
