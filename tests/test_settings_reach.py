"""Every `InferenceConfig` / `EnvironmentConfig` field reaches what runs, on every path
(one process, async, a Ray rollout worker, the CLI), and a setting the user wrote is never
replaced in silence."""
from __future__ import annotations

import dataclasses
import json
import warnings

import pytest

from envs import make_env
from workbench import ConfigStore, Trainer
from workbench.config import EnvironmentConfig, InferenceConfig
from workbench.environments.registry import ConfigOverrideWarning
from workbench.rollout import AsyncRollout, Rollout
from workbench.rollout.configured import ENVIRONMENT_FIELDS, INFERENCE_FIELDS

#: A value other than the default for every field that a rollout or its environments read.
ROLLOUT_VALUES = {"max_tokens": 7, "temperature": 0.55, "top_p": 0.9, "top_k": 13, "max_turns": 3,
                  "max_context_tokens": 999, "seed": 5, "history": "rendered", "tool_format": "prompt"}
ENV_VALUES = {"max_steps": 2, "system_prompt": "Be brief.", "params": {"low": 1, "high": 9}, "step_timeout": 7.5,
              "strict_format": True, "constrained_decoding": True}


def distinct_config(tiny_model_path, tmp_path, async_rollout: bool = False) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.update("inference", {**ROLLOUT_VALUES, "async_rollout": async_rollout})
    c.update("environment", {"name": "guess_number", **ENV_VALUES})
    c.training.batch_size, c.training.group_size = 2, 2
    c.checkpoint.output_dir = str(tmp_path / "ckpt")
    return c.validate()


def assert_reached(rollout: Rollout, async_rollout: bool) -> None:
    """Each "rollout" field of the tables, and each environment field, as the config set it."""
    assert isinstance(rollout, AsyncRollout) is async_rollout
    assert rollout.sampling == {k: ROLLOUT_VALUES[k] for k in ("max_tokens", "temperature", "top_p", "top_k")}
    assert rollout.max_turns == 3 and rollout.max_context_tokens == 999
    assert rollout.seed is not None  # inference.seed=5: seeded sampling (None would be fresh randomness)
    assert rollout.step_timeouts == [7.5] * len(rollout.environments)
    assert rollout.history == "rendered" and rollout.tool_format == "prompt"
    for env in rollout.environments:
        assert env.max_steps == 2 and env.get_prompt_prefix() == "Be brief."
        assert (env.low, env.high) == (1, 9)
        assert env.strict_format is True and env.constrained_decoding is True


def test_every_field_says_where_it_takes_effect():
    assert set(INFERENCE_FIELDS) == {f.name for f in dataclasses.fields(InferenceConfig)}
    assert set(ENVIRONMENT_FIELDS) == {f.name for f in dataclasses.fields(EnvironmentConfig)}
    assert set(INFERENCE_FIELDS.values()) | set(ENVIRONMENT_FIELDS.values()) <= {"rollout", "engine", "environment"}
    tested = set(ROLLOUT_VALUES) | {"async_rollout", "multi_turn", "enable_thinking"} | set(ENV_VALUES)
    assert {k for k, v in {**INFERENCE_FIELDS, **ENVIRONMENT_FIELDS}.items() if v == "rollout"} <= tested


@pytest.mark.parametrize("async_rollout", [False, True])
def test_settings_reach_the_trainers_rollout(tiny_model_path, tmp_path, async_rollout):
    trainer = Trainer(distinct_config(tiny_model_path, tmp_path, async_rollout))
    assert_reached(trainer.make_rollout([0], 2), async_rollout)
    config = distinct_config(tiny_model_path, tmp_path, async_rollout)
    config.inference.multi_turn = False
    assert Trainer(config).make_rollout([0], 1).max_turns == 1


