"""KL estimators, the in-reward KL penalty and KL controllers on hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from workbench import algo


def t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def approx(x: float):
    return pytest.approx(x, rel=1e-5, abs=1e-6)


# Three tokens: d = logp - ref = 1, -2, 0.
LOGP = [[0.0, -2.0, -0.5]]
REF = [[-1.0, 0.0, -0.5]]


@pytest.mark.parametrize(
    "names, expected",
    [
        (("kl", "k1"), [1.0, -2.0, 0.0]),  # d
        (("abs",), [1.0, 2.0, 0.0]),  # |d|
        (("mse", "k2"), [0.5, 2.0, 0.0]),  # 0.5 d^2
        # k3 = exp(-d) + d - 1: e^-1 + 1 - 1 = 0.3678794; e^2 - 2 - 1 = 4.3890561; 0
        (("low_var_kl", "k3"), [math.exp(-1.0), math.exp(2.0) - 3.0, 0.0]),
    ],
)
def test_kl_estimators_hand_case(names, expected):
    for name in names:
        got = algo.kl_penalty(t(LOGP), t(REF), name)
        assert got.shape == (1, 3)
        assert got[0].tolist() == [approx(e) for e in expected]


def test_kl_default_estimator_is_k1():
    assert algo.kl_penalty(t(LOGP), t(REF))[0].tolist() == [1.0, -2.0, 0.0]


def test_low_var_kl_clamps():
    # ref - logp = 30 is clamped to 20 before exp; e^20 - 21 is then clamped to 10.
    # ref - logp = -30 -> clamped to -20 -> e^-20 + 20 - 1 = 19 -> clamped to 10 as well.
    got = algo.kl_penalty(t([[0.0, 0.0]]), t([[30.0, -30.0]]), "low_var_kl")
    assert got[0].tolist() == [approx(10.0), approx(10.0)]
    assert torch.isfinite(got).all()


def test_kl_unknown_estimator_lists_valid_names():
    with pytest.raises(ValueError) as err:
        algo.kl_penalty(t(LOGP), t(REF), "k4")
    for name in ("kl", "abs", "mse", "low_var_kl", "k3"):
        assert name in str(err.value)


def test_apply_kl_penalty_hand_case():
    # d = logp - ref: row 0 [0.1, 0.2, 0.3] (all tokens), row 1 [0.5, -0.5, 9 (masked)]
    # kl_coef 0.1:
    #   row 0: [0 - 0.01, 0 - 0.02, 1 - 0.03]   = [-0.01, -0.02, 0.97]
    #   row 1: [0 - 0.05, 2 + 0.05, 0 - 0]      = [-0.05, 2.05, 0.0]
    # kl_value = mean(mean(0.1, 0.2, 0.3), mean(0.5, -0.5)) = mean(0.2, 0.0) = 0.1
    rewards = t([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]])
    ref = t([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]])
    logp = ref + t([[0.1, 0.2, 0.3], [0.5, -0.5, 9.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    penalized, kl_value = algo.apply_kl_penalty(rewards, logp, ref, mask, kl_coef=0.1)
    assert isinstance(kl_value, float)
    assert kl_value == approx(0.1)
    for got_row, exp_row in zip(penalized.tolist(), [[-0.01, -0.02, 0.97], [-0.05, 2.05, 0.0]]):
        assert got_row == [approx(e) for e in exp_row]


def test_apply_kl_penalty_other_estimator():
    # k2 = 0.5 d^2 with d = 1, -2 -> [0.5, 2.0]; coef 1 -> rewards 3 - [0.5, 2] = [2.5, 1.0]
    # kl_value = mean over one row = 1.25
    penalized, kl_value = algo.apply_kl_penalty(
        t([[3.0, 3.0]]), t([[0.0, -2.0]]), t([[-1.0, 0.0]]), t([[1, 1]]), kl_coef=1.0, kl_penalty="k2"
    )
    assert penalized[0].tolist() == [approx(2.5), approx(1.0)]
    assert kl_value == approx(1.25)


def test_kl_controller_adaptive_hand_case():
    # init 0.1, target 0.05, horizon 100
    #   update(0.06, 10): error = clip(0.06/0.05 - 1 = 0.2) = 0.2 -> x (1 + 0.2*10/100) = x1.02 -> 0.102
    #   update(0.5, 10):  error = clip(9) = 0.2                   -> x1.02 -> 0.10404
    #   update(0.0, 50):  error = clip(-1) = -0.2 -> x (1 - 0.2*50/100) = x0.9 -> 0.093636
    ctrl = algo.KLController(init_kl_coef=0.1, target_kl=0.05, adaptive=True, horizon=100)
    assert ctrl.value == approx(0.1)
    ctrl.update(0.06, n_steps=10)
    assert ctrl.value == approx(0.102)
    ctrl.update(0.5, n_steps=10)
    assert ctrl.value == approx(0.10404)
    ctrl.update(0.0, n_steps=50)
    assert ctrl.value == approx(0.093636)
    assert isinstance(ctrl.value, float)


def test_kl_controller_small_error_is_proportional():
    # error = 0.055/0.05 - 1 = 0.1 (inside the clip) -> x (1 + 0.1 * 100/1000) = x1.01
    ctrl = algo.AdaptiveKLController(init_kl_coef=0.2, target_kl=0.05, horizon=1000)
    ctrl.update(0.055, n_steps=100)
    assert ctrl.value == approx(0.202)


def test_kl_controller_fixed():
    ctrl = algo.KLController(init_kl_coef=0.3, adaptive=False)
    ctrl.update(100.0, n_steps=1000)
    ctrl.update(0.0, n_steps=1000)
    assert ctrl.value == 0.3
    fixed = algo.FixedKLController(0.3)
    fixed.update(5.0, 10)
    assert fixed.value == 0.3


def test_kl_controller_validation():
    with pytest.raises(ValueError):
        algo.KLController(0.1, target_kl=None, adaptive=True)
    with pytest.raises(ValueError):
        algo.AdaptiveKLController(0.1, target_kl=0.05, horizon=0)
