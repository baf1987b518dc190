"""Adapters on the real libraries: TextArena games and reasoning-gym tasks through
check_env, a rollout of the tiny model, and one GRPO step; GymTextEnvironment's API check."""
from __future__ import annotations

import math
import random
from pathlib import Path

import pytest

ta = pytest.importorskip("textarena")
rg = pytest.importorskip("reasoning_gym")

from workbench import (  # noqa: E402
    BaseEnvironment, ConfigStore, GymTextEnvironment, TextArenaEnvironment, Trainer, VerifierEnvironment,
    check_env, make_env,
)
from workbench.environments.adapters.verifier import extract_answer  # noqa: E402

HANOI_3 = ["A C", "A B", "C B", "A C", "B A", "B C", "A C"]  # the optimal 7 moves


def tiny_config(tiny_model_path: Path, tmp_path: Path, env: str) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.environment.name = env
    c.inference.max_tokens = 8
    c.inference.max_turns = 2
    c.training.batch_size = 4
    c.training.group_size = 2
    c.training.micro_batch_size = 2
    c.checkpoint.output_dir = str(tmp_path / "ckpt")
    c.checkpoint.save_interval = 0
    return c.validate()


def replay(env: BaseEnvironment, seed: int, actions: list[str]) -> list[tuple]:
    out = [env.reset(seed=seed)]
    for action in actions:
        out.append(env.step(action))
        if out[-1][2]:
            break
    return out


# -- TextArena ----------------------------------------------------------------------------
@pytest.mark.parametrize("env_id", ["GuessTheNumber-v0", "TowerOfHanoi-v0"])
def test_textarena_games_pass_check_env(env_id):
    env = make_env(f"textarena:{env_id}")
    assert isinstance(env, TextArenaEnvironment) and env.env_id == env_id
    results = check_env(env)
    assert [r.name for r in results if not r.passed] == []
    assert "global_rng" in [r.name for r in results]


def test_tower_of_hanoi_solved_rewards_one_and_reports_success():
    env = TextArenaEnvironment("TowerOfHanoi-v0")
    assert env.max_steps == 28  # twice the game's 14 turns
    obs = env.reset(seed=0)
    assert "Tower of Hanoi with 3 disks" in obs and "A: [3, 2, 1]" in obs
    obs, reward, done, info = env.step("I move the top disk from A to C")  # no brackets: invalid
    assert (reward, done, info["invalid_action"]) == (0.0, False, True)
    assert "invalid move" in obs.lower()
    rewards = []
    for i, move in enumerate(HANOI_3):
        obs, reward, done, info = env.step(move)  # ActionFormattingWrapper writes "A C" as "[A C]"
        rewards.append(reward)
        assert info["invalid_action"] is False
        assert done == (i == len(HANOI_3) - 1)
    assert rewards == [0.0] * 6 + [1.0]
    assert info["success"] is True and "solved" in info["reason"]
    assert "C: [3, 2, 1]" in obs
    assert "[A C]" not in obs  # the game's echo of the player's own move is left out


def test_textarena_partial_reward_at_the_turn_limit_is_not_success():
    env = make_env("textarena:TowerOfHanoi-v0", max_turns=2)  # a game setting, passed to textarena.make
    assert env.params == {"env_id": "TowerOfHanoi-v0", "max_turns": 2} and env.max_steps == 4
    env.reset(seed=0)
    env.step("A B")
    env.step("A C")
    obs, reward, done, info = env.step("B C")  # TextArena counts 3 moves for max_turns=2
    assert info["invalid_action"] is False and "C: [2, 1]" in obs
    # The share of disks placed from the base up: disk 2 is not the base disk, so 0.
    assert done and reward == 0.0 and info["success"] is False and "turn limit" in info["reason"]