@pytest.mark.parametrize("async_rollout", [False, True])
def test_settings_reach_a_ray_rollout_workers_rollout(tiny_model_path, tmp_path, async_rollout):
    from workbench.distributed.rollout_workers import RolloutWorker

    config = distinct_config(tiny_model_path, tmp_path, async_rollout)
    # The trainer hands the workers its environment object, whose own step_timeout is the default 60 s.
    env = make_env("guess_number", max_steps=2, system_prompt="Be brief.", low=1, high=9,
                   strict_format=True, constrained_decoding=True)
    worker = RolloutWorker(config, env, torch_threads=2)  # the class Ray runs as an actor, here in-process
    assert_reached(worker.make_rollout([0, 1], [0, 0], None, 0), async_rollout)


def test_settings_reach_the_cli_rollout(tiny_model_path, tmp_path):
    from workbench.cli import build_config, parse_args
    from workbench.engines import make_engine
    from workbench.models import load_model_and_tokenizer
    from workbench.rollout import make_rollout
    from workbench.cli.runner import rollout_envs

    path = distinct_config(tiny_model_path, tmp_path).save(tmp_path / "run.yaml")
    config = build_config(parse_args(["rollout", "--config", str(path), "--episodes", "2"]))
    model, tok = load_model_and_tokenizer(config.model.path, "float32", "cpu")
    envs, seeds = rollout_envs(config, "guess_number", 2)
    assert_reached(make_rollout(config, make_engine(config, model, tok), envs, seeds), False)

    from workbench.cli import main

    assert main(["rollout", "--config", str(path), "--episodes", "2", "--output", str(tmp_path / "out")]) == 0
    lines = (tmp_path / "out" / "rollout_guess_number.jsonl").read_text().splitlines()[1:]
    for ep in map(json.loads, lines):  # what ran: the system prompt, turn and token limits, the range
        assert ep["messages"][0] == {"role": "system", "content": "Be brief."}
        assert "between 1 and 9" in ep["messages"][1]["content"]
        assert len(ep["turns"]) <= 2 and all(t["token_end"] - t["token_start"] <= 7 for t in ep["turns"])


def test_chat_settings_reach_the_play_widget_and_the_gateway(tiny_model_path, tmp_path, tiny_engine):
    """inference.history / tool_format reach a PlayWidget given the run's config and a gateway
    started from it (`chat_settings`); what the widget is given by hand wins."""
    pytest.importorskip("ipywidgets")
    from workbench.gateway import Gateway, GatewayRollout
    from workbench.rollout.configured import chat_settings
    from workbench.widgets import PlayWidget

    config = distinct_config(tiny_model_path, tmp_path)  # history "rendered", tool_format "prompt"
    widget = PlayWidget(make_env("guess_number"), tiny_engine, config=config)
    assert widget.rollout.history == "rendered" and widget.rollout.tool_format == "prompt"
    assert PlayWidget(make_env("guess_number"), tiny_engine, config=config, history="sampled").rollout.history == "sampled"
    assert Gateway(tiny_engine, **chat_settings(config)).builder.history == "rendered"
    assert Gateway(tiny_engine).builder.history == "sampled"  # "auto" on a prefix-stable template
    rollout = GatewayRollout(tiny_engine, lambda *a: 0.0, [0], config=config)
    assert rollout._gateway_args["history"] == "rendered" and rollout._gateway_args["tool_format"] == "prompt"


def test_enable_thinking_reaches_the_template_on_every_path(tiny_model_path, tmp_path):
    """inference.enable_thinking goes to the chat template; the tiny model's ChatML template has
    no such switch, so every path refuses the run at its start, naming the model and the fix."""
    from workbench.cli import build_config, parse_args
    from workbench.cli.runner import rollout_envs
    from workbench.distributed.rollout_workers import RolloutWorker
    from workbench.engines import make_engine
    from workbench.models import load_model_and_tokenizer
    from workbench.rollout import TemplateError, make_rollout

    refused = r"model .*tiny-llama.*: its chat template has no enable_thinking switch; leave inference.enable_thinking"
    config = distinct_config(tiny_model_path, tmp_path)
    config.inference.enable_thinking = False
    with pytest.raises(TemplateError, match=refused):
        Trainer(config)  # when the run starts, before any rollout
    with pytest.raises(TemplateError, match=refused):
        RolloutWorker(config, make_env("guess_number"), torch_threads=2).make_rollout([0], [0], None, 0)
    path = config.save(tmp_path / "thinking.yaml")
    cli = build_config(parse_args(["rollout", "--config", str(path), "--episodes", "1"]))
    assert cli.inference.enable_thinking is False
    model, tok = load_model_and_tokenizer(cli.model.path, "float32", "cpu")
    envs, seeds = rollout_envs(cli, "guess_number", 1)
    with pytest.raises(TemplateError, match=refused):
        make_rollout(cli, make_engine(cli, model, tok), envs, seeds)


