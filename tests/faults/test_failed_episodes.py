"""Episodes that fail before the model takes a turn never reach a forward pass.

An OpenEnv server at capacity, an environment whose `reset` raises under load, a gateway
agent that never calls the model: such episodes come back with no token at all. Before,
one of them in a batch made `update_actor` build a micro-batch of empty rows and the
model's forward failed ("cannot reshape tensor of 0 elements"), killing the run at step 0.

Here 3 of 8 episodes fail at reset (a whole GRPO group and one member of another). The
step trains, counts them (`rollout/failed_episodes`), names them on a line, and the update
equals the update of the batch without them (the independent reference: `batch.select`
of the episodes that ran, which holds no failed row). A batch in which every episode
failed is skipped with a warning and the step counter moves on. The Ray learners' case
(a rank whose shard holds only failed episodes) is in `tests/test_ray_learners.py`.
"""
from __future__ import annotations

import copy
import threading

import pytest
import torch

from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.environments.base import BaseEnvironment, StepResult
from workbench.training.trainer import NothingToTrainWarning

#: Resets that still have to fail, per (test key, seed): shared by every copy of the env.
_FAILS: dict[tuple[str, int], int] = {}
_LOCK = threading.Lock()


class FlakyReset(BaseEnvironment):
    """One reply per episode, rewarded by its length (so GRPO groups have variance).
    `params["fail"]` maps a seed to how many of its resets raise (the first ones)."""

    def reset(self) -> str:
        key = (self.params["key"], self._seed)
        with _LOCK:
            left = _FAILS.get(key, 0)
            if left:
                _FAILS[key] = left - 1
                raise ConnectionError(f"server at capacity (seed {self._seed})")
        return "Say something."

    def step(self, action: str) -> StepResult:
        return "Done.", float(len(action) % 5), True, {}


def flaky(key: str, fail: dict[int, int]) -> FlakyReset:
    with _LOCK:
        for seed, n in fail.items():
            _FAILS[(key, seed)] = n
    env = FlakyReset()
    env.params["key"] = key
    return env


def _trainer(tiny_model_path, tmp_path, env, **training):
    config = tiny_config(tiny_model_path, tmp_path, **{"batch_size": 8, "group_size": 2, **training})
    config.model.dtype = "float32"
    config.inference.temperature = 1.0
    return Trainer(config, environment=env, dataset=[0, 1, 2, 3])


def test_three_of_eight_failing_at_reset_train_one_step_and_are_named(tiny_model_path, tmp_path, capsys):
    trainer = _trainer(tiny_model_path, tmp_path, flaky("step", {3: 2, 1: 1}))
    before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
    metrics = trainer.train_step()
    batch = trainer.last_batch
    failed = [i for i, ep in enumerate(batch) if ep.error]
    assert len(failed) == 3 and batch.untrained_rows() == failed
    assert metrics["rollout/failed_episodes"] == 3.0
    assert metrics["actor/skipped_updates"] == 0.0 and trainer.global_step == 1
    line = capsys.readouterr().out
    assert "3 of 8 episodes failed before the model took a turn" in line
    assert "server at capacity (seed 3)" in line and "server at capacity (seed 1)" in line
    after = trainer.policy.trainable_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before), "the step must train"
    assert all(torch.isfinite(v).all() for v in after.values())


