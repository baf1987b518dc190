"""Tests for the example environments in `envs/`: registry, determinism, experts,
lenient parsing, rewards, and the seeds' own Simple Text Game on BaseEnvironment."""
from __future__ import annotations

import pytest

from envs import ENVIRONMENTS, EXPERTS, get_expert, list_envs, make_env, text_game
from envs.arithmetic import ArithmeticEnv, parse_action
from envs.grid import GridEnv, shortest_path
from envs.guess_number import GuessNumberEnv
from envs.wordle import WordleEnv, load_words, score_guess
from workbench.config import ConfigStore, EnvironmentConfig
from workbench.environments.base import BaseEnvironment, EnvironmentError_

NAMES = sorted(ENVIRONMENTS)


def play_expert(env, seed: int) -> tuple[bool, list[tuple]]:
    """Play one episode with the env's expert; (success, transcript)."""
    expert = get_expert(env.NAME)
    transcript = [env.reset(seed=seed)]
    done, info = False, {}
    while not done:
        action = expert(env)
        obs, reward, done, info = env.step(action)
        transcript.append((action, obs, reward, done))
    return bool(info.get("success")), transcript


# -- registry -----------------------------------------------------------------------
def test_registry_lists_all_envs():
    assert list_envs() == sorted(["text_game", "guess_number", "arithmetic", "grid", "wordle"])
    assert set(EXPERTS) == set(ENVIRONMENTS)
    for name, cls in ENVIRONMENTS.items():
        assert issubclass(cls, BaseEnvironment) and cls.NAME == name


def test_make_env_unknown_name_lists_names():
    with pytest.raises(ValueError, match="guess_number"):
        make_env("no_such_env")


def test_make_env_params_and_config_fields():
    env = make_env("guess_number", high=32, max_steps=7, seed=3)
    assert (env.low, env.high, env.max_steps, env.config.seed) == (1, 32, 7, 3)
    assert "between 1 and 32" in env.reset()
    env = make_env("grid", EnvironmentConfig(max_steps=20, params={"size": 5}), n_walls=2)
    assert (env.size, env.max_steps, env.params["n_walls"]) == (5, 20, 2)
    env = make_env("grid", {"size": 3, "n_walls": 1})
    assert env.size == 3 and env.max_steps == GridEnv.DEFAULT_MAX_STEPS


def test_unknown_param_is_an_error():
    with pytest.raises(ValueError, match="valid params"):
        make_env("guess_number", hihg=10)


@pytest.mark.parametrize("name", NAMES)
def test_default_max_steps_and_system_prompt_override(name):
    env = make_env(name)
    assert env.max_steps == ENVIRONMENTS[name].DEFAULT_MAX_STEPS
    assert "reply" in env.get_prompt_prefix().lower()
    assert make_env(name, system_prompt="Custom.").get_prompt_prefix() == "Custom."


# -- determinism and experts ----------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_same_seed_same_first_observation_and_transcript(name):
    env = make_env(name)
    assert env.reset(seed=5) == env.reset(seed=5)
    assert len({str(play_expert(make_env(name), s)[1]) for s in range(6)}) > 1  # seeds matter
    _, first = play_expert(make_env(name), 7)
    _, second = play_expert(make_env(name), 7)
    assert first == second
    actions = ["1", "up", "take key", "crane", "Answer: 3"]
    transcripts = []
    for _ in range(2):
        env, out = make_env(name), []
        out.append(env.reset(seed=2))
        for action in actions:
            out.append(env.step(action))
            if env.is_done():
                break
        transcripts.append(out)
    assert transcripts[0] == transcripts[1]


@pytest.mark.parametrize("name", [n for n in NAMES if n != "wordle"])
def test_expert_solves_every_seed(name):
    env = make_env(name)
    for seed in range(12):
        success, transcript = play_expert(env, seed)
        assert success, f"{name} expert failed on seed {seed}: {transcript}"


def test_wordle_expert_wins_90_percent_within_6_guesses():
    env = make_env("wordle")
    wins = 0
    for seed in range(30):
        success, _ = play_expert(env, seed)
        wins += success and len(env.history) <= 6
    assert wins >= 27


def test_lenient_parsers():
    from envs._common import find_direction, first_int, first_number

    assert first_int("I guess 8!") == 8 and first_int("range 1-16") == 1 and first_int("none") is None
    assert first_number("Eight.") == 8 and first_number("maybe 3 or eight") == 3
    assert find_direction("I'll go NORTH now") == "up" and find_direction("Left.") == "left"
    assert find_direction("r") == "right" and find_direction("rather not") is None


