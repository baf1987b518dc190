"""Runs you can reopen: `fit` saves each step's batch into the run folder
(`workbench.training.run_files`) and `workbench.debug.load_run` gives it back exactly.

The runs are real fits of the tiny model on guess_number (PPO with a critic and the KL in
the reward, so every tensor field a batch can hold is there); the in-memory batch of each
step is kept by a callback and compared field by field with what the folder gives back.
"""
from __future__ import annotations

import gzip
import json
import shutil
from pathlib import Path

import pytest
import torch

from envs import make_env
from envs.guess_number import GuessNumberEnv
from tests.test_trainer import tiny_config
from workbench import ConfigError, Trainer
from workbench.debug import Run, RunError, load_run
from workbench.training import run_files
from workbench.trajectory import TOKEN_FIELDS


def fit_and_keep(trainer: Trainer, **fit) -> dict[int, object]:
    """Run `fit`, returning {0-based step: the batch that step trained on, as the trainer left it}."""
    kept: dict[int, object] = {}
    trainer.fit(callbacks=[lambda tr, m: kept.__setitem__(m["step"], tr.last_batch)], **fit)
    return kept


def assert_same_batch(reopened, trained) -> None:
    assert list(reopened.tensors) == list(trained.tensors)
    for name, tensor in trained.tensors.items():
        got = reopened.tensors[name]
        assert got.dtype == tensor.dtype and torch.equal(got, tensor), name
    assert [ep.to_dict() for ep in reopened] == [ep.to_dict() for ep in trained]
    assert reopened.meta == trained.meta


@pytest.fixture(scope="module")
def ppo_run(tiny_model_path, tmp_path_factory):
    """(run folder, trainer, {step: batch}) of 3 PPO steps with checkpoints after step 2 and the last, 3."""
    tmp = tmp_path_factory.mktemp("ppo_run")
    config = tiny_config(tiny_model_path, tmp, adv_estimator="gae", use_kl_in_reward=True)
    config.checkpoint.save_interval = 2
    trainer = Trainer(config, environment=make_env("guess_number"))
    kept = fit_and_keep(trainer, steps=3)
    return tmp / "ckpt", trainer, kept


def test_every_field_of_a_reopened_batch_equals_the_trained_batch(ppo_run):
    folder, trainer, kept = ppo_run
    run = load_run(folder)
    assert isinstance(run, Run) and run.path == folder
    assert run.steps == [0, 1, 2] and sorted(kept) == [0, 1, 2]
    fields = set(kept[2].tensors)
    trained = {k for k in TOKEN_FIELDS if not k.startswith(("diff_", "recomputed_"))  # by compare_policies, importers only
               and k != "rollout_is_weights"  # only with training.rollout_is (async training)
               and k != "position_ids"}  # only when an episode holds several sequences ("rendered" history)
    assert fields == trained  # values, ref/old/new logprobs, kl, advantages, ratio, ...: all of them
    for step, batch in kept.items():
        assert_same_batch(run.batch(step), batch)
    assert_same_batch(run.batch(), kept[2])  # None: the last saved step
    assert run.batch(1) is not run.batch(1)  # a fresh batch each time
    # The metrics row of step s pairs with batch s; the config is the one trained with.
    assert run.metrics["step"].tolist() == [0, 1, 2]
    for step, batch in kept.items():
        row = run.metrics.iloc[step]
        assert row["reward/mean"] == pytest.approx(batch.summary()["reward/mean"], abs=1e-12)
        assert row["perf/rollout_seconds"] == batch.meta["rollout_seconds"]
    assert run.config.to_dict() == trainer.config.to_dict()
    assert [p.name for p in run.checkpoints] == ["step_000002", "step_000003"]  # every 2, and the last
    assert run.evals == [] and run.eval_steps == []
    text = repr(run)
    assert "gae on guess_number" in text and "3 steps" in text and "saved batches 0-2" in text
    assert "step_000002" in run._repr_html_()


