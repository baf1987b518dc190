"""Trainer: stages, reward placement, resume, bad input, gradient accumulation."""
from __future__ import annotations

import math
import shutil
from pathlib import Path

import pytest
import torch

from envs import make_env
from workbench import ConfigStore, RewardError, Trainer, algo
from workbench.training import checkpoint as ckpt

# numbers compared under dtype "auto": make test runs this file in both dtypes (WORKBENCH_AUTO_DTYPE)
pytestmark = pytest.mark.numerics


def tiny_config(tiny_model_path: Path, tmp_path: Path, **training) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.inference.max_tokens = 8
    c.inference.max_turns = 2
    c.training.batch_size = 4
    c.training.group_size = 2
    c.training.micro_batch_size = 2
    c.training.learning_rate = 1e-3
    c.checkpoint.output_dir = str(tmp_path / "ckpt")
    c.checkpoint.save_interval = 0
    for k, v in training.items():
        setattr(c.training, k, v)
    return c.validate()


def trained_weights(trainer: Trainer) -> dict[str, torch.Tensor]:
    return trainer.policy.trainable_state_dict()


def test_stages_fill_fields_and_rewards_sit_on_turn_ends(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"))
    batch = trainer.rollout()
    trainer.score(batch)
    for b, ep in enumerate(batch):
        scores = batch.token_values(b, "token_level_scores")
        for turn in ep.turns:
            last = max(i for i in range(turn.token_start, turn.token_end) if ep.loss_mask[i])
            assert scores[last] == pytest.approx(turn.reward)
        assert sum(scores) == pytest.approx(ep.total_reward)
        assert ep.score == pytest.approx(ep.total_reward)
    trainer.compute_advantages(batch)
    # GRPO by hand: (score - group mean) / (group std + eps), on every policy token.
    scores = [ep.score for ep in batch]
    for b, ep in enumerate(batch):
        group = [s for s, e in zip(scores, batch) if e.group_id == ep.group_id]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((g - mean) ** 2 for g in group) / (len(group) - 1))
        expected = (ep.score - mean) / (std + 1e-6)
        adv = batch.token_values(b, "advantages")
        for i, m in enumerate(ep.loss_mask):
            assert adv[i] == pytest.approx(expected * m, abs=1e-4)
    before = trained_weights(trainer)
    metrics = trainer.update(batch)
    after = trained_weights(trainer)
    assert metrics["actor/skipped_updates"] == 0
    assert any(not torch.equal(before[k], after[k]) for k in before)
    for name in ("new_logprobs", "ratio", "entropy"):
        assert batch.has(name)
    # First PPO epoch: new logprobs equal old ones (same weights), so the ratio is 1 on policy tokens.
    ratio = batch.ratio[batch.loss_mask.bool()]
    assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-4)


def test_reward_fn_outcome_on_last_policy_token(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("grid"),
                      reward_fn=lambda t: 10.0 + len(t.turns))
    batch = trainer.score(trainer.rollout())
    for b, ep in enumerate(batch):
        scores = batch.token_values(b, "token_level_scores")
        last = max(i for i, m in enumerate(ep.loss_mask) if m)
        assert scores[last] == 10.0 + ep.num_turns
        assert sum(scores) == pytest.approx(10.0 + ep.num_turns)


def test_raising_reward_fn_names_the_episode(tiny_model_path, tmp_path):
    def reward(trajectory, environment):
        if trajectory.episode_id == 2:
            raise ValueError("bad trajectory")
        return 1.0

    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"), reward_fn=reward)
    batch = trainer.rollout()
    with pytest.raises(RewardError, match=r"ValueError on episode 2 .*bad trajectory"):
        trainer.score(batch)
    trainer.reward_fn = lambda t: float("nan")
    with pytest.raises(RewardError, match="finite"):
        trainer.score(batch)


