"""Reward has one home: the `reward` config section (saved with checkpoints, set from the
CLI), `workbench.reward.score_batch` shared by trainer / CLI / tuner, the tuner's
advantages following the configured estimator, `Episode.outcome`, and seed 000's
`RewardManager(environment)` with a tensor from `compute_batch_rewards`.
"""
from __future__ import annotations

import re
from pathlib import Path

import pytest
import torch
import yaml

from envs import get_expert, make_env
from workbench import ConfigStore, Trainer
from workbench.reward import RewardManager
from workbench.rollout import Rollout
from workbench.trajectory import Episode, TrajectoryBatch, Turn


def _played(tokenizer, plays: list[tuple[int, str]]) -> TrajectoryBatch:
    """guess_number episodes typed by scripted players ("expert" wins, "linear" guesses 1, 2, ...)."""
    from workbench.widgets import TokenizerOnlyEngine

    rollout = Rollout(TokenizerOnlyEngine(tokenizer), [make_env("guess_number") for _ in plays],
                      seeds=[s for s, _ in plays], max_turns=6)
    rollout.reset()
    expert = get_expert("guess_number")
    while rollout.live:
        rollout.step(human_actions={i: expert(rollout.slots[i].env) if plays[i][1] == "expert"
                                    else str(rollout.slots[i].episode.num_turns + 1) for i in rollout.live})
    return rollout.batch


def test_seed_000_reward_manager_takes_the_environment():
    env = make_env("guess_number", max_steps=10)
    manager = RewardManager(env)  # seed 000, section 6
    assert manager.step_reward_weight == 1.0 and manager.environment is env
    seeds = RewardManager(env, success_bonus=5.0, invalid_action_penalty=0.5, efficiency_bonus=0.1)
    won = {"rewards": [0.1, 0.1, 10.0], "infos": [{}, {"invalid_action": True}, {"success": True}], "num_turns": 3}
    lost = {"rewards": [-0.1, -0.1], "infos": [{"invalid_action": True}, {"invalid_action": True}], "num_turns": 2}
    assert seeds.compute_trajectory_reward(won) == pytest.approx(10.2 + 5.0 - 0.5 + 0.1 * (10 - 3))
    rewards = seeds.compute_batch_rewards([won, lost])
    assert isinstance(rewards, torch.Tensor) and rewards.dtype == torch.float32 and rewards.shape == (2,)
    assert rewards.tolist() == pytest.approx([15.4, -0.2 - 1.0])
    assert rewards.mean().item() == pytest.approx((15.4 - 1.2) / 2)  # the seed's print line
    ep = Episode(rewards=[1.0, 2.0], infos=[{}, {"success": True}], success=True,
                 turns=[Turn(index=0), Turn(index=1)])
    assert seeds.compute_trajectory_reward(ep) == pytest.approx(3.0 + 5.0 + 0.1 * 8)
    with pytest.raises(TypeError, match="pass weights by keyword"):
        RewardManager(2.0)


def test_reward_section_round_trips_and_is_set_from_the_cli(tmp_path):
    from workbench.cli import build_config, parse_args

    c = ConfigStore()
    assert (c.reward.step_reward_weight, c.reward.success_bonus, c.reward.max_steps) == (1.0, 0.0, None)
    c.reward.success_bonus, c.reward.max_steps = 5.0, 8
    back = ConfigStore.load(c.save(tmp_path / "c.yaml"))
    assert back.reward.success_bonus == 5.0 and back.reward.max_steps == 8
    args = parse_args(["train", "--reward-param", "success_bonus=5", "--reward-param", "efficiency_bonus=0.1",
                       "--output", str(tmp_path / "run")])
    cfg = build_config(args)
    assert (cfg.reward.success_bonus, cfg.reward.efficiency_bonus) == (5.0, 0.1)
    from workbench.config import ConfigError

    with pytest.raises(ConfigError, match="reward"):
        build_config(parse_args(["rollout", "--reward-param", "bonus=1"]))