def test_config_save_rollouts_every_is_validated(tiny_model_path, tmp_path):
    with pytest.raises(ConfigError, match="save_rollouts_every must be >= 0"):
        tiny_config(tiny_model_path, tmp_path, save_rollouts_every=-1)


def test_every_n_saves_multiples_of_n_and_the_last_step(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path, save_rollouts_every=2, loggers=["jsonl"]),
                      environment=make_env("guess_number"))
    kept = fit_and_keep(trainer, steps=4)
    run = load_run(tmp_path / "ckpt")
    assert run.steps == [0, 2, 3]  # 0 and 2 (every 2), 3 (the last step of the fit)
    assert run.metrics["step"].tolist() == [0, 1, 2, 3]
    assert_same_batch(run.batch(2), kept[2])
    with pytest.raises(RunError) as err:
        run.batch(1)
    message = str(err.value)
    assert str(tmp_path / "ckpt" / "rollouts" / "step_000001.jsonl.gz") in message
    assert "saved steps: 0, 2-3" in message and "every 2 steps" in message


def test_a_folder_without_rollouts_is_a_run_error_saying_what_to_do(tiny_model_path, tmp_path):
    # What every run folder looked like before this change: metrics, no batches.
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path, save_rollouts_every=0),
                      environment=make_env("guess_number"))
    trainer.fit(steps=1)
    folder = tmp_path / "ckpt"
    assert (folder / "metrics.jsonl").exists() and not (folder / "rollouts").exists()
    assert not (folder / "config.yaml").exists()  # save_rollouts_every=0: fit writes nothing new
    with pytest.raises(RunError) as err:
        load_run(folder)
    message = str(err.value)
    assert str(folder) in message and "no rollouts/ folder" in message and "save_rollouts_every" in message
    with pytest.raises(RunError, match="no such folder"):
        load_run(tmp_path / "nowhere")


def test_an_empty_folder_is_said_to_be_empty(tmp_path):
    # `diagnose EMPTY` prints it as its one line: tests/faults/test_run_folder_faults.py
    (tmp_path / "empty").mkdir()
    with pytest.raises(RunError, match=r"empty: no run has written there yet"):
        load_run(tmp_path / "empty")


def copy_run(folder: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(folder, tmp_path / "copy"))


def test_a_cut_gzip_file_is_a_run_error_naming_it(ppo_run, tmp_path):
    folder, _, kept = ppo_run
    copy = copy_run(folder, tmp_path)
    path = run_files.rollout_path(copy, 1)
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    run = load_run(copy)
    with pytest.raises(RunError) as err:
        run.batch(1)
    assert str(path) in str(err.value) and "cut short or damaged" in str(err.value)
    assert_same_batch(run.batch(2), kept[2])  # the other steps still open


def test_a_half_line_inside_the_gzip_is_a_run_error_naming_it(ppo_run, tmp_path):
    folder, _, _ = ppo_run
    copy = copy_run(folder, tmp_path)
    path = run_files.rollout_path(copy, 0)
    text = gzip.decompress(path.read_bytes()).decode()
    path.write_bytes(gzip.compress(text[: len(text) - 200].encode()))  # a valid gzip whose last line is cut
    with pytest.raises(RunError) as err:
        load_run(copy).batch(0)
    assert str(path) in str(err.value) and "JSONDecodeError" in str(err.value)


def test_missing_or_cut_run_files_are_run_errors_naming_them(ppo_run, tmp_path):
    folder, _, _ = ppo_run
    copy = copy_run(folder, tmp_path)
    metrics = copy / "metrics.jsonl"
    lines = metrics.read_text().splitlines()
    metrics.write_text("\n".join(lines[:-1] + [lines[-1][:40]]) + "\n")
    with pytest.raises(RunError) as err:
        load_run(copy)
    assert f"{metrics} line 3 is cut short" in str(err.value)
    metrics.unlink()
    with pytest.raises(RunError, match="metrics.jsonl is missing"):
        load_run(copy)
    (copy / "config.yaml").unlink()
    with pytest.raises(RunError) as err:
        load_run(copy)
    assert f"{copy / 'config.yaml'} is missing" in str(err.value)


