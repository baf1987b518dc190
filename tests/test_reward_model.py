"""A reward model as a reward source: a tiny `AutoModelForSequenceClassification` built here
scores deterministically and equals a plain forward of each text alone; a causal LM's
probability of "Yes" equals a plain softmax; the `reward.reward_model` setting reaches the
score; and the seeds' `Role.RewardModel` runs it on a Ray reward-model worker."""
from __future__ import annotations

import copy

import pytest
import torch

from envs import make_env
from workbench.reward import RewardModel, score_batch
from workbench.rollout import Rollout


@pytest.fixture(scope="module")
def classifier_path(tiny_model_path, tmp_path_factory):
    from transformers import AutoConfig, AutoTokenizer, LlamaForSequenceClassification

    config = AutoConfig.from_pretrained(tiny_model_path)
    config.num_labels = 1
    config.architectures = ["LlamaForSequenceClassification"]
    torch.manual_seed(0)
    model = LlamaForSequenceClassification(config)
    with torch.no_grad():
        model.score.weight.normal_(0, 1.0)  # a head whose scores differ visibly between texts
    path = tmp_path_factory.mktemp("rm")
    model.save_pretrained(path)
    AutoTokenizer.from_pretrained(tiny_model_path).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def episodes(tiny_engine):
    envs = [make_env("guess_number") for _ in range(5)]
    return Rollout(tiny_engine, envs, seeds=[1, 2, 3, 4, 5], max_turns=3, max_tokens=6, seed=1).run()


def _plain(model, tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    with torch.no_grad():
        return model(torch.tensor([ids])).logits[0]  # one text, no padding


def test_a_classifier_reward_model_equals_a_plain_forward_of_each_text(classifier_path, episodes):
    rm = RewardModel.from_path(str(classifier_path), dtype="float32", device="cpu", batch_size=2)
    assert rm.kind == "classifier"
    judgments = rm.judge(episodes.episodes)
    lengths = {len(rm.tokenizer(rm.text(ep), add_special_tokens=False)["input_ids"]) for ep in episodes}
    assert len(lengths) > 1  # padded batches really happen
    for ep, j in zip(episodes, judgments):
        expected = float(_plain(rm.model, rm.tokenizer, rm.text(ep))[0])
        assert j.error is None and j.source == "reward_model"
        assert j.score == pytest.approx(expected, abs=1e-5)  # fp32
        assert j.prompt == rm.text(ep) and j.prompt_tokens > 0
    assert len({round(j.score, 4) for j in judgments}) > 1
    assert [j.score for j in rm.judge(episodes.episodes)] == [j.score for j in judgments]  # deterministic
    short = RewardModel.from_path(str(classifier_path), dtype="float32", device="cpu", max_tokens=5)
    assert all("more than reward.reward_model_max_tokens=5" in j.error for j in short.judge(episodes.episodes))


def test_a_causal_lm_scores_by_its_probability_of_yes(tiny_model_path, episodes):
    rm = RewardModel.from_path(str(tiny_model_path), dtype="float32", device="cpu", batch_size=3)
    assert rm.kind == "yes_token"
    yes = rm.tokenizer("Yes", add_special_tokens=False)["input_ids"][0]
    for ep, j in zip(episodes, rm.judge(episodes.episodes)):
        expected = float(torch.softmax(_plain(rm.model, rm.tokenizer, rm.text(ep))[-1], dim=-1)[yes])
        assert j.score == pytest.approx(expected, rel=1e-4, abs=1e-7)
        assert "Did the assistant do the task well? Answer Yes or no." in j.prompt


def test_the_reward_model_setting_reaches_the_score(classifier_path, episodes):
    from workbench import ConfigStore

    c = ConfigStore()
    c.reward.reward_model, c.reward.env_weight, c.reward.reward_model_weight = str(classifier_path), 0.0, 2.0
    c.reward.judge_dtype = "float32"
    batch = copy.deepcopy(episodes)
    score_batch(batch, reward=c.validate().reward)
    rm = RewardModel.from_path(str(classifier_path), dtype="float32", device="cpu")
    for b, ep in enumerate(batch):
        expected = 2.0 * float(_plain(rm.model, rm.tokenizer, rm.text(ep))[0])
        assert ep.score == pytest.approx(expected, abs=1e-4)
        assert sum(batch.token_values(b, "token_level_scores")) == pytest.approx(expected, abs=1e-4)
        assert ep.judgments[0]["model"] == str(classifier_path)


def test_verl_role_reward_model_needs_the_reward_model_and_takes_it(tiny_model_path, classifier_path, tmp_path):
    from tests.test_trainer import tiny_config
    from workbench.compat.verl_compat import RayPPOTrainer, ResourcePoolManager, Role
    from workbench.compat.verl_config import from_verl

    pools = ResourcePoolManager({"a": [2]}, {Role.ActorRollout: "a", Role.RewardModel: "a"})
    mapping = {Role.ActorRollout: object, Role.RewardModel: object}
    with pytest.raises(ValueError, match="Role.RewardModel needs the reward model: set reward.reward_model"):
        RayPPOTrainer(tiny_config(tiny_model_path, tmp_path), role_worker_mapping=mapping,
                      resource_pool_manager=pools)
    assert from_verl({"reward_model": {"model": {"path": str(classifier_path)}}}).reward.reward_model == \
        str(classifier_path)
    config = tiny_config(tiny_model_path, tmp_path)
    config.reward.reward_model, config.reward.judge_dtype = str(classifier_path), "float32"
    trainer = RayPPOTrainer(config, role_worker_mapping=mapping, resource_pool_manager=pools)
    try:
        batch = trainer.score(trainer.rollout())
        assert all(ep.judgments and ep.judgments[0]["source"] == "reward_model" for ep in batch)
    finally:
        trainer.cleanup()


@pytest.mark.ray
def test_on_ray_the_reward_model_scores_on_its_worker_as_it_does_here(ray_cluster, tiny_model_path,
                                                                     classifier_path, tmp_path):
    from tests.test_trainer import tiny_config
    from workbench import Trainer
    from workbench.distributed.reward_workers import RewardModelWorkerGroup

    config = tiny_config(tiny_model_path, tmp_path)
    config.reward.reward_model, config.reward.judge_dtype = str(classifier_path), "float32"
    config.ray.use_ray, config.ray.num_actors, config.ray.num_learners = True, 1, 1
    trainer = Trainer(config, environment=make_env("guess_number"))
    try:
        assert isinstance(trainer.model_rewards.source("reward_model"), RewardModelWorkerGroup)
        metrics = trainer.train_step()
        batch = trainer.last_batch
        here = RewardModel.from_path(str(classifier_path), dtype="float32", device="cpu").judge(batch.episodes)
        assert [ep.judgments[0]["score"] for ep in batch] == pytest.approx([j.score for j in here], abs=1e-5)
        assert metrics["reward/reward_model/score_mean"] == pytest.approx(
            sum(j.score for j in here) / len(here), abs=1e-5)
    finally:
        trainer.cleanup()