def test_textarena_seeding_is_per_instance_and_leaves_global_random_alone():
    env = TextArenaEnvironment("GuessTheNumber-v0")
    random.seed(123)
    expected_next = random.random()
    random.seed(123)

    def secret(seed: int) -> int:
        env.reset(seed=seed)
        return env.game.game_number

    secrets = [secret(s) for s in range(12)]
    assert random.random() == expected_next  # the process's stream did not move
    assert secrets == [secret(s) for s in range(12)]  # same seed, same game
    assert len(set(secrets)) > 3
    # TextArena's own seeding: reset(seed=s) plays the game textarena.make(...).reset(seed=s) plays.
    raw = ta.make("GuessTheNumber-v0")
    raw.reset(num_players=1, seed=5)
    assert secret(5) == raw.env.env.game_number


def test_guess_the_number_binary_search_wins_and_bad_ids_explain():
    env = TextArenaEnvironment("GuessTheNumber-v0")
    env.reset(seed=3)
    lo, hi, done = 1, 20, False
    while not done:
        guess = (lo + hi) // 2
        obs, reward, done, info = env.step(f"My guess is [{guess}]")
        if "higher" in obs:
            lo = guess + 1
        elif "lower" in obs:
            hi = guess - 1
    assert reward == 1.0 and info["success"] and env.step_count <= 5
    with pytest.raises(ValueError, match=r"did you mean \['GuessTheNumber-v0'"):
        TextArenaEnvironment("GuessTheNumbr-v0")
    with pytest.raises(TypeError, match="single-player games; 'TicTacToe-v0' refused num_players=1"):
        TextArenaEnvironment("TicTacToe-v0")
    with pytest.raises(ValueError, match=r"bad game setting \['hihg'\] .*GuessTheNumberEnv"):
        make_env("textarena:GuessTheNumber-v0", hihg=3)


def test_gym_adapter_refuses_other_apis_and_names_the_adapter():
    with pytest.raises(TypeError, match=r"TextArena environment .*TextArenaEnvironment"):
        GymTextEnvironment(ta.make("GuessTheNumber-v0"))
    with pytest.raises(TypeError, match=r"question/answer dataset .*reasoning_gym:<task>"):
        GymTextEnvironment(rg.create_dataset("chain_sum", seed=0))
    with pytest.raises(TypeError, match="already a workbench BaseEnvironment"):
        GymTextEnvironment(TextArenaEnvironment("TowerOfHanoi-v0"))

    class NeedsPlayers:
        def reset(self, num_players, seed=None):
            return None

        def step(self, action):
            return False, {}

    with pytest.raises(TypeError, match=r"requires \['num_players'\]; GymTextEnvironment calls reset\(seed="):
        GymTextEnvironment(NeedsPlayers())


# -- VerifierEnvironment / reasoning-gym ---------------------------------------------------
def test_reasoning_gym_task_scores_with_the_dataset():
    env = make_env("reasoning_gym:chain_sum", size=50)
    assert isinstance(env, VerifierEnvironment) and env.config.name == "reasoning_gym:chain_sum"
    assert env.params == {"seed": 0, "size": 50, "attempts": 1}
    assert [r.name for r in check_env(env) if not r.passed] == []
    question = env.reset(seed=4)
    assert question == env.sample["question"] and question.startswith("State the final answer")
    answer = env.sample["answer"]
    assert str(eval(env.sample["metadata"]["expression"])) == answer  # the dataset's own oracle
    obs, reward, done, info = env.step(f"Adding up: <answer>{answer}</answer>")
    assert (reward, done, info["success"], info["answer"]) == (1.0, True, True, answer)
    env.reset(seed=4)
    obs, reward, done, info = env.step(f"<answer>{int(answer) + 1}</answer>")
    assert (reward, done, info["success"]) == (0.0, True, False)
    env.reset(seed=4)
    _, reward, _, info = env.step(f"the sum is {answer}")  # no tags: reasoning-gym's partial credit
    assert reward == pytest.approx(len(answer) / len(f"the sum is {answer}")) and not info["success"]
    questions = {env.reset(seed=s) for s in range(10)}
    assert len(questions) > 5 and env.reset(seed=4) == question


