"""The end of a run is always saved.

Before, checkpoints were written every `checkpoint.save_interval` steps and not at the end,
so `train --steps 7` with the default interval of 5 lost steps 6 and 7: `workbench diff`
and `fork(policy=run.checkpoints[-1])` had nothing of the final policy to load.
"""
from __future__ import annotations

import json

import pytest
import torch

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.cli import main
from workbench.training import checkpoint as ckpt


def _steps(folder) -> list[int]:
    return [int(p.name.split("_")[1]) for p in ckpt.list_checkpoints(folder)]


def test_cli_train_7_steps_with_save_interval_5_leaves_step_7(tmp_path, tiny_model_path):
    out = tmp_path / "run"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "7", "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "1", "--eval-episodes", "0", "--save-interval", "5",
                 "--output", str(out)]) == 0
    assert _steps(out / "checkpoints") == [5, 7]
    state = json.loads((out / "checkpoints" / "step_000007" / "trainer_state.json").read_text())
    assert state["global_step"] == 7 and len(state["metrics_history"]) == 7


def test_fit_saves_the_last_step_once_and_resumes_from_it(tmp_path, tiny_model_path):
    config = tiny_config(tiny_model_path, tmp_path)
    config.checkpoint.save_interval = 2
    trainer = Trainer(config, environment=make_env("guess_number"))
    trainer.fit(steps=2)  # step 2 is both an interval step and the last: written once
    assert _steps(config.checkpoint.output_dir) == [2]
    trainer.fit(steps=1)
    assert _steps(config.checkpoint.output_dir) == [2, 3]
    final = trainer.policy.trainable_state_dict()
    again = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"))
    assert again.resume().name == "step_000003"
    assert again.global_step == 3
    assert all(torch.equal(final[k], v) for k, v in again.policy.trainable_state_dict().items())


def test_ctrl_c_between_steps_saves_the_last_finished_step(tmp_path, tiny_model_path):
    config = tiny_config(tiny_model_path, tmp_path)
    config.checkpoint.save_interval = 10
    trainer = Trainer(config, environment=make_env("guess_number"))

    def interrupt_in_step_3_rollout(tr, metrics):
        if tr.global_step == 2:
            tr.rollout = _raise_keyboard_interrupt  # the next step's rollout is where Ctrl-C lands

    with pytest.raises(KeyboardInterrupt):
        trainer.fit(steps=5, callbacks=[interrupt_in_step_3_rollout])
    assert trainer.global_step == 2 and _steps(config.checkpoint.output_dir) == [2]
    saved = ckpt.read_checkpoint(ckpt.list_checkpoints(config.checkpoint.output_dir)[-1])
    weights = trainer.policy.trainable_state_dict()
    assert all(torch.equal(saved["tensors"]["policy"][k], weights[k]) for k in weights)


def test_ctrl_c_inside_an_update_saves_nothing_and_says_so(tmp_path, tiny_model_path, capsys):
    config = tiny_config(tiny_model_path, tmp_path)
    config.checkpoint.save_interval = 10
    trainer = Trainer(config, environment=make_env("guess_number"))
    real_update = trainer.update

    def update(batch):
        if trainer.global_step == 1:
            raise KeyboardInterrupt
        return real_update(batch)

    trainer.update = update
    with pytest.raises(KeyboardInterrupt):
        trainer.fit(steps=3)
    assert trainer.global_step == 1 and _steps(config.checkpoint.output_dir) == []
    assert "interrupted inside the update of step 1" in capsys.readouterr().out


def _raise_keyboard_interrupt():
    raise KeyboardInterrupt