def test_trainer_scores_with_the_reward_section_and_saves_it(tiny_model_path, tmp_path):
    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.inference.max_tokens, c.inference.max_turns = 6, 2
    c.training.batch_size, c.training.group_size, c.training.micro_batch_size = 4, 2, 2
    c.checkpoint.output_dir, c.checkpoint.save_interval = str(tmp_path / "ckpt"), 0
    c.reward.invalid_action_penalty, c.reward.step_reward_weight = 0.5, 2.0
    trainer = Trainer(c.validate(), environment=make_env("guess_number"))
    batch = trainer.score(trainer.rollout())
    invalid = [sum(1 for i in ep.infos if i.get("invalid_action")) for ep in batch]
    assert any(invalid), "the tiny model's replies are not numbers: some turns are invalid"
    for b, ep in enumerate(batch):
        assert ep.score == pytest.approx(2.0 * ep.total_reward - 0.5 * invalid[b])
        assert ep.outcome == ep.score
        assert sum(batch.token_values(b, "token_level_scores")) == pytest.approx(ep.score, abs=1e-5)
    saved = yaml.safe_load((trainer.save_checkpoint(tmp_path / "step") / "config.yaml").read_text())
    assert saved["reward"]["invalid_action_penalty"] == 0.5 and saved["reward"]["step_reward_weight"] == 2.0
    # a RewardManager passed as reward_fn is what the checkpoint records
    trainer.reward_fn = RewardManager(success_bonus=3.0)
    saved = yaml.safe_load((trainer.save_checkpoint(tmp_path / "step2") / "config.yaml").read_text())
    assert saved["reward"]["success_bonus"] == 3.0 and saved["reward"]["invalid_action_penalty"] == 0.0
    trainer.cleanup()


def test_tuner_shows_the_configured_estimator_and_applies_the_trainers_scoring(tiny_model_and_tokenizer):
    from workbench.reward import episode_advantages, score_batch
    from workbench.widgets import RewardTuner, rescore_table

    _, tok = tiny_model_and_tokenizer
    batch = _played(tok, [(3, "expert"), (3, "linear"), (3, "linear"), (5, "expert"), (5, "linear"), (5, "expert")])
    config = ConfigStore()
    config.training.adv_estimator = "rloo"
    config.reward.success_bonus = 2.0
    tuner = RewardTuner(batch, config=config)
    assert tuner.weights["success_bonus"] == 2.0
    after = [RewardManager(success_bonus=2.0).compute_trajectory_reward(ep, ep.environment) for ep in batch]
    assert tuner.scores_after == pytest.approx(after)
    groups = [ep.group_id for ep in batch]
    rloo = episode_advantages(after, groups, "rloo")
    grpo = episode_advantages(after, groups, "grpo")
    assert list(tuner.table["adv_after"]) == pytest.approx(rloo)
    assert rloo != pytest.approx(grpo)
    table = rescore_table(batch, RewardManager(), adv_estimator="reinforce_plus_plus")
    assert list(table["adv_before"]) == pytest.approx(
        episode_advantages([ep.outcome for ep in batch], groups, "reinforce_plus_plus"))
    applied = tuner.apply()
    reference = score_batch(_played(tok, [(3, "expert"), (3, "linear"), (3, "linear"), (5, "expert"),
                                          (5, "linear"), (5, "expert")]), RewardManager(success_bonus=2.0))
    assert [ep.score for ep in applied] == pytest.approx([ep.score for ep in reference])
    assert torch.equal(applied.token_level_scores, reference.token_level_scores)


def test_outcome_is_the_only_score_else_env_reward():
    ep = Episode(rewards=[1.0, 0.5])
    assert ep.outcome == 1.5
    ep.score = -2.0
    assert ep.outcome == -2.0
    root = Path(__file__).resolve().parents[1] / "workbench"
    pattern = re.compile(r"score\)? if [\w.]*score is not None else [\w.]*total_reward")
    copies = [f"{p.relative_to(root)}:{n}" for p in root.rglob("*.py")
              for n, line in enumerate(p.read_text().splitlines(), 1) if pattern.search(line)]
    assert copies == ["trajectory.py:" + str(next(
        n for n, line in enumerate((root / "trajectory.py").read_text().splitlines(), 1) if pattern.search(line)))]


def test_seed003_reward_wrapper_calls_reward_fn_as_the_trainer_does():
    """EnvironmentRewardWrapper goes through reward.call_reward_fn: the environment
    argument, errors that name the episode, non-finite values refused."""
    from envs import make_env
    from workbench.reward import RewardError
    from workbench.trajectory import Episode
    from workbench.compat.verl_compat import EnvironmentRewardWrapper

    env = make_env("guess_number")
    ep = Episode(episode_id=7, env_seed=3)
    seen = []
    assert EnvironmentRewardWrapper(env, lambda t, e: seen.append(e) or 1.5)(ep) == 1.5
    assert seen == [env]  # a hand-built episode has no environment copy of its own: the wrapper's
    with pytest.raises(RewardError, match="episode 7"):
        EnvironmentRewardWrapper(env, lambda t: 1 / 0)(ep)
    with pytest.raises(RewardError, match="finite"):
        EnvironmentRewardWrapper(env, lambda t: float("nan"))(ep)
