"""A scripted expert that fails (issue 43, item 6).

An expert that returned None killed the SFT warm-up with `ValueError: You need to specify
either text or text_target` (the tokenizer's words), one that raised ended it with a raw
`KeyError`; neither named the expert or the episode. Now each failure is an
`ExpertFailedWarning` naming the expert, the episode (and its seed) and the turn, that
demonstration is skipped, and the warm-up goes on with the others; an expert that fails on
every episode is an `ExpertError` naming it.

Real trainers on the tiny model; the environment is guess_number with an expert that fails
on some seeds.
"""
from __future__ import annotations

import warnings

import pytest

from envs.guess_number import GuessNumberEnv
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.training.sft import DEMONSTRATION_SEED_BASE, ExpertError, ExpertFailedWarning


class FlakyExpertEnv(GuessNumberEnv):
    """guess_number whose expert returns None at turn 1 of seeds = 1 (mod 4) and raises a
    KeyError at turn 0 of seeds = 2 (mod 4); every seed fails when `always` is set."""

    always = False

    def expert_action(self):
        seed = self._seed - DEMONSTRATION_SEED_BASE
        if self.always or (seed % 4 == 2 and self.step_count == 0):
            raise KeyError("lo_bound")
        if seed % 4 == 1 and self.step_count == 1:
            return None
        return super().expert_action()


class AlwaysFailingEnv(FlakyExpertEnv):
    always = True


def _trainer(tiny_model_path, tmp_path, env_cls):
    config = tiny_config(tiny_model_path, tmp_path)
    config.sft.steps, config.sft.episodes = 1, 4
    config.inference.max_turns = config.environment.max_steps = 3
    return Trainer(config.validate(), environment=env_cls(config.environment))


def test_a_failing_expert_names_itself_the_episode_and_the_turn_and_sft_goes_on(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, FlakyExpertEnv)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(steps=1)  # the SFT warm-up's step
    notes = [str(w.message) for w in caught if issubclass(w.category, ExpertFailedWarning)]
    assert len(notes) == 2, notes
    raised = next(n for n in notes if "raised" in n)
    assert "FlakyExpertEnv.expert_action raised KeyError: 'lo_bound'" in raised
    assert f"demonstration episode 2 (seed {DEMONSTRATION_SEED_BASE + 2}), turn 0" in raised
    none = next(n for n in notes if "returned" in n)
    assert "FlakyExpertEnv.expert_action returned NoneType" in none
    assert f"demonstration episode 1 (seed {DEMONSTRATION_SEED_BASE + 1}), turn 1" in none
    assert all("that demonstration is skipped" in n for n in notes)
    demos = trainer.demonstrations()
    assert sorted(ep.env_seed - DEMONSTRATION_SEED_BASE for ep in demos) == [0, 3]
    assert demos.meta["skipped"] == 2 and not any(ep.error for ep in demos)
    assert trainer.global_step == 1 and trainer.metrics_history[-1]["sft/episodes"] == 2.0
    assert trainer.demonstrations() is demos  # kept: not played again on the next step


def test_an_expert_that_fails_on_every_episode_is_an_error_naming_it(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, AlwaysFailingEnv)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExpertFailedWarning)
        with pytest.raises(ExpertError, match=r"AlwaysFailingEnv.expert_action failed on all 4 demonstration "
                                              r"episodes.*raised KeyError"):
            trainer.fit(steps=1)
    assert trainer.global_step == 0
