"""Dynamic sampling (`training.dynamic_sampling`): groups whose rewards are all equal are
dropped and replaced by fresh groups, within a bound, on the tiny model.

`SeedParity` makes a group flat or varied by its seed: even seeds reward every reply 0,
odd seeds reward a checksum of the reply (two sampled replies differ, so their rewards do).
"""
from __future__ import annotations

import json
import math
import warnings
import zlib

import pytest
import torch
import yaml

from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.cli import main
from workbench.config import ConfigError
from workbench.environments.base import BaseEnvironment
from workbench.training.dynamic_sampling import EXTRA_SEED_OFFSET, DynamicSamplingBoundWarning
from workbench.training.run_files import rollout_path
from workbench.training.trainer import ZeroVarianceWarning
from workbench.trajectory import TrajectoryBatch


class SeedParity(BaseEnvironment):
    """One turn. Even seed: reward 0 whatever the reply; odd seed: a checksum of the reply."""

    def reset(self) -> str:
        return f"Say anything (task {self._seed})."

    def step(self, action: str) -> tuple:
        reward = (zlib.crc32(action.encode()) % 997) / 997 if self._seed % 2 else 0.0
        return "done", reward, True, {}


class Flat(BaseEnvironment):
    """One turn, reward 1 whatever the reply: no group ever varies."""

    def reset(self) -> str:
        return "Say anything."

    def step(self, action: str) -> tuple:
        return "done", 1.0, True, {}


def _trainer(tiny_model_path, tmp_path, env, **training) -> Trainer:
    config = tiny_config(tiny_model_path, tmp_path, **training)
    config.inference.max_turns = 1
    return Trainer(config, environment=env)


def _count_rollouts(trainer: Trainer) -> list[int]:
    """Wrap the trainer's real rollout stage to count its calls (episodes per call)."""
    calls, real = [], trainer.stages.rollout

    def counted(*args, **kwargs):
        batch = real(*args, **kwargs)
        calls.append(len(batch))
        return batch

    trainer.stages.rollout = counted
    return calls


def test_flat_groups_are_replaced_by_fresh_varied_ones_and_the_batch_size_is_kept(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, SeedParity(), dynamic_sampling=True,
                       dynamic_sampling_max_batches=3)
    calls = _count_rollouts(trainer)
    with warnings.catch_warnings():
        warnings.simplefilter("error", DynamicSamplingBoundWarning)
        warnings.simplefilter("error", ZeroVarianceWarning)
        metrics = trainer.train_step()
    batch = trainer.last_batch
    # step 0's own groups are seeds 0 (flat) and 1 (varied); round 1 draws two fresh seeds
    # (one group missing, half the groups varied so far): EXTRA_SEED_OFFSET + 0 (flat) and + 1 (varied)
    assert calls == [4, 4]
    assert [ep.env_seed for ep in batch] == [1, 1, EXTRA_SEED_OFFSET + 1, EXTRA_SEED_OFFSET + 1]
    assert len(batch) == 4 and metrics["episodes"] == 4.0 and batch.input_ids.shape[0] == 4
    assert [ep.episode_id for ep in batch] == [0, 1, 2, 3]
    assert metrics["rollout/dynamic_dropped_groups"] == 2.0
    assert metrics["rollout/dynamic_resample_rounds"] == 1.0
    assert metrics["rollout/dynamic_resampled_groups"] == 2.0
    assert metrics["rollout/dynamic_kept_groups"] == 2.0
    assert metrics["rollout/dynamic_zero_variance_rate"] == 0.5
    assert metrics["rollout/dynamic_bound_reached"] == 0.0
    assert metrics["reward/zero_std_group_rate"] == 0.0
    # the trained batch's tensors are its episodes' own rows, and every group moved the policy
    for b, ep in enumerate(batch):
        n = ep.num_tokens
        assert batch.input_ids[b, :n].tolist() == ep.token_ids
        assert float(batch.token_level_scores[b].sum()) == pytest.approx(ep.score)
        assert float(batch.advantages[b].abs().sum()) > 0
    assert metrics.get("actor/skipped_updates", 0.0) == 0.0 and metrics["perf/rollout_seconds"] > 0


