"""Loss aggregation, masked statistics, PPO/GSPO policy losses and the value loss on hand-worked numbers."""

from __future__ import annotations

import math

import pytest
import torch

from workbench import algo


def t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def approx(x: float, rel: float = 1e-5, abs_: float = 1e-6):
    return pytest.approx(x, rel=rel, abs=abs_)


# --------------------------------------------------------------------------- masked statistics


def test_masked_mean_sum_var_whiten_hand_case():
    # Selected values 1, 2, 3 (100 and nan are masked): sum 6, mean 2,
    # squared deviations 1, 0, 1 -> biased var 2/3, unbiased var 1.
    values = t([[1.0, 2.0, 100.0], [3.0, float("nan"), 7.0]])
    mask = t([[1, 1, 0], [1, 0, 0]])
    assert algo.masked_sum(values, mask).item() == approx(6.0)
    assert algo.masked_mean(values, mask).item() == approx(2.0)
    assert algo.masked_mean(values, mask, axis=-1).tolist() == [approx(1.5), approx(3.0)]
    assert algo.masked_var(values, mask, unbiased=False).item() == approx(2 / 3)
    assert algo.masked_var(values, mask).item() == approx(1.0)
    # whiten: (x - 2) / sqrt(1 + 1e-8) on every position (masked ones too)
    white = algo.masked_whiten(values.nan_to_num(), mask)
    assert white[0].tolist() == [approx(-1.0), approx(0.0), approx(98.0)]
    assert white[1, 0].item() == approx(1.0)


def test_masked_var_needs_two_positions():
    with pytest.raises(ValueError):
        algo.masked_var(t([[1.0, 2.0]]), t([[1, 0]]))
    with pytest.raises(ValueError):
        algo.masked_var(t([[1.0, 2.0]]), t([[0, 0]]))


def test_entropy_from_logits_hand_case():
    # logits [0, ln 3] -> p = [1/4, 3/4]; H = -(0.25 ln 0.25 + 0.75 ln 0.75) = 0.5623351
    # uniform over 4 -> ln 4 = 1.3862944
    logits = torch.tensor([[[0.0, math.log(3.0), -1e9, -1e9], [5.0, 5.0, 5.0, 5.0]]])  # (1, 2, V=4)
    ent = algo.entropy_from_logits(logits)
    assert ent.shape == (1, 2)
    assert ent[0, 0].item() == approx(0.5623351)
    assert ent[0, 1].item() == approx(math.log(4.0))


# --------------------------------------------------------------------------- agg_loss

LOSS_MAT = [[1.0, 2.0, 3.0, 4.0], [5.0, 6.0, 7.0, 8.0]]
LOSS_MASK = [[1, 1, 0, 0], [1, 1, 1, 0]]
# Row sums over the mask: 1+2 = 3 and 5+6+7 = 18; token counts 2 and 3; T = 4.


@pytest.mark.parametrize(
    "mode, expected",
    [
        ("token-mean", 21 / 5),  # (3 + 18) / 5 tokens = 4.2
        ("seq-mean-token-sum", 10.5),  # (3 + 18) / 2 rows
        ("seq-mean-token-mean", 3.75),  # (3/2 + 18/3) / 2 = (1.5 + 6) / 2
        ("seq-mean-token-sum-norm", 2.625),  # (3/4 + 18/4) / 2 rows = 21/8 (current verl)
    ],
)
def test_agg_loss_modes_hand_case(mode, expected):
    assert algo.agg_loss(t(LOSS_MAT), t(LOSS_MASK), mode).item() == approx(expected)


def test_agg_loss_sum_norm_constant_scale_factor():
    # (3/10 + 18/10) / 2 = 1.05 with a fixed normaliser 10 instead of T = 4
    loss = algo.agg_loss(t(LOSS_MAT), t(LOSS_MASK), "seq-mean-token-sum-norm", loss_scale_factor=10)
    assert loss.item() == approx(1.05)


def test_agg_loss_fully_masked_row_is_finite():
    # Row 2 is empty: it contributes 0 but still counts in the sequence mean: (1.5 + 0) / 2
    loss = algo.agg_loss(t([[1.0, 2.0], [9.0, 9.0]]), t([[1, 1], [0, 0]]), "seq-mean-token-mean")
    assert loss.item() == approx(0.75)


