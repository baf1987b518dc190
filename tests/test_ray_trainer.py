"""`Trainer` with `ray.use_ray=True` (2 rollout workers + 2 FSDP2 learners on CPU, gloo)
against the single-process `Trainer`: same batch, same metrics, same weights; checkpoints
cross between the two; episodes record the weight version they were sampled with."""
from __future__ import annotations

import copy


import pytest
import torch

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.distributed.controller import optimizer_state_by_index, trained_names

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")


def _config(tiny_model_path, tmp_path, use_ray: bool):
    c = tiny_config(tiny_model_path, tmp_path / ("ray" if use_ray else "one"))
    c.inference.async_rollout = True  # per-episode sampling seeds: samples do not depend on the split
    c.ray.use_ray, c.ray.num_actors, c.ray.num_learners = use_ray, 2, 2
    c.model.dtype = "float32"  # bit-equal to one process: an fp32 comparison (bf16 rounds per batch shape)
    return c.validate()


def _weights(trainer):
    return {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}


def _adam(optimizer) -> dict:
    return {"state": {i: {k: v.clone() for k, v in st.items()} for i, st in optimizer.state_dict()["state"].items()}}


def _assert_adam_close(got: dict, want: dict, tol: float = 1e-5) -> None:
    """Same parameters, same step counts, moments within `tol` (max abs)."""
    assert sorted(got["state"]) == sorted(want["state"]) and want["state"]
    for i, st in want["state"].items():
        assert float(got["state"][i]["step"]) == float(st["step"])
        for k in ("exp_avg", "exp_avg_sq"):
            assert float((got["state"][i][k] - st[k]).abs().max()) <= tol, (i, k)


def _length_reward(trajectory) -> float:
    """Differs within a group (the sampled ids differ), so GRPO has a gradient."""
    return float(sum(trajectory.token_ids) % 7)


def test_ray_trainer_equals_one_process_and_checkpoints_cross(ray_cluster, tiny_model_path, tmp_path):
    env = make_env("guess_number")
    one = Trainer(_config(tiny_model_path, tmp_path, False), environment=env, reward_fn=_length_reward)
    dist = Trainer(_config(tiny_model_path, tmp_path, True), environment=env, reward_fn=_length_reward)
    try:
        assert torch.equal(torch.cat([v.flatten() for v in _weights(one).values()]),
                           torch.cat([v.flatten() for v in _weights(dist).values()]))
        w0 = _weights(one)
        m_one, m_dist = one.train_step(), dist.train_step()
        b_one, b_dist = one.last_batch, dist.last_batch
        # Stage 1: the workers' batch is the single-process batch, token for token.
        assert [e.token_ids for e in b_one] == [e.token_ids for e in b_dist]
        assert [e.group_id for e in b_one] == [e.group_id for e in b_dist]
        assert [e.weight_version for e in b_dist] == [0] * len(b_dist)
        assert torch.allclose(b_one.rollout_logprobs, b_dist.rollout_logprobs, atol=1e-5)
        assert b_one.summary()["reward/zero_std_group_rate"] < 1.0  # a real gradient
        # Stage 4: the learners' update is the single-process update.
        for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm", "reward/mean"):
            assert m_dist[k] == pytest.approx(m_one[k], rel=1e-5, abs=1e-5), k
        w_one, w_dist = _weights(one), _weights(dist)
        assert max(float((w_one[k] - w_dist[k]).abs().max()) for k in w_one) < 1e-5
        assert any(not torch.equal(w_one[k], w0[k]) for k in w0)  # the step did move the weights
        # Later steps sample with the pushed weights and say which version.
        dist.train_step()
        assert [e.weight_version for e in dist.last_batch] == [1] * len(dist.last_batch)
        assert dist.global_step == 2
        # A checkpoint of the Ray run loads into the single-process trainer, and back,
        # Adam moments included (the learners' states are gathered before it is written).
        one.train_step()
        adam_one = _adam(one.optimizer)
        path = dist.save_checkpoint(tmp_path / "from_ray")
        one.load_checkpoint(path, force=True)
        assert one.global_step == 2
        _assert_adam_close(_adam(one.optimizer), adam_one)
        w_dist = _weights(dist)
        assert all(torch.equal(w_dist[k], v) for k, v in _weights(one).items())
        one.train_step()  # single process goes on from the Ray run's weights
        path = one.save_checkpoint(tmp_path / "from_one")
        dist.load_checkpoint(path, force=True)
        assert dist.global_step == 3
        assert dist.ray_stages.rollout_workers.version == 3  # pushed to the workers too
        learner = dist.ray_stages.learners.state_dict()["policy"]
        w_one = _weights(one)
        assert all(torch.equal(learner[k], w_one[k]) for k in w_one)
        names = trained_names(one.policy.model)
        on_learners = optimizer_state_by_index(dist.ray_stages.learners.optimizer_state()["optimizer"], names)
        _assert_adam_close(on_learners, _adam(one.optimizer), tol=0.0)  # loaded exactly, 3 steps of moments
        dist.train_step()
        assert [e.weight_version for e in dist.last_batch] == [3] * len(dist.last_batch)
    finally:
        dist.cleanup()
        one.cleanup()