def test_rewards_that_never_vary_stop_after_exactly_the_bound_and_say_so(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, Flat(), dynamic_sampling=True, dynamic_sampling_max_batches=2)
    calls = _count_rollouts(trainer)
    with pytest.warns(DynamicSamplingBoundWarning, match=r"step 0: after 2 extra rollout round\(s\) .*, 0 of the 6 "
                                                         r"groups sampled have rewards that vary \(2 needed\): it "
                                                         r"trains on its own batch"):
        with pytest.warns(ZeroVarianceWarning):
            metrics = trainer.train_step()
    assert calls == [4, 4, 4]  # the step's own rollout, then exactly 2 extra rounds of 2 groups
    assert metrics["rollout/dynamic_resample_rounds"] == 2.0
    assert metrics["rollout/dynamic_resampled_groups"] == 4.0
    assert metrics["rollout/dynamic_dropped_groups"] == 6.0
    assert metrics["rollout/dynamic_bound_reached"] == 1.0
    assert metrics["rollout/dynamic_zero_variance_rate"] == 1.0
    batch = trainer.last_batch  # the step's own batch, as without dynamic sampling
    assert [ep.env_seed for ep in batch] == [0, 0, 1, 1] and metrics["episodes"] == 4.0
    # a second step samples other extra seeds than the first (derived from the step and the round)
    calls.clear()
    with pytest.warns(DynamicSamplingBoundWarning, match="step 1"):
        trainer.train_step()
    assert calls == [4, 4, 4]


def test_without_resampling_the_step_trains_on_the_varied_groups_it_has(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, SeedParity(), dynamic_sampling=True,
                       dynamic_sampling_max_batches=0)
    calls = _count_rollouts(trainer)
    with pytest.warns(DynamicSamplingBoundWarning, match=r"1 of the 2 groups sampled have rewards that vary \(2 "
                                                         r"needed\): it trains on their 2 episodes instead of 4"):
        metrics = trainer.train_step()
    assert calls == [4]
    assert [ep.env_seed for ep in trainer.last_batch] == [1, 1] and metrics["episodes"] == 2.0
    assert metrics["rollout/dynamic_bound_reached"] == 1.0 and metrics["rollout/dynamic_dropped_groups"] == 1.0


def test_off_the_step_is_the_plain_pipeline_bit_for_bit(tiny_model_path, tmp_path):
    """With the setting off, `train_step` equals rollout -> score -> advantages -> update by hand
    (the pipeline without the filter): same metrics, same weights, flat groups kept."""
    stepped = _trainer(tiny_model_path, tmp_path / "a", SeedParity())
    assert stepped.config.training.dynamic_sampling is False
    metrics = stepped.train_step()
    by_hand = _trainer(tiny_model_path, tmp_path / "b", SeedParity())
    batch = by_hand.score(by_hand.rollout())
    by_hand.compute_advantages(batch, old_logprobs=not by_hand._reuse_update_logprobs())
    update = by_hand.update(batch)
    assert [ep.env_seed for ep in stepped.last_batch] == [0, 0, 1, 1]  # the flat group stays
    assert not any(k.startswith("rollout/dynamic") for k in metrics)
    for key, value in {**batch.summary(), **update}.items():
        if not key.startswith("perf/"):  # NaN (a success rate SeedParity does not report) equals NaN here
            assert metrics[key] == value or (math.isnan(metrics[key]) and math.isnan(value)), key
    a, b = stepped.policy.trainable_state_dict(), by_hand.policy.trainable_state_dict()
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_stepwise_cells_get_the_same_filter_and_a_warning_when_they_skip_it(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, SeedParity(), dynamic_sampling=True)
    batch = trainer.score(trainer.rollout())
    with pytest.warns(UserWarning, match=r"not filtered: call batch = trainer.filter_groups\(batch\)"):
        trainer.compute_advantages(batch)
    filtered = trainer.filter_groups(trainer.score(trainer.rollout()))
    assert trainer.last_batch is filtered and len(filtered) == 4
    assert filtered.meta["rollout/dynamic_kept_groups"] == 2.0


