"""Every remedy the doctor prints runs as printed (issue 43, item 3).

1. `diagnose RUN` (and the run's own summary) print each remedy as a complete command,
   `python -m workbench train --from RUN/checkpoints/step_N --steps N --output RUN-<remedy>
   FLAGS`; the test copies each command from the output and runs it (a real process), and
   the branch it makes records the remedy. It used to print `train --from CHECKPOINT FLAGS`,
   which runs nowhere.
2. Remedies fit the run: the overlong penalty's window fits `inference.max_tokens` (the
   default window of 16 was refused for every max_tokens <= 16, the demo's 8 included); a
   PPO (gae) run gets no dynamic sampling (refused for a non-group estimator) and
   zero-variance advice that is true for GAE (its advantages are not 0); an environment
   without a scripted expert gets no SFT remedy, nor one without a strict format the strict
   format.
3. A branch checks what it can before loading the model and leaves no folder behind when it
   fails: `--sft.steps 4` on an environment without an expert is refused before any model
   loads (it failed after the model load and the held-out evaluation, leaving a half-made
   folder), and a branch whose model cannot load removes the folder it created.
"""
from __future__ import annotations

import dataclasses
import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.doctor_policies import roll
from workbench.cli import main
from workbench.config import ConfigStore
from workbench.doctor.checks import REMEDIES, remedy_for, run_checks
from workbench.doctor.findings import DoctorConfig, History, RunFacts
from workbench.environments.base import BaseEnvironment, StepResult
from workbench.training import Trainer

ROOT = Path(__file__).resolve().parents[1]
GUESS = {"low": 1, "high": 8, "max_steps": 4, "max_turns": 4}


class NoExpertEnv(BaseEnvironment):
    """One turn, reward = reply length / 10; no scripted expert, no strict format."""

    def reset(self) -> str:
        return "Write something."

    def step(self, action: str) -> StepResult:
        return "Done.", len(action.strip()) / 10, True, {"success": len(action.strip()) > 3}


# -- remedies fit the run ---------------------------------------------------------------------------
@pytest.mark.parametrize("max_tokens", [2, 3, 8, 12, 16, 17, 64, 512])
def test_the_overlong_remedy_fits_every_max_tokens(max_tokens):
    config = ConfigStore()
    config.inference.max_tokens = max_tokens
    remedy = remedy_for("truncation-surge", RunFacts.of(config))
    assert remedy["reward.overlong_penalty"] == 1.0 and 1 <= remedy["reward.overlong_buffer"] < max_tokens
    assert remedy == remedy_for("repetition-to-limit", RunFacts.of(config))
    for key, value in remedy.items():
        section, name = key.split(".")
        setattr(getattr(config, section), name, value)
    config.validate()  # the branch would start


def test_no_overlong_remedy_for_one_token_replies():
    config = ConfigStore()
    config.inference.max_tokens = 1
    assert remedy_for("truncation-surge", RunFacts.of(config)) == {}


@pytest.fixture(scope="module")
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


def _zero_variance(batch, estimator):
    config = ConfigStore()
    config.training.adv_estimator = estimator
    h = History(run=RunFacts.of(config))
    h.add(batch, 0)
    (f,) = run_checks(h, DoctorConfig(), ["zero-variance-groups"])
    return f


def test_zero_variance_words_and_remedy_fit_the_estimator(tok):
    batch = roll(tok, "guess_number", lambda env, ep: "99", **GUESS)  # every group loses alike
    grpo, gae, rpp = (_zero_variance(batch, e) for e in ("grpo", "gae", "reinforce_plus_plus"))
    assert grpo.fired and grpo.remedy == {"training.dynamic_sampling": True}
    assert "advantages are 0" in grpo.message
    for f in (gae, rpp):
        assert f.fired and f.remedy == {}  # dynamic sampling is refused for these estimators
        assert "advantages are 0" not in f.message and "teach nothing" not in f.message
        assert "are not 0" in f.message and "does not tell these episodes apart" in f.message
        assert "does not apply" in f.advice
    assert "critic" in gae.message
    config = ConfigStore()
    config.training.adv_estimator = "grpo"
    config.update("training", {"dynamic_sampling": True}).validate()


def test_no_sft_or_strict_remedy_for_an_environment_without_them():
    config = ConfigStore()
    plain = RunFacts.of(config, NoExpertEnv)
    assert plain.has_expert is False and plain.supports_strict_format is False
    assert remedy_for("format-errors", plain) == {} and remedy_for("parse-from-incidental-span", plain) == {}
    from envs.guess_number import GuessNumberEnv

    game = RunFacts.of(config, GuessNumberEnv)
    assert remedy_for("format-errors", game) == REMEDIES["format-errors"]
    assert remedy_for("parse-from-incidental-span", game) == REMEDIES["parse-from-incidental-span"]


# -- the printed commands run --------------------------------------------------------------------------
@pytest.fixture(scope="module")
def run_dir(tiny_model_path, tmp_path_factory) -> Path:
    """A finished 2-step CLI run of the untrained tiny model on guess_number (GRPO): its replies
    are not numbers, so format-errors fires, and what zero-variance-groups needs is pinned rather
    than left to the sampled replies (a bf16 CPU once sampled a group whose rewards differed): the
    environment's rewards are weighted 0 (`reward.step_reward_weight`), so every group's rewards
    are equal (0) whatever the model replies."""
    out = tmp_path_factory.mktemp("remedies") / "gn"
    rc = main(["train", "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "4", "--group-size", "2",
               "--max-tokens", "8", "--max-turns", "2", "--save-interval", "1", "--eval-episodes", "2",
               "--reward-param", "step_reward_weight=0", "--output", str(out)])
    assert rc == 0
    return out


