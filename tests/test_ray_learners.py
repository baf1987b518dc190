"""Data-parallel learners (Ray actors, one gloo process group, FSDP2) equal one process.

Each case builds a `Trainer` (the independent reference), samples a real ragged batch with
the tiny model, loads the trainer's starting weights into a 2-learner and a 1-learner
`LearnerGroup`, and runs one update (all PPO epochs) on copies of the same batch. Weights,
metrics and the batch fields the update writes must agree within 1e-5 with each other and
with `Trainer.update`. One Ray cluster for the module; the LoRA groups (with a critic, so
they serve GRPO and PPO cases) are built once and reset through `load_state_dict`.
"""
from __future__ import annotations

import copy

import pytest
import torch

ray = pytest.importorskip("ray")

from envs import make_env  # noqa: E402
from tests.test_trainer import tiny_config  # noqa: E402
from workbench import Trainer  # noqa: E402
from workbench.distributed import LearnerGroup  # noqa: E402
from workbench.training.update import lengths_of, plan_update, shard_plan, split_groups  # noqa: E402

pytestmark = pytest.mark.ray

TOL = 1e-5
#: Batch fields the update writes (compared with the trainer's).
FIELDS = ("new_logprobs", "ratio", "entropy")
#: Token-fraction metrics: under a seq-mean-* mode one process averages them over micro-batches
#: weighted by sequences, so their value depends on how rows fall into micro-batches (which
#: differs between 1 and 2 ranks); with token-mean they are exact token means and compared.
GROUPING_DEPENDENT = ("actor/pg_clipfrac", "actor/pg_clipfrac_lower", "actor/ppo_kl")
#: Per case: the training settings (on top of tiny_config's, 8 episodes in groups of 2).
CASES = {
    # Two epochs of two mini-batches: the ranks hold different numbers of micro-batches
    # in some mini-batch, so zero-weight padding runs.
    "grpo-token-mean": dict(ppo_epochs=2, mini_batch_size=4),
    "grpo-seq-mean-token-mean": dict(loss_agg_mode="seq-mean-token-mean", entropy_coeff=0.01),
    "grpo-seq-mean-token-sum-norm": dict(loss_agg_mode="seq-mean-token-sum-norm"),  # divides by the batch's T
    "ppo-critic-token-mean": dict(adv_estimator="gae", ppo_epochs=2),
    "ppo-critic-seq-mean-token-mean": dict(adv_estimator="gae", loss_agg_mode="seq-mean-token-mean"),
}


def _config(tiny_model_path, tmp_path, **training):
    c = tiny_config(tiny_model_path, tmp_path, **{"batch_size": 8, "group_size": 2, **training})
    c.model.dtype = "float32"  # equal to one process within 1e-5: an fp32 comparison (bf16 rounds per shape)
    return c


@pytest.fixture(scope="module")
def lora_groups(ray_cluster, tiny_model_path, tmp_path_factory):
    config = _config(tiny_model_path, tmp_path_factory.mktemp("lora"), adv_estimator="gae")
    groups = {n: LearnerGroup(copy.deepcopy(config), n) for n in (2, 1)}
    yield groups
    for g in groups.values():
        g.shutdown()


def _trainer_and_batch(config):
    trainer = Trainer(config, environment=make_env("guess_number"))
    batch = trainer.rollout()
    trainer.score(batch)
    trainer.compute_advantages(batch)
    return trainer, batch


def _start_state(trainer: Trainer) -> dict[str, dict[str, torch.Tensor]]:
    state = {"policy": trainer.policy.trainable_state_dict()}
    if trainer.critic is not None:
        state["critic"] = trainer.critic.trainable_state_dict()
    return state


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert set(a) == set(b)
    return max(float((a[k].float() - b[k].float()).abs().max()) for k in a)


def _compared(metrics: dict[str, float], config) -> list[str]:
    skip = GROUPING_DEPENDENT if config.training.loss_agg_mode != "token-mean" else ()
    return [k for k in metrics if k.startswith(("actor/", "critic/")) and k not in skip]


