"""Forking in the notebook, without a kernel: ConversationView's "continue from here" and
PlayWidget starting from a recorded turn. Episodes are the tiny model's guess_number games."""
from __future__ import annotations

import re

import pytest

from envs import make_env
from workbench import ConfigStore
from workbench.debug import ReplayMismatch
from workbench.rollout import Rollout
from workbench.widgets import ConversationView, PlayWidget
from workbench.widgets.conversation import render_branches_html


@pytest.fixture(scope="module")
def recorded(tiny_engine, tiny_model_path):
    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.inference.max_turns, c.inference.max_tokens = 3, 6
    c.validate()
    rollout = Rollout(tiny_engine, [make_env("guess_number", c.environment) for _ in range(2)], seeds=[4, 5],
                      max_turns=3, max_tokens=6, seed=2)
    rollout.reset()
    rollout.step(human_actions={0: "0"})  # out of range: the game goes on
    batch = rollout.run()
    assert batch[0].num_turns == 3
    return c, batch


def test_conversation_view_forks_a_turn_and_shows_branches_beside_the_original(recorded, tiny_engine):
    config, batch = recorded
    plain = ConversationView(batch)
    assert plain.continue_from(1, "3") is None and "no engine" in plain.fork_status
    view = ConversationView(batch, engine=tiny_engine, config=config)
    assert view._fork_pick.options == (("turn 0", 0), ("turn 1", 1), ("turn 2", 2))
    view._fork_pick.value = 1
    assert view.fork_turn == 1 and view.fork_text == batch[0].turns[1].action  # the box holds the turn's action
    view._fork_box.value = "3"
    view._fork_count.value = 2
    view._fork_go.click()
    branches = view.branches
    assert len(branches) == 2 and view.fork_status.startswith("2 branches from turn 1: returns")
    for b in branches:
        assert b.turns[1].source == "edited" and b.turns[1].action == "3"
        assert b.token_ids[:batch[0].turns[1].token_start] == batch[0].token_ids[:batch[0].turns[1].token_start]
    html = view.branches_html
    assert len(re.findall(r'class="wb-branch[ "]', html)) == 3  # the original and two branches, side by side
    assert "parts at turn 1" in html and "turns 0–0 as in the original" in html
    assert f"return {batch[0].outcome:+.3g}" in html and f"return {branches[0].outcome:+.3g}" in html
    assert "wb-edited" in html and "edited · turn 1" in html
    assert html == render_branches_html(batch[0], branches)
    # Another episode clears the branches; an observation edit at turn 0 works the same way.
    view.show(1)
    assert view.branches is None and view.branches_html == ""
    obs = "Guess the secret number between 1 and 16. You have 3 guesses. Hint: it is 5."
    out = view.continue_from(turn=0, text=obs, edit="observation", n=1)
    assert out[0].states[0] == obs and out[0].forked_from["edit"] == "observation"
    assert "edited first observation" in view.branches_html and "Hint: it is 5." in view.branches_html
    out = view.continue_from(turn=2, text="3 is too high. Guess lower.", edit="observation", n=1)
    assert out[0].turns[1].observation == "3 is too high. Guess lower."
    html = view.branches_html
    assert "environment · edited" in html and "turns 0–0 as in the original" in html
    assert html.count("3 is too high. Guess lower.") == 2  # the summary line and the branch, not the original


def test_conversation_view_reports_a_replay_mismatch(recorded, tiny_engine):
    config, batch = recorded
    view = ConversationView(batch, engine=tiny_engine, config=config,
                            fork_options={"environment": lambda: make_env("guess_number", high=8)})
    assert view.continue_from(turn=1, text="3", n=1) is None
    assert view.fork_status.startswith("fork failed: ReplayMismatch") and "reset" in view.fork_status
    assert "wb-errline" in view.branches_html


def test_play_widget_starts_from_a_recorded_turn(recorded, tiny_engine):
    config, batch = recorded
    original = batch[0]
    play = PlayWidget(make_env("guess_number"), engine=tiny_engine, seed=0, max_turns=3, max_tokens=6)
    shown = play.start_from(original, turn=2, config=config)
    ep = play.episode
    assert play.turn == 2 and not play.done and play.seed == original.env_seed
    assert shown == original.turns[1].observation
    assert ep.token_ids == original.token_ids[:original.turns[2].token_start]
    assert [t.source for t in ep.turns] == ["human", "model"]
    assert "replayed episode 0 up to turn 2" in play.html
    assert play.send("7")
    assert play.episode.turns[2].action == "7" and play.episode.turns[2].source == "human"
    assert play.done  # max_turns 3
    # Without a config: the widget's own environment and limits; a different env is caught.
    other = PlayWidget(make_env("guess_number", high=8), engine=tiny_engine, max_turns=3, max_tokens=6)
    with pytest.raises(ReplayMismatch):
        other.start_from(original, turn=1)
    assert other.turn == 0