def test_settings_are_validated_naming_the_field(tiny_model_path, tmp_path):
    with pytest.raises(ConfigError, match=r"training.dynamic_sampling .* group-relative training.adv_estimator"):
        tiny_config(tiny_model_path, tmp_path, dynamic_sampling=True, adv_estimator="gae")
    with pytest.raises(ConfigError, match=r"training.group_size must be >= 2"):
        tiny_config(tiny_model_path, tmp_path, dynamic_sampling=True, group_size=1)
    with pytest.raises(ConfigError, match=r"training.dynamic_sampling_max_batches must be an integer >= 0"):
        tiny_config(tiny_model_path, tmp_path, dynamic_sampling_max_batches=-1)
    tiny_config(tiny_model_path, tmp_path, dynamic_sampling=False, adv_estimator="gae")  # off: no objection


def test_the_cli_flags_reach_the_trainer_and_the_run_saves_the_batch_trained_on(tiny_model_path, tmp_path):
    out = tmp_path / "out"
    env = f"{__name__}:SeedParity"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "1", "--batch-size", "4", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "1", "--eval-episodes", "0", "--save-interval", "0",
                 "--environment.name", env, "--output", str(out),
                 "--training.dynamic_sampling", "true", "--training.dynamic_sampling_max_batches", "1"]) == 0
    used = yaml.safe_load((out / "config.yaml").read_text())["training"]
    assert used["dynamic_sampling"] is True and used["dynamic_sampling_max_batches"] == 1
    (row,) = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert row["rollout/dynamic_resample_rounds"] == 1.0 and row["rollout/dynamic_bound_reached"] == 0.0
    assert row["rollout/dynamic_dropped_groups"] == 2.0 and row["episodes"] == 4.0
    saved = TrajectoryBatch.load(rollout_path(out, 0))
    assert [ep.env_seed for ep in saved] == [1, 1, EXTRA_SEED_OFFSET + 1, EXTRA_SEED_OFFSET + 1]


def test_the_doctor_s_advice_for_flat_groups_names_the_setting(tiny_model_and_tokenizer):
    from tests.doctor_policies import roll
    from tests.test_doctor_checks import GUESS, check

    f = check("zero-variance-groups", [roll(tiny_model_and_tokenizer[1], "guess_number", lambda env, ep: "99",
                                            **GUESS)])
    assert f.fired and "training.dynamic_sampling=true" in f.advice


@pytest.mark.ray
def test_on_ray_the_extra_rounds_run_on_the_rollout_workers_and_match_one_process(ray_cluster, tiny_model_path,
                                                                                   tmp_path):
    pytest.importorskip("ray")
    from tests.test_ray_trainer import _config

    trainers = []
    for use_ray in (False, True):
        config = _config(tiny_model_path, tmp_path, use_ray)
        config.inference.max_turns = 1
        config.training.dynamic_sampling = True
        trainers.append(Trainer(config.validate(), environment=SeedParity()))
    one, dist = trainers
    try:
        m_one, m_dist = one.train_step(), dist.train_step()
        assert [e.token_ids for e in one.last_batch] == [e.token_ids for e in dist.last_batch]
        assert [e.env_seed for e in dist.last_batch] == [1, 1, EXTRA_SEED_OFFSET + 1, EXTRA_SEED_OFFSET + 1]
        for key in m_one:
            if key.startswith("rollout/dynamic"):
                assert m_one[key] == m_dist[key], key
        assert m_dist["rollout/dynamic_resample_rounds"] == 1.0 and m_dist["episodes"] == 4.0
        assert m_dist["actor/pg_loss"] == pytest.approx(m_one["actor/pg_loss"], abs=1e-5)
    finally:
        dist.cleanup()