def test_agg_loss_unknown_mode_lists_valid_modes():
    with pytest.raises(ValueError) as err:
        algo.agg_loss(t(LOSS_MAT), t(LOSS_MASK), "token-sum")
    for mode in algo.LOSS_AGG_MODES:
        assert mode in str(err.value)


# --------------------------------------------------------------------------- vanilla PPO policy loss


def ppo_case():
    # old log-probs 0, so ratio = exp(log_probs).  clip 0.2 -> [0.8, 1.2], clip_ratio_c = 3.
    #   t0: ratio 1.0, A = +1: -1.0 vs -1.0 -> -1.0   (not clipped)
    #   t1: ratio 1.5, A = +1: -1.5 vs -1.2 -> -1.2   (clipped: -1.2 > -1.5)
    #   t2: ratio 0.5, A = -1:  0.5 vs  0.8 ->  0.8   (clipped), dual cap 3 not hit
    #   t3: ratio 4.0, A = -1:  4.0 vs  1.2 ->  4.0,  dual cap min(4, 3) = 3 (clipfrac_lower)
    #   t4: masked out, extreme values must not matter.
    # token-mean loss = (-1 - 1.2 + 0.8 + 3) / 4 = 0.4
    # pg_clipfrac = 2/4, pg_clipfrac_lower = 1/4
    # ppo_kl = mean(-log ratio) = -(0 + ln 1.5 + ln 0.5 + ln 4) / 4 = -ln 3 / 4 = -0.2746531
    ratios = [1.0, 1.5, 0.5, 4.0, 1000.0]
    log_probs = torch.tensor([[math.log(r) for r in ratios]], requires_grad=True)
    old = torch.zeros(1, 5)
    adv = t([[1.0, 1.0, -1.0, -1.0, -50.0]])
    mask = t([[1, 1, 1, 1, 0]])
    return old, log_probs, adv, mask


def test_policy_loss_vanilla_hand_case():
    old, log_probs, adv, mask = ppo_case()
    loss, metrics = algo.compute_policy_loss(old, log_probs, adv, mask, clip_ratio=0.2, clip_ratio_c=3.0)
    assert loss.item() == approx(0.4)
    assert set(metrics) == {"actor/pg_loss", "actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl"}
    assert all(isinstance(v, float) for v in metrics.values())
    assert metrics["actor/pg_loss"] == approx(0.4)
    assert metrics["actor/pg_clipfrac"] == approx(0.5)
    assert metrics["actor/pg_clipfrac_lower"] == approx(0.25)
    assert metrics["actor/ppo_kl"] == approx(-math.log(3.0) / 4)


def test_policy_loss_vanilla_gradient_only_through_unclipped_tokens():
    # d loss / d logp_t = -A_t * ratio_t / 4 for unclipped t0 -> -0.25; clipped t1, t2,
    # dual-clipped t3 and masked t4 have zero gradient.
    old, log_probs, adv, mask = ppo_case()
    loss, _ = algo.compute_policy_loss(old, log_probs, adv, mask)
    loss.backward()
    assert log_probs.grad.tolist()[0] == [approx(-0.25), 0.0, 0.0, 0.0, 0.0]


def test_policy_loss_other_agg_mode():
    # seq-mean-token-sum over one row: -1 - 1.2 + 0.8 + 3 = 1.6
    old, log_probs, adv, mask = ppo_case()
    loss, metrics = algo.compute_policy_loss(old, log_probs, adv, mask, loss_agg_mode="seq-mean-token-sum")
    assert loss.item() == approx(1.6)
    assert metrics["actor/pg_loss"] == approx(1.6)


