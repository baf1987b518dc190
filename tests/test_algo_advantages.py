"""Advantage estimators vs plain-Python reference loops, hand-worked cases and the registry."""

from __future__ import annotations

import math
import random

import numpy as np
import pytest
from pytest import approx
import torch

from workbench import algo

SEEDS = [0, 1, 2, 3, 4]
ATOL = 1e-5


# --------------------------------------------------------------------------- random multi-turn batches


def multi_turn_mask_row(rng: random.Random, T: int) -> list[float]:
    """Leading zeros, then runs of 1s (turns) separated by runs of 0s (observations), then padding."""
    row = [0.0] * rng.randint(1, 3)
    while len(row) < T:
        row += [1.0] * rng.randint(1, 4)
        row += [0.0] * rng.randint(1, 3)
    row = row[:T]
    for t in range(T - rng.randint(0, 3), T):  # right padding
        row[t] = 0.0
    if sum(row) == 0:
        row[-1] = 1.0
    return row


def random_batch(seed: int, B: int = 8, T: int = 16):
    rng = random.Random(seed)
    mask = [multi_turn_mask_row(rng, T) for _ in range(B)]
    rewards = [[rng.gauss(0.0, 1.0) for _ in range(T)] for _ in range(B)]
    values = [[rng.gauss(0.0, 1.0) for _ in range(T)] for _ in range(B)]
    # group ids with some singletons: sizes drawn from {1, 2, 3, 4}
    index: list[str] = []
    g = 0
    while len(index) < B:
        index += [f"prompt-{g}"] * rng.randint(1, 4)
        g += 1
    index = index[:B]
    rng.shuffle(index)
    return rewards, values, mask, index


def t(x: list) -> torch.Tensor:
    return torch.tensor(x, dtype=torch.float32)


def assert_close(actual: torch.Tensor, expected: list, atol: float = ATOL) -> None:
    assert actual.shape == torch.Size([len(expected), len(expected[0])])
    for got_row, exp_row in zip(actual.tolist(), expected):
        for got, exp in zip(got_row, exp_row):
            assert abs(got - exp) <= atol, (got, exp)


# --------------------------------------------------------------------------- plain-Python references


def ref_whiten(x: list[list[float]], mask: list[list[float]]) -> list[list[float]]:
    flat = [v for row, mrow in zip(x, mask) for v, m in zip(row, mrow) if m]
    n = len(flat)
    mean = sum(flat) / n
    var = sum((v - mean) ** 2 for v in flat) / (n - 1)
    return [[(v - mean) / math.sqrt(var + 1e-8) for v in row] for row in x]


def ref_gae(rewards, values, mask, gamma, lam):
    advs = []
    for r, v, m in zip(rewards, values, mask):
        T = len(r)
        adv = [0.0] * T
        next_value, gae = 0.0, 0.0
        for i in reversed(range(T)):
            if m[i]:  # policy token: normal GAE step
                delta = r[i] + gamma * next_value - v[i]
                gae = delta + gamma * lam * gae
                next_value = v[i]
            adv[i] = gae  # observation token: carry through unchanged
        advs.append(adv)
    returns = [[a + vv for a, vv in zip(arow, vrow)] for arow, vrow in zip(advs, values)]
    return advs, returns


def ref_groups(index):
    groups: dict = {}
    for i, k in enumerate(index):
        groups.setdefault(k, []).append(i)
    return groups


def ref_grpo(rewards, mask, index, epsilon, norm_by_std):
    scores = [sum(r) for r in rewards]
    adv = [0.0] * len(scores)
    for members in ref_groups(index).values():
        n = len(members)
        if n == 1:
            mean, std = 0.0, 1.0
        else:
            mean = sum(scores[i] for i in members) / n
            std = math.sqrt(sum((scores[i] - mean) ** 2 for i in members) / (n - 1))
        for i in members:
            adv[i] = (scores[i] - mean) / (std + epsilon) if norm_by_std else scores[i] - mean
    return [[a * m for m in mrow] for a, mrow in zip(adv, mask)]


