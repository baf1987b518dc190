"""The overlong penalty (`reward.overlong_penalty`, DAPO's soft overlong punishment): values
against a hand-computed case, on real episodes of the tiny model whose replies hit
`inference.max_tokens`, off = unchanged, and the CLI flags reaching it."""
from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import yaml

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.cli import main
from workbench.config import ConfigError, RewardConfig
from workbench.reward import RewardManager, overlong_penalties, overlong_penalty, score_batch


def test_values_against_the_hand_computed_ramp():
    # Lmax = 8, W = 4, f = 2: no penalty up to 8 - 4 = 4 tokens, then -f * (L - 4) / 4, and -f from 8 on
    f = 2.0
    assert [overlong_penalty(L, 8, 4, f) for L in (1, 3, 4, 5, 6, 7, 8, 9)] == \
        [0.0, 0.0, 0.0, -0.5, -1.0, -1.5, -2.0, -2.0]
    assert [overlong_penalty(L, 8, 4, 0.0) for L in (3, 8)] == [0.0, 0.0]  # off


def test_real_episodes_lose_the_ramp_per_reply_on_the_reply_s_last_token(tiny_model_path, tmp_path):
    config = tiny_config(tiny_model_path, tmp_path)
    config.inference.max_tokens = 4  # the tiny random model rarely stops before 4 tokens
    config.inference.max_turns = 2
    trainer = Trainer(config, environment=make_env("guess_number"))
    batch = trainer.rollout()
    plain = [ep.score for ep in trainer.score(batch)]
    plain_tokens = batch.token_level_scores.clone()
    replies = [(ep, t) for ep in batch for t in ep.turns if any(ep.loss_mask[t.token_start:t.token_end])]
    assert any(t.finish_reason == "length" for _, t in replies)  # some replies hit the limit
    shaping = RewardConfig(overlong_penalty=1.0, overlong_buffer=2)
    # W = 2, f = 1, by reply length: at the real limit Lmax = 4 the ramp starts after 2 tokens; scored
    # as if the limit had been 5 or 6, the same replies sit earlier on the ramp
    hand = {4: {1: 0.0, 2: 0.0, 3: -0.5, 4: -1.0}, 5: {1: 0.0, 2: 0.0, 3: 0.0, 4: -0.5}, 6: {n: 0.0 for n in (1, 2, 3, 4)}}
    for limit, table in hand.items():
        score_batch(batch, None, reward=shaping, max_tokens=limit)
        for b, ep in enumerate(batch):
            expected, penalty = plain_tokens[b].clone(), 0.0
            for turn in ep.turns:
                sampled = [i for i in range(turn.token_start, turn.token_end) if ep.loss_mask[i]]
                if sampled:
                    expected[sampled[-1]] += table[len(sampled)]  # on the reply's last sampled token
                    penalty += table[len(sampled)]
            assert torch.equal(batch.token_level_scores[b], expected), limit
            assert ep.score == pytest.approx(plain[b] + penalty)
            assert float(batch.token_level_scores[b].sum()) == pytest.approx(ep.score)  # tokens sum to the score
        if limit == 4:
            assert sum(ep.score for ep in batch) < sum(plain)


def test_with_a_reward_fn_the_penalty_still_applies(tiny_model_path, tmp_path):
    config = tiny_config(tiny_model_path, tmp_path)
    config.inference.max_tokens, config.inference.max_turns = 4, 1
    config.reward.overlong_penalty, config.reward.overlong_buffer = 0.5, 2
    trainer = Trainer(config.validate(), environment=make_env("guess_number"), reward_fn=lambda trajectory: 3.0)
    batch = trainer.score(trainer.rollout())
    for b, ep in enumerate(batch):
        (turn,) = ep.turns
        n = sum(ep.loss_mask[turn.token_start:turn.token_end])
        penalty = {1: 0.0, 2: 0.0, 3: -0.25, 4: -0.5}[n]
        assert ep.score == pytest.approx(3.0 + penalty)
        assert float(batch.token_level_scores[b].sum()) == pytest.approx(ep.score)


def test_off_leaves_scores_and_metrics_unchanged(tiny_model_path, tmp_path):
    config = tiny_config(tiny_model_path, tmp_path)
    config.inference.max_tokens = 4
    trainer = Trainer(config, environment=make_env("guess_number"))
    assert trainer.config.reward.overlong_penalty == 0.0
    batch = trainer.rollout()
    ours = score_batch(batch, None, reward=trainer.config.reward, max_tokens=4).token_level_scores.clone()
    unshaped = score_batch(batch, None, reward=None).token_level_scores  # no reward section at all
    assert torch.equal(ours, unshaped)
    assert overlong_penalties(batch[0], trainer.config.reward, None) == []  # off: the limit is not even needed
    metrics = trainer.train_step()
    assert not any(k.startswith("reward/overlong") for k in metrics)


