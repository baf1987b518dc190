"""`python -m workbench export-verl`: the folder verl's multi-turn agent loop runs.

The generated YAMLs are read with verl's own loaders (interaction and tool registries,
hydra composition of verl's ppo_trainer), the interaction and tools are driven through
verl's base-class methods, and everything is checked against our environments and
tools run directly (plain `GuessNumberEnv` / `ArithmeticEnv` / `CalculatorTool`).
"""
from __future__ import annotations

import asyncio
import importlib
import sys
import warnings

import pandas as pd
import pytest
import yaml

from envs.arithmetic import ArithmeticEnv
from envs.guess_number import GuessNumberEnv, expert_action
from workbench.cli import main
from workbench.config import ConfigStore, EnvironmentConfig
from workbench.reward import RewardManager
from workbench.tools import CalculatorTool
from workbench.tools.registry import ToolRegistry
from workbench.compat.verl_config import VERL_SECTIONS, from_verl
from workbench.compat.verl_runtime import VERL_INSTALL

try:
    for _module in ("verl.interactions.base", "verl.tools.base_tool", "hydra"):
        importlib.import_module(_module)
    VERL_MISSING = ""
except ImportError as exc:
    VERL_MISSING = f"verl is not importable ({exc}); install it with: {VERL_INSTALL}"

needs_verl = pytest.mark.skipif(bool(VERL_MISSING), reason=VERL_MISSING or "verl is importable")

FILES = ["README.md", "interaction.yaml", "train.parquet", "val.parquet", "verl_trainer.yaml"]


@pytest.fixture
def generated(monkeypatch):
    """Puts an export folder on sys.path; forgets its generated module afterwards (two
    tests write modules of the same name into different folders)."""
    names = []

    def add(out, module):
        monkeypatch.syspath_prepend(str(out))
        sys.modules.pop(module, None)
        names.append(module)

    yield add
    for name in names:
        sys.modules.pop(name, None)


def export(out, *args: str) -> None:
    assert main(["export-verl", "--out", str(out), *args]) == 0


def play(interaction, kwargs, prompt, reference, actions):
    """Drive `interaction` as verl's ToolAgentLoop does and step `reference` alongside;
    returns [(verl's (done, text, score, extra), reference's (obs, reward, done or is_done(), info))]."""
    messages = [dict(m) for m in prompt]
    pairs = []

    async def run():
        iid = await interaction.start_interaction("request-1", **kwargs)
        assert iid == "request-1"
        while True:
            action = actions.pop(0) if actions else expert_action(reference)
            messages.append({"role": "assistant", "content": action})
            got = await interaction.generate_response(iid, messages, **kwargs)
            obs, reward, done, info = reference.step(action)
            pairs.append((got, (obs, reward, done or reference.is_done(), info)))
            messages.append({"role": "user", "content": got[1]})
            if got[0]:
                break
        total = await interaction.calculate_score(iid)
        await interaction.finalize_interaction(iid)
        assert iid not in interaction.episodes
        return total

    return pairs, asyncio.run(run())