def test_policy_loss_clip_higher():
    # ratios 1.25 (A=+1), 1.3 (A=+1), 0.75 (A=-1)
    #   low = 0.2, high = 0.28 -> [0.8, 1.28]: -1.25 (free), -1.28 (clipped), 0.8 (clipped)
    #     mean = (-1.25 - 1.28 + 0.8) / 3 = -0.5766667, clipfrac 2/3
    #   symmetric 0.2 -> [0.8, 1.2]: -1.2, -1.2, 0.8 -> mean -0.5333333, clipfrac 1
    log_probs = torch.log(t([[1.25, 1.3, 0.75]]))
    old = torch.zeros(1, 3)
    adv = t([[1.0, 1.0, -1.0]])
    mask = torch.ones(1, 3)
    loss, m = algo.compute_policy_loss(old, log_probs, adv, mask, clip_ratio=0.2, clip_ratio_high=0.28)
    assert loss.item() == approx(-0.5766667)
    assert m["actor/pg_clipfrac"] == approx(2 / 3)
    loss_sym, m_sym = algo.compute_policy_loss(old, log_probs, adv, mask, clip_ratio=0.2)
    assert loss_sym.item() == approx(-0.5333333)
    assert m_sym["actor/pg_clipfrac"] == approx(1.0)
    # clip_ratio_low alone widens only the floor: 0.75 is inside [0.7, 1.2] -> 0.75
    loss_low, _ = algo.compute_policy_loss(old, log_probs, adv, mask, clip_ratio=0.2, clip_ratio_low=0.3)
    assert loss_low.item() == approx((-1.2 - 1.2 + 0.75) / 3)


def test_policy_loss_log_ratio_clamp_and_dual_clip():
    # log ratio 25 is clamped to 20 -> ppo_kl = -20; A = -2 -> loss capped at 2 * 3 = 6
    loss, m = algo.compute_policy_loss(t([[0.0]]), t([[25.0]]), t([[-2.0]]), t([[1.0]]))
    assert loss.item() == approx(6.0)
    assert m["actor/ppo_kl"] == approx(-20.0)
    assert m["actor/pg_clipfrac_lower"] == approx(1.0)


def test_policy_loss_rejects_clip_ratio_c_le_one():
    old, log_probs, adv, mask = ppo_case()
    with pytest.raises(ValueError, match="clip_ratio_c"):
        algo.compute_policy_loss(old, log_probs, adv, mask, clip_ratio_c=1.0)


# --------------------------------------------------------------------------- GSPO


def gspo_case():
    # Row 0 log ratios 0.1, 0.2, 0.3 -> mean 0.2 -> s0 = e^0.2 = 1.2214028, A = +1
    # Row 1 log ratios -0.4, -0.4, (masked 9) -> mean -0.4 -> s1 = e^-0.4 = 0.6703200, A = -1
    old = torch.zeros(2, 3)
    log_probs = torch.tensor([[0.1, 0.2, 0.3], [-0.4, -0.4, 9.0]], requires_grad=True)
    adv = t([[1.0, 1.0, 1.0], [-1.0, -1.0, -1.0]])
    mask = t([[1, 1, 1], [1, 1, 0]])
    return old, log_probs, adv, mask


def test_policy_loss_gspo_hand_case():
    # low 0.2, high 0.25 -> [0.8, 1.25]
    #   row 0: s0 = 1.2214 inside -> per token -1.2214028 (not clipped)
    #   row 1: max(0.67032, 0.8) = 0.8 (clipped)
    # seq-mean-token-mean: (-1.2214028 + 0.8) / 2 = -0.2107014
    # clipfrac = 2 clipped / 5 tokens = 0.4; ppo_kl = -(0.6 - 0.8) / 5 = 0.04
    old, log_probs, adv, mask = gspo_case()
    loss, m = algo.compute_policy_loss_gspo(old, log_probs, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.25)
    assert loss.item() == approx(-0.2107014)
    assert m["actor/pg_loss"] == approx(-0.2107014)
    assert m["actor/pg_clipfrac"] == approx(0.4)
    assert m["actor/pg_clipfrac_lower"] == 0.0
    assert m["actor/ppo_kl"] == approx(0.04)
    # gradient: each row-0 token gets -A * s0 / (3 tokens * 2 rows) = -1.2214028 / 6 = -0.2035671
    loss.backward()
    g = log_probs.grad.tolist()
    assert g[0] == [approx(-0.2035671)] * 3
    assert g[1] == [0.0, 0.0, 0.0]


def test_policy_loss_gspo_always_seq_mean_token_mean():
    old, log_probs, adv, mask = gspo_case()
    a, _ = algo.compute_policy_loss_gspo(old, log_probs, adv, mask, clip_ratio=0.25, loss_agg_mode="token-mean")
    b, _ = algo.compute_policy_loss_gspo(old, log_probs, adv, mask, clip_ratio=0.25)
    assert a.item() == approx(b.item())
    with pytest.raises(ValueError):
        algo.compute_policy_loss_gspo(old, log_probs, adv, mask, loss_agg_mode="nope")


