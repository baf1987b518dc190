"""Failure isolation: one bad episode in a batch never breaks the others.

Each test runs >= 3 episodes; the affected one is driven by a typed (human) action so
the failure is deterministic, the others are sampled by the tiny model and must end
normally, token-exact, with no error or warning.
"""
from __future__ import annotations

import json
import time

import pytest

from envs import make_env
from envs.guess_number import GuessNumberEnv
from workbench.rollout import Rollout, check_token_alignment
from workbench.tools import FunctionTool

MAX_TURNS = 3


def call(name: str, arguments: dict | None = None) -> str:
    return f"<tool_call>{json.dumps({'name': name, 'arguments': arguments or {}})}</tool_call>"


def assert_normal(ep, tok):
    assert ep.done and ep.error is None, ep
    assert ep.warnings == [], ep.warnings
    assert check_token_alignment(ep, tok).ok
    assert 1 <= ep.num_turns <= MAX_TURNS
    assert ep.success or ep.truncation_reason == "max_turns" or ep.turns[-1].done


def run_with(engine, envs, affected: int, action: str | None, **kwargs):
    rollout = Rollout(engine, envs, seeds=list(range(len(envs))), max_turns=MAX_TURNS, max_tokens=8, **kwargs)
    rollout.reset()
    if action is not None and affected in rollout.live:
        t0 = time.perf_counter()
        rollout.step(human_actions={affected: action})
        rollout.last_step_seconds = time.perf_counter() - t0
    batch = rollout.run()
    assert len(batch) == len(envs)
    for i, ep in enumerate(batch):
        if i != affected:
            assert_normal(ep, engine.tokenizer)
    return rollout, batch


# -- tools ---------------------------------------------------------------------------------

def explode(x: int = 0) -> str:
    """A tool that always fails.

    Args:
        x: ignored.
    """
    raise ZeroDivisionError("tool exploded on purpose")


def slow(x: int = 0) -> str:
    """A tool that takes 2 s.

    Args:
        x: ignored.
    """
    time.sleep(2.0)
    return "finally"


def test_tool_that_raises(tiny_engine):
    envs = [make_env("guess_number") for _ in range(3)]
    _, batch = run_with(tiny_engine, envs, 1, call("explode", {"x": 1}), parser="function_calling",
                        tools=[FunctionTool(explode)])
    ep = batch[1]
    assert ep.error is None and ep.warnings == []
    tc = ep.turns[0].tool_calls[0]
    assert tc["name"] == "explode" and tc["success"] is False
    assert "ZeroDivisionError" in tc["result"] and "tool exploded on purpose" in tc["result"]
    tool_msgs = [m for m in ep.messages if m["role"] == "tool"]
    assert tool_msgs and "tool exploded on purpose" in tool_msgs[0]["content"]
    assert ep.num_turns == MAX_TURNS or ep.done  # the episode went on after the failed call
    assert check_token_alignment(ep, tiny_engine.tokenizer).ok


def test_tool_past_its_timeout(tiny_engine):
    envs = [make_env("guess_number") for _ in range(3)]
    rollout, batch = run_with(tiny_engine, envs, 0, call("slow"), parser="function_calling",
                              tools=[FunctionTool(slow, timeout=0.2)])
    assert rollout.last_step_seconds < 1.5, f"the step waited {rollout.last_step_seconds:.2f}s for a 0.2s timeout"
    ep = batch[0]
    tc = ep.turns[0].tool_calls[0]
    assert tc["success"] is False and "timed out" in tc["result"].lower() and "0.2" in tc["result"]
    assert ep.error is None and ep.warnings == [] and ep.num_turns >= 2
    assert check_token_alignment(ep, tiny_engine.tokenizer).ok


def test_call_with_broken_json(tiny_engine):
    envs = [make_env("arithmetic") for _ in range(3)]
    broken = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 +</tool_call>'
    _, batch = run_with(tiny_engine, envs, 2, broken)
    ep = batch[2]
    turn = ep.turns[0]
    assert turn.parse_error and "json" in turn.parse_error.lower()
    assert turn.tool_calls == [] and ep.infos[0]["invalid_action"] is True
    assert "could not be parsed" in ep.messages[3]["content"]
    assert ep.error is None and ep.warnings == [] and ep.num_turns >= 2


