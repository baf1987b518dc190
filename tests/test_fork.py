"""Fork an episode at any turn: replay checked against the record, edited turns, branches.

Episodes are real: the tiny model plays guess_number (and arithmetic with its calculator
tool) through a `Rollout`; forks replay them on fresh environments from the registry.
"""
from __future__ import annotations

import dataclasses

import pytest

from envs import make_env
from envs.guess_number import GuessNumberEnv
from workbench import ConfigStore
from workbench.debug import ReplayMismatch, fork
from workbench.rollout import Rollout
from workbench.rollout.fork import fork_episode, replay
from workbench.trajectory import TrajectoryBatch

PREFIX_FIELDS = ("token_ids", "loss_mask", "rollout_logprobs")


def run_config(model_path, env: str = "guess_number", **inference) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(model_path)
    c.environment.name = env
    c.inference.max_turns = 3
    c.inference.max_tokens = 6
    for k, v in inference.items():
        setattr(c.inference, k, v)
    return c.validate()


def record(engine, config: ConfigStore, seeds=(0, 1), human: dict[int, str] | None = None) -> TrajectoryBatch:
    """Episodes rolled out with the run's settings (turn 0 typed for the episodes in `human`)."""
    inf = config.inference
    envs = [make_env(config.environment.name, config.environment) for _ in seeds]
    rollout = Rollout(engine, envs, seeds=list(seeds), max_turns=inf.max_turns, max_tokens=inf.max_tokens,
                      temperature=inf.temperature, max_context_tokens=inf.max_context_tokens, seed=11)
    rollout.reset()
    if human:
        rollout.step(human_actions=human)
    return rollout.run()


def prefix_differences(branch, original, position: int) -> list[str]:
    """Names of the token lists whose first `position` entries differ (empty = identical)."""
    return [name for name in PREFIX_FIELDS if getattr(branch, name)[:position] != getattr(original, name)[:position]]


@pytest.fixture(scope="module")
def recorded(tiny_engine, tiny_model_path):
    config = run_config(tiny_model_path)
    batch = record(tiny_engine, config, human={1: "8"})
    assert batch[1].turns[0].source == "human"
    return config, batch


def test_fork_prefix_equals_the_original_token_for_token(recorded, tiny_engine):
    config, batch = recorded
    original = batch[0]
    assert original.num_turns == 3  # the tiny model never wins: every episode runs to max_turns
    branches = fork_episode(original, 2, tiny_engine, n=3, config=config, seed=5)
    position = original.turns[2].token_start
    assert len(branches) == 3
    for branch in branches:
        assert branch.forked_from["turn"] == 2 and branch.forked_from["token_position"] == position
        assert prefix_differences(branch, original, position) == []
        assert branch.token_ids[:position] == original.token_ids[:position]
        assert branch.turn_index[:position] == original.turn_index[:position]
        assert branch.num_turns == 3 and branch.done
        assert [t.observation for t in branch.turns[:2]] == [t.observation for t in original.turns[:2]]
    # The comparison above would catch a single changed token, mask or logprob.
    for name in PREFIX_FIELDS:
        broken = type(branches[0])(**{f: list(getattr(branches[0], f)) for f in PREFIX_FIELDS})
        values = getattr(broken, name)
        values[position - 1] = values[position - 1] + 1
        assert prefix_differences(broken, original, position) == [name]
    assert batch.meta.get("fork") is None and branches.meta["fork"]["n"] == 3


def test_replay_against_a_changed_observation_raises_naming_the_turn(recorded, tiny_engine):
    config, batch = recorded

    class ChangedSecondReply(GuessNumberEnv):
        """guess_number whose second reply (turn 1) reads differently."""

        def reset(self):
            self.replies = 0
            return super().reset()

        def step(self, action):
            obs, reward, done, info = super().step(action)
            self.replies += 1
            return (obs + " (changed)" if self.replies == 2 else obs), reward, done, info

    original = batch[1]
    # Replaying one turn is unaffected; the second turn's observation differs.
    replay(original, 1, tiny_engine, config=config, environment=lambda: ChangedSecondReply(config.environment))
    with pytest.raises(ReplayMismatch) as info:
        fork_episode(original, 2, tiny_engine, n=2, config=config,
                     environment=lambda: ChangedSecondReply(config.environment))
    err = info.value
    assert err.turn == 1 and err.what == "observation"
    assert "turn 1" in str(err)
    assert err.recorded == original.turns[1].observation
    assert err.replayed == original.turns[1].observation + " (changed)"
    assert repr(err.recorded) in str(err) and repr(err.replayed) in str(err)
    # Another seed's secret: the reply to the typed guess "8" at turn 0 reads differently.
    secrets = {}
    for seed in range(1, 40):
        env = make_env("guess_number", config.environment)
        env.reset(seed=seed)
        secrets[seed] = env.step("8")[0]
    seed = next(s for s, obs in secrets.items() if obs != original.turns[0].observation)
    with pytest.raises(ReplayMismatch, match="differs at turn 0"):
        fork_episode(dataclasses.replace(original, env_seed=seed), 1, tiny_engine, n=1, config=config)


