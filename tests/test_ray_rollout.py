"""Ray rollout workers against the single-process rollout: same episodes, weight sync, a killed worker.

One small local Ray cluster for the module; the tiny model; 2 workers of 1 torch thread.
"""
from __future__ import annotations

import sys
import time

import pytest
import torch

from envs import make_env
from tests.numerics import FP32_LOGPROB_TOL
from workbench import ConfigStore, Trainer
from workbench.environments.base import BaseEnvironment

pytestmark = pytest.mark.ray
ray = pytest.importorskip("ray")

from workbench.distributed.rollout_workers import (  # noqa: E402
    RAY_INSTALL_COMMAND, RolloutWorkerGroup, group_ranges, require_ray,
)


class SlowCountdownEnv(BaseEnvironment):
    """Ends after 1 + seed % 3 steps, each taking `delay` seconds; reward 1 on the last."""

    def __init__(self, delay: float = 0.0):
        super().__init__()
        self.delay = delay

    def reset(self) -> str:
        self.left = 1 + (self._seed or 0) % 3  # `_seed`: set by reset(seed=...)
        return f"Count down from {self.left}."

    def step(self, action: str):
        time.sleep(self.delay)
        self.left -= 1
        return f"{self.left} left.", float(self.left == 0), self.left == 0, {}


def tiny_config(path, **inference) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(path)
    c.model.lora_rank = 4
    c.model.dtype = "float32"  # the same tokens however episodes split over workers: fp32 (bf16 rounds per batch)
    c.inference.max_tokens = 6
    c.inference.max_turns = 3
    for k, v in inference.items():
        setattr(c.inference, k, v)
    return c.validate()


@pytest.fixture(scope="module")
def trainer(tiny_model_path):
    return Trainer(tiny_config(tiny_model_path), environment=make_env("guess_number"))


@pytest.fixture(scope="module")
def group(ray_cluster, trainer):
    g = RolloutWorkerGroup(trainer.config, num_workers=2, environment=make_env("guess_number"))
    g.sync_weights(trainer.policy, version=0)
    yield g
    g.shutdown()


def assert_same_episodes(batch, reference, logprob_tol=FP32_LOGPROB_TOL):
    """fp32 on both sides (tiny_config), but the workers run other thread counts than this process,
    so their products round otherwise: the same ids, logprobs within the fp32 tolerance."""
    assert len(batch) == len(reference)
    for ep, ref in zip(batch, reference):
        assert (ep.episode_id, ep.group_id, ep.env_seed) == (ref.episode_id, ref.group_id, ref.env_seed)
        assert ep.token_ids == ref.token_ids
        assert ep.loss_mask == ref.loss_mask
        assert ep.turn_index == ref.turn_index
        assert ep.rollout_logprobs == pytest.approx(ref.rollout_logprobs, rel=logprob_tol, abs=logprob_tol)
        assert ep.rewards == ref.rewards and ep.actions == ref.actions and ep.error == ref.error
    assert torch.equal(batch.input_ids, reference.input_ids)
    assert torch.equal(batch.loss_mask, reference.loss_mask)
    assert batch.group_ids == reference.group_ids


def test_group_ranges_contiguous_and_balanced():
    assert group_ranges(5, 2) == [range(0, 3), range(3, 5)]
    assert group_ranges(1, 3) == [range(0, 1)]
    assert [len(r) for r in group_ranges(10, 4)] == [3, 3, 2, 2]


def test_missing_ray_names_install_command(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)  # import ray -> ImportError
    with pytest.raises(ImportError, match="pip install"):
        require_ray()
    assert "ray" in RAY_INSTALL_COMMAND


def test_two_workers_match_single_process_greedy(group, trainer):
    seeds = [11, 12, 13]
    arrivals = {}
    batch = group.run(seeds, group_size=2, temperature=0.0, sampling_seed=0,
                      on_episode=lambda w, i: arrivals.setdefault(i, w))
    reference = trainer.make_rollout(seeds, 2, temperature=0.0, sampling_seed=0).run()
    assert_same_episodes(batch, reference)
    # Groups were split: seeds 11, 12 (episodes 0-3) on worker 0, seed 13 on worker 1.
    assert arrivals == {0: 0, 1: 0, 2: 0, 3: 0, 4: 1, 5: 1}
    assert batch.meta["weight_versions"] == [0] * 6
    assert batch.meta["retried_episodes"] == [] and batch.meta["worker_restarts"] == 0
    assert {k: batch.meta[k] for k in reference.meta} == reference.meta  # fault counters, if any