def ref_rloo(rewards, mask, index):
    scores = [sum(r) for r in rewards]
    adv = list(scores)
    for members in ref_groups(index).values():
        n = len(members)
        if n > 1:
            total = sum(scores[i] for i in members)
            for i in members:
                adv[i] = scores[i] - (total - scores[i]) / (n - 1)  # minus mean of the others
    return [[a * m for m in mrow] for a, mrow in zip(adv, mask)]


def ref_rpp(rewards, mask, gamma, multi_turn=True):
    returns = []
    for r, m in zip(rewards, mask):
        T = len(r)
        ret = [0.0] * T
        running = 0.0
        for i in reversed(range(T)):
            if multi_turn:
                if m[i]:
                    running = r[i] + gamma * running
                    ret[i] = running
            else:
                running = r[i] + gamma * running
                ret[i] = running
                if not m[i]:
                    running = 0.0
        returns.append(ret)
    white = ref_whiten(returns, mask)
    adv = [[w * m for w, m in zip(wrow, mrow)] for wrow, mrow in zip(white, mask)]
    return adv, returns


def ref_rpp_baseline(rewards, mask, index):
    scores = [sum(r) for r in rewards]
    centered = list(scores)
    for members in ref_groups(index).values():
        if len(members) > 1:
            mean = sum(scores[i] for i in members) / len(members)
            for i in members:
                centered[i] = scores[i] - mean
    tiled = [[c * m for m in mrow] for c, mrow in zip(centered, mask)]
    white = ref_whiten(tiled, mask)
    return [[w * m for w, m in zip(wrow, mrow)] for wrow, mrow in zip(white, mask)]


# --------------------------------------------------------------------------- GAE


@pytest.mark.parametrize("seed", SEEDS)
def test_gae_matches_reference_loop(seed):
    rewards, values, mask, _ = random_batch(seed)
    gamma, lam = 0.97, 0.9
    exp_adv, exp_ret = ref_gae(rewards, values, mask, gamma, lam)

    raw, ret_raw = algo.compute_gae_advantage_return(t(rewards), t(values), t(mask), gamma, lam, whiten=False)
    assert_close(raw, exp_adv)
    assert_close(ret_raw, exp_ret)

    adv, ret = algo.compute_gae_advantage_return(
        token_level_rewards=t(rewards), values=t(values), response_mask=t(mask), gamma=gamma, lam=lam
    )
    assert_close(adv, ref_whiten(exp_adv, mask))
    assert_close(ret, exp_ret)  # returns are computed before whitening


def test_gae_skips_observation_tokens_hand_case():
    # mask [1, 1, 0, 0, 1]; the reward 5 and values 9 on observation tokens must be ignored.
    # gamma 0.9, lam 0.8 (gamma*lam = 0.72), backwards:
    #   t4: delta = 1 + 0 - 0.8 = 0.2            gae = 0.2,                   next_value = 0.8
    #   t3, t2 (observations): carry gae = 0.2, next_value = 0.8
    #   t1: delta = 0 + 0.9*0.8 - 0.6 = 0.12     gae = 0.12 + 0.72*0.2 = 0.264, next_value = 0.6
    #   t0: delta = 0 + 0.9*0.6 - 0.5 = 0.04     gae = 0.04 + 0.72*0.264 = 0.23008
    # returns = adv + values = [0.73008, 0.864, 9.2, 9.2, 1.0]
    rewards = t([[0.0, 0.0, 5.0, 0.0, 1.0]])
    values = t([[0.5, 0.6, 9.0, 9.0, 0.8]])
    mask = t([[1, 1, 0, 0, 1]])
    adv, ret = algo.compute_gae_advantage_return(rewards, values, mask, gamma=0.9, lam=0.8, whiten=False)
    assert_close(adv, [[0.23008, 0.264, 0.2, 0.2, 0.2]])
    assert_close(ret, [[0.73008, 0.864, 9.2, 9.2, 1.0]])