def test_edited_action_has_mask_zero_and_is_marked(recorded, tiny_engine):
    config, batch = recorded
    original = batch[0]
    branches = fork(original, turn=1, action="9", n=2, engine=tiny_engine, config=config)
    tok = tiny_engine.tokenizer
    for branch in branches:
        edited = branch.turns[1]
        assert edited.source == "edited" and edited.action == "9"
        span = range(edited.token_start, edited.token_end)
        assert edited.token_start == original.turns[1].token_start
        assert [branch.loss_mask[i] for i in span] == [0] * len(span)
        assert [branch.rollout_logprobs[i] for i in span] == [0.0] * len(span)
        assert tok.decode(branch.token_ids[edited.token_start:edited.token_end - 1]) == "9"
        assert branch.forked_from["edit"] == "action" and branch.forked_from["text"] == "9"
        # The environment heard "9": its reply is guess_number's answer to 9.
        assert "9 is too" in edited.observation or "Correct" in edited.observation
        assert branch.turns[2].source == "model" and sum(branch.loss_mask[branch.turns[2].token_start:
                                                                         branch.turns[2].token_end]) > 0


def test_edited_observation_replaces_what_the_model_sees(recorded, tiny_engine):
    config, batch = recorded
    original = batch[0]
    text = "17 is too high. Guess lower."
    branches = fork_episode(original, 1, tiny_engine, observation=text, n=1, config=config, temperature=0)
    branch = branches[0]
    position = original.turns[0].token_end
    assert branch.forked_from["token_position"] == position
    assert prefix_differences(branch, original, position) == []
    assert branch.turns[0].observation == text
    seen = tiny_engine.tokenizer.decode(branch.token_ids[position:branch.turns[1].token_start])
    assert text in seen and original.turns[0].observation not in seen
    assert branch.states[1] == text


def test_n_branches_come_back_with_returns_and_greedy_ones_agree(recorded, tiny_engine):
    config, batch = recorded
    original = batch[1]
    greedy = fork_episode(original, 0, tiny_engine, n=3, config=config, temperature=0)
    assert len(greedy) == 3
    assert greedy[0].token_ids == greedy[1].token_ids == greedy[2].token_ids
    for branch in greedy:
        assert branch.done and branch.num_turns == 3
        assert branch.outcome == pytest.approx(sum(t.reward for t in branch.turns))
        assert branch.forked_from["original_outcome"] == original.outcome


def test_fork_of_a_saved_batch_with_the_run_config(tiny_model_path, tmp_path):
    from workbench.training import Trainer

    config = run_config(tiny_model_path)
    config.model.lora_rank = 4
    config.training.batch_size, config.training.group_size = 2, 2
    config.checkpoint.output_dir = str(tmp_path / "ckpt")
    trainer = Trainer(config, environment=make_env("guess_number"))
    batch = trainer.score(trainer.rollout())
    trainer.config.save(tmp_path / "config.yaml")
    loaded = TrajectoryBatch.load(batch.save(tmp_path / "rollouts" / "step_000000.jsonl.gz"))
    run_config_ = ConfigStore.load(tmp_path / "config.yaml")
    original = loaded[0]
    branches = fork(original, turn=1, action="4", n=2, engine=trainer.engine, config=run_config_)
    position = original.turns[1].token_start
    for branch in branches:
        assert prefix_differences(branch, original, position) == []
        assert branch.score is not None  # scored like the original (config.reward)
    # Trainer.fork: the trainer's own engine, environment, parser and tools; scored.
    again = trainer.fork(original, 1, n=2)
    assert len(again) == 2 and all(prefix_differences(b, original, position) == [] for b in again)
    assert again.has("token_level_scores")
    # A Trainer passed to debug.fork does the same.
    assert len(fork(original, 1, n=1, engine=trainer)) == 1
    with pytest.raises(ValueError, match="the trainer's own config"):
        fork(original, 1, n=1, engine=trainer, config=run_config_)


def test_fork_replays_tool_calls(tiny_engine, tiny_model_path):
    """arithmetic with the calculator: a typed tool call at turn 0 re-runs when replayed."""
    config = run_config(tiny_model_path, env="arithmetic")
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'
    env = make_env("arithmetic")
    rollout = Rollout(tiny_engine, [env], seeds=[3], max_turns=3, max_tokens=6, parser="function_calling", seed=1)
    rollout.reset()
    rollout.step(human_actions={0: call})
    original = rollout.run()[0]
    assert original.turns[0].tool_calls and original.turns[0].tool_calls[0]["result"] == "5"
    branches = fork_episode(original, 1, tiny_engine, n=1, config=config, parser="function_calling")
    assert branches[0].turns[0].tool_calls[0]["result"] == "5"
    assert prefix_differences(branches[0], original, original.turns[1].token_start) == []


def test_an_episode_in_memory_forks_on_a_copy_of_its_own_environment(recorded, tiny_engine, tmp_path):
    config, batch = recorded
    original = batch[0]
    branches = fork_episode(original, 1, tiny_engine, n=1, max_turns=3, max_tokens=6, temperature=0)  # no config
    assert prefix_differences(branches[0], original, original.turns[1].token_start) == []
    loaded = TrajectoryBatch.load(batch.save(tmp_path / "b.jsonl"))
    with pytest.raises(ValueError, match="needs the run's config"):
        fork_episode(loaded[0], 1, tiny_engine, n=1)