def _compare(trainer, batch, groups, config):
    """Update the trainer and every group on copies of `batch`; return the max differences."""
    start = _start_state(trainer)
    for g in groups.values():
        g.config = copy.deepcopy(config)
        g.load_state_dict(start)
        assert _max_diff(g.state_dict()["policy"], start["policy"]) == 0.0  # shard + gather round trip
    copies = {n: copy.deepcopy(batch) for n in groups}
    expected = trainer.update(batch)
    got = {n: g.update(copies[n], step=trainer.global_step) for n, g in groups.items()}
    ref = _start_state(trainer)
    diffs = {}
    for n, g in groups.items():
        state = g.state_dict()
        moved = _max_diff(ref["policy"], start["policy"])
        assert moved > 10 * TOL, "the update must move the weights for the comparison to mean anything"
        d = {f"{name} weights": _max_diff(state[name], ref[name]) for name in ref}
        for k in _compared(expected, config):
            d[k] = abs(got[n][k] - expected[k])
        for f in FIELDS:  # relative where values exceed 1 (the ratio: exp of a logprob difference)
            mine, theirs = getattr(copies[n], f), getattr(batch, f)
            d[f] = float(((mine - theirs).abs() / theirs.abs().clamp(min=1)).max())
        assert set(got[n]) == set(expected)
        diffs[n] = d
    for n, d in diffs.items():
        worst = {k: v for k, v in d.items() if not v <= TOL}
        assert not worst, f"{n} learner(s) differ from Trainer.update: {worst}"
    # 2 learners against 1 learner, directly.
    assert _max_diff(groups[2].state_dict()["policy"], groups[1].state_dict()["policy"]) <= TOL
    for k in _compared(got[1], config):
        assert abs(got[2][k] - got[1][k]) <= TOL, k
    return diffs


