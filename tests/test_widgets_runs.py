"""Every widget takes a reopened run (`workbench.debug.load_run`) where it takes a batch,
built without a kernel from the folder of a real fit of the tiny model; what they render
is compared with the same widget built on the batch the trainer held in memory."""
from __future__ import annotations

import re

import pytest

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.debug import load_run
from workbench.widgets import (
    ConversationView, RewardTuner, TokenView, TrainingDashboard, TrajectoryTable, render_episode_html,
)
from workbench.widgets._groups import group_line_html
from workbench.widgets._html import esc


@pytest.fixture(scope="module")
def fitted(tiny_model_path, tmp_path_factory):
    """(run, trainer, {step: in-memory batch}) after 2 GRPO steps with a KL loss."""
    tmp = tmp_path_factory.mktemp("widget_run")
    trainer = Trainer(tiny_config(tiny_model_path, tmp, use_kl_loss=True), environment=make_env("guess_number"))
    kept: dict = {}
    trainer.fit(steps=2, callbacks=[lambda tr, m: kept.__setitem__(m["step"], tr.last_batch)])
    return load_run(tmp / "ckpt"), trainer, kept


def test_conversation_view_shows_the_runs_last_or_chosen_step(fitted):
    run, _, kept = fitted
    view = ConversationView(run)
    assert len(view.episodes) == len(kept[1])
    for i, ep in enumerate(kept[1]):
        view.index = i
        assert view.html == render_episode_html(ep, group=group_line_html(kept[1], i))  # + its group's numbers
        assert esc(ep.messages[1]["content"]) in view.html  # the game's opening, as it was played
        assert esc(ep.turns[0].action.strip()[:20]) in re.sub(r"<mark[^>]*>|</mark>", "", view.html)
    old = ConversationView(run, step=0)
    assert old.html == render_episode_html(kept[0][0], group=group_line_html(kept[0], 0))
    old.set_batch(run, step=1, index=2)
    assert old.html == render_episode_html(kept[1][2], group=group_line_html(kept[1], 2))


def test_token_view_of_a_run_decodes_with_the_runs_tokenizer(fitted, tiny_model_and_tokenizer):
    run, _, kept = fitted
    tokenizer = tiny_model_and_tokenizer[1]
    view = TokenView(run, step=0, field="kl")  # no tokenizer given: the run's model's
    assert view.fields == TokenView(kept[0], tokenizer).fields and "kl" in view.fields
    assert view.values() == kept[0].token_values(0, "kl")
    assert view.html == TokenView(kept[0], tokenizer, field="kl").html
    assert "⟨" not in view.html  # decoded text, not bare ids
    first_token = esc(tokenizer.decode(kept[0][0].token_ids[:1]))
    assert first_token in view.html
    assert TokenView(run).values() == kept[1].token_values(0, "advantages")  # default: the last step


def test_trajectory_table_and_reward_tuner_of_a_run(fitted):
    run, trainer, kept = fitted
    table, in_memory = TrajectoryTable(run), TrajectoryTable(kept[1])
    assert table.df.equals(in_memory.df) and table.html == in_memory.html
    labels = [label for label, _ in table._list.options]
    for ep, label in zip(kept[1], labels):  # each row's first action, as the trainer saw it
        assert ep.actions[0][:40].replace("\n", " ") in label
    assert f"<td>{kept[1][0].env_seed}</td>" in table.html
    assert TrajectoryTable(run, step=0).df.equals(TrajectoryTable(kept[0]).df)

    tuner = RewardTuner(run, step=0)  # the run's own reward weights and estimator
    assert tuner.adv_estimator == trainer.config.training.adv_estimator
    expected = RewardTuner(kept[0], config=trainer.config)
    assert tuner.weights == expected.weights
    assert tuner.table.equals(expected.table)
    assert list(tuner.table["score_before"]) == [ep.score for ep in kept[0]]


def test_dashboard_of_a_run_draws_its_metrics(fitted):
    run, trainer, _ = fitted
    dash = TrainingDashboard(run)
    assert dash.steps == 2
    assert dash.series("reward/mean") == ([0, 1], pytest.approx([m["reward/mean"] for m in trainer.metrics_history]))
    assert dash.series("kl/mean")[1] == pytest.approx([m["kl/mean"] for m in trainer.metrics_history])


def test_step_without_a_run_is_a_type_error(fitted):
    _, _, kept = fitted
    with pytest.raises(TypeError, match="step=0 picks a saved step of a Run"):
        ConversationView(kept[0], step=0)
