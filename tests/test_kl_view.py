"""The batch's `kl` is the estimate the run trains with, and the token view names it."""
from __future__ import annotations

import pytest
import torch

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer, algo
from workbench.widgets.tokens import render_tokens_html

# numbers compared under dtype "auto": make test runs this file in both dtypes (WORKBENCH_AUTO_DTYPE)
pytestmark = pytest.mark.numerics


def test_kl_uses_the_kl_loss_estimator_and_the_view_says_which(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path, use_kl_loss=True, kl_loss_type="low_var_kl",
                                  kl_penalty="kl"), environment=make_env("guess_number"))
    trainer.train_step()  # moves the policy away from the reference
    batch = trainer.compute_advantages(trainer.score(trainer.rollout()))
    assert batch.meta["kl_estimator"] == "low_var_kl"
    expected = algo.kl_penalty(batch.old_logprobs, batch.ref_logprobs, "low_var_kl") * batch.loss_mask
    assert torch.equal(batch.kl, expected)
    trained = batch.kl[batch.loss_mask.bool()]
    assert float(trained.min()) >= 0.0 and float(trained.abs().max()) > 0  # k3 is never negative
    assert "kl (low_var_kl estimate)" in render_tokens_html(batch, 0, "kl", trainer.tokenizer)


def test_kl_in_the_reward_uses_the_penalty_estimator(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path, use_kl_in_reward=True, kl_penalty="kl",
                                  use_kl_loss=True, kl_loss_type="low_var_kl"), environment=make_env("guess_number"))
    batch = trainer.compute_advantages(trainer.score(trainer.rollout()))
    assert batch.meta["kl_estimator"] == "kl"
    assert torch.equal(batch.kl, algo.kl_penalty(batch.old_logprobs, batch.ref_logprobs, "kl") * batch.loss_mask)