def test_gae_full_mask_gamma_lam_one_is_reward_to_go_minus_value():
    # With every token a policy token and gamma = lam = 1, A_t = sum_{k>=t} r_k - v_t.
    rewards = t([[1.0, 0.0, 2.0]])
    values = t([[0.5, 1.0, 1.5]])
    adv, ret = algo.compute_gae_advantage_return(rewards, values, torch.ones(1, 3), 1.0, 1.0, whiten=False)
    assert_close(adv, [[3.0 - 0.5, 2.0 - 1.0, 2.0 - 1.5]])
    assert_close(ret, [[3.0, 2.0, 2.0]])


def test_gae_accepts_bool_mask_and_has_no_grad():
    rewards, values, mask, _ = random_batch(7)
    v = t(values).requires_grad_(True)
    a_float, _ = algo.compute_gae_advantage_return(t(rewards), v, t(mask), 0.99, 0.95)
    a_bool, _ = algo.compute_gae_advantage_return(t(rewards), v, t(mask).bool(), 0.99, 0.95)
    assert torch.allclose(a_float, a_bool)
    assert not a_float.requires_grad


# --------------------------------------------------------------------------- GRPO / Dr.GRPO


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("norm_by_std", [True, False])
def test_grpo_matches_reference_loop(seed, norm_by_std):
    rewards, _, mask, index = random_batch(seed)
    expected = ref_grpo(rewards, mask, index, 1e-6, norm_by_std)
    adv, ret = algo.compute_grpo_advantage(
        t(rewards), t(mask), index, epsilon=1e-6, norm_adv_by_std_in_grpo=norm_by_std
    )
    assert_close(adv, expected)
    assert_close(ret, expected)


@pytest.mark.parametrize("seed", SEEDS[:2])
def test_grpo_index_types_agree(seed):
    rewards, _, mask, index = random_batch(seed)
    as_int = [int(k.split("-")[1]) for k in index]
    results = [
        algo.compute_grpo_advantage(t(rewards), t(mask), ids)[0]
        for ids in (index, tuple(index), np.array(index, dtype=object), np.array(as_int), torch.tensor(as_int))
    ]
    for r in results[1:]:
        assert torch.allclose(r, results[0])


def test_grpo_binary_rewards_identical_group_gives_zero():
    # Group "a": scores 1, 1 -> std 0 -> (1 - 1) / (0 + eps) = 0.  Group "b": 1, 0 ->
    # mean 0.5, unbiased std sqrt(0.5) = 0.70711 -> +-0.5 / 0.70711 = +-0.70711.
    rewards = t([[0, 1], [0, 1], [1, 0], [0, 0]])
    adv, _ = algo.compute_grpo_advantage(rewards, torch.ones(4, 2), ["a", "a", "b", "b"])
    assert_close(adv, [[0, 0], [0, 0], [0.70711, 0.70711], [-0.70711, -0.70711]])


def test_grpo_group_of_one_and_dr_grpo_hand_case():
    # Group "p": scores 1, 2, 6 -> mean 3, deviations -2, -1, 3,
    #   unbiased std = sqrt((4 + 1 + 9) / 2) = sqrt(7) = 2.6457513.
    # Group "q": single score 3 -> mean 0, std 1 -> 3 / (1 + 1e-6) = 2.999997 (GRPO), 3 (Dr.GRPO).
    # The last token of every row is masked out.
    rewards = t([[1, 0, 0], [0, 2, 0], [6, 0, 0], [0, 0, 3]])
    mask = t([[1, 1, 0]] * 4)
    index = ["p", "p", "p", "q"]
    s7 = math.sqrt(7) + 1e-6
    adv, _ = algo.compute_grpo_advantage(rewards, mask, index)
    assert_close(adv, [[-2 / s7, -2 / s7, 0], [-1 / s7, -1 / s7, 0], [3 / s7, 3 / s7, 0], [2.999997, 2.999997, 0]])
    dr, dr_ret = algo.compute_grpo_advantage(rewards, mask, index, norm_adv_by_std_in_grpo=False)
    assert_close(dr, [[-2, -2, 0], [-1, -1, 0], [3, 3, 0], [3, 3, 0]])
    assert_close(dr_ret, [[-2, -2, 0], [-1, -1, 0], [3, 3, 0], [3, 3, 0]])