def test_verifier_attempts_and_rebuild_from_import_paths():
    env = VerifierEnvironment("tests.test_adapters:sample_square", "tests.test_adapters:score_square", attempts=3)
    assert env.max_steps == 3 and env.config.name == "workbench.environments.adapters.verifier:VerifierEnvironment"
    env.reset(seed=1)
    n = env.sample["n"]
    assert env.step("<answer>nope</answer>")[:3] == ("That is not right. Try again (2 attempts left).", 0.0, False)
    obs, reward, done, info = env.step("")
    assert info["invalid_action"] is True and not done
    obs, reward, done, info = env.step(f"<answer>{n * n + 1}</answer>")
    assert (obs, reward, done) == ("That is not right.", 0.5, True)  # last attempt: its partial score
    rebuilt = make_env(env.config.name, env.config)
    assert isinstance(rebuilt, VerifierEnvironment) and rebuilt.attempts == 3
    assert rebuilt.reset(seed=1) == env.reset(seed=1)
    with pytest.raises(ValueError, match="attempts must be an int >= 1"):
        VerifierEnvironment(sample_square, score_square, attempts=0)
    with pytest.raises(TypeError, match="'question' str"):
        VerifierEnvironment(lambda rng: {"q": 1}, score_square).reset(seed=0)
    assert extract_answer("a <answer>1</answer> b <answer> 2 </answer>") == "2"
    assert extract_answer("  just 7 ") == "just 7"


def sample_square(rng: random.Random) -> dict:
    n = rng.randint(2, 30)
    return {"question": f"What is {n} squared?", "n": n}


def score_square(answer: str | None, sample: dict) -> float:
    target = sample["n"] ** 2
    if answer == str(target):
        return 1.0
    return 0.5 if answer and answer.isdigit() and abs(int(answer) - target) <= 2 else 0.0


# -- rollout and one GRPO step on the tiny model -------------------------------------------
@pytest.mark.parametrize("spec", ["textarena:GuessTheNumber-v0", "reasoning_gym:chain_sum"])
def test_rollout_and_one_grpo_step_on_the_tiny_model(spec, tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path, spec))
    assert trainer.config.environment.name == spec
    assert trainer.config.environment.import_path in (
        "workbench.environments.adapters.textarena:TextArenaEnvironment", "workbench.environments.adapters.verifier:VerifierEnvironment")
    batch = trainer.compute_advantages(trainer.score(trainer.rollout()))
    assert len(batch) == 4
    for group in (0, 1):
        eps = [ep for ep in batch if ep.group_id == batch[2 * group].group_id]
        assert len(eps) == 2 and eps[0].env_seed == eps[1].env_seed
        assert eps[0].states[0] == eps[1].states[0]  # one GRPO group plays one task
    for ep in batch:
        assert ep.error is None and ep.num_turns >= 1
        # The rollout's rewards and observations are the environment's: replay the actions.
        fresh = make_env(spec, trainer.config.environment)
        replayed = replay(fresh, ep.env_seed, ep.actions)
        assert replayed[0] == ep.states[0]
        assert [r[1] for r in replayed[1:]] == pytest.approx(ep.rewards)
        assert ep.score == pytest.approx(sum(ep.rewards))
    scores = [ep.score for ep in batch]
    for b, ep in enumerate(batch):  # GRPO advantages: (score - group mean) / (group std + eps)
        group = [s for s, e in zip(scores, batch) if e.group_id == ep.group_id]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((g - mean) ** 2 for g in group) / (len(group) - 1))
        adv = [a for a, m in zip(batch.token_values(b, "advantages"), ep.loss_mask) if m]
        assert adv == pytest.approx([(ep.score - mean) / (std + 1e-6)] * len(adv), abs=1e-4)
    metrics = trainer.update(batch)
    assert metrics["actor/skipped_updates"] == 0 and math.isfinite(metrics["actor/pg_loss"])