def test_on_the_step_reports_it_and_settings_are_checked(tiny_model_path, tmp_path):
    config = tiny_config(tiny_model_path, tmp_path)
    config.inference.max_tokens, config.inference.max_turns = 4, 1
    config.reward.overlong_penalty, config.reward.overlong_buffer = 1.0, 2
    trainer = Trainer(config.validate(), environment=make_env("guess_number"))
    metrics = trainer.train_step()
    batch = trainer.last_batch
    hits = [overlong_penalties(ep, config.reward, 4) for ep in batch]
    assert metrics["reward/overlong_penalty_mean"] == pytest.approx(sum(p for h in hits for _, p in h) / len(batch))
    assert metrics["reward/overlong_penalty_mean"] < 0
    assert 0 < metrics["reward/overlong_reply_rate"] <= 1
    with pytest.raises(ValueError, match="pass max_tokens=config.inference.max_tokens"):
        overlong_penalties(batch[0], config.reward, None)
    config.reward.overlong_buffer = 4
    with pytest.raises(ConfigError, match=r"reward.overlong_buffer \(4\) must be < inference.max_tokens \(4\)"):
        config.validate()
    config.reward.overlong_buffer, config.reward.overlong_penalty = 2, -1.0
    with pytest.raises(ConfigError, match=r"reward.overlong_penalty must be between 0 and 1e\+06"):
        config.validate()


def test_the_manager_reads_a_whole_reward_section_and_ignores_the_length_terms():
    # verl export writes the whole `reward` section for RewardManager.from_config
    manager = RewardManager.from_config(dataclasses.asdict(RewardConfig(success_bonus=2.0, overlong_penalty=1.0)))
    assert manager.success_bonus == 2.0


def test_the_cli_flags_reach_the_score(tiny_model_path, tmp_path):
    out = tmp_path / "out"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "1", "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "1", "--eval-episodes", "0", "--save-interval", "0",
                 "--output", str(out), "--reward.overlong_penalty", "0.5", "--reward.overlong_buffer", "2"]) == 0
    used = yaml.safe_load((out / "config.yaml").read_text())["reward"]
    assert used["overlong_penalty"] == 0.5 and used["overlong_buffer"] == 2
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert -0.5 <= row["reward/overlong_penalty_mean"] < 0 and row["reward/overlong_reply_rate"] > 0


def test_the_doctor_s_advice_for_replies_run_to_the_limit_names_the_setting(tiny_model_and_tokenizer):
    from tests.doctor_policies import expert, roll, roll_steps
    from tests.test_doctor_checks import GUESS, check

    tok = tiny_model_and_tokenizer[1]
    looping = roll(tok, "arithmetic", lambda env, ep: "Answer: 12 " * 30, max_tokens=24, difficulty=1)
    f = check("repetition-to-limit", [looping])
    assert f.fired and "reward.overlong_penalty" in f.advice
    e = expert("guess_number")
    babble = lambda env, ep: "I am thinking very hard about which number to choose here " * 3  # noqa: E731
    f = check("truncation-surge", roll_steps(tok, "guess_number", [e, e, babble], max_tokens=16, **GUESS))
    assert f.fired and "reward.overlong_penalty" in f.advice


def test_export_verl_says_which_remedies_it_does_not_carry(tmp_path):
    from workbench.config import ConfigStore

    config = ConfigStore()
    config.training.dynamic_sampling, config.training.dynamic_sampling_max_batches = True, 2
    config.reward.overlong_penalty, config.reward.overlong_buffer = 0.5, 8
    config.save(tmp_path / "run.yaml")
    out = tmp_path / "verl"
    assert main(["export-verl", "--config", str(tmp_path / "run.yaml"), "--out", str(out), "--val-size", "1"]) == 0
    readme = " ".join((out / "README.md").read_text().split())
    assert "`training.dynamic_sampling` is not exported" in readme and "(which counts the step's own batch: 3" in readme
    assert "`reward.overlong_penalty` is not exported" in readme and "`len` = 8, `penalty_factor` = 0.5" in readme
    assert "'overlong_penalty': 0.5" in (out / "guess_number_verl.py").read_text()  # the section, as written


def test_a_checkpoint_of_a_run_scored_by_a_manager_keeps_the_penalty_settings(tiny_model_path, tmp_path):
    config = tiny_config(tiny_model_path, tmp_path)
    config.reward.overlong_penalty, config.reward.overlong_buffer = 0.5, 3
    env = make_env("guess_number")
    trainer = Trainer(config.validate(), environment=env, reward_fn=RewardManager(env, success_bonus=1.5))
    path = trainer.save_checkpoint(tmp_path / "ckpt" / "step_000000")
    saved = yaml.safe_load((path / "config.yaml").read_text())["reward"]
    assert saved["success_bonus"] == 1.5  # the weights the run scored with
    assert saved["overlong_penalty"] == 0.5 and saved["overlong_buffer"] == 3
