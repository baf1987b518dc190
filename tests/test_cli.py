"""The command line, run in-process through `workbench.cli.main` on the tiny model.

Flags override `--config` only when given; `--minutes` stops `train` after the step
that crosses the limit and says so; `--device`/`--dtype` reach the config.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from workbench.cli import build_config, main, parse_args
from workbench.config import ConfigError, ConfigStore

REPO = Path(__file__).resolve().parents[1]


def _yaml(tmp_path, tiny_model_path) -> str:
    cfg = ConfigStore()
    cfg.model.model_name = str(tiny_model_path)
    cfg.model.lora_rank = 2
    cfg.inference.max_tokens = 7
    cfg.inference.max_turns = 2
    cfg.inference.temperature = 0.5
    cfg.training.learning_rate = 3e-5
    cfg.training.batch_size, cfg.training.group_size, cfg.training.micro_batch_size = 4, 2, 2
    cfg.training.num_epochs, cfg.training.num_iters_per_epoch = 1, 2
    cfg.training.seed = 11
    cfg.checkpoint.output_dir = str(tmp_path / "yaml_ckpt")
    cfg.checkpoint.save_interval = 0
    return str(cfg.save(tmp_path / "run.yaml"))


def test_yaml_values_survive_flags_not_given_and_given_flags_win(tmp_path, tiny_model_path):
    config = _yaml(tmp_path, tiny_model_path)
    out = tmp_path / "out"
    rc = main(["train", "--config", config, "--batch-size", "2", "--temperature", "0.9",
               "--eval-episodes", "0", "--output", str(out)])
    assert rc == 0
    used = yaml.safe_load((out / "config.yaml").read_text())
    # not given on the command line: the file's values (the flags' presets are 32, 4, 5e-4, 20 steps, 0)
    assert used["inference"]["max_tokens"] == 7 and used["inference"]["max_turns"] == 2
    assert used["training"]["learning_rate"] == 3e-5 and used["training"]["seed"] == 11
    assert used["model"]["model_name"] == str(tiny_model_path) and used["model"]["lora_rank"] == 2
    assert used["training"]["num_iters_per_epoch"] == 2
    # given: the flags
    assert used["training"]["batch_size"] == 2 and used["inference"]["temperature"] == 0.9
    assert used["checkpoint"]["output_dir"] == str(out / "checkpoints")  # --output given
    steps = [json.loads(line)["step"] for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert len(steps) == 2  # num_epochs x num_iters_per_epoch from the file


def test_flag_semantics_without_running(tmp_path, tiny_model_path):
    config = _yaml(tmp_path, tiny_model_path)
    # --config alone: the file, checkpoints where the file says
    cfg = build_config(parse_args(["train", "--config", config]))
    assert cfg == ConfigStore.load(config)
    assert cfg.checkpoint.output_dir == str(tmp_path / "yaml_ckpt")
    # every config flag given wins over the file
    cfg = build_config(parse_args(["train", "--config", config, "--lr", "0.01", "--steps", "3", "--algo", "ppo",
                                   "--max-tokens", "5", "--seed", "4", "--device", "cpu", "--dtype", "bfloat16",
                                   "--group-size", "4", "--batch-size", "8", "--save-interval", "2"]))
    t = cfg.training
    assert (t.learning_rate, t.num_epochs, t.num_iters_per_epoch, t.adv_estimator, t.seed) == (0.01, 1, 3, "gae", 4)
    assert (t.batch_size, t.group_size, cfg.checkpoint.save_interval) == (8, 4, 2)
    assert (cfg.inference.max_tokens, cfg.model.device, cfg.model.dtype) == (5, "cpu", "bfloat16")
    assert cfg.inference.temperature == 0.5  # not given: the file's
    # no --config: the presets shown in --help
    cfg = build_config(parse_args(["train"]))
    assert (cfg.inference.max_tokens, cfg.training.learning_rate, cfg.training.num_iters_per_epoch) == (32, 5e-4, 20)
    assert (cfg.model.device, cfg.model.dtype) == ("auto", "auto")
    assert cfg.checkpoint.output_dir == "runs/train/checkpoints"
    # rollout: --seed is the sampling seed
    cfg = build_config(parse_args(["rollout", "--config", config, "--seed", "9"]))
    assert cfg.inference.seed == 9 and cfg.training.seed == 11


def test_bad_device_flag_is_a_config_error_naming_the_field(tmp_path, capsys):
    rc = main(["rollout", "--device", "gpu", "--output", str(tmp_path / "r")])
    assert rc == 2
    assert "model.device must be \"auto\" or a torch device" in capsys.readouterr().err


def test_minutes_stops_training_after_the_step_that_crosses_the_limit(tmp_path, tiny_model_path):
    out = tmp_path / "out"
    argv = ["train", "--model", str(tiny_model_path), "--steps", "4", "--batch-size", "2", "--group-size", "2",
            "--max-tokens", "4", "--max-turns", "1", "--eval-episodes", "0", "--save-interval", "0",
            "--output", str(out)]
    assert main(argv + ["--minutes", "0.000001"]) == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert [json.loads(line)["step"] for line in lines] == [0]  # stopped after the first step
    summary = (out / "summary.md").read_text()
    assert summary.startswith("stopped early (--minutes 1e-06): time limit of 6e-05 s reached after 1 of 4 steps")


def test_without_minutes_training_runs_every_step(tmp_path, tiny_model_path):
    out = tmp_path / "out"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "1", "--eval-episodes", "0", "--save-interval", "0",
                 "--output", str(out)]) == 0
    assert len((out / "metrics.jsonl").read_text().splitlines()) == 2
    assert not (out / "summary.md").read_text().startswith("stopped early")



def test_every_config_field_has_a_generated_flag_with_its_docstring():
    import dataclasses

    from workbench.config.flags import field_docs
    from workbench.config import SECTIONS

    parser_help = subprocess.run([sys.executable, "-m", "workbench", "train", "--help"], capture_output=True,
                                 text=True, timeout=120, cwd=REPO).stdout
    for section, cls in SECTIONS.items():
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            assert f"--{section}.{f.name} VALUE" in parser_help
            assert docs[f.name], f"{section}.{f.name} has no docstring"
    assert "Entropy bonus weight in the actor loss." in " ".join(parser_help.split())


def test_generated_flags_set_fields_over_the_config_file(tmp_path):
    from workbench.cli import build_config, parse_args

    path = ConfigStore().save(tmp_path / "run.yaml")
    config = build_config(parse_args(["train", "--config", str(path), "--training.entropy_coeff", "0.01",
                                      "--inference.stop", '["\\n", "</answer>"]', "--inference.seed", "null",
                                      "--model.use_lora", "false"]))
    assert config.training.entropy_coeff == 0.01 and config.inference.stop == ["\n", "</answer>"]
    assert config.inference.seed is None and config.model.use_lora is False
    assert build_config(parse_args(["train", "--config", str(path)])).training.entropy_coeff == 0.0
    with pytest.raises(ConfigError, match=r"training.entropy_coeff must be a number"):
        build_config(parse_args(["train", "--training.entropy_coeff", "lots"]))
    with pytest.raises(ConfigError, match=r"unknown field training.bogus"):
        from workbench.config.flags import apply_config_flags

        apply_config_flags(ConfigStore(), argparse.Namespace(**{"cfg:training.bogus": "1"}))
