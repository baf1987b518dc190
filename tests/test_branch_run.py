"""Branching a run (`train --from`, `Trainer.from_checkpoint`, `workbench.debug.branch_run`):
a new run from a checkpoint of a finished 3-step run on the tiny model, with settings
changed, into its own folder that records where it came from; the parent is never written.
"""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import yaml
from safetensors.torch import load_file

from workbench.cli import main
from workbench.config import ConfigError, ConfigStore
from workbench.debug import RunError, branch_run, load_run
from workbench.environments.base import BaseEnvironment, StepResult
from workbench.training import Trainer
from workbench.training.branch import BRANCH_FILE, BranchError
from workbench.training.checkpoint import ResumedHyperparameterWarning

REPO = Path(__file__).resolve().parents[1]
PARENT_LR = 3e-5


class LengthEnv(BaseEnvironment):
    """One turn; the reward is the reply's length in characters / 10, so a random tiny model's
    groups differ in reward and GRPO really changes the weights (success: more than 3 characters)."""

    def reset(self) -> str:
        return "Write something."

    def step(self, action: str) -> StepResult:
        n = len(action.strip())
        return "Done.", n / 10, True, {"success": n > 3}


def _snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its sha256: what 'the parent was not written' compares."""
    return {str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(folder.rglob("*")) if p.is_file()}


def _rows(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


@pytest.fixture(scope="module")
def parent(tmp_path_factory, tiny_model_path) -> Path:
    """A finished CLI run: 3 GRPO steps, a checkpoint after each, 2 held-out episodes."""
    tmp = tmp_path_factory.mktemp("branch")
    cfg = ConfigStore()
    cfg.model.model_name = str(tiny_model_path)
    cfg.model.lora_rank = 2
    cfg.environment.name = "tests.test_branch_run:LengthEnv"
    cfg.inference.max_tokens, cfg.inference.max_turns, cfg.inference.temperature = 6, 1, 0.9
    cfg.inference.seed = 3
    cfg.training.learning_rate = PARENT_LR
    cfg.training.batch_size, cfg.training.group_size, cfg.training.micro_batch_size = 4, 2, 2
    cfg.training.num_epochs, cfg.training.num_iters_per_epoch = 1, 3
    cfg.training.seed = 11
    cfg.checkpoint.save_interval, cfg.checkpoint.keep_last_n = 1, 0
    config = cfg.save(tmp / "run.yaml")
    out = tmp / "parent"
    assert main(["train", "--config", str(config), "--eval-episodes", "2", "--output", str(out)]) == 0
    assert [p.name for p in load_run(out).checkpoints] == ["step_000001", "step_000002", "step_000003"]
    return out


def test_cli_branch_changes_only_the_flag_given_and_continues_the_steps(parent, tmp_path):
    before = _snapshot(parent)
    out = tmp_path / "lr"
    ckpt = parent / "checkpoints" / "step_000002"
    rc = main(["train", "--from", str(ckpt), "--training.learning_rate", "0.002", "--steps", "2",
               "--output", str(out)])
    assert rc == 0
    assert _snapshot(parent) == before  # nothing of the parent was written

    # config: the parent's, with the one flag given (max_tokens 6 / temperature 0.9 are not the CLI presets)
    used, was = yaml.safe_load((out / "config.yaml").read_text()), yaml.safe_load((parent / "config.yaml").read_text())
    assert used["training"]["learning_rate"] == 0.002
    assert (used["inference"]["max_tokens"], used["inference"]["temperature"]) == (6, 0.9)
    assert used["checkpoint"]["output_dir"] == str(out / "checkpoints") and used["training"]["log_dir"] == str(out)
    assert (used["training"]["num_epochs"], used["training"]["num_iters_per_epoch"]) == (1, 4)  # 2 + --steps 2
    changed = {f"{s}.{k}" for s in used for k in used[s] if used[s][k] != was[s][k]}
    assert changed == {"training.learning_rate", "training.num_iters_per_epoch", "training.log_dir",
                       "checkpoint.output_dir"}

    origin = json.loads((out / BRANCH_FILE).read_text())
    assert origin["step"] == 2 and origin["until_step"] == 4
    assert origin["overrides"] == {"training.learning_rate": 0.002}
    assert origin["parent_values"] == {"training.learning_rate": PARENT_LR}
    assert Path(origin["parent_run"]) == parent.resolve() and Path(origin["checkpoint"]) == ckpt.resolve()

    # the step count continues; the parent's rows before the branch step come first, unchanged
    rows, parent_rows = _rows(out / "metrics.jsonl"), _rows(parent / "metrics.jsonl")
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert rows[:2] == parent_rows[:2]
    assert [p.name for p in load_run(out).checkpoints] == ["step_000003", "step_000004"]
    state = json.loads((out / "checkpoints" / "step_000004" / "trainer_state.json").read_text())
    assert state["global_step"] == 4
    # held-out "before" at the branch step, on the parent's seeds (its count, 2: --eval-episodes not given)
    evals = json.loads((out / "evals.json").read_text())
    assert [e["step"] for e in evals] == [2, 4] and all(e["eval/episodes"] == 2 for e in evals)
    parent_seeds = [ep.env_seed for ep in load_run(parent).eval_batch(0)]
    assert [ep.env_seed for ep in load_run(out).eval_batch(2)] == parent_seeds == [10_000, 10_001]

    run = load_run(out)
    assert run.branched_from.step == 2 and run.branched_from.overrides == {"training.learning_rate": 0.002}
    assert run.parent().path == parent.resolve()
    assert run.steps == [2, 3]
    with pytest.raises(RunError, match="parent"):
        run.batch(0)  # before the branch step: the parent's, and the message says where it is
    assert "branched at step 2" in repr(run)


def test_python_branch_starts_from_the_checkpoints_weights_and_optimizer(parent, tmp_path):
    ckpt = parent / "checkpoints" / "step_000002"
    before = _snapshot(parent)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer = branch_run(ckpt, {"training": {"learning_rate": 0.004}}, output_dir=tmp_path / "py", steps=1)
    # the new learning rate is what was asked for: no "resuming with another learning rate" warning
    assert not [w for w in caught if issubclass(w.category, ResumedHyperparameterWarning)]
    assert trainer.global_step == 2 and len(trainer.metrics_history) == 2
    saved = load_file(str(ckpt / "policy.safetensors"))
    weights = trainer.policy.trainable_state_dict()
    assert saved.keys() == weights.keys() and len(saved) > 0
    for name, tensor in saved.items():
        assert torch.equal(weights[name].cpu(), tensor), name
    earlier = load_file(str(parent / "checkpoints" / "step_000001" / "policy.safetensors"))
    assert any(not torch.equal(earlier[n], t) for n, t in saved.items())  # the parent did learn: not vacuous
    moments = load_file(str(ckpt / "optimizer.safetensors"))
    state = trainer.optimizer.state_dict()["state"]
    for key, tensor in moments.items():
        _, idx, name = key.split(".", 2)
        assert torch.equal(state[int(idx)][name].cpu(), tensor), key
    assert {g["lr"] for g in trainer.optimizer.param_groups} == {0.004}
    assert trainer.branched_from.overrides == {"training.learning_rate": 0.004}
    trainer.fit()
    assert trainer.global_step == 3 and trainer.metrics_history[-1]["step"] == 2
    assert [r["step"] for r in _rows(tmp_path / "py" / "metrics.jsonl")] == [0, 1, 2]
    assert (tmp_path / "py" / "checkpoints" / "step_000003").is_dir()
    assert _snapshot(parent) == before
    trainer.cleanup()


def test_branch_without_overrides_replays_the_parents_next_step(parent, tmp_path):
    """Same weights, optimizer, RNG and step-derived seeds: the branch's step 2 is the parent's step 2."""
    trainer = Trainer.from_checkpoint(parent / "checkpoints" / "step_000002", output_dir=tmp_path / "same")
    trainer.fit()  # no steps: the parent's target, step 3
    assert trainer.global_step == 3 and trainer.branched_from.overrides == {}
    mine, theirs = _rows(tmp_path / "same" / "metrics.jsonl")[2], _rows(parent / "metrics.jsonl")[2]
    for key in ("reward/mean", "env/success_rate", "rollout/response_length_mean", "actor/pg_loss"):
        assert mine[key] == pytest.approx(theirs[key], abs=1e-5), key
    trainer.cleanup()


@pytest.mark.parametrize("flags, field", [(["--model.lora_rank", "4"], "model.lora_rank"),
                                          (["--algo", "ppo"], "training.adv_estimator"),
                                          (["--env", "guess_number"], "environment.name")])
def test_an_identity_field_is_refused_naming_it(parent, tmp_path, capsys, flags, field):
    out = tmp_path / "bad"
    rc = main(["train", "--from", str(parent / "checkpoints" / "step_000002"), *flags, "--steps", "1",
               "--output", str(out)])
    assert rc == 2
    err = capsys.readouterr().err
    assert f"a branch cannot change {field}" in err
    assert not out.exists()  # refused before anything was written
    with pytest.raises(BranchError, match=field):
        branch_run(parent / "checkpoints" / "step_000002", {field: 4 if "rank" in field else "gae" if "adv" in field
                                                            else "guess_number"}, output_dir=out)


def test_an_output_in_the_parents_folder_is_refused(parent, tmp_path, capsys):
    before = _snapshot(parent)
    ckpt = parent / "checkpoints" / "step_000002"
    for out in (parent, parent / "branches" / "lr", parent / "checkpoints"):
        rc = main(["train", "--from", str(ckpt), "--lr", "0.001", "--steps", "1", "--output", str(out)])
        assert rc == 2
        assert "a branch never writes into the run it came from" in capsys.readouterr().err
        with pytest.raises(BranchError, match="parent's folder"):
            Trainer.from_checkpoint(ckpt, output_dir=out, steps=1)
    assert _snapshot(parent) == before and not (parent / "branches").exists()


def test_cli_mistakes_say_what_to_give(parent, tmp_path, capsys):
    last = parent / "checkpoints" / "step_000003"
    cases = [
        (["--from", str(last), "--output", str(tmp_path / "a")], "give --steps N"),  # at the parent's last step
        (["--from", str(last), "--steps", "1"], "--from needs --output"),
        (["--from", str(last), "--config", str(parent / "config.yaml"), "--output", str(tmp_path / "b")],
         "cannot be combined"),
        (["--from", str(tmp_path / "nowhere"), "--output", str(tmp_path / "c")], "no such folder"),
        (["--from", str(tmp_path), "--output", str(tmp_path / "d")], "neither a checkpoint folder"),
        (["--from", str(last), "--training.learning_rate", "fast", "--steps", "1", "--output", str(tmp_path / "e")],
         "training.learning_rate"),
    ]
    cases.append((["--from", str(last), "--checkpoint.output_dir", str(tmp_path / "g"), "--steps", "1",
                   "--output", str(tmp_path / "e")], "give --output instead"))
    broken = tmp_path / "broken" / "step_000003"
    shutil.copytree(last, broken)
    (broken / "policy.safetensors").write_bytes((broken / "policy.safetensors").read_bytes()[:-8])
    cases.append((["--from", str(broken), "--steps", "1", "--output", str(tmp_path / "h")],
                  "does not match its manifest"))
    for flags, message in cases:
        assert main(["train", *flags]) == 2, flags
        assert message in capsys.readouterr().err, flags
    with pytest.raises(ConfigError, match="steps must be an integer"):
        Trainer.from_checkpoint(last, output_dir=tmp_path / "f", steps=0)
    with pytest.raises(BranchError, match="set by its output folder"):
        branch_run(last, {"training.log_dir": str(tmp_path / "g")}, output_dir=tmp_path / "f", steps=1)
    assert not any((tmp_path / n).exists() for n in "abcdefgh")


def test_cli_branch_in_a_subprocess_from_a_run_folder(parent, tmp_path):
    """`python -m workbench train --from RUN` (its newest checkpoint) with a shorthand flag."""
    out = tmp_path / "sub"
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    proc = subprocess.run([sys.executable, "-m", "workbench", "train", "--from", str(parent), "--lr", "0.001",
                           "--steps", "1", "--output", str(out)],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "branched from" in proc.stdout + proc.stderr
    run = load_run(out)
    assert run.branched_from.step == 3
    assert run.branched_from.overrides == {"training.learning_rate": 0.001}
    assert run.config.training.learning_rate == 0.001 and run.config.inference.max_tokens == 6
    assert list(run.metrics["step"]) == [0, 1, 2, 3]
    # "before" is the parent's last weights on the parent's held-out seeds: the parent's "after", exactly
    parent_run = load_run(parent)
    assert [e["step"] for e in run.evals] == [3, 4]
    assert run.evals[0] == parent_run.evals[-1] and parent_run.evals[-1]["step"] == 3
    mine, theirs = run.eval_batch(3), parent_run.eval_batch(3)
    assert [ep.env_seed for ep in mine] == [ep.env_seed for ep in theirs]
    assert [ep.messages for ep in mine] == [ep.messages for ep in theirs]