def test_grpo_index_length_mismatch_and_missing_index():
    with pytest.raises(ValueError, match="index"):
        algo.compute_grpo_advantage(torch.zeros(3, 2), torch.ones(3, 2), ["a", "b"])
    with pytest.raises(ValueError, match="index"):
        algo.get_advantage_estimator("grpo")(token_level_rewards=torch.zeros(3, 2), response_mask=torch.ones(3, 2))


# --------------------------------------------------------------------------- RLOO


@pytest.mark.parametrize("seed", SEEDS)
def test_rloo_matches_reference_loop(seed):
    rewards, _, mask, index = random_batch(seed)
    adv, ret = algo.compute_rloo_advantage(t(rewards), t(mask), index)
    expected = ref_rloo(rewards, mask, index)
    assert_close(adv, expected)
    assert_close(ret, expected)


def test_rloo_hand_case():
    # Group scores 1, 2, 6: 1 - (2+6)/2 = -3, 2 - (1+6)/2 = -1.5, 6 - (1+2)/2 = 4.5; singleton 5 stays 5.
    rewards = t([[1, 0], [2, 0], [6, 0], [0, 5]])
    adv, _ = algo.compute_rloo_advantage(rewards, torch.ones(4, 2), [0, 0, 0, 1])
    assert_close(adv, [[-3, -3], [-1.5, -1.5], [4.5, 4.5], [5, 5]])


# --------------------------------------------------------------------------- REINFORCE++


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("multi_turn", [False, True])
def test_reinforce_plus_plus_matches_reference_loop(seed, multi_turn):
    rewards, _, mask, _ = random_batch(seed)
    gamma = 0.95
    exp_adv, exp_ret = ref_rpp(rewards, mask, gamma, multi_turn)
    adv, ret = algo.compute_reinforce_plus_plus_advantage(t(rewards), t(mask), gamma=gamma, multi_turn=multi_turn)
    assert_close(ret, exp_ret)
    assert_close(adv, exp_adv)


def test_reinforce_plus_plus_carries_the_final_reward_to_earlier_turns():
    # mask [1, 0, 1], reward 1 on the last token, gamma 1:
    #   default (multi-turn): the observation token passes G = 1 through, reports 0 -> returns [1, 0, 1]
    #   multi_turn=False (older verl): t1 stores G = 1, then resets to 0; t0: G = 0  -> returns [0, 1, 1]
    rewards = t([[0.0, 0.0, 1.0]])
    mask = t([[1, 0, 1]])
    _, ret = algo.compute_reinforce_plus_plus_advantage(rewards, mask, gamma=1.0)
    assert_close(ret, [[1.0, 0.0, 1.0]])
    _, ret_old = algo.compute_reinforce_plus_plus_advantage(rewards, mask, gamma=1.0, multi_turn=False)
    assert_close(ret_old, [[0.0, 1.0, 1.0]])