def _try_commands(text: str) -> list[str]:
    return [line.split("try: ", 1)[1] for line in text.splitlines() if line.strip().startswith("try: ")]


def test_diagnose_prints_complete_commands_that_run_as_printed(run_dir, capsys):
    assert main(["diagnose", str(run_dir)]) == 0
    commands = _try_commands(capsys.readouterr().out)
    by_flag = {c.split()[-2]: c for c in commands}
    assert {"--training.dynamic_sampling", "--sft.steps"} <= set(by_flag), commands
    summary = (run_dir / "summary.md").read_text()
    for flag, command in by_flag.items():
        assert command.startswith(f"python -m workbench train --from {run_dir.resolve()}/checkpoints/step_00000")
        assert "--output " in command and "--steps " in command
        assert command in summary  # the run's own summary prints the same command
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE", "CI": "1"}
    for flag in ("--training.dynamic_sampling", "--sft.steps"):
        argv = shlex.split(by_flag[flag])
        assert argv[0] == "python"
        proc = subprocess.run([sys.executable, *argv[1:]], cwd=ROOT, env=env, capture_output=True, text=True,
                              timeout=600)
        assert proc.returncode == 0, (by_flag[flag], proc.stderr[-3000:])
        out = Path(argv[argv.index("--output") + 1])
        import json

        origin = json.loads((out / "branch.json").read_text())
        field = flag.removeprefix("--")
        assert field in origin["overrides"], origin
        assert out.name.startswith("gn-")


# -- a branch checks before it loads and leaves nothing behind --------------------------------------
@pytest.fixture(scope="module")
def plain_checkpoint(tiny_model_path, tmp_path_factory) -> Path:
    tmp = tmp_path_factory.mktemp("plain")
    config = ConfigStore()
    config.model.model_name = str(tiny_model_path)
    config.model.lora_rank = 2
    config.environment.name = "tests.test_doctor_remedies_run:NoExpertEnv"
    config.inference.max_tokens, config.inference.max_turns = 6, 1
    config.training.batch_size, config.training.group_size, config.training.micro_batch_size = 4, 2, 2
    config.checkpoint.output_dir = str(tmp / "parent" / "checkpoints")
    trainer = Trainer(config.validate())
    path = trainer.save_checkpoint(tmp / "parent" / "checkpoints" / "step_000000")
    trainer.cleanup()
    return path


def test_sft_on_an_environment_without_an_expert_is_refused_before_the_model_loads(plain_checkpoint, tmp_path,
                                                                                    capsys, monkeypatch):
    built = []
    real_init = Trainer.__init__
    monkeypatch.setattr(Trainer, "__init__", lambda self, *a, **k: built.append(1) or real_init(self, *a, **k))
    out = tmp_path / "branch"
    rc = main(["train", "--from", str(plain_checkpoint), "--sft.steps", "4", "--steps", "1", "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "sft.steps 4" in err and "NoExpertEnv has no scripted expert" in err, err
    assert "Traceback" not in err and built == []  # no trainer (no model) was built
    assert not out.exists()


def test_a_branch_that_fails_after_taking_its_folder_leaves_no_folder(plain_checkpoint, tiny_model_path, tmp_path,
                                                                      capsys):
    # The parent's model folder is gone (moved): the branch's checks pass, then the model cannot load.
    moved = tmp_path / "model"
    shutil.copytree(tiny_model_path, moved)
    import yaml

    ckpt = tmp_path / "ckpt" / "step_000000"
    shutil.copytree(plain_checkpoint, ckpt)
    saved = yaml.safe_load((ckpt / "config.yaml").read_text())
    saved["model"]["model_name"] = str(moved)
    (ckpt / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
    from workbench.training.checkpoint import _sha256  # re-sign the edited file
    import json

    manifest = json.loads((ckpt / "MANIFEST.json").read_text())
    manifest["files"]["config.yaml"] = {"bytes": (ckpt / "config.yaml").stat().st_size,
                                        "sha256": _sha256(ckpt / "config.yaml")}
    (ckpt / "MANIFEST.json").write_text(json.dumps(manifest, indent=1))
    shutil.rmtree(moved)
    out = tmp_path / "deep" / "branch"
    rc = main(["train", "--from", str(ckpt), "--steps", "1", "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and err.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in err, err
    assert not out.exists() and not out.parent.exists()  # the folders the branch created are gone again


def test_a_setting_the_environment_refuses_is_refused_before_the_model_loads(plain_checkpoint, tmp_path, capsys,
                                                                           monkeypatch):
    built = []
    real_init = Trainer.__init__
    monkeypatch.setattr(Trainer, "__init__", lambda self, *a, **k: built.append(1) or real_init(self, *a, **k))
    out = tmp_path / "branch"
    rc = main(["train", "--from", str(plain_checkpoint), "--environment.strict_format", "true", "--steps", "1",
               "--output", str(out)])
    err = capsys.readouterr().err
    assert rc == 2 and "NoExpertEnv has no strict format mode" in err and built == [] and not out.exists(), err