def test_failed_episodes_change_nothing_in_the_update(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, flaky("equal", {3: 2, 1: 1}), micro_batch_size=3)
    batch = trainer.rollout()
    trainer.score(batch)
    ran = [i for i in range(len(batch)) if i not in batch.untrained_rows()]
    assert len(ran) == 5
    reference = batch.select(ran)  # the independent reference: a batch that never held a failed row
    trainer.compute_advantages(batch)
    trainer.compute_advantages(reference)
    # The failed member of group seed1 is no member of its baseline: advantages as without it.
    for j, i in enumerate(ran):
        T = batch[i].num_tokens
        assert torch.allclose(batch.advantages[i, :T], reference.advantages[j, :T], atol=1e-6)
        assert torch.allclose(batch.old_logprobs[i, :T], reference.old_logprobs[j, :T], atol=1e-6)
    assert float(batch.advantages[batch.untrained_rows()].abs().sum()) == 0.0
    start = copy.deepcopy(trainer.policy.trainable_state_dict())
    opt_state = copy.deepcopy(trainer.optimizer.state_dict())
    got = trainer.update(batch)
    with_failed = copy.deepcopy(trainer.policy.trainable_state_dict())
    trainer.policy.load_trainable_state_dict(start)
    trainer.optimizer.load_state_dict(opt_state)
    expected = trainer.update(reference)
    without = trainer.policy.trainable_state_dict()
    moved = max(float((without[k] - start[k]).abs().max()) for k in start)
    assert moved > 1e-4
    assert max(float((with_failed[k] - without[k]).abs().max()) for k in start) <= 1e-6
    for k in ("actor/pg_loss", "actor/entropy", "actor/grad_norm"):
        assert got[k] == pytest.approx(expected[k], rel=1e-5, abs=1e-7), k


def test_failed_episodes_with_a_critic_and_a_reference(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, flaky("ppo", {3: 2, 0: 1}), adv_estimator="gae",
                       use_kl_loss=True, ppo_epochs=2, mini_batch_size=4)
    metrics = trainer.train_step()
    batch = trainer.last_batch
    assert metrics["rollout/failed_episodes"] == 3.0
    for name in ("values", "ref_logprobs", "old_logprobs", "advantages"):
        assert float(getattr(batch, name)[batch.untrained_rows()].abs().sum()) == 0.0, name
        assert torch.isfinite(getattr(batch, name)).all(), name
    assert metrics["actor/skipped_updates"] == 0.0
    assert all(v == v for k, v in metrics.items() if k.startswith("critic/")), metrics


def test_a_batch_where_every_episode_failed_is_skipped_with_a_warning(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, flaky("all", {s: 2 for s in range(4)}))
    before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
    with pytest.warns(NothingToTrainWarning, match=r"step 0 is skipped: all 8 episodes.*server at capacity"):
        metrics = trainer.train_step()
    assert metrics["actor/skipped_updates"] == 1.0 and metrics["rollout/failed_episodes"] == 8.0
    assert trainer.global_step == 1
    after = trainer.policy.trainable_state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    metrics = trainer.train_step()  # the failures are used up: the next step trains
    assert metrics["rollout/failed_episodes"] == 0.0 and trainer.global_step == 2


def test_a_gateway_agent_that_never_calls_the_model_is_left_out(tiny_model_path, tmp_path):
    pytest.importorskip("openai")
    from tests.test_gateway import TASKS, chatty_agent
    from workbench.gateway import GatewayRollout

    calls = {"n": 0}

    def agent(base_url: str, episode_id: str, task: dict) -> float:
        with _LOCK:
            calls["n"] += 1
            silent = calls["n"] <= 2  # the first two agents answer without asking the model
        return 0.0 if silent else chatty_agent(base_url, episode_id, task)

    trainer = _trainer(tiny_model_path, tmp_path, flaky("gateway", {}), batch_size=4, group_size=4,
                       learning_rate=1e-2)
    batch = GatewayRollout(trainer.engine, agent, [TASKS[0]], group_size=4, max_turns=2, seed=11).run()
    assert sorted(ep.response_length == 0 for ep in batch) == [False, False, True, True]
    assert batch.summary()["rollout/failed_episodes"] == 2.0
    trainer.score(batch)
    trainer.compute_advantages(batch)
    before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
    metrics = trainer.update(batch)
    assert metrics["actor/skipped_updates"] == 0.0
    after = trainer.policy.trainable_state_dict()
    assert all(torch.isfinite(v).all() for v in after.values())
    ran = [i for i in range(4) if i not in batch.untrained_rows()]
    if batch[ran[0]].score != batch[ran[1]].score:  # the two that ran differ: the step must train
        assert any(not torch.equal(before[k], after[k]) for k in before)