# -- guess_number -----------------------------------------------------------------------
def test_guess_number_feedback_and_rewards():
    env = GuessNumberEnv()
    env.reset(seed=0)
    secret = env.secret
    low_guess = 1 if secret > 1 else 16
    obs, reward, done, info = env.step(f"I guess {low_guess}!")
    assert ("higher" if secret > 1 else "lower") in obs and reward == pytest.approx(-0.05) and not done
    obs, reward, done, info = env.step("banana")
    assert info["invalid_action"] and reward == pytest.approx(-0.1) and not done
    obs, reward, done, info = env.step("99")
    assert info["invalid_action"] and "out of range" in obs
    obs, reward, done, info = env.step(f"The answer is {secret}.")
    assert done and info["success"] and reward == 1.0 and str(secret) in obs


def test_guess_number_scaled_reward_and_truncation():
    env = GuessNumberEnv({"scale_by_remaining": True})
    env.reset(seed=1)
    env.step(str(env.secret % 16 + 1))  # wrong
    _, reward, done, _ = env.step(str(env.secret))
    assert done and reward == pytest.approx(5 / 6)
    env.reset(seed=1)
    wrong = str(env.secret % 16 + 1)
    for _ in range(5):
        assert not env.step(wrong)[2]
    obs, _, done, info = env.step(wrong)
    assert done and info["truncated"] and "The number was" in obs
    with pytest.raises(EnvironmentError_):
        env.step("3")


# -- grid ---------------------------------------------------------------------------------
def test_grid_maps_are_solvable_and_bumps_are_reported():
    env = GridEnv({"size": 4, "n_walls": 5})
    for seed in range(40):
        env.reset(seed=seed)
        assert shortest_path(env.size, env.walls, env.agent, env.goal) is not None
    env = GridEnv()
    env.reset(seed=0)
    env.agent, env.walls, env.goal = (0, 0), {(0, 1)}, (3, 3)
    obs, reward, _, info = env.step("go UP please")
    assert "edge" in obs and info["bump"] and reward == pytest.approx(-0.05)
    obs, _, _, info = env.step("East")
    assert "wall" in obs and env.agent == (0, 0)
    obs, _, _, info = env.step("hmm")
    assert info["invalid_action"]
    env.step("down")
    assert env.agent == (1, 0) and env.render().splitlines()[1].startswith("A")


# -- wordle ---------------------------------------------------------------------------------
def test_wordle_word_list_and_scoring():
    words = load_words()
    assert len(words) >= 300 and all(len(w) == 5 and w.isalpha() and w.islower() for w in words)
    assert score_guess("crane", "crane") == "GGGGG"
    assert score_guess("slate", "smoke") == "G...G"
    assert score_guess("eerie", "there") == "Y.Y.G"  # only one spare e left for yellows
    assert score_guess("speed", "abide") == "..Y.Y"  # second e grey: only one e in abide
    assert score_guess("lolly", "hello") == ".YGG."


def test_wordle_invalid_guess_does_not_use_a_guess():
    env = WordleEnv()
    env.reset(seed=3)
    _, reward, _, info = env.step("qwxyz")
    assert info["invalid_action"] and reward == pytest.approx(-0.1) and env.history == []
    assert env.parse_guess("I think the word is CRANE")[0] == "crane"
    assert env.parse_guess("my guess: plant")[0] == "plant"
    env.secret = "smoke"
    obs, _, done, info = env.step("slate")
    assert "SLATE  G . . . G" in obs and not done and info["marks"] == "G...G"
    for _ in range(5):
        obs, reward, done, info = env.step("crane")
    assert done and not info["success"] and "SMOKE" in obs


# -- arithmetic -------------------------------------------------------------------------------
def test_arithmetic_parsing_formats():
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "3 * (4 + 1)"}}</tool_call>'
    assert parse_action(call) == ("calculator", "3 * (4 + 1)")
    assert parse_action('{"name": "calculator", "arguments": "{\\"expression\\": \\"2+2\\"}"}') == ("calculator", "2+2")
    assert parse_action("Let me use calculator((7+3)*2) now") == ("calculator", "(7+3)*2")
    assert parse_action("Action: calculator\nAction Input: 5*5") == ("calculator", "5*5")
    assert parse_action("Answer: 42") == ("answer", "42")
    assert parse_action("So the answer is 1,200.") == ("answer", "1,200")
    assert parse_action('{"name": "answer", "arguments": {"answer": 7}}') == ("answer", "7")
    assert parse_action(" 17 ") == ("answer", "17")
    assert parse_action("I am thinking 3 apples") is None


