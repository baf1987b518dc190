"""Episodes that end in an environment error are seen and left out of the update.

An environment whose `step` raises for some seeds (after the model's first reply): those
episodes have trained tokens, but their reward is the environment's failure. The step names
them on the console (share, first error, episode ids), the run doctor's environment-errors
check fires with them as evidence, and the update equals the update of the batch without them
(`batch.select` of the episodes that ran: the independent reference). A batch where every
episode hit an environment error is skipped with a warning naming the error, and the doctor
says so.
"""
from __future__ import annotations

import copy

import pytest
import torch

from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.doctor.checks import run_checks
from workbench.doctor.findings import History
from workbench.environments.base import BaseEnvironment, StepResult
from workbench.training.trainer import NothingToTrainWarning


class BrokenStep(BaseEnvironment):
    """Two replies per episode, rewarded by length; the first step of seeds in `params["broken"]` raises."""

    def reset(self) -> str:
        return "Say something."

    def step(self, action: str) -> StepResult:
        if self._seed in self.params["broken"]:
            raise RuntimeError(f"the game server refused the move (seed {self._seed})")
        return "Again.", float(len(action) % 5), self.step_count >= 1, {}


def _trainer(tiny_model_path, tmp_path, broken):
    config = tiny_config(tiny_model_path, tmp_path, batch_size=8, group_size=2)
    config.model.dtype = "float32"
    config.inference.temperature = 1.0
    env = BrokenStep()
    env.params["broken"] = list(broken)
    return Trainer(config, environment=env, dataset=[0, 1, 2, 3])


def test_environment_errors_are_named_and_left_out_of_the_update(tiny_model_path, tmp_path, capsys):
    trainer = _trainer(tiny_model_path, tmp_path, broken=[1])
    start = copy.deepcopy(trainer.policy.trainable_state_dict())
    opt_state = copy.deepcopy(trainer.optimizer.state_dict())
    metrics = trainer.fit(steps=1)[-1]  # fit: the step line and the doctor's per-step lines
    batch = trainer.last_batch
    hit = [i for i, ep in enumerate(batch) if ep.environment_error]
    assert len(hit) == 2 and all(batch[i].response_length > 0 for i in hit)  # they sampled, then the env failed
    assert batch.untrained_rows() == hit and metrics["env/environment_error_rate"] == 0.25
    line = capsys.readouterr().out
    assert "2 of 8 episodes (25%) ended in an environment error and are left out of the update" in line
    assert "first error: RuntimeError: the game server refused the move (seed 1)" in line
    assert "environment-errors" in line  # the doctor's line
    finding = run_checks(History().add(batch, 0), names=["environment-errors"])[0]
    assert finding.fired and finding.value == 0.25 and sorted(e.episode_id for e in finding.evidence) == hit
    with_errors = copy.deepcopy(trainer.policy.trainable_state_dict())

    # the reference: the same update of the same weights on the batch that never held those episodes
    reference = batch.select([i for i in range(len(batch)) if i not in hit])
    trainer.policy.load_trainable_state_dict(start)
    trainer.optimizer.load_state_dict(opt_state)
    trainer.compute_advantages(reference)
    trainer.update(reference)
    without = trainer.policy.trainable_state_dict()
    assert max(float((without[k] - start[k]).abs().max()) for k in start) > 1e-4
    assert max(float((with_errors[k] - without[k]).abs().max()) for k in start) <= 1e-6


def test_a_batch_where_every_episode_hit_an_environment_error_says_so(tiny_model_path, tmp_path, capsys):
    trainer = _trainer(tiny_model_path, tmp_path, broken=[0, 1, 2, 3])
    with pytest.warns(NothingToTrainWarning, match="all 8 episodes of this batch ended in an environment error"):
        metrics = trainer.fit(steps=1)[-1]
    assert metrics["actor/skipped_updates"] == 1.0 and metrics["env/environment_error_rate"] == 1.0
    out = capsys.readouterr().out
    assert "8 of 8 episodes (100%) ended in an environment error" in out and "environment-errors" in out
