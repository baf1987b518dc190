"""Faults of one episode's data that used to sink a whole batch, a save or an update.

1. an observation with invalid UTF-8 (a lone surrogate, as `bytes.decode(errors=
   "surrogateescape")` makes), at reset or at a step, and a `get_prompt_prefix` that
   raises: that episode ends with an error naming the cause, the others finish;
2. a numpy array (and numpy scalars) in a step's `info`: `batch.save` writes them as
   JSON (lists, numbers) and the batch loads back;
3. every episode failing at reset: `Trainer.train_step` skips the update with a warning
   naming the episodes' errors, not a reshape error from inside the update.

Environments are real `BaseEnvironment` subclasses; generation uses the tiny model.
"""
from __future__ import annotations

import numpy as np
import pytest

from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.environments.base import BaseEnvironment, StepResult  # noqa: F401
from workbench.rollout import Rollout
from workbench.rollout.async_rollout import AsyncRollout
from workbench.training.trainer import NothingToTrainWarning
from workbench.trajectory import TrajectoryBatch

BAD_TEXT = "caf\udce9 au lait"  # b"caf\xe9 au lait".decode("utf-8", "surrogateescape")


class Quirky(BaseEnvironment):
    """Say anything twice. Config params pick one fault: `bad_reset`, `bad_step` (an
    observation with a lone surrogate), `bad_prefix` (get_prompt_prefix raises),
    `numpy_info` (numpy values in `info`), `fail_reset` (reset raises)."""

    def get_prompt_prefix(self) -> str:
        if self.params.get("bad_prefix"):
            raise KeyError("prompt_template")
        return "Say anything."

    def reset(self) -> str:
        if self.params.get("fail_reset"):
            raise RuntimeError(f"no level file for seed {self._seed}")
        return BAD_TEXT if self.params.get("bad_reset") else "Go."

    def step(self, action: str) -> StepResult:
        self.step_count += 1
        info = {"success": self.step_count >= 2}
        if self.params.get("numpy_info"):
            info.update(board=np.arange(6).reshape(2, 3), score=np.float32(0.5), hits=np.int64(3),
                        flags=np.array([True, False]), nested={"v": np.zeros(2)})
        obs = BAD_TEXT if self.params.get("bad_step") else "Again."
        return obs, 1.0, self.step_count >= 2, info


def _env(**params) -> Quirky:
    env = Quirky()
    env.params.update(params)
    return env


@pytest.mark.parametrize("cls", [Rollout, AsyncRollout], ids=["sync", "async"])
@pytest.mark.parametrize("fault", ["bad_reset", "bad_step", "bad_prefix"])
def test_one_bad_observation_or_prefix_ends_that_episode_only(tiny_engine, cls, fault):
    envs = [_env(), _env(**{fault: True}), _env(), _env()]
    batch = cls(tiny_engine, envs, seeds=[0, 0, 1, 1], max_turns=3, max_tokens=4, temperature=0.0).run()
    assert len(batch) == 4
    bad = batch.episodes[1]
    assert bad.error and bad.done
    expected = {"bad_reset": "observation", "bad_step": "observation", "bad_prefix": "get_prompt_prefix"}[fault]
    assert expected in bad.error, bad.error
    if fault != "bad_prefix":
        assert "UTF-8" in bad.error
    for ep in (batch.episodes[0], batch.episodes[2], batch.episodes[3]):
        assert not ep.error and ep.done and len(ep.turns) == 2


def test_numpy_values_in_info_are_saved_as_json(tiny_engine, tmp_path):
    batch = Rollout(tiny_engine, [_env(numpy_info=True), _env(numpy_info=True)], seeds=[0, 1], max_turns=2,
                    max_tokens=4, temperature=0.0).run()
    assert not any(ep.error for ep in batch)
    for name in ("batch.jsonl", "batch.jsonl.gz"):
        path = batch.save(tmp_path / name)
        info = TrajectoryBatch.load(path).episodes[0].turns[0].info
        assert info["board"] == [[0, 1, 2], [3, 4, 5]] and info["score"] == 0.5 and info["hits"] == 3
        assert info["flags"] == [True, False] and info["nested"] == {"v": [0.0, 0.0]}


def test_every_episode_failing_at_reset_names_the_errors(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=_env(fail_reset=True))
    with pytest.warns(NothingToTrainWarning, match=r"all 4 episodes.*no level file for seed") as info:
        metrics = trainer.train_step()
    assert not any("reshape" in str(w.message) for w in info)
    assert metrics["actor/skipped_updates"] == 1.0 and metrics["rollout/failed_episodes"] == 4.0
    assert trainer.global_step == 1  # the step counts; nothing was trained