def test_non_finite_loss_skips_update_and_keeps_weights(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"))
    batch = trainer.compute_advantages(trainer.score(trainer.rollout()))
    poisoned = batch.advantages.clone()
    poisoned[0, batch.loss_mask[0].bool()] = float("nan")
    batch.set("advantages", poisoned)
    before = trained_weights(trainer)
    metrics = trainer.update(batch)
    after = trained_weights(trainer)
    assert metrics["actor/skipped_updates"] == 1
    assert all(torch.equal(before[k], after[k]) for k in before)


def test_micro_batches_accumulate_to_the_full_batch_gradient(tiny_model_path, tmp_path):
    grads = {}
    batch = None
    for micro in (1, 4):
        config = tiny_config(tiny_model_path, tmp_path, micro_batch_size=micro)
        config.model.dtype = "float32"  # an fp32 comparison (bf16 rounds differently per micro-batch shape)
        trainer = Trainer(config, environment=make_env("guess_number"))
        if batch is None:
            batch = trainer.compute_advantages(trainer.score(trainer.rollout()))
        # Plain SGD with lr 1 turns the weight change into minus the gradient.
        trainer.optimizer = torch.optim.SGD(trainer.policy.trainable_parameters(), lr=1.0)
        trainer.config.training.max_grad_norm = 1e9
        before = trained_weights(trainer)
        trainer.update(batch)
        after = trained_weights(trainer)
        grads[micro] = torch.cat([(before[k] - after[k]).flatten() for k in sorted(before)])
    assert grads[1].abs().max() > 0
    assert torch.allclose(grads[1], grads[4], atol=1e-5, rtol=1e-3)


def test_on_policy_step_reuses_the_update_forward_for_old_logprobs(tiny_model_path, tmp_path):
    """train_step skips the separate old-logprob forward when the update is on-policy; the
    step must match one with the separate forward, and the batch still carries the fields."""
    from workbench import ConfigError

    weights, batches, forwards = {}, {}, {}
    for reuse in (False, True):
        trainer = Trainer(tiny_config(tiny_model_path, tmp_path, reuse_update_logprobs=reuse, use_kl_loss=True),
                          environment=make_env("guess_number"))
        batch = trainer.score(trainer.rollout())
        calls = []
        hook = trainer.policy.model.register_forward_pre_hook(lambda *a: calls.append(1))
        trainer.compute_advantages(batch, old_logprobs=not reuse)
        hook.remove()
        forwards[reuse] = len(calls)
        assert batch.has("old_logprobs") is not reuse and batch.has("kl") is not reuse
        trainer.update(batch)
        for name in ("old_logprobs", "ratio", "kl"):
            assert batch.has(name)
        ratio = batch.ratio[batch.loss_mask.bool()]
        if reuse:
            assert torch.equal(ratio, torch.ones_like(ratio))  # the same forward, detached
        assert torch.allclose(ratio, torch.ones_like(ratio), atol=1e-5)
        weights[reuse], batches[reuse] = trained_weights(trainer), batch
    # With the KL loss the reference pass runs either way; the policy pass only without reuse.
    assert forwards[True] > 0 and forwards[False] == 2 * forwards[True], forwards
    m = batches[True].loss_mask.bool()
    assert torch.equal(batches[True].input_ids, batches[False].input_ids)  # same rollout
    assert torch.allclose(batches[True].old_logprobs[m], batches[False].old_logprobs[m], atol=1e-5)
    assert torch.allclose(batches[True].kl[m], batches[False].kl[m], atol=1e-5)
    for k in weights[True]:
        assert torch.allclose(weights[True][k], weights[False][k], atol=1e-6), k
    off_policy = Trainer(tiny_config(tiny_model_path, tmp_path, ppo_epochs=2), environment=make_env("guess_number"))
    with pytest.raises(ConfigError, match="on-policy"):
        off_policy.compute_advantages(off_policy.score(off_policy.rollout()), old_logprobs=False)


#: Process-wide gauges, not properties of a run: `rollout/stuck_threads` counts timed-out
#: calls still running anywhere in the process (an earlier test's hung environment too).
PROCESS_GAUGES = {"rollout/stuck_threads"}


#: Metrics of the sampling engine's own logprobs: the engine times its decode modes (threads,
#: packed products) and the mode it picks rounds differently, so these agree to fp32 rounding only.
ENGINE_ROUNDED = ("actor/rollout_logprob_diff",)


def _comparable(history):
    return [{k: v for k, v in m.items() if not k.startswith("perf/") and k not in PROCESS_GAUGES
             and k not in ENGINE_ROUNDED} for m in history]


def _engine_rounded(history):
    return [[m.get(k) for k in ENGINE_ROUNDED] for m in history]


def test_resume_gives_identical_weights_and_metrics(tiny_model_path, tmp_path):
    env = make_env("guess_number")
    straight = Trainer(tiny_config(tiny_model_path, tmp_path / "a"), environment=env)
    for _ in range(2):
        straight.train_step()
    path = straight.save_checkpoint(tmp_path / "a" / "mid")
    for _ in range(2):
        straight.train_step()

    resumed = Trainer(tiny_config(tiny_model_path, tmp_path / "b"), environment=env)
    resumed.load_checkpoint(path)
    assert resumed.global_step == 2
    for _ in range(2):
        resumed.train_step()
    a, b = trained_weights(straight), trained_weights(resumed)
    assert a.keys() == b.keys()
    assert all(torch.equal(a[k], b[k]) for k in a)
    assert _comparable(straight.metrics_history) == _comparable(resumed.metrics_history)
    for x, y in zip(_engine_rounded(straight.metrics_history), _engine_rounded(resumed.metrics_history)):
        assert x == pytest.approx(y, abs=1e-5)


def test_cut_off_checkpoint_is_detected_and_previous_used(tiny_model_path, tmp_path):
    c = tiny_config(tiny_model_path, tmp_path)
    c.checkpoint.save_interval = 1
    c.checkpoint.keep_last_n = 0
    trainer = Trainer(c, environment=make_env("guess_number"))
    trainer.fit(num_epochs=1, num_iters_per_epoch=2)
    out = Path(c.checkpoint.output_dir)
    assert [p.name for p in ckpt.list_checkpoints(out)] == ["step_000001", "step_000002"]
    # Simulate a write cut off mid-file.
    weights = out / "step_000002" / "policy.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ckpt.CheckpointError, match="does not match its manifest"):
        ckpt.verify_checkpoint(out / "step_000002")
    with pytest.warns(UserWarning, match="skipping corrupt checkpoint"):
        assert ckpt.latest_checkpoint(out).name == "step_000001"
    # A checkpoint that never got its manifest (crash before the rename) is rejected too.
    shutil.copytree(out / "step_000001", out / "step_000003")
    (out / "step_000003" / ckpt.MANIFEST).unlink()
    with pytest.raises(ckpt.CheckpointError, match="cut off"):
        ckpt.read_checkpoint(out / "step_000003")
    fresh = Trainer(c, environment=make_env("guess_number"))
    with pytest.warns(UserWarning):
        fresh.fit(num_epochs=1, num_iters_per_epoch=2)  # resumes from step 1, trains step 2 again
    assert fresh.global_step == 2
    assert len(fresh.metrics_history) == 2


def test_keep_last_n_prunes_old_checkpoints(tiny_model_path, tmp_path):
    c = tiny_config(tiny_model_path, tmp_path)
    c.checkpoint.save_interval = 1
    c.checkpoint.keep_last_n = 2
    Trainer(c, environment=make_env("guess_number")).fit(num_epochs=1, num_iters_per_epoch=3)
    names = [p.name for p in ckpt.list_checkpoints(c.checkpoint.output_dir)]
    assert names == ["step_000002", "step_000003"]


def test_ppo_with_critic_and_kl_in_reward(tiny_model_path, tmp_path):
    c = tiny_config(tiny_model_path, tmp_path, adv_estimator="gae", use_kl_in_reward=True, kl_coef=0.1,
                    adaptive_kl=True, target_kl=0.01)
    trainer = Trainer(c, environment=make_env("grid"))
    metrics = trainer.train_step()
    batch = trainer.last_batch
    for name in ("values", "returns", "ref_logprobs", "kl"):
        assert batch.has(name)
    assert math.isfinite(metrics["critic/vf_loss"])
    # KL penalty subtracted exactly: rewards = scores - coef * kl on policy tokens.
    expected = batch.token_level_scores - 0.1 * algo.kl_penalty(batch.old_logprobs, batch.ref_logprobs, "kl") * batch.loss_mask
    assert torch.allclose(batch.token_level_rewards, expected, atol=1e-6)
    assert metrics["kl/coef"] != 0.1 or batch.meta["kl_value"] == 0  # adaptive controller moved
