"""Validation on every path (issue 43, items 4, 7 and 11).

1. a field set on `trainer.config` after the Trainer was built (the README's idiom) is
   validated again before `fit`, `rollout`, `update`, ... use it: `max_staleness = 2.0`
   raised a TypeError inside `RolloutAhead`, `= -3` a `ValueError: maxlen must be
   non-negative`; now a ConfigError names the field, and nothing was trained;
2. integer fields have bounds: `--training.max_staleness 100000000000000000000` passed
   validation and raised OverflowError after the model loaded;
3. `--reward.overlong_penalty 1e300` passed validation and then blamed the environment's
   reward for a float32 overflow;
4. `train --steps 0` (with or without `--from`) named `training.num_iters_per_epoch`, a field
   the user never set; now the error names `--steps`.

Real trainers on the tiny model; the CLI through `workbench.cli.main`.
"""
from __future__ import annotations

import pytest

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.cli import main
from workbench.config import ConfigError, ConfigStore


@pytest.fixture(scope="module")
def trainer(tiny_model_path, tmp_path_factory):
    return Trainer(tiny_config(tiny_model_path, tmp_path_factory.mktemp("paths")), environment=make_env("guess_number"))


@pytest.mark.parametrize("value, words", [(2.0, "must be an integer"), (-3, "must be an integer >= 0"),
                                          (10**20, "must be an integer between")])
def test_max_staleness_set_after_the_trainer_is_built_is_checked_by_fit(trainer, value, words):
    trainer.config.training.max_staleness = value
    try:
        with pytest.raises(ConfigError, match=f"training.max_staleness {words}"):
            trainer.fit(steps=1)
        assert trainer.global_step == 0 and trainer.ahead is None
    finally:
        trainer.config.training.max_staleness = 0


@pytest.mark.parametrize("stage", ["rollout", "update", "compute_advantages", "train_step", "evaluate", "sft_step"])
def test_every_stage_checks_a_field_set_after_the_trainer_is_built(trainer, stage):
    batch = trainer.score(trainer.rollout())
    args = {"rollout": (), "update": (batch,), "compute_advantages": (batch,), "train_step": (),
            "evaluate": ([1, 2],), "sft_step": (batch,)}[stage]
    trainer.config.training.micro_batch_size = 0
    try:
        with pytest.raises(ConfigError, match="training.micro_batch_size must be an integer >= 1"):
            getattr(trainer, stage)(*args)
    finally:
        trainer.config.training.micro_batch_size = 2
    assert trainer.global_step == 0


def test_integer_fields_have_bounds():
    c = ConfigStore()
    c.training.max_staleness = 10**20
    with pytest.raises(ConfigError, match="training.max_staleness must be an integer between"):
        c.validate()
    c.training.max_staleness = 0
    c.inference.max_tokens = 2**40
    with pytest.raises(ConfigError, match="inference.max_tokens must be an integer between"):
        c.validate()
    c.inference.max_tokens = 64
    c.training.seed = 2**32 - 1  # numpy's seed range is allowed for seeds
    c.validate()


@pytest.mark.parametrize("flag, value, field", [
    ("--training.max_staleness", "100000000000000000000", "training.max_staleness"),
    ("--reward.overlong_penalty", "1e300", "reward.overlong_penalty"),
    ("--reward.success_bonus", "1e300", "reward.success_bonus"),
])
def test_cli_refuses_out_of_bounds_values_at_validation(tmp_path, capsys, flag, value, field):
    rc = main(["train", "--model", "/nonexistent/model", flag, value, "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and err.startswith(f"config error: {field} must be") and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()  # refused before anything was written (or a model looked for)


def test_steps_0_names_the_flag_the_user_gave(tmp_path, capsys, tiny_model_path):
    rc = main(["train", "--model", str(tiny_model_path), "--steps", "0", "--output", str(tmp_path / "run")])
    err = capsys.readouterr().err
    assert rc == 2 and "--steps must be an integer >= 1" in err and "num_iters_per_epoch" not in err, err
    assert not (tmp_path / "run").exists()


def test_branch_with_steps_0_names_the_flag_the_user_gave(trainer, tmp_path, capsys):
    ckpt = trainer.save_checkpoint(tmp_path / "parent" / "checkpoints" / "step_000000")
    rc = main(["train", "--from", str(ckpt), "--steps", "0", "--output", str(tmp_path / "branch")])
    err = capsys.readouterr().err
    assert rc == 2 and "--steps must be an integer >= 1" in err and "num_iters_per_epoch" not in err, err
    assert not (tmp_path / "branch").exists()