def test_reinforce_plus_plus_first_turn_advantage_carries_the_final_reward_hand_case():
    # Two episodes, two turns each: turn 1 = tokens 0-1, observation = tokens 2-3, turn 2 =
    # tokens 4-5, padding = token 6. Episode 0 wins (reward 1 on token 5), episode 1 scores 0.
    # gamma 0.5: episode 0's returns on its policy tokens are 0.5^(5-t) counted in policy
    # tokens only: t5 1, t4 0.5, t1 0.25, t0 0.125 (the observation is skipped, not counted).
    mask = [[1, 1, 0, 0, 1, 1, 0]] * 2
    rewards = [[0, 0, 0, 0, 0, 1.0, 0], [0.0] * 7]
    adv, ret = algo.compute_reinforce_plus_plus_advantage(t(rewards), t(mask), gamma=0.5)
    assert_close(ret, [[0.125, 0.25, 0, 0, 0.5, 1.0, 0], [0.0] * 7])
    # Whitening over the 8 policy tokens: values 0.125, 0.25, 0.5, 1 and four 0s.
    vals = [0.125, 0.25, 0.5, 1.0, 0, 0, 0, 0]
    mean = sum(vals) / 8
    var = sum((v - mean) ** 2 for v in vals) / 7  # unbiased, as masked_whiten
    first_turn = (0.125 - mean) / var ** 0.5
    assert adv[0, 0].item() == approx(first_turn, rel=1e-5)
    assert adv[0, 0].item() > adv[1, 0].item()  # the winner's first turn is credited over the loser's
    assert adv[0, 2].item() == 0.0 and adv[0, 6].item() == 0.0


@pytest.mark.parametrize("seed", SEEDS)
def test_reinforce_plus_plus_baseline_matches_reference_loop(seed):
    rewards, _, mask, index = random_batch(seed)
    adv, ret = algo.compute_reinforce_plus_plus_baseline_advantage(t(rewards), t(mask), index, epsilon=1e-6)
    expected = ref_rpp_baseline(rewards, mask, index)
    assert_close(adv, expected)
    assert_close(ret, expected)


# --------------------------------------------------------------------------- registry


ALL_KWARGS = dict(gamma=0.9, lam=0.95, epsilon=1e-6, norm_adv_by_std_in_grpo=True, unrelated_key="ignored")


@pytest.mark.parametrize(
    "name", ["gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"]
)
def test_registry_estimators_accept_full_kwargs(name):
    rewards, values, mask, index = random_batch(11)
    fn = algo.get_advantage_estimator(name)
    adv, ret = fn(token_level_rewards=t(rewards), response_mask=t(mask), index=index, values=t(values), **ALL_KWARGS)
    assert adv.shape == ret.shape == (8, 16)
    assert torch.isfinite(adv).all()


def test_registry_matches_direct_calls():
    rewards, values, mask, index = random_batch(12)
    kw = dict(token_level_rewards=t(rewards), response_mask=t(mask), index=index, values=t(values), **ALL_KWARGS)
    gae = algo.get_advantage_estimator(algo.AdvantageEstimator.GAE)(**kw)[0]
    assert torch.allclose(gae, algo.compute_gae_advantage_return(t(rewards), t(values), t(mask), 0.9, 0.95)[0])
    assert algo.get_advantage_estimator("grpo") is algo.compute_grpo_advantage
    assert algo.get_advantage_estimator("rloo") is algo.compute_rloo_advantage


def test_registry_gae_without_values_is_value_error():
    with pytest.raises(ValueError, match="values"):
        algo.get_advantage_estimator("gae")(token_level_rewards=torch.zeros(2, 3), response_mask=torch.ones(2, 3))
    with pytest.raises(ValueError, match="values"):
        algo.compute_gae_advantage_return(torch.zeros(2, 3), None, torch.ones(2, 3), 1.0, 1.0)


def test_registry_unknown_name_lists_known_names():
    with pytest.raises(ValueError) as err:
        algo.get_advantage_estimator("ppo_magic")
    for name in ("gae", "grpo", "rloo", "reinforce_plus_plus", "reinforce_plus_plus_baseline"):
        assert name in str(err.value)


def test_register_custom_estimator():
    @algo.register_advantage_estimator("test_constant_one")
    def constant_one(token_level_rewards, response_mask, **kwargs):
        ones = torch.ones_like(token_level_rewards) * response_mask
        return ones, ones

    fn = algo.get_advantage_estimator("test_constant_one")
    adv, _ = fn(token_level_rewards=torch.zeros(1, 2), response_mask=t([[1, 0]]), index=["x"], gamma=1.0)
    assert adv.tolist() == [[1.0, 0.0]]