def test_weight_sync_changes_samples_and_tags_version(group, trainer):
    seeds = [21, 22]
    before = group.run(seeds, group_size=2, temperature=0.0)
    original = trainer.policy.trainable_state_dict()
    gen = torch.Generator().manual_seed(0)
    changed = {k: (torch.randn(v.shape, generator=gen) * 0.5 if "lora_B" in k else v) for k, v in original.items()}
    try:
        trainer.policy.load_trainable_state_dict(changed)
        trainer.engine.sync_weights(trainer.policy.model)
        group.sync_weights(changed, version=7)
        after = group.run(seeds, group_size=2, temperature=0.0)
        reference = trainer.make_rollout(seeds, 2, temperature=0.0, sampling_seed=0).run()
    finally:
        trainer.policy.load_trainable_state_dict(original)
        trainer.engine.sync_weights(trainer.policy.model)
        group.sync_weights(trainer.policy, version=0)
    assert_same_episodes(after, reference)
    assert any(a.token_ids != b.token_ids for a, b in zip(after, before))
    assert after.meta["weight_versions"] == [7] * 4 and before.meta["weight_versions"] == [0] * 4


def test_sampled_async_rollout_does_not_depend_on_the_split(ray_cluster, tiny_model_path):
    config = tiny_config(tiny_model_path, async_rollout=True)
    env = make_env("guess_number")
    single = Trainer(config, environment=env)
    seeds = [31, 32, 33]
    reference = single.make_rollout(seeds, 2, temperature=1.0, sampling_seed=5).run()
    group = RolloutWorkerGroup(config, num_workers=2, environment=env)
    try:
        group.sync_weights(single.policy, version=1)
        batch = group.run(seeds, group_size=2, temperature=1.0, sampling_seed=5)
    finally:
        group.shutdown()
    assert_same_episodes(batch, reference)
    # Within a group the episodes drew different samples (the seeds are per episode).
    assert any(batch[2 * g].token_ids != batch[2 * g + 1].token_ids for g in range(3))


def test_killed_worker_is_replaced_and_only_unfinished_episodes_rerun(ray_cluster, trainer):
    env = SlowCountdownEnv(delay=0.4)
    seeds = [0, 1, 2, 3]  # episode lengths 1, 2, 3, 1 steps; worker 0 runs seeds 0 and 1
    group = RolloutWorkerGroup(trainer.config, num_workers=2, environment=env)
    try:
        group.sync_weights(trainer.policy, version=3)
        victim = group.workers[0]
        seen_before_kill: list[int] = []
        killed = []

        def kill_on_first(worker, index):
            if worker == 0 and not killed:
                seen_before_kill.append(index)
                ray.kill(victim)
                killed.append(index)

        batch = group.run(seeds, group_size=2, temperature=0.0, on_episode=kill_on_first)
        replacement = group.workers[0]
        assert replacement is not victim
        assert ray.get(replacement.load_weights.remote({}, 3)) == 0  # alive and answering
    finally:
        group.shutdown()
    reference = trainer.make_rollout(seeds, 2, temperature=0.0, sampling_seed=0)
    reference.environments = [SlowCountdownEnv() for _ in range(8)]
    reference = reference.run()
    assert [ep.episode_id for ep in batch] == list(range(8))  # each once: none lost, no duplicate
    assert_same_episodes(batch, reference)
    retried = set(batch.meta["retried_episodes"])
    assert killed, "the worker was never killed mid-run"
    print("killed after episode", killed, "retried", sorted(retried))
    # Worker 0 had episodes 0-3; seed 0's episodes (0, 1) end first. The one that arrived
    # before the kill is kept; seed 1's (2, 3) were unfinished and ran again.
    assert {2, 3} <= retried <= {0, 1, 2, 3} - set(seen_before_kill)
    assert batch.meta["worker_restarts"] == 1
    assert batch.meta["weight_versions"] == [3] * 8
    assert [ep.total_reward for ep in batch] == [1.0] * 8
