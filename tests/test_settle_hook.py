"""`on_truncate`: an episode the workbench cuts (max_steps, max_turns, context) is settled
by its environment, once, and the settled reward lands on its last turn."""
from __future__ import annotations

import pytest

from workbench import BaseEnvironment
from workbench.rollout.rollout import Rollout


class Countdown(BaseEnvironment):
    """Never ends by itself; pays 0.1 per step and, when cut, `0.5 + steps` (so the test
    can tell which step count the settlement saw and that it came once)."""

    calls: list[str]

    def reset(self) -> str:
        self.calls = []
        return "Say anything."

    def step(self, action: str):
        return "again", 0.1, False, {}

    def on_truncate(self, reason: str) -> float:
        self.calls.append(reason)
        return 0.5 + self.step_count


def _run(engine, env, max_turns, actions, max_context_tokens=2048):
    rollout = Rollout(engine, [env], seeds=[0], max_turns=max_turns, max_tokens=4,
                      max_context_tokens=max_context_tokens)
    rollout.reset()
    for a in actions:
        if not rollout.live:
            break
        rollout.step(human_actions={0: a})
    return rollout.batch[0]


def test_max_steps_settles_once_inside_the_environment(tiny_engine):
    env = Countdown({"max_steps": 2})
    ep = _run(tiny_engine, env, max_turns=5, actions=["a", "b", "c"])
    assert ep.truncation_reason == "max_steps"
    assert env.calls == ["max_steps"]  # the rollout's own settle call found it done already
    assert ep.rewards == pytest.approx([0.1, 0.1 + 2.5])
    assert ep.turns[-1].info["settled_reward"] == pytest.approx(2.5)


def test_max_turns_settles_through_the_rollout(tiny_engine):
    env = Countdown({"max_steps": 10})
    ep = _run(tiny_engine, env, max_turns=3, actions=["a", "b", "c", "d"])
    assert ep.truncation_reason == "max_turns"
    assert env.calls == ["max_turns"]
    assert ep.rewards == pytest.approx([0.1, 0.1, 0.1 + 3.5])
    assert ep.total_reward == pytest.approx(3.8)


def test_context_budget_settles_with_reason_context(tiny_engine):
    class Wordy(Countdown):
        def step(self, action: str):
            return "again " * 30, 0.1, False, {}

    env = Wordy({"max_steps": 50})
    rollout = Rollout(tiny_engine, [env], seeds=[0], max_turns=50, max_tokens=4, max_context_tokens=200)
    ep = rollout.run()[0]
    assert ep.truncation_reason == "context"
    assert env.calls == ["context"]
    assert ep.rewards[-1] == pytest.approx(0.1 + 0.5 + len(ep.turns))
    assert ep.num_tokens <= 200


def test_non_finite_settlement_is_a_warning_not_a_crash(tiny_engine):
    class Bad(Countdown):
        def on_truncate(self, reason):
            return float("nan")

    ep = _run(tiny_engine, Bad({"max_steps": 10}), max_turns=1, actions=["a"])
    assert ep.rewards == pytest.approx([0.1])
    assert any("on_truncate('max_turns')" in w and "finite" in w for w in ep.warnings)


def test_textarena_game_cut_by_max_turns_gets_the_games_partial_credit(tiny_engine):
    pytest.importorskip("textarena")
    from workbench import TextArenaEnvironment

    env = TextArenaEnvironment("GuessTheNumber-v0")
    ep = _run(tiny_engine, env, max_turns=1, actions=["[5]"])
    assert ep.truncation_reason == "max_turns"
    target = env.game.state.game_state["game_number"] if hasattr(env.game, "state") else None
    # TextArena's own partial credit: 1 - |guess - target| / (max - min) on 1..20.
    expected = 1 - abs(5 - target) / 19
    assert 0 < expected < 1
    assert ep.total_reward == pytest.approx(expected)
    assert ep.turns[-1].info["settled_reward"] == pytest.approx(expected)
