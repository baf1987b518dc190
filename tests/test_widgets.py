"""Notebook widgets, driven without a kernel or browser: state after each action.

Batches are real: the tiny model rolls out guess_number through the Trainer (GRPO
with a KL loss, one update first so policy != reference and the KL is non-zero;
PPO/GAE on the same episodes), or scripted players type actions through a
`Rollout` (deterministic outcomes for the reward tuner).
"""
from __future__ import annotations

import re
import time
from pathlib import Path

import pandas as pd
import pytest
import torch

from envs import get_expert, make_env
from workbench import ConfigStore
from workbench.reward import RewardManager
from workbench.rollout import Rollout
from workbench.trajectory import TrajectoryBatch
from workbench.widgets import (
    ConversationView, PlayWidget, RewardTuner, TokenizerOnlyEngine, TokenView, TrainingDashboard,
    TrajectoryTable, available_fields, history_series, render_episode_html,
)

BG_RE = re.compile(r'class="wb-tok"[^>]*style="background:(rgb\(\d+,\d+,\d+\))')
TITLE_RE = re.compile(r'class="wb-tok(?: wb-untrained)?" style="[^"]*" title="([^"]*)"')


def tiny_config(path: Path, tmp_path: Path, **training) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(path)
    c.model.lora_rank = 4
    c.inference.max_tokens = 6
    c.inference.max_turns = 2
    c.training.batch_size = 4
    c.training.group_size = 2
    c.training.micro_batch_size = 4
    c.training.learning_rate = 5e-3
    c.checkpoint.output_dir = str(tmp_path / "ckpt")
    c.checkpoint.save_interval = 0
    c.checkpoint.resume = False
    for k, v in training.items():
        setattr(c.training, k, v)
    return c.validate()


@pytest.fixture(scope="module")
def trained(tiny_model_path, tmp_path_factory):
    """(trainer, dashboard, GRPO batch with every field, PPO batch on the same episodes)."""
    from workbench.training import Trainer

    tmp = tmp_path_factory.mktemp("widgets")
    grpo = Trainer(tiny_config(tiny_model_path, tmp, use_kl_loss=True), environment=make_env("guess_number"))
    dash = TrainingDashboard(min_interval=0.0)
    grpo.fit(num_epochs=1, num_iters_per_epoch=1, callbacks=[dash.callback])  # policy moves off the reference
    batch = grpo.rollout()
    grpo.score(batch)
    grpo.compute_advantages(batch)
    grpo.update(batch)
    path = batch.save(tmp / "grpo.jsonl")
    ppo_batch = TrajectoryBatch.load(path)
    for name in list(ppo_batch.tensors):
        if name not in ("input_ids", "attention_mask", "loss_mask", "rollout_logprobs"):
            del ppo_batch.tensors[name]
    ppo = Trainer(tiny_config(tiny_model_path, tmp, adv_estimator="gae", use_kl_in_reward=True),
                  environment=make_env("guess_number"))
    ppo.policy.load_trainable_state_dict(grpo.policy.trainable_state_dict())
    ppo.score(ppo_batch)
    ppo.compute_advantages(ppo_batch)
    return grpo, dash, batch, ppo_batch


def scripted_batch(tokenizer, plays: list[tuple[int, str]], max_turns: int = 6) -> TrajectoryBatch:
    """Episodes of guess_number played by scripted players through a Rollout (human turns).

    Players: "expert" (binary search), "linear" (1, 2, 3, ...), "sloppy" (an invalid
    reply first, then binary search).
    """
    envs = [make_env("guess_number") for _ in plays]
    rollout = Rollout(TokenizerOnlyEngine(tokenizer), envs, seeds=[s for s, _ in plays], max_turns=max_turns)
    rollout.reset()
    expert = get_expert("guess_number")
    while rollout.live:
        actions = {}
        for i in rollout.live:
            kind, k = plays[i][1], rollout.slots[i].episode.num_turns
            env = rollout.slots[i].env
            if kind == "linear":
                actions[i] = str(k + 1)
            elif kind == "sloppy" and k == 0:
                actions[i] = "hmm, let me think"
            else:
                actions[i] = expert(env)
        rollout.step(human_actions=actions)
    return rollout.batch


