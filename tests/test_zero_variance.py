"""A group-relative step where every group has identical rewards says so (warning + metric)."""
from __future__ import annotations

import warnings

import pytest

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.training.trainer import ZeroVarianceWarning


def test_all_flat_groups_warn_and_report_rate_one(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"),
                      reward_fn=lambda trajectory: 1.0)
    batch = trainer.score(trainer.rollout())
    with pytest.warns(ZeroVarianceWarning, match="identical rewards"):
        trainer.compute_advantages(batch)
    assert batch.meta["reward/zero_std_group_rate"] == 1.0
    assert batch.meta["reward/groups"] == 2.0
    assert float(batch.advantages.abs().max()) == 0.0


def test_one_group_with_spread_gives_a_rate_below_one_and_no_warning(tiny_model_path, tmp_path):
    # Episodes 0 and 1 form group 0; give them different scores, every other episode 1.0.
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"),
                      reward_fn=lambda trajectory: float(trajectory.episode_id == 0))
    batch = trainer.score(trainer.rollout())
    assert len({e.group_id for e in batch[:2]}) == 1 and batch[2].group_id != batch[0].group_id
    with warnings.catch_warnings():
        warnings.simplefilter("error", ZeroVarianceWarning)
        trainer.compute_advantages(batch)
    assert batch.meta["reward/zero_std_group_rate"] == 0.5
    metrics = batch.summary()
    assert metrics["reward/zero_std_group_rate"] == 0.5
    assert float(batch.advantages[0].abs().max()) > 0