def test_policy_loss_registry():
    assert algo.get_policy_loss_fn("vanilla") is algo.compute_policy_loss
    assert algo.get_policy_loss_fn("gspo") is algo.compute_policy_loss_gspo
    old, log_probs, adv, mask = ppo_case()
    for name in ("vanilla", "gspo"):  # same keyword set works for both
        loss, metrics = algo.get_policy_loss_fn(name)(
            old_log_probs=old, log_probs=log_probs, advantages=adv, response_mask=mask,
            clip_ratio=0.2, clip_ratio_low=None, clip_ratio_high=0.28, clip_ratio_c=3.0, loss_agg_mode="token-mean",
        )
        assert torch.isfinite(loss)
        assert "actor/ppo_kl" in metrics
    with pytest.raises(ValueError) as err:
        algo.get_policy_loss_fn("ppo2")
    assert "vanilla" in str(err.value) and "gspo" in str(err.value)


# --------------------------------------------------------------------------- value loss


def test_value_loss_clipped_hand_case():
    # cliprange_value 0.5
    #   t0: v 1.0, old 0.8, R 2.0: clip(1.0, 0.3, 1.3) = 1.0; errors 1, 1       -> 1    (not clipped)
    #   t1: v 2.0, old 1.0, R 0.0: clip -> 1.5;           errors 4, 2.25        -> 4    (not clipped)
    #   t2: v 2.0, old 1.0, R 3.0: clip -> 1.5;           errors 1, 2.25        -> 2.25 (clipped)
    #   t3: masked
    # loss = 0.5 * (1 + 4 + 2.25) / 3 = 1.2083333; clipfrac = 1/3
    vpreds = torch.tensor([[1.0, 2.0, 2.0, 50.0]], requires_grad=True)
    returns = t([[2.0, 0.0, 3.0, -50.0]])
    old_values = t([[0.8, 1.0, 1.0, 0.0]])
    mask = t([[1, 1, 1, 0]])
    loss, m = algo.compute_value_loss(vpreds, returns, old_values, mask, cliprange_value=0.5)
    assert loss.item() == approx(1.2083333)
    assert m == {"critic/vf_loss": approx(1.2083333), "critic/vf_clipfrac": approx(1 / 3)}
    # gradient: 0.5 * 2 (v - R) / 3 on the unclipped-max tokens t0, t1; t2's max is the clipped
    # (constant) branch -> 0; masked t3 -> 0.  t0: (1-2)/3 = -1/3, t1: (2-0)/3 = 2/3
    loss.backward()
    assert vpreds.grad.tolist()[0] == [approx(-1 / 3), approx(2 / 3), 0.0, 0.0]


def test_value_loss_agg_mode():
    # seq-mean-token-sum: 0.5 * (1 + 4 + 2.25) = 3.625
    loss, _ = algo.compute_value_loss(
        t([[1.0, 2.0, 2.0]]), t([[2.0, 0.0, 3.0]]), t([[0.8, 1.0, 1.0]]), torch.ones(1, 3), 0.5, "seq-mean-token-sum"
    )
    assert loss.item() == approx(3.625)


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-sum", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_agg_loss_on_multi_turn_masks_matches_plain_loop(mode, seed):
    # Masks with observation gaps between turns and padding at the end (see
    # tests/test_algo_advantages.py::multi_turn_mask_row), checked against plain loops.
    import random

    from tests.test_algo_advantages import multi_turn_mask_row

    rng = random.Random(seed)
    B, T = 6, 20
    mask = [multi_turn_mask_row(rng, T) for _ in range(B)]
    loss = [[rng.gauss(0, 1) for _ in range(T)] for _ in range(B)]
    sums = [sum(l * m for l, m in zip(lr, mr)) for lr, mr in zip(loss, mask)]
    counts = [sum(mr) for mr in mask]
    if mode == "token-mean":
        expected = sum(sums) / sum(counts)
    elif mode == "seq-mean-token-sum":
        expected = sum(sums) / B
    elif mode == "seq-mean-token-mean":
        expected = sum(s / c for s, c in zip(sums, counts)) / B
    else:
        expected = sum(s / T for s in sums) / B
    assert algo.agg_loss(t(loss), t(mask), mode).item() == approx(expected)
