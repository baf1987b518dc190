"""The OpenAI Agents SDK (openai-agents 0.24) drives the gateway as it is, and its episodes train.

Two agents, each run 4 times by `GatewayRollout` on the tiny random model (which writes
neither tool calls nor JSON by itself):
  * a tool-first agent, `ModelSettings(tool_choice="required", parallel_tool_calls=False)` with
    one function tool (the random model would chain calls until the token limit): the SDK
    executes the tool in every episode (then, tool choice reset to auto as the SDK does, the
    model answers in text);
  * an agent with `output_type=` a pydantic model (the SDK sends a strict json_schema): every
    episode's final output parses into the model.
Both batches are token-exact (no alignment warning: the SDK re-sends history the gateway
matches to the sampled ids), record their grammars, and train: the trainer's logprobs of the
sampled tokens equal the engine's (masked) ones, and one update changes the weights.
"""
from __future__ import annotations

import asyncio
from typing import Literal

import pytest
import torch

agents = pytest.importorskip("agents")
from pydantic import BaseModel  # noqa: E402

from workbench.gateway import GatewayRollout  # noqa: E402

agents.set_tracing_disabled(True)  # the SDK would otherwise export traces to OpenAI


class Verdict(BaseModel):
    answer: Literal["yes", "no"]
    sure: bool


def _model(base_url: str):
    from openai import AsyncOpenAI

    client = AsyncOpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    return agents.OpenAIChatCompletionsModel(model="policy", openai_client=client)


def tool_agent(base_url: str, episode_id: str, task: dict) -> float:
    """Moves once with the `move` tool (forced), then reports; reward 1 for moving up."""
    moves: list[str] = []

    @agents.function_tool
    def move(direction: Literal["up", "down", "left", "right"]) -> str:
        """Move one cell on the grid."""
        moves.append(direction)
        return f"You moved {direction}."

    agent = agents.Agent(name="mover", instructions="You are on a grid. Use the move tool, then say where you are.",
                         tools=[move], model=_model(base_url),
                         model_settings=agents.ModelSettings(tool_choice="required", parallel_tool_calls=False,
                                                             max_tokens=96, temperature=1.0))
    asyncio.run(agents.Runner.run(agent, task["question"], max_turns=3))
    task["moves"].append(list(moves))
    return 1.0 if moves and moves[0] == "up" else 0.0


def json_agent(base_url: str, episode_id: str, task: dict) -> float:
    """A structured final output; reward 1 for "yes"."""
    agent = agents.Agent(name="judge", instructions="Answer the question.", output_type=Verdict,
                         model=_model(base_url), model_settings=agents.ModelSettings(max_tokens=48, temperature=1.0))
    result = asyncio.run(agents.Runner.run(agent, task["question"], max_turns=1))
    task["outputs"].append(result.final_output)
    return 1.0 if result.final_output.answer == "yes" else 0.0


@pytest.fixture(scope="module")
def trainer(tiny_model_path, tmp_path_factory):
    from envs import make_env
    from workbench import ConfigStore, Trainer

    c = ConfigStore()
    c.model.model_name, c.model.lora_rank = str(tiny_model_path), 4
    c.model.dtype = "float32"  # engine and trainer logprobs compared at fp32's tolerance (1e-4) below
    c.training.batch_size = c.training.group_size = 4
    c.training.learning_rate = 1e-2
    c.checkpoint.output_dir, c.checkpoint.save_interval = str(tmp_path_factory.mktemp("ckpt")), 0
    return Trainer(c.validate(), environment=make_env("guess_number"))


def _trains(trainer, batch) -> None:
    """Token-exact, scored under the masks the engine sampled with, and one update moves the weights."""
    assert [ep.warnings for ep in batch] == [[]] * len(batch)
    trainer.score(batch)
    trainer.compute_advantages(batch)
    m = batch.loss_mask.bool()
    assert (batch.old_logprobs[m] - batch.rollout_logprobs[m]).abs().max() < 1e-4
    before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
    metrics = trainer.update(batch)
    assert metrics["actor/rollout_logprob_diff"] < 1e-4
    if batch.advantages.abs().sum() > 0:
        after = trainer.policy.trainable_state_dict()
        assert any(not torch.equal(before[k], after[k]) for k in before)


def test_a_tool_first_agent_calls_its_tool_in_every_episode_and_trains(trainer):
    task = {"question": "Where can you go?", "moves": []}
    batch = GatewayRollout(trainer.engine, tool_agent, [task], group_size=4, max_turns=3, seed=2,
                           max_tokens=96).run()
    assert len(task["moves"]) == 4 and all(len(m) == 1 for m in task["moves"]), task["moves"]
    for ep in batch:
        assert ep.num_turns == 2 and ep.turns[0].tool_calls and ep.turns[0].tool_calls[0]["name"] == "move"
        # the first call forced (required, one call); then the SDK's tool choice is back to auto, and
        # parallel_tool_calls=false still allows at most one call in a reply that may be text
        assert (ep.turns[0].constraint["required"], ep.turns[1].constraint["required"]) == (True, False)
    assert sorted(ep.rewards[-1] for ep in batch) == sorted(1.0 if m[0] == "up" else 0.0 for m in task["moves"])
    _trains(trainer, batch)


def test_an_agent_with_an_output_type_gets_valid_json_in_every_episode_and_trains(trainer):
    task = {"question": "Is the sky blue?", "outputs": []}
    batch = GatewayRollout(trainer.engine, json_agent, [task], group_size=4, max_turns=1, seed=5,
                           max_tokens=48).run()
    assert len(task["outputs"]) == 4 and all(isinstance(o, Verdict) for o in task["outputs"])
    assert all(ep.turns[0].constraint["kind"] == "json_schema" for ep in batch)
    assert sorted(ep.rewards[-1] for ep in batch) == sorted(1.0 if o.answer == "yes" else 0.0 for o in task["outputs"])
    _trains(trainer, batch)