def test_arithmetic_calculator_then_answer():
    env = ArithmeticEnv({"difficulty": 3})
    problem = env.reset(seed=4)
    assert problem.endswith("?") and env.answer >= 0
    obs, reward, done, info = env.step(f"calculator({env.expression})")
    assert obs.endswith(f"= {env.answer}") and reward == 0.0 and not done
    obs, reward, done, info = env.step("calculator(import os)")
    assert "error" in obs and not done
    obs, reward, done, info = env.step(f"Answer: {env.answer + 1}")
    assert done and reward == 0.0 and not info["success"]
    env.reset(seed=4)
    obs, reward, done, info = env.step("no idea")
    assert info["invalid_action"] and not done
    _, reward, done, info = env.step(f'answer({env.answer})')
    assert done and reward == 1.0 and info["success"]


def test_arithmetic_tools():
    env = ArithmeticEnv()
    tools = env.get_tools()
    assert env.action_parser == "function_calling"
    assert [t.definition.name for t in tools] == ["calculator"]
    assert tools[0].execute(expression="6 * 7") == "42"


# -- text_game ---------------------------------------------------------------------------------
def test_text_game_lenient_commands_and_rewards():
    env = text_game.TextGameEnv()
    obs = env.reset(seed=0)
    assert "key" in obs and "locked door" in obs
    _, reward, _, _ = env.step(f"GO {env.d1.upper()}")
    assert reward < 0 and env.room == 0  # door still locked
    _, reward, _, _ = env.step("open the door")
    assert reward < 0
    _, reward, _, _ = env.step("I will pick up the key.")
    assert reward == pytest.approx(0.1) and "key" in env.inventory
    _, reward, _, info = env.step("dance wildly")
    assert info["invalid_action"] and reward == pytest.approx(-0.1)
    env.step("unlock door")
    env.step(env.d1)  # bare direction means go
    assert env.room == 1
    env.step(f"go {env.d2}")
    _, reward, done, _ = env.step(f"attack the {env.monster}")
    assert not done and reward < 0  # no weapon yet
    assert env.get_state_description().startswith("You are in")


# -- the seeds' own Simple Text Game on BaseEnvironment ----------------------------------------
# Copied verbatim from seed 001 ("Example: Simple Text Game"); only the import differs.
class TextGameEnv(BaseEnvironment):
    """Simple text-based game."""

    def reset(self) -> str:
        self.score = 0
        self.inventory = []
        return "Welcome to the game! You are in a room."

    def step(self, action: str) -> tuple:
        reward = 0.0

        if "take" in action.lower():
            self.inventory.append("item")
            reward = 1.0
        elif "attack" in action.lower():
            reward = 5.0
            self._done = True
        else:
            reward = -0.1

        self.score += reward
        return self.get_state_description(), reward, self._done, {}

    def get_state_description(self) -> str:
        return f"Score: {self.score}, Inventory: {self.inventory}"


def test_seed_text_game_runs_with_base_bookkeeping():
    config = ConfigStore()
    env = TextGameEnv(config.environment)
    assert env.max_steps == 10
    # episode 1: ends by attacking
    assert env.reset() == "Welcome to the game! You are in a room."
    obs, reward, done, _ = env.step("take sword")
    assert (reward, done, env.step_count) == (1.0, False, 1) and "item" in obs
    obs, reward, done, _ = env.step("attack")
    assert done and reward == 5.0 and env.is_done() and env.step_count == 2
    with pytest.raises(EnvironmentError_):
        env.step("take")
    # episode 2: step_count and _done reset; truncated at max_steps
    env.reset()
    assert env.step_count == 0 and not env._done and not env.is_done()
    for i in range(10):
        obs, reward, done, info = env.step("wait")
        assert done == (i == 9)
    assert info["truncated"] and env.step_count == 10
    # episode 3: fresh again
    env.reset()
    assert env.inventory == [] and env.step_count == 0
    assert env.step("take")[2] is False


def test_arithmetic_instruction_goes_on_a_line_after_the_problem():
    plain, told = make_env("arithmetic"), make_env("arithmetic", instruction="Use the calculator tool.")
    problem = plain.reset(seed=5)
    assert told.reset(seed=5) == problem + "\nUse the calculator tool."
    assert "Use the calculator" not in problem  # the default adds nothing