def test_a_resumed_run_overwrites_the_steps_it_redoes(tiny_model_path, tmp_path):
    first = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"))
    first.config.checkpoint.save_interval = 2
    first_kept = fit_and_keep(first, steps=4)  # batches 0..3, checkpoints after 2 and 4 steps
    shutil.rmtree(tmp_path / "ckpt" / "step_000004")  # as if killed before the last checkpoint was saved
    resumed = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"))
    resumed_kept = fit_and_keep(resumed, until_step=3)  # resumes at step 2, redoes step 2 only
    run = load_run(tmp_path / "ckpt")
    assert run.steps == [0, 1, 2]  # step 3 of the first run is gone, as its metrics line is
    assert run.metrics["step"].tolist() == [0, 1, 2]
    assert_same_batch(run.batch(0), first_kept[0])
    assert_same_batch(run.batch(2), resumed_kept[2])
    assert run.batch(2).meta["rollout_seconds"] != first_kept[2].meta["rollout_seconds"]


def test_cli_run_saves_held_out_batches_before_and_after(tiny_model_path, tmp_path):
    from workbench.cli import build_config, parse_args
    from workbench.cli.runner import train_and_report

    out = tmp_path / "run"
    args = parse_args(["train", "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "2",
                       "--group-size", "2", "--max-tokens", "6", "--max-turns", "2", "--eval-episodes", "2",
                       "--output", str(out)])
    report = train_and_report(build_config(args), out, eval_episodes=2)
    run = load_run(out)
    assert run.steps == [0, 1] and run.eval_steps == [0, 2]
    assert [e["step"] for e in run.evals] == [0, 2]
    assert_same_batch(run.eval_batch(0), report["before"])
    assert_same_batch(run.eval_batch(), report["after"])
    assert run.evals[1]["eval/success_rate"] == report["after"].summary()["env/success_rate"]
    assert run.config.checkpoint.output_dir == str(out / "checkpoints")
    size = sum(p.stat().st_size for p in (out / "rollouts").iterdir())
    assert 0 < size < 100_000  # a few kB for two tiny steps


def test_tokenizer_of_a_run_whose_model_is_not_here_is_a_run_error(ppo_run, tmp_path, tiny_model_path):
    folder, _, _ = ppo_run
    run = load_run(folder)
    tokenizer = run.tokenizer()  # the tiny model's, from config.model.path; loaded once
    assert tokenizer.decode(tokenizer("guess 5").input_ids) == "guess 5" and run.tokenizer() is tokenizer
    copy = copy_run(folder, tmp_path)
    config = (copy / "config.yaml").read_text().replace(str(tiny_model_path), str(tmp_path / "gone"))
    (copy / "config.yaml").write_text(config)
    with pytest.raises(RunError, match=r"does not load here.*TokenView\(run, tokenizer=\.\.\.\)"):
        load_run(copy).tokenizer()


class Unwritable:
    """A value no JSON writer can turn into text (even its repr fails)."""

    def __repr__(self):
        raise ValueError("this value cannot be written")


class GuessWithASetInInfo(GuessNumberEnv):
    """guess_number whose step info holds a value that cannot be saved (numpy arrays and
    sets are saved as lists; this one cannot be written at all)."""

    def step(self, action):
        obs, reward, done, info = super().step(action)
        return obs, reward, done, {**info, "tried": Unwritable()}


def test_a_batch_that_cannot_be_saved_warns_and_training_goes_on(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=GuessWithASetInInfo())
    with pytest.warns(run_files.RunFilesWarning, match=r"training step 0 to .*step_000000\.jsonl\.gz: ValueError"):
        trainer.fit(steps=1)
    assert trainer.global_step == 1
    assert list((tmp_path / "ckpt" / "rollouts").iterdir()) == []  # nothing half-written left behind
