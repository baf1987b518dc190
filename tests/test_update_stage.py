"""`workbench.training.update` in one process reproduces `Trainer.update` exactly.

Two trainers start from the same weights; one runs `Trainer.update`, the other the stage
functions (`plan_update`, `update_actor`, `update_critic`) on a copy of the same batch.
Weights, metrics and the batch fields the update writes must match bit for bit. The
plan/split helpers the learner group uses are checked against plain recomputation.
"""
from __future__ import annotations

import copy

import pytest
import torch

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.training.update import (
    lengths_of, plan_update, shard_plan, split_groups, update_actor, update_critic,
)

# numbers compared under dtype "auto": make test runs this file in both dtypes (WORKBENCH_AUTO_DTYPE)
pytestmark = pytest.mark.numerics

CASES = {
    # GRPO, LoRA, two epochs of two mini-batches (the randperm matters), token-mean.
    "grpo-token-mean": dict(ppo_epochs=2, mini_batch_size=2),
    # GRPO with every sequence weighing the same, entropy bonus and a KL loss.
    "grpo-seq-mean": dict(loss_agg_mode="seq-mean-token-mean", entropy_coeff=0.01, use_kl_loss=True),
    # PPO with the critic.
    "ppo-gae": dict(adv_estimator="gae", ppo_epochs=2),
}


def _batch(trainer: Trainer):
    batch = trainer.rollout()
    trainer.score(batch)
    return trainer.compute_advantages(batch)


@pytest.mark.parametrize("case", list(CASES))
def test_update_functions_equal_trainer_update(tiny_model_path, tmp_path, case):
    config = tiny_config(tiny_model_path, tmp_path, batch_size=8, group_size=2, **CASES[case])
    env = make_env("guess_number")
    ref, mine = Trainer(config, environment=env), Trainer(copy.deepcopy(config), environment=env)
    mine.policy.load_trainable_state_dict(ref.policy.trainable_state_dict())
    if ref.critic is not None:
        mine.critic.load_state_dict(ref.critic.state_dict())
    batch = _batch(ref)
    assert len(set(lengths_of(batch))) > 1, "want a ragged batch"
    theirs = copy.deepcopy(batch)
    expected = ref.update(batch)

    t = mine.config.training
    plan = plan_update(theirs, t, mine.global_step)
    got = update_actor(mine.policy.model, mine.optimizer, theirs, t, plan)
    if mine.critic is not None:
        got.update(update_critic(mine.critic, mine.critic_optimizer, theirs, t, plan))

    expected.pop("perf/update_seconds")
    assert got == expected
    assert expected["actor/grad_norm"] > 0
    for name, w in ref.policy.trainable_state_dict().items():
        assert torch.equal(w, mine.policy.trainable_state_dict()[name]), name
    if ref.critic is not None:
        for name, w in ref.critic.trainable_state_dict().items():
            assert torch.equal(w, mine.critic.trainable_state_dict()[name]), name
    for field in ("new_logprobs", "ratio", "entropy", "old_logprobs"):
        assert torch.equal(getattr(batch, field), getattr(theirs, field)), field


def test_split_keeps_groups_and_shard_plan_keeps_global_counts(tiny_model_path, tmp_path):
    config = tiny_config(tiny_model_path, tmp_path, batch_size=8, group_size=2, ppo_epochs=2, mini_batch_size=4)
    trainer = Trainer(config, environment=make_env("guess_number"))
    batch = _batch(trainer)
    t = config.training
    shards = split_groups(batch, 3)
    groups = batch.group_ids
    assert sorted(i for s in shards for i in s) == list(range(len(batch)))
    for s in shards:  # whole groups only
        assert all(groups.count(groups[i]) == sum(groups[j] == groups[i] for j in s) for i in s)
    plan = plan_update(batch, t, step=0)
    # The randperm of the trainer: seed * 1_000_033 + step, one permutation per epoch.
    gen = torch.Generator().manual_seed(t.seed * 1_000_033)
    perms = [torch.randperm(len(batch), generator=gen).tolist() for _ in range(t.ppo_epochs)]
    assert [m.rows for m in plan.mini_batches] == [p[s:s + 4] for p in perms for s in (0, 4)]
    for m in plan.mini_batches:
        assert m.tokens == float(batch.loss_mask[m.rows].sum())
        assert m.sequences == 4
    local = shard_plan(plan, batch, shards, t)
    for k, m in enumerate(plan.mini_batches):
        back = sorted(shards[r][i] for r in range(3) for i in local[r].mini_batches[k].rows)
        assert back == sorted(m.rows)
        steps = {p.mini_batches[k].micro_steps for p in local}
        assert len(steps) == 1 and steps.pop() >= max(
            -(-len(p.mini_batches[k].rows) // t.micro_batch_size) for p in local)
        assert all(p.mini_batches[k].tokens == m.tokens and p.mini_batches[k].sequences == 4 for p in local)
    with pytest.raises(ValueError, match="groups cannot be split"):
        split_groups(batch, 5)


def test_learner_group_without_ray_says_how_to_install(tiny_model_path, tmp_path, monkeypatch):
    import sys

    import re

    from workbench.distributed import LearnerGroup
    from workbench.distributed.rollout_workers import RAY_INSTALL_COMMAND

    monkeypatch.setitem(sys.modules, "ray", None)  # `import ray` raises ImportError
    with pytest.raises(ImportError, match=r"Ray learners \(ray.num_learners\) need Ray.*" + re.escape(RAY_INSTALL_COMMAND)):
        LearnerGroup(tiny_config(tiny_model_path, tmp_path), 2)