def test_unknown_tool(tiny_engine):
    envs = [make_env("arithmetic") for _ in range(3)]
    _, batch = run_with(tiny_engine, envs, 0, call("teleport", {"where": "moon"}))
    ep = batch[0]
    tc = ep.turns[0].tool_calls[0]
    assert tc["name"] == "teleport" and tc["success"] is False
    assert "teleport" in tc["result"] and "calculator" in tc["result"]  # names the tools that exist
    assert ep.error is None and ep.warnings == [] and ep.num_turns >= 2


# -- environments ----------------------------------------------------------------------------

class StepRaises(GuessNumberEnv):
    def step(self, action):
        raise KeyError("secret went missing")


class ResetRaises(GuessNumberEnv):
    def reset(self):
        raise OSError("word list not found")


class HugeObservation(GuessNumberEnv):
    def step(self, action):
        obs, reward, done, info = super().step(action)
        return obs + " blah" * 4000, reward, done, info


def test_env_step_raises(tiny_engine):
    envs = [make_env("guess_number"), StepRaises(), make_env("guess_number")]
    _, batch = run_with(tiny_engine, envs, 1, None)
    ep = batch[1]
    assert ep.done and ep.num_turns == 1
    assert ep.error is not None and "KeyError" in ep.error and "secret went missing" in ep.error
    assert ep.turns[0].env_error and "KeyError" in ep.turns[0].env_error
    assert ep.warnings == [] and check_token_alignment(ep, tiny_engine.tokenizer).ok
    assert batch.summary()["env/error_rate"] == pytest.approx(1 / 3)


def test_env_reset_raises(tiny_engine):
    envs = [make_env("guess_number"), make_env("guess_number"), ResetRaises()]
    rollout, batch = run_with(tiny_engine, envs, 2, None)
    ep = batch[2]
    assert ep.done and ep.num_turns == 0 and ep.token_ids == []
    assert "reset" in ep.error and "OSError" in ep.error and "word list not found" in ep.error
    assert batch.input_ids.shape[0] == 3 and batch.attention_mask[2].sum() == 0


def test_observation_overflows_context(tiny_engine):
    envs = [make_env("guess_number"), make_env("guess_number"), HugeObservation()]
    _, batch = run_with(tiny_engine, envs, 2, "8", max_context_tokens=1024)
    ep = batch[2]
    assert ep.truncated and ep.truncation_reason == "context"
    assert ep.error is None and ep.num_turns == 1
    assert ep.num_tokens < 1024
    assert ep.warnings == [] and check_token_alignment(ep, tiny_engine.tokenizer).ok
    # the oversize observation was not appended
    assert "blah blah" not in tiny_engine.tokenizer.decode(ep.token_ids)
    for other in (batch[0], batch[1]):
        assert other.num_tokens < 1024


def test_generation_budget_shrinks_to_the_context(tiny_engine):
    """An episode close to the budget gets fewer new tokens, then ends as "context"."""
    envs = [make_env("guess_number") for _ in range(3)]
    rollout = Rollout(tiny_engine, envs, seeds=[0, 1, 2], max_turns=20, max_tokens=40, max_context_tokens=200)
    batch = rollout.run()
    for ep in batch:
        assert ep.num_tokens <= 200
        assert ep.truncation_reason in ("context", "max_turns") or ep.success
        assert ep.warnings == []
    assert any(ep.truncation_reason == "context" for ep in batch)


class HugeFirstObservation(GuessNumberEnv):
    def reset(self):
        return super().reset() + " blah" * 4000


def test_first_observation_overflows_context(tiny_engine):
    envs = [make_env("guess_number"), HugeFirstObservation(), make_env("guess_number")]
    _, batch = run_with(tiny_engine, envs, 1, None, max_context_tokens=1024)
    ep = batch[1]
    # the observation is cut to leave room for one full turn (8 tokens), with the cut recorded
    assert ep.done and ep.error is None and ep.num_tokens <= 1024
    assert ep.prompt_length <= 1024 - 8 and ep.num_turns >= 1 and ep.response_length > 0
    assert len(ep.warnings) == 1 and ep.warnings[0].startswith("context: first observation cut from 20,061 to ")
    assert ep.messages[1]["content"].endswith("[... observation cut: 20,061 characters do not fit the context "
                                              "budget of 1024 tokens]")
    assert check_token_alignment(ep, tiny_engine.tokenizer).ok