@pytest.fixture(scope="module")
def tokenizer(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


# -- ConversationView ----------------------------------------------------------------------


def test_conversation_view_shows_turns_rewards_and_steps_through_batch(trained, tokenizer):
    _, _, batch, _ = trained
    view = ConversationView(batch)
    assert view.index == 0 and "wb-conversation" in view._dom_classes
    ep = batch[0]
    html = view.html
    assert html.count("wb-msg wb-assistant") == ep.num_turns
    for turn in ep.turns:
        assert f"turn {turn.index}" in html
        assert f"reward {turn.reward:+.3g}" in html
        assert render_episode_html(ep, style=False).split(">", 1)[1][:40] in html  # same renderer
    view._next.click()
    assert view.index == 1 and view._pick.value == 1
    assert f"<b>episode {batch[1].episode_id}</b>" in view.html
    view._pick.value = 3
    assert view.index == 3 and view._next.disabled and not view._prev.disabled
    view._prev.click()
    assert view.index == 2
    assert repr(view) == f"ConversationView(episode 2/{len(batch)}, turns={batch[2].num_turns})"


def test_conversation_view_marks_human_turns_tool_calls_and_errors(tokenizer):
    class Exploding(type(make_env("guess_number"))):
        def step(self, action):
            if "boom" in action:
                raise RuntimeError("kaboom")
            return super().step(action)

    envs = [make_env("arithmetic"), Exploding()]
    rollout = Rollout(TokenizerOnlyEngine(tokenizer), envs, seeds=[0, 0], max_turns=4)
    rollout.reset()
    rollout.step(human_actions={0: '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>',
                                1: "8"})
    rollout.step(human_actions={0: "<tool_call>{not json</tool_call>", 1: "boom"})
    batch = rollout.batch
    html = ConversationView(batch).html
    assert "human · turn 0" in html and "not trained on" in html
    assert 'class="wb-toolcall"' in html and "<b>calculator</b>" in html and "← 5" in html
    assert batch[0].turns[1].parse_error and "parse error:" in html
    assert "wb-error" in html
    html1 = ConversationView(batch, index=1).html
    assert batch[1].turns[1].env_error and "environment error" in html1 and "kaboom" in html1


# -- TokenView -----------------------------------------------------------------------------


def test_token_view_colours_by_field_with_values_in_titles(trained, tokenizer):
    _, _, batch, _ = trained
    view = TokenView(batch, tokenizer)
    assert view.fields[:3] == ["advantages", "kl", "rollout_logprobs"]
    assert {"old_logprobs", "ref_logprobs", "ratio", "entropy", "loss_mask"} <= set(view.fields)
    assert "values" not in view.fields  # GRPO: no critic
    assert view.field == "advantages" and "wb-tokens" in view._dom_classes
    ep = batch[0]
    adv_html = view.html
    titles = TITLE_RE.findall(adv_html)
    assert len(titles) == ep.num_tokens
    adv = batch.token_values(0, "advantages")
    first_trained = ep.loss_mask.index(1)
    assert f"advantages={adv[first_trained]:+.4g}" in titles[first_trained].replace("&#x27;", "'")
    assert titles[0].endswith("not trained")
    assert adv_html.count("wb-tok wb-untrained") == ep.num_tokens - ep.response_length

    view._field.value = "kl"  # the dropdown
    assert view.field == "kl"
    kl_html = view.html
    kl = batch.token_values(0, "kl")
    assert any(abs(v) > 0 for v in kl), "policy was updated once, so KL to the reference is not zero"
    kl_titles = TITLE_RE.findall(kl_html)
    assert f"kl={kl[first_trained]:+.4g}" in kl_titles[first_trained]
    assert BG_RE.findall(kl_html) != BG_RE.findall(adv_html)  # colours changed with the field

    view.field = "rollout_logprobs"
    lp = batch.token_values(0, "rollout_logprobs")
    assert "(p=" in TITLE_RE.findall(view.html)[first_trained]
    assert f"rollout_logprobs={lp[first_trained]:+.4g}" in TITLE_RE.findall(view.html)[first_trained]
    with pytest.raises(Exception):
        view.field = "values"
    view.index = 1
    assert view._pick.value == 1 and f"episode {batch[1].episode_id}" in view.html


def test_token_view_offers_only_present_fields_ppo_and_plain(trained, tokenizer):
    _, _, grpo_batch, ppo_batch = trained
    ppo_fields = available_fields(ppo_batch)
    assert {"advantages", "values", "returns", "kl", "old_logprobs"} <= set(ppo_fields)
    assert "ratio" not in ppo_fields and "entropy" not in ppo_fields  # no update on this batch
    view = TokenView(ppo_batch, tokenizer, field="values")
    assert "values=" in view.html
    plain = TrajectoryBatch(grpo_batch.episodes)  # only the collated fields
    view2 = TokenView(plain, tokenizer)
    assert view2.fields == ["rollout_logprobs", "loss_mask"] and view2.field == "rollout_logprobs"


# -- TrainingDashboard ---------------------------------------------------------------------


def test_dashboard_update_adds_points_and_throttles():
    dash = TrainingDashboard(min_interval=0.3)
    dash.update({"step": 0, "reward/mean": 0.5, "reward/std": 0.1, "kl/mean": 0.01})
    assert dash.series("reward/mean") == ([0], [0.5])
    lo, hi = dash.figure.data[dash.trace_index["_band_lo"]], dash.figure.data[dash.trace_index["_band_hi"]]
    assert list(lo.y) == pytest.approx([0.4]) and list(hi.y) == pytest.approx([0.6])
    dash.update({"step": 1, "reward/mean": 0.7, "reward/std": 0.2, "kl/mean": 0.02, "critic/vf_loss": 1.5})
    assert dash.series("reward/mean") == ([0], [0.5])  # within min_interval: recorded, not drawn yet
    assert dash.steps == 2
    time.sleep(0.6)  # the timer draws it without another update
    assert dash.series("reward/mean") == ([0, 1], [0.5, 0.7])
    assert dash.series("critic/vf_loss") == ([1], [1.5])
    assert dash.series("kl/mean")[1] == [0.01, 0.02]
    dash.update({"step": 2, "reward/mean": 0.9, "actor/skipped_reason": "text is ignored"})
    dash.flush()
    assert dash.series("reward/mean")[1] == [0.5, 0.7, 0.9]
    assert "TrainingDashboard(steps=3, last reward/mean=0.9)" == repr(dash)


def test_dashboard_from_saved_history_and_live_fit(trained):
    trainer, live, _, _ = trained
    assert live.steps == len(trainer.metrics_history) == 1
    assert live.series("reward/mean")[1] == pytest.approx([trainer.metrics_history[0]["reward/mean"]])
    assert live.series("actor/entropy")[1] == pytest.approx([trainer.metrics_history[0]["actor/entropy"]])
    history = [{"step": i, "reward/mean": i / 10, "env/success_rate": 0.1 * i, "perf/tokens_per_s": 100 + i}
               for i in range(5)]
    for source in (history, pd.DataFrame(history)):
        dash = TrainingDashboard(source)
        assert dash.series("env/success_rate") == ([0, 1, 2, 3, 4], pytest.approx([0.0, 0.1, 0.2, 0.3, 0.4]))
        assert dash.series("perf/tokens_per_s")[1] == [100, 101, 102, 103, 104]
        assert dash.series("critic/vf_loss") == ([], [])
    assert history_series(history, ["reward/mean"])["reward/mean"][1] == [0.0, 0.1, 0.2, 0.3, 0.4]


# -- PlayWidget ----------------------------------------------------------------------------


def test_play_widget_human_turn_is_recorded_with_mask_zero(tiny_engine):
    play = PlayWidget(make_env("guess_number"), engine=tiny_engine, seed=0, max_tokens=8)
    first = play.observation
    assert first.startswith("Guess the secret number") and first in play.html
    play._text.value = "8"
    play._send_btn.click()
    ep = play.episode
    assert ep.num_turns == 1 and play.turn == 1
    turn = ep.turns[0]
    assert turn.source == "human" and turn.action == "8"
    assert ep.loss_mask[turn.token_start:turn.token_end] == [0] * (turn.token_end - turn.token_start)
    assert ep.response_length == 0
    expected = make_env("guess_number")
    expected.reset(seed=0)
    obs, reward, done, _ = expected.step("8")
    assert play.observation == obs and obs in play.html
    assert play.reward == pytest.approx(reward) and play.done == done
    assert play._text.value == ""
    assert play.batch[0] is ep and play.batch.loss_mask.sum() == 0

    suggestion = play.ask_model()
    assert play._text.value == suggestion and suggestion != ""
    assert play.episode.num_turns == 1  # asking does not play
    play.model_step()
    assert play.episode.turns[1].source == "model" and play.episode.response_length > 0


def test_play_widget_without_model(tokenizer):
    play = PlayWidget("guess_number", tokenizer=tokenizer, seed=3)
    assert play._ask.disabled and play._model_turn.disabled and not play.has_model
    assert play.ask_model() == "" and "no model" in play.html
    while not play.done:
        play.send(get_expert("guess_number")(play.env))
    assert play.episode.success and play._send_btn.disabled
    assert all(t.source == "human" for t in play.episode.turns)
    assert not play.send("4")  # over
    play.reset()
    assert play.turn == 0 and not play.done
    assert "PlayWidget(env=GuessNumberEnv, seed=3, turns=0" in repr(play)


# -- RewardTuner -----------------------------------------------------------------------------


def _expected(batch, **weights):
    rm = RewardManager(**weights)
    scores = [rm(ep) for ep in batch]
    # rank 1 = best; ties share the best rank
    ranks = [1 + sum(o > s for o in scores) for s in scores]
    return scores, ranks


def test_reward_tuner_slider_rescores_and_reranks(tokenizer):
    plays = [(0, "expert"), (0, "linear"), (0, "sloppy"), (1, "expert"), (1, "linear"), (1, "sloppy")]
    batch = scripted_batch(tokenizer, plays)
    tuner = RewardTuner(batch)
    assert set(tuner.sliders) == {"step_reward_weight", "success_bonus", "invalid_action_penalty", "efficiency_bonus"}
    scores, ranks = _expected(batch)
    assert tuner.scores_after == pytest.approx(scores)
    assert list(tuner.table["score_before"]) == pytest.approx([ep.total_reward for ep in batch])

    # outcome-only reward: success counts, the step penalties do not, invalid replies cost 0.5
    tuner.sliders["step_reward_weight"].value = 0.0      # move the sliders one by one
    tuner.sliders["success_bonus"].value = 1.0
    tuner.sliders["invalid_action_penalty"].value = 0.5
    new = dict(step_reward_weight=0.0, success_bonus=1.0, invalid_action_penalty=0.5)
    scores2, ranks2 = _expected(batch, **new)
    assert tuner.weights == {**new, "efficiency_bonus": 0.0}
    assert tuner.scores_after == pytest.approx(scores2)
    assert list(tuner.table["rank_after"]) == ranks2
    before_ranks = _expected(batch)[1]
    assert list(tuner.table["rank_before"]) == before_ranks
    changed = [i for i in range(len(batch)) if ranks2[i] != before_ranks[i]]
    assert changed and sorted(tuner.changed["episode"]) == changed
    assert all(f"<td>{i}</td>" in tuner._table.value for i in changed)
    # GRPO advantages after, by hand: (s - group mean) / (group std + eps), unbiased std
    for i, ep in enumerate(batch):
        group = [scores2[j] for j, e in enumerate(batch) if e.group_id == ep.group_id]
        mean = sum(group) / len(group)
        std = (sum((g - mean) ** 2 for g in group) / (len(group) - 1)) ** 0.5
        assert tuner.table["adv_after"][i] == pytest.approx((scores2[i] - mean) / (std + 1e-6), abs=1e-4)
    assert list(tuner.figure.data[1].x) == pytest.approx(scores2)
    assert all(ep.score is None for ep in batch)  # stored batch untouched until apply()

    tuner.set_reward_fn(lambda ep: -ep.num_turns)  # custom fn from a code cell
    assert tuner.custom and tuner.sliders["success_bonus"].disabled
    assert tuner.scores_after == [-ep.num_turns for ep in batch]
    tuner.set_reward_fn(None)
    tuner.apply()
    assert [ep.score for ep in batch] == pytest.approx(scores2)
    assert "RewardTuner(6 episodes" in repr(tuner)


# -- TrajectoryTable -------------------------------------------------------------------------


def test_trajectory_table_selection_opens_linked_views(trained, tokenizer):
    _, _, batch, _ = trained
    conv, toks = ConversationView(batch), TokenView(batch, tokenizer)
    table = TrajectoryTable(batch, conversation=conv, tokens=toks)
    assert len(table.rows) == len(batch) and "adv_mean" in table.df.columns
    table._list.value = 2  # a click in the list
    assert table.selected == 2 and conv.index == 2 and toks.index == 2
    assert f"<b>episode {batch[2].episode_id}</b>" in conv.html
    assert 'class="wb-selected"' in table.html

    table.sort_by, table.ascending = "reward", False
    rewards = [float(e.score) for e in batch]
    assert list(table.rows["index"]) == sorted(range(len(batch)), key=lambda i: -rewards[i])
    assert table.selected == 2  # re-sorting keeps the selection

    table._filter.value = f"index >= 2"
    assert sorted(table.rows["index"]) == [2, 3] and table.error is None
    table.query = "success == True"
    assert len(table.rows) == sum(e.success for e in batch)
    table.query = "this is not ( a query"
    assert table.error and len(table.rows) == len(batch) and "bad filter" in table._msg.value
    table.query = ""
    table.select(1)
    assert conv.index == 1 and toks.index == 1
    with pytest.raises(IndexError):
        table.select(99)
    assert repr(table).startswith(f"TrajectoryTable({len(batch)}/{len(batch)} episodes")


# -- findings of the "first hour" review: each test fails on the widgets before the fix -------


def test_reward_tuner_efficiency_bonus_uses_the_episodes_environment(tokenizer):
    plays = [(0, "expert"), (0, "linear"), (1, "expert"), (1, "linear")]
    batch = scripted_batch(tokenizer, plays)
    wins = [i for i, ep in enumerate(batch) if ep.success]
    assert wins, "the expert wins"
    tuner = RewardTuner(batch)  # environment from the registry: make_env("guess_number"), 6 guesses
    assert [type(e).__name__ for e in tuner.environments] == [ep.env_name for ep in batch]
    assert [e.max_steps for e in tuner.environments] == [6] * len(batch)
    base = list(tuner.scores_after)
    tuner.set_weights(efficiency_bonus=0.1)
    for i, ep in enumerate(batch):
        unused = 6 - ep.num_turns if ep.success else 0
        assert tuner.scores_after[i] == pytest.approx(base[i] + 0.1 * unused)
    assert any(tuner.scores_after[i] > base[i] + 0.05 for i in wins)  # the bonus is not 0
    assert "step budget max_steps=6" in tuner._note.value

    # the environment the episodes ran with wins over the registry default
    ten = RewardTuner(batch, environment=make_env("guess_number", max_steps=10), weights={"efficiency_bonus": 0.1})
    for i, ep in enumerate(batch):
        unused = 10 - ep.num_turns if ep.success else 0
        assert ten.scores_after[i] == pytest.approx(base[i] + 0.1 * unused)
    factory = RewardTuner(batch, environment=lambda: make_env("guess_number", max_steps=10),
                          weights={"efficiency_bonus": 0.1})
    assert factory.scores_after == pytest.approx(ten.scores_after)
    ten.apply()  # apply() scores with the same environment
    assert [ep.score for ep in batch] == pytest.approx(ten.scores_after)


def test_reward_tuner_histograms_share_bins_and_counts_read_right(tokenizer):
    batch = scripted_batch(tokenizer, [(0, "expert"), (0, "linear"), (0, "sloppy")])
    tuner = RewardTuner(batch, weights={"success_bonus": 5.0})
    fig = tuner.figure
    for before, after, cols in ((0, 1, ("score_before", "score_after")), (2, 3, ("adv_before", "adv_after"))):
        b, a = fig.data[before], fig.data[after]
        assert b.xbins.to_plotly_json() == a.xbins.to_plotly_json()
        assert b.autobinx is False and a.autobinx is False
        values = list(tuner.table[cols[0]]) + list(tuner.table[cols[1]])
        assert b.xbins.start < min(values) and b.xbins.end > max(values)
    # the summary sits below the sliders, not beside them (beside, it covered their readouts)
    assert tuner.children[0] is tuner._controls and tuner.children[1] is tuner._note
    assert all(s in tuner._controls.children for s in tuner.sliders.values())

    one = RewardTuner(batch.select([0]) if hasattr(batch, "select") else TrajectoryBatch([batch[0]]))
    assert "1 episode, 1 group" in one._note.value and "1 episodes" not in one._note.value
    assert repr(one).startswith("RewardTuner(1 episode,")
    assert "3 episodes, 1 group" in tuner._note.value


def _with_advantages(batch, per_episode: list[float], tmp_path: Path) -> TrajectoryBatch:
    """A copy of `batch` (first len(per_episode) episodes) with one advantage per episode and KL 0."""
    batch = TrajectoryBatch.load(batch.select(list(range(len(per_episode)))).save(tmp_path / "copy.jsonl"))
    mask = batch.tensors["loss_mask"].float()
    batch.set("advantages", mask * torch.tensor(per_episode)[:, None])
    batch.set("kl", torch.zeros_like(mask))
    return batch


def test_token_view_scale_is_per_episode_by_default_batch_on_request(trained, tokenizer, tmp_path):
    batch = _with_advantages(trained[2], [0.1, 2.8], tmp_path)
    assert all(ep.response_length for ep in batch)
    view = TokenView(batch, tokenizer, field="advantages")
    assert view.scale == "episode"
    assert "+0.1" in view.html and "-0.1" in view.html and "2.8" not in view.html.split('<div class="wb-tokbox">')[0]
    assert "colour scale: this episode" in view.html
    view._scale.value = "batch"  # the toggle
    assert view.scale == "batch"
    legend = view.html.split('<div class="wb-tokbox">')[0]
    assert "+2.8" in legend and "colour scale: whole batch" in legend
    assert TokenView(batch, tokenizer, scale="batch").html == view.html


def test_token_view_all_zero_field_reads_zero_and_controls_wrap(trained, tokenizer, tmp_path):
    batch = _with_advantages(trained[2], [0.5], tmp_path)
    view = TokenView(batch, tokenizer, field="kl")
    legend = view.html.split('<div class="wb-tokbox">')[0]
    assert "all 0" in legend and "e-08" not in legend and "e-8" not in legend
    controls = view.children[0]
    assert controls.layout.flex_flow == "row wrap"   # narrow column: wrap, not clip
    assert view._field.layout.min_width == "230px" and view._field.style.description_width == "initial"


def test_play_widget_enter_sends(tokenizer):
    play = PlayWidget(make_env("guess_number"), tokenizer=tokenizer, seed=0)
    play._text.value = "8"
    play._text._handle_custom_msg({"event": "submit"}, [])  # what the browser sends on Enter
    assert play.turn == 1 and play.episode.turns[0].action == "8" and play._text.value == ""
    play._text._handle_custom_msg({"event": "something else"}, [])
    assert play.turn == 1


def test_trajectory_table_row_click_selects_episode(trained, tokenizer):
    _, _, batch, _ = trained
    conv, toks = ConversationView(batch), TokenView(batch, tokenizer)
    table = TrajectoryTable(batch, conversation=conv, tokens=toks)
    html = table.html
    assert "wb-clickable" in html
    assert all(f'data-key="{i}"' in html for i in range(len(batch)))
    table._table.set_state({"selected": 3})  # the browser's message for a click on row 3
    assert table.selected == 3 and conv.index == 3 and toks.index == 3 and table._list.value == 3
    table.select(1)  # and the other way: a selection from code reaches the table's state
    assert table._table.selected == 1 and 'class="wb-selected" data-key="1"' in table.html


def test_dashboard_axes_titled_and_kl_sign_explained():
    dash = TrainingDashboard([{"step": 0, "kl/mean": -0.002}, {"step": 1, "kl/mean": 0.001}])
    layout = dash.figure.layout
    assert layout.xaxis.title.text == "step" and layout.xaxis9.title.text == "step"
    assert layout.yaxis.title.text == "score" and layout.yaxis3.title.text == "nats / token"
    titles = [a.text for a in layout.annotations]
    assert "KL to reference (estimate, can be < 0)" in titles
    kl = dash.figure.data[dash.trace_index["kl/mean"]]
    assert "negative" in kl.hovertemplate
    assert "can be negative" in dash._note.value and "k3 (low_var_kl)" in dash._note.value
    assert dash.layout.width == "100%" and "width: 100%" in dash._status.value