@pytest.mark.parametrize("case", list(CASES))
def test_two_learners_equal_one_and_the_trainer_lora(lora_groups, tiny_model_path, tmp_path, case):
    config = _config(tiny_model_path, tmp_path, **CASES[case])
    trainer, batch = _trainer_and_batch(config)
    t = config.training
    shards = split_groups(batch, 2)
    tokens = [float(batch.loss_mask[s].sum()) for s in shards]
    assert tokens[0] != tokens[1], "want ranks holding different token counts"
    if case == "grpo-token-mean":  # some mini-batch must be padded with zero-weight micro-batches
        plans = shard_plan(plan_update(batch, t, trainer.global_step), batch, shards, t)
        own = [[-(-len(m.rows) // t.micro_batch_size) for m in p.mini_batches] for p in plans]
        assert any(o < m.micro_steps for p, counts in zip(plans, own) for o, m in zip(counts, p.mini_batches))
    diffs = _compare(trainer, batch, lora_groups, config)
    print(case, diffs)


def test_compute_log_probs_equal_trainer(lora_groups, tiny_model_path, tmp_path):
    config = _config(tiny_model_path, tmp_path)
    trainer, batch = _trainer_and_batch(config)
    lora_groups[2].load_state_dict(_start_state(trainer))
    lp = lora_groups[2].compute_log_probs(batch)
    assert float(lp.abs().sum()) > 0
    mask = batch.loss_mask  # (B, T)
    assert torch.equal(lp, lp * mask)
    assert float((lp - batch.old_logprobs * mask).abs().max()) <= TOL


def test_two_learners_equal_one_and_the_trainer_full_finetuning(ray_cluster, tiny_model_path, tmp_path):
    config = _config(tiny_model_path, tmp_path, loss_agg_mode="seq-mean-token-mean", ppo_epochs=2,
                     mini_batch_size=4)
    config.model.use_lora = False
    config.training.learning_rate = 1e-4
    trainer, batch = _trainer_and_batch(config.validate())
    assert len(set(lengths_of(batch))) > 1
    groups = {n: LearnerGroup(copy.deepcopy(config), n) for n in (2, 1)}
    try:
        diffs = _compare(trainer, batch, groups, config)
        print("full", diffs)
    finally:
        for g in groups.values():
            g.shutdown()


def test_a_rank_holding_only_failed_episodes_pads_and_equals_one_process(lora_groups, tiny_model_path, tmp_path):
    """A group whose episodes all failed at reset (no token at all) is the only group of one
    rank: that rank runs zero-weight forwards only, and the update equals one process's."""
    from tests.faults.test_failed_episodes import flaky

    config = _config(tiny_model_path, tmp_path, batch_size=4, group_size=2)
    trainer = Trainer(config, environment=flaky("ray", {1: 2}), dataset=[0, 1])
    batch = trainer.rollout()
    trainer.score(batch)
    trainer.compute_advantages(batch)
    assert batch.untrained_rows() == [2, 3] and {batch[i].num_tokens for i in (2, 3)} == {0}
    shards = split_groups(batch, 2)
    assert sorted(float(batch.loss_mask[s].sum()) == 0 for s in shards) == [False, True]
    assert len({ep.score for ep in batch.episodes[:2]}) == 2, "the group that ran needs reward variance"
    lora_groups[2].load_state_dict(_start_state(trainer))
    lp = lora_groups[2].compute_log_probs(batch)
    assert float((lp - batch.old_logprobs).abs().max()) <= TOL and float(lp[2:].abs().sum()) == 0.0
    _compare(trainer, batch, lora_groups, config)


@pytest.mark.filterwarnings("ignore::workbench.training.trainer.ZeroVarianceWarning")
def test_more_learners_than_groups_is_refused(lora_groups, tiny_model_path, tmp_path):
    config = _config(tiny_model_path, tmp_path, batch_size=2, group_size=2)
    trainer, batch = _trainer_and_batch(config)
    with pytest.raises(ValueError, match="1 episode groups cannot be split over 2 learners"):
        lora_groups[2].update(batch)


def test_nonfinite_loss_on_one_rank_skips_the_step_on_every_rank(lora_groups, tiny_model_path, tmp_path):
    config = _config(tiny_model_path, tmp_path)
    trainer, batch = _trainer_and_batch(config)
    row = split_groups(batch, 2)[1][0]  # a row of rank 1 only
    batch.advantages[row] = torch.where(batch.loss_mask[row] > 0, float("nan"), 0.0)
    start = _start_state(trainer)
    group = lora_groups[2]
    group.config = copy.deepcopy(config)
    group.load_state_dict(start)
    expected = trainer.update(copy.deepcopy(batch))
    got = group.update(batch, step=trainer.global_step)
    assert expected["actor/skipped_updates"] == got["actor/skipped_updates"] == 1.0
    assert got["actor/skipped_reason"] == expected["actor/skipped_reason"] == "non-finite loss or gradient"
    assert "actor/grad_norm" not in got
    assert _max_diff(group.state_dict()["policy"], start["policy"]) == 0.0
    assert _max_diff(_start_state(trainer)["policy"], start["policy"]) == 0.0


def test_episodes_of_several_sequences_train_the_same_on_learners(lora_groups, tiny_model_path, tmp_path):
    """"rendered" history with a template that re-renders earlier turns: every later turn is a
    sequence of its own (`position_ids` in the batch); the learners' logprobs and update equal
    one process's."""
    import json
    import shutil

    from tests.test_token_exactness import STRIP_EARLIER_ASSISTANT

    folder = tmp_path / "model"
    shutil.copytree(tiny_model_path, folder)
    # earlier replies rendered empty; a saved chat_template.jinja wins over tokenizer_config.json
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    tok_cfg = json.loads((folder / "tokenizer_config.json").read_text())
    tok_cfg["chat_template"] = STRIP_EARLIER_ASSISTANT
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg))
    config = _config(tiny_model_path, tmp_path)
    config.model.model_name = str(folder)
    trainer, batch = _trainer_and_batch(config.validate())
    assert trainer.tokenizer.chat_template == STRIP_EARLIER_ASSISTANT
    assert all(ep.history == "rendered" for ep in batch) and sum(len(ep.segments) for ep in batch) >= 4
    assert "position_ids" in batch.tensors
    lora_groups[2].load_state_dict(_start_state(trainer))
    lp = lora_groups[2].compute_log_probs(batch)
    assert float((lp - batch.old_logprobs * batch.loss_mask).abs().max()) <= TOL
    _compare(trainer, batch, lora_groups, config)