def test_killed_learner_is_named_and_the_run_resumes_from_its_checkpoint(ray_cluster, tiny_model_path, tmp_path):
    from workbench.distributed import LearnerLostError
    from workbench.training import checkpoint as ckpt

    env = make_env("guess_number")
    config = _config(tiny_model_path, tmp_path, True)
    trainer = Trainer(config, environment=env, reward_fn=_length_reward)
    try:
        trainer.train_step()
        saved = trainer.save_checkpoint(tmp_path / "ray" / "ckpt" / ckpt.checkpoint_name(1))
        weights = _weights(trainer)
        ray.kill(trainer.ray_stages.learners.workers[1])
        with pytest.raises(LearnerLostError, match=r"learner rank 1 of 2 died during update.*resume\(\)"):
            trainer.train_step()  # rank 0 would wait in a collective forever without the check
    finally:
        trainer.cleanup()
    assert ckpt.latest_checkpoint(config.checkpoint.output_dir) == saved
    again = Trainer(_config(tiny_model_path, tmp_path, True), environment=env, reward_fn=_length_reward)
    try:
        assert again.resume() == saved and again.global_step == 1
        assert all(torch.equal(weights[k], v) for k, v in _weights(again).items())
        again.train_step()
        assert again.global_step == 2
        assert [e.weight_version for e in again.last_batch] == [1] * len(again.last_batch)
    finally:
        again.cleanup()


def test_sft_steps_on_ray_reach_the_learners_and_workers(ray_cluster, tiny_model_path, tmp_path):
    """An SFT step runs in the controller; its weights and Adam moments must reach the learners
    (the next RL update starts from them) and the rollout workers (the next batch samples them)."""
    env = make_env("guess_number", low=1, high=8, max_steps=2)
    trainers = []
    for use_ray in (False, True):
        c = _config(tiny_model_path, tmp_path, use_ray)
        c.sft.steps, c.sft.episodes, c.sft.learning_rate = 2, 4, 1e-2
        trainers.append(Trainer(c, environment=env, reward_fn=_length_reward))
    one, dist = trainers
    try:
        base = _weights(one)
        for t in trainers:
            t.train_step()  # SFT steps: the second one pulls the moments the first one pushed
            t.train_step()
            assert "sft/nll" in t.metrics_history[-1] and t.global_step == 2
        sft_weights = _weights(dist)
        assert max(float((sft_weights[k] - v).abs().max()) for k, v in _weights(one).items()) < 1e-6
        learner = dist.ray_stages.learners.state_dict()["policy"]
        assert all(torch.equal(learner[k], v) for k, v in sft_weights.items())
        names = trained_names(one.policy.model)
        on_learners = optimizer_state_by_index(dist.ray_stages.learners.optimizer_state()["optimizer"], names)
        _assert_adam_close(on_learners, _adam(one.optimizer))  # the SFT step's moments
        assert dist.ray_stages.rollout_workers.version == 2
        dist.train_step()  # RL: the workers sample with the SFT weights
        batch = dist.last_batch
        assert [e.weight_version for e in batch] == [2] * len(batch)
        sft_lp = one.compute_logprobs(copy.deepcopy(batch)).old_logprobs  # (B, T) under the SFT weights
        one.policy.load_trainable_state_dict(base)
        base_lp = one.compute_logprobs(copy.deepcopy(batch)).old_logprobs  # under the weights before SFT
        mask = batch.loss_mask.bool()
        assert float((batch.rollout_logprobs - sft_lp)[mask].abs().max()) < 1e-4
        assert float((batch.rollout_logprobs - base_lp)[mask].abs().max()) > 1e-2
    finally:
        dist.cleanup()
        one.cleanup()