@needs_verl
def test_guess_number_through_verl_matches_the_env(tmp_path, generated):
    from verl.interactions.base import BaseInteraction
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
    from verl.utils.import_utils import load_extern_object

    out = tmp_path / "gn"
    export(out, "--env", "guess_number", "--train-size", "6", "--val-size", "3")
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES + ["guess_number_verl.py"])  # no tools.yaml

    # the dataset: one row per seed, the first prompt is the env's own reset text
    train, val = pd.read_parquet(out / "train.parquet"), pd.read_parquet(out / "val.parquet")
    assert set(train.columns) == {"data_source", "agent_name", "prompt", "reward_model", "extra_info"}
    assert [row["seed"] for row in train.extra_info] == list(range(6))
    assert [row["seed"] for row in val.extra_info] == [10_000, 10_001, 10_002]
    reference = GuessNumberEnv(ConfigStore().environment)  # as workbench's Trainer builds it
    for i, row in train.iterrows():
        assert row.data_source == "workbench/guess_number" and row.agent_name == "tool_agent"
        assert [m["role"] for m in row.prompt] == ["system", "user"]
        assert row.prompt[1]["content"] == reference.reset(seed=i)
        assert row.prompt[0]["content"] == reference.get_prompt_prefix()
        assert dict(row.extra_info["interaction_kwargs"]) == {"name": "guess_number", "seed": i}
        assert row.extra_info["index"] == i and row.reward_model["ground_truth"] == str(i)
    assert "tools_kwargs" not in train.extra_info[0] or train.extra_info[0]["tools_kwargs"] is None

    # verl's own loader builds the interaction from interaction.yaml
    generated(out, "guess_number_verl")
    interactions = initialize_interactions_from_config(str(out / "interaction.yaml"))
    assert list(interactions) == ["guess_number"]
    interaction = interactions["guess_number"]
    assert isinstance(interaction, BaseInteraction) and interaction.name == "guess_number"

    row = train.iloc[3]
    kwargs = dict(row.extra_info["interaction_kwargs"])
    reference.reset(seed=kwargs["seed"])
    pairs, total = play(interaction, kwargs, row.prompt, reference, ["no idea", "99"])
    for (done, text, score, extra), (obs, reward, ref_done, info) in pairs:
        assert text == obs
        assert score == pytest.approx(reward) and extra["env_reward"] == pytest.approx(reward)
        assert done == ref_done
        assert extra["invalid_action"] == bool(info.get("invalid_action"))
    rewards = [ref[1] for _, ref in pairs]
    assert rewards[:2] == [-0.1, -0.1] and rewards[-1] == 1.0 and pairs[-1][0][3]["success"]
    assert pairs[-1][0][1] == f"Correct! The number was {reference.secret}."
    assert total == pytest.approx(sum(rewards))

    # the reward function, loaded from the file as verl's reward loop does
    compute_score = load_extern_object(str(out / "guess_number_verl.py"), "compute_score")
    scores = [got[2] for got, _ in pairs]
    assert compute_score(data_source=row.data_source, solution_str="", ground_truth="3",
                         extra_info={"turn_scores": scores, "tool_rewards": []}) == pytest.approx(sum(rewards))
    with pytest.raises(ValueError, match="turn_scores"):
        compute_score(data_source=row.data_source, solution_str="", ground_truth="3", extra_info={})


@needs_verl
def test_arithmetic_tool_through_verl_matches_our_tool(tmp_path, generated):
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config
    from verl.tools.base_tool import BaseTool
    from verl.tools.schemas import ToolResponse
    from verl.tools.utils.tool_registry import initialize_tools_from_config

    out = tmp_path / "ar"
    export(out, "--env", "arithmetic", "--train-size", "4", "--val-size", "2")
    assert sorted(p.name for p in out.iterdir()) == sorted(FILES + ["arithmetic_verl.py", "tools.yaml"])
    train = pd.read_parquet(out / "train.parquet")
    reference = ArithmeticEnv(ConfigStore().environment)
    for i, row in train.iterrows():
        assert row.prompt[1]["content"] == reference.reset(seed=i)
        assert dict(row.extra_info["tools_kwargs"]["calculator"]["create_kwargs"]) == {"seed": i}

    generated(out, "arithmetic_verl")
    tools = initialize_tools_from_config(str(out / "tools.yaml"))
    assert [t.name for t in tools] == ["calculator"]
    tool = tools[0]
    assert isinstance(tool, BaseTool)
    schema = tool.get_openai_tool_schema()
    assert schema.function.parameters.required == ["expression"]
    assert schema.function.parameters.properties["expression"].type == "string"
    assert schema.function.description == CalculatorTool().definition.description

    row = train.iloc[2]
    reference.reset(seed=2)
    create_kwargs = dict(row.extra_info["tools_kwargs"]["calculator"]["create_kwargs"])

    async def use():
        iid, created = await tool.create(create_kwargs=create_kwargs)
        assert isinstance(created, ToolResponse) and tool.instances[iid]["create_kwargs"] == {"seed": 2}
        results = [await tool.execute(iid, {"expression": e}) for e in ("7 + 3*4 - 5", reference.expression, "2 +")]
        results.append(await tool.execute(iid, {}))
        reward = await tool.calc_reward(iid)
        await tool.release(iid)
        assert iid not in tool.instances
        return results, reward

    results, reward = asyncio.run(use())
    ours = ToolRegistry([CalculatorTool()])
    (ok, r_ok, m_ok), (story, r_story, _), (bad, r_bad, m_bad), (missing, _, _) = results
    assert ok.text == CalculatorTool().execute(expression="7 + 3*4 - 5") == "14" and m_ok["success"]
    assert story.text == str(reference.answer)
    assert bad.text == ours.execute("calculator", {"expression": "2 +"}).result
    assert bad.text.startswith("Tool 'calculator' raised") and not m_bad["success"]
    assert missing.text == ours.execute("calculator", {}).result and "expression" in missing.text
    assert r_ok == r_story == r_bad == reward == 0.0

    # the final answer goes through the interaction: one env step, the env's reward
    interaction = initialize_interactions_from_config(str(out / "interaction.yaml"))["arithmetic"]
    kwargs = dict(row.extra_info["interaction_kwargs"])

    async def answer():
        iid = await interaction.start_interaction(None, **kwargs)
        messages = [dict(m) for m in row.prompt] + [{"role": "assistant", "content": f"Answer: {reference.answer}"}]
        return await interaction.generate_response(iid, messages, **kwargs)

    done, text, score, extra = asyncio.run(answer())
    obs, env_reward, env_done, info = reference.step(f"Answer: {reference.answer}")
    assert (done, text, score) == (env_done, obs, env_reward) == (True, f"Correct! The answer is {reference.answer}.", 1.0)


