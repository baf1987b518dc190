"""Progress bars (forced on: totals; off or automatic in CI: silent) and `fit(steps=N)`."""
from __future__ import annotations

import re

import pytest

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.training.trainer import FitTargetReachedWarning
from workbench.utils.progress import progress_enabled


def make_trainer(tiny_model_path, tmp_path, **training) -> Trainer:
    training.setdefault("loggers", [])
    return Trainer(tiny_config(tiny_model_path, tmp_path, **training), environment=make_env("guess_number"))


def renders(text: str, desc: str) -> list[tuple[int, int]]:
    """(n, total) of every render of the `desc` bars in tqdm's text output, in order."""
    parts = re.split(r"[\r\n]", text)
    return [(int(m[1]), int(m[2])) for p in parts if (m := re.search(rf"{desc}: +\d+%.*?\| (\d+)/(\d+) ", p))]


def test_fit_steps_adds_steps_until_step_and_epochs_are_absolute(tiny_model_path, tmp_path):
    trainer = make_trainer(tiny_model_path, tmp_path)
    trainer.fit(steps=2)
    assert trainer.global_step == 2 and len(trainer.metrics_history) == 2
    trainer.fit(steps=2)  # the same cell run again trains 2 more
    assert trainer.global_step == 4
    assert [m["step"] for m in trainer.metrics_history] == [0, 1, 2, 3]
    with pytest.warns(FitTargetReachedWarning, match="already at the absolute target step 3"):
        trainer.fit(until_step=3)
    assert trainer.global_step == 4
    with pytest.warns(FitTargetReachedWarning):
        trainer.fit(num_epochs=1, num_iters_per_epoch=4)  # old form: absolute step 4, reached
    assert trainer.global_step == 4
    trainer.fit(num_epochs=1, num_iters_per_epoch=5)  # old form: up to absolute step 5
    assert trainer.global_step == 5
    trainer.fit(until_step=6)
    assert trainer.global_step == 6 and len(trainer.metrics_history) == 6
    with pytest.raises(ValueError, match="not both"):
        trainer.fit(steps=1, until_step=9)
    with pytest.raises(ValueError, match="integer >= 0"):
        trainer.fit(steps=-1)


def test_fit_steps_counts_from_the_resumed_step(tiny_model_path, tmp_path):
    first = make_trainer(tiny_model_path, tmp_path)
    first.config.checkpoint.save_interval = 1
    first.fit(steps=2)
    resumed = make_trainer(tiny_model_path, tmp_path)  # checkpoint.resume=True: resumes at step 2
    resumed.fit(steps=1)
    assert resumed.global_step == 3
    assert [m["step"] for m in resumed.metrics_history] == [0, 1, 2]


def test_bars_show_their_totals_when_forced_on(tiny_model_path, tmp_path, capsys, monkeypatch):
    monkeypatch.setenv("CI", "1")  # forced on wins over CI
    trainer = make_trainer(tiny_model_path, tmp_path, progress=True)
    capsys.readouterr()
    trainer.rollout()
    shown = renders(capsys.readouterr().err, "rollout")
    assert {total for _, total in shown} == {4} and shown[-1] == (4, 4)  # batch_size episodes
    trainer.evaluate([1, 2, 3])
    shown = renders(capsys.readouterr().err, "eval")
    assert {total for _, total in shown} == {3} and shown[-1] == (3, 3)
    trainer.fit(steps=2)
    err = capsys.readouterr().err
    shown = renders(err, "fit")
    assert {total for _, total in shown} == {2} and shown[0] == (0, 2) and shown[-1] == (2, 2)
    assert {total for _, total in renders(err, "rollout")} == {4}  # each step's rollout
    assert "reward=" in err and "success=" in err  # the postfix
    trainer.fit(steps=1)  # counts this call's one step (steps 2 -> 3); the postfix says which step
    err = capsys.readouterr().err
    shown = renders(err, "fit")
    assert shown[0] == (0, 1) and shown[-1] == (1, 1) and "step=2" in err


@pytest.mark.parametrize("setting, ci", [(False, None), (None, "1"), (None, None)])
def test_nothing_printed_when_off(tiny_model_path, tmp_path, capsys, monkeypatch, setting, ci):
    # (None, None): automatic, and pytest's captured stderr is not a terminal.
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    assert progress_enabled(setting) is False
    trainer = make_trainer(tiny_model_path, tmp_path, progress=setting)
    trainer.doctor = None  # its finding lines are reports, not progress (tests/test_doctor_run.py has them)
    capsys.readouterr()
    trainer.fit(steps=1)
    trainer.evaluate([1, 2])
    assert capsys.readouterr() == ("", "")


def test_progress_enabled_rules(monkeypatch):
    monkeypatch.setenv("CI", "true")
    assert progress_enabled(None) is False and progress_enabled(True) is True
    for off in ("", "0", "false"):
        monkeypatch.setenv("CI", off)
        monkeypatch.setattr("sys.stderr.isatty", lambda: True, raising=False)
        assert progress_enabled(None) is True  # a terminal, not CI
        assert progress_enabled(False) is False
