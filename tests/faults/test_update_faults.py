"""A step that would make the weights non-finite is undone, counted, and the run goes on."""
from __future__ import annotations

import torch

from envs import make_env
from tests.test_trainer import tiny_config, trained_weights
from workbench import Trainer
from workbench.training.guards import guarded_step


def _optimizer_state(opt: torch.optim.Optimizer) -> list[dict[str, torch.Tensor]]:
    return [{k: v.clone() for k, v in opt.state[p].items()} for g in opt.param_groups for p in g["params"]
            if p in opt.state]


def test_non_finite_weights_after_step_are_restored_and_the_next_step_learns(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"))
    trainer.train_step()  # optimizer state exists now
    before = trained_weights(trainer)
    state_before = _optimizer_state(trainer.optimizer)
    for g in trainer.optimizer.param_groups:
        g["lr"] = float("inf")  # what `training.learning_rate=inf` did before validation caught it
    metrics = trainer.train_step()
    after = trained_weights(trainer)
    assert metrics["actor/nonfinite_weight_restores"] == 1.0
    assert metrics["actor/skipped_updates"] == 1.0
    assert "non-finite weights" in metrics["actor/skipped_reason"]
    assert all(torch.equal(before[k], after[k]) for k in before), "weights must be exactly the old ones"
    state_after = _optimizer_state(trainer.optimizer)
    assert len(state_after) == len(state_before)
    for a, b in zip(state_before, state_after):
        assert all(torch.equal(a[k], b[k]) for k in a), "optimizer state must be exactly the old one"
    for g in trainer.optimizer.param_groups:
        g["lr"] = 1e-3
    metrics = trainer.train_step()
    assert metrics["actor/nonfinite_weight_restores"] == 0.0
    changed = trained_weights(trainer)
    assert any(not torch.equal(after[k], changed[k]) for k in after), "the next good step must update"
    assert all(torch.isfinite(v).all() for v in changed.values())


def test_guarded_step_keeps_a_finite_step_bitwise():
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(5))
    ref = torch.nn.Parameter(w.detach().clone())
    opt, opt_ref = torch.optim.AdamW([w], lr=0.1), torch.optim.AdamW([ref], lr=0.1)
    for _ in range(3):
        for p in (w, ref):
            p.grad = torch.arange(5.0) - 2.0
        assert guarded_step(opt, [w])
        opt_ref.step()
    assert torch.equal(w, ref)