def _leaves(data, prefix=""):
    for key, value in data.items():
        if isinstance(value, dict) and value:
            yield from _leaves(value, f"{prefix}{key}.")
        else:
            yield f"{prefix}{key}", value


def _has(config, key):
    node = config
    for part in key.split("."):
        if part not in node.keys():  # keys() lists keys whose value is ??? (MISSING); `in node` does not
            return False
        node = node._get_node(part)
    return True


@needs_verl
def test_trainer_config_and_shaping(tmp_path, generated):
    from hydra import compose, initialize_config_dir
    from verl.interactions.utils.interaction_registry import initialize_interactions_from_config

    run = {"environment": {"name": "guess_number", "max_steps": 8, "params": {"high": 32}},
           "model": {"model_name": "Qwen/Qwen2.5-0.5B-Instruct", "use_lora": False},
           "inference": {"backend": "vllm", "max_tokens": 48, "max_turns": 6, "max_context_tokens": 1024,
                         "temperature": 0.7},
           "training": {"batch_size": 16, "group_size": 8, "mini_batch_size": 8, "learning_rate": 3e-6,
                        "num_iters_per_epoch": 3, "clip_ratio_high": 0.28},
           "checkpoint": {"save_interval": 0, "keep_last_n": 0},
           "reward": {"success_bonus": 2.0, "invalid_action_penalty": 0.5, "efficiency_bonus": 0.1}}
    (tmp_path / "run.yaml").write_text(yaml.safe_dump(run))
    out = tmp_path / "gn32"
    export(out, "--config", str(tmp_path / "run.yaml"), "--val-size", "2")
    train = pd.read_parquet(out / "train.parquet")
    assert len(train) == 2 * 3  # 16 / 8 prompts per step x 3 steps
    assert "between 1 and 32" in train.prompt[0][1]["content"]

    # hydra composes it onto verl's ppo_trainer, as `main_ppo --config-path out --config-name verl_trainer` does
    base_dir = tmp_path / "base"
    base_dir.mkdir()
    (base_dir / "base.yaml").write_text("hydra:\n  searchpath: [pkg://verl.trainer.config]\n"
                                        "defaults: [ppo_trainer, _self_]\n")
    with initialize_config_dir(config_dir=str(base_dir), version_base=None):
        base = compose(config_name="base")
    with initialize_config_dir(config_dir=str(out), version_base=None):
        cfg = compose(config_name="verl_trainer")
    written = yaml.safe_load((out / "verl_trainer.yaml").read_text())
    keys = [k for k, _ in _leaves({k: v for k, v in written.items() if k not in ("hydra", "defaults")})]
    assert [k for k in keys if not _has(base, k)] == []  # every key written is one verl's ppo_trainer has
    arr = cfg.actor_rollout_ref
    assert (cfg.data.train_batch_size, arr.rollout.n, arr.actor.ppo_mini_batch_size) == (2, 8, 1)
    assert (arr.model.path, arr.model.lora_rank, arr.actor.optim.lr) == ("Qwen/Qwen2.5-0.5B-Instruct", 0, 3e-6)
    assert (arr.actor.clip_ratio_low, arr.actor.clip_ratio_high) == (0.2, 0.28)
    assert (cfg.data.max_prompt_length, cfg.data.max_response_length, arr.rollout.response_length) == (976, 48, 48)
    assert (cfg.trainer.save_freq, cfg.trainer.max_actor_ckpt_to_keep, cfg.algorithm.adv_estimator) == (-1, None, "grpo")
    assert arr.rollout.name == "vllm" and arr.rollout.mode == "async" and arr.rollout.temperature == 0.7
    mt = arr.rollout.multi_turn
    assert (mt.enable, mt.max_assistant_turns, mt.interaction_config_path, mt.tool_config_path) == (
        True, 6, "interaction.yaml", None)
    assert arr.rollout.agent.default_agent_loop == "tool_agent"
    assert (cfg.reward.custom_reward_function.path, cfg.reward.custom_reward_function.name) == (
        "guess_number_verl.py", "compute_score")

    # the same table read forwards gives our config back
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # the export-only keys (paths, agent loop) are unmapped
        back = from_verl({k: v for k, v in written.items() if k in VERL_SECTIONS})
    assert (back.training.batch_size, back.training.group_size, back.training.mini_batch_size) == (16, 8, 8)
    assert (back.training.learning_rate, back.training.clip_ratio_high) == (3e-6, 0.28)
    assert (back.inference.max_tokens, back.inference.max_context_tokens, back.inference.max_turns) == (48, 1024, 6)
    assert (back.model.model_name, back.model.use_lora, back.inference.backend) == (
        "Qwen/Qwen2.5-0.5B-Instruct", False, "vllm")
    assert back.checkpoint.save_interval == 0  # (from_verl skips null values: max_actor_ckpt_to_keep stays default)
    assert written["trainer"]["max_actor_ckpt_to_keep"] is None

    # turn scores are shaped by the reward section and add up to RewardManager's score
    generated(out, "guess_number_verl")
    interaction = initialize_interactions_from_config(str(out / "interaction.yaml"))["guess_number"]
    reference = GuessNumberEnv(EnvironmentConfig(name="guess_number", max_steps=8, params={"high": 32}))
    row = train.iloc[1]
    reference.reset(seed=1)
    pairs, total = play(interaction, dict(row.extra_info["interaction_kwargs"]), row.prompt, reference, ["33"])
    assert [got[1] for got, _ in pairs] == [ref[0] for _, ref in pairs]
    assert pairs[0][0][2] == pytest.approx(-0.1 - 0.5)  # invalid: env reward and the penalty
    manager = RewardManager(success_bonus=2.0, invalid_action_penalty=0.5, efficiency_bonus=0.1)
    expected = manager.compute_trajectory_reward({"rewards": [ref[1] for _, ref in pairs],
                                                  "infos": [ref[3] for _, ref in pairs]}, reference)
    assert pairs[-1][1][3]["success"] and expected > 3.0 - 0.6 - 0.05 * 6
    assert sum(got[2] for got, _ in pairs) == pytest.approx(expected) == pytest.approx(total)


def test_unknown_env_is_a_clear_error(tmp_path, capsys):
    out = tmp_path / "none"
    assert main(["export-verl", "--env", "no_such_env", "--out", str(out)]) == 2
    err = capsys.readouterr().err
    assert "unknown environment 'no_such_env'" in err and "guess_number" in err
    assert not out.exists()