def test_step_timeout_in_the_config_is_what_runs_with_an_environment_object(tiny_model_path, tmp_path):
    config = distinct_config(tiny_model_path, tmp_path)
    env = make_env("guess_number", max_steps=2, system_prompt="Be brief.", low=1, high=9,
                   strict_format=True, constrained_decoding=True)  # step_timeout 60
    trainer = Trainer(config, environment=env)
    assert config.environment.step_timeout == 7.5
    assert trainer.make_rollout([0], 1).step_timeouts == [7.5]


def test_a_conflicting_setting_is_warned_about_naming_both_values(tiny_model_path, tmp_path):
    config = distinct_config(tiny_model_path, tmp_path)  # max_steps=2, system_prompt "Be brief.", high=9
    env = make_env("guess_number", max_steps=5, system_prompt="Be brief.", low=1, high=9,
                   strict_format=True, constrained_decoding=True)
    with pytest.warns(ConfigOverrideWarning, match=r"config.environment.max_steps is 2 but the environment object "
                                                   r"given to the trainer \(GuessNumberEnv\) has 5"):
        trainer = Trainer(config, environment=env)
    assert trainer.config.environment.max_steps == 5  # what runs is what the config now records
    config = distinct_config(tiny_model_path, tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("error", ConfigOverrideWarning)  # the same settings: no word
        Trainer(config, environment=make_env("guess_number", max_steps=2, system_prompt="Be brief.", low=1, high=9,
                                             strict_format=True, constrained_decoding=True))


def test_the_hf_engines_prefix_cache_settings_reach_every_engine(tiny_model_path, tmp_path):
    """inference.enable_prefix_caching and prefix_cache_mb reach the hf engine of the trainer,
    of a Ray rollout worker and of a fork from a checkpoint (before, the hf engine ignored both)."""
    from workbench.debug.policies import load_policy
    from workbench.distributed.rollout_workers import RolloutWorker
    from workbench.engines import hf_engine

    config = distinct_config(tiny_model_path, tmp_path)
    config.inference.prefix_cache_mb = 3.0
    config.inference.max_batch_size = 5
    config.inference.cuda_graphs = True
    config.inference.packed_decode = False  # default on
    assert Trainer(config).engine.prefix_cache.max_bytes == 3 * 2**20
    trainer_engine = Trainer(config).engine
    assert trainer_engine.max_batch_size == 5 and trainer_engine.cuda_graphs is True
    assert trainer_engine.packed_decode is False
    worker = RolloutWorker(config, make_env("guess_number"), torch_threads=2)
    assert worker.engine.prefix_cache.max_bytes == 3 * 2**20 and worker.engine.max_batch_size == 5
    assert worker.engine.cuda_graphs is True and worker.engine.packed_decode is False
    model, tok, loaded = load_policy("base", config)
    engine = hf_engine(loaded, model, tok)
    assert engine.prefix_cache.max_bytes == 3 * 2**20 and engine.max_batch_size == 5 and engine.cuda_graphs
    assert engine.packed_decode is False
    config.inference.enable_prefix_caching = False
    assert Trainer(config).engine.prefix_cache is None
    assert hf_engine(config, model, tok).prefix_cache is None
    with pytest.raises(Exception, match=r"inference\.prefix_cache_mb must be > 0"):
        ConfigStore.from_dict({"inference": {"prefix_cache_mb": 0}})
    with pytest.raises(Exception, match=r"inference\.max_batch_size"):
        ConfigStore.from_dict({"inference": {"max_batch_size": 0}})
