"""Tests for `GymTextEnvironment` with a small real gymnasium.Env that uses Text spaces."""
from __future__ import annotations

import string

import gymnasium
import pytest
from gymnasium import spaces

from workbench.environments.adapters.gym import GymTextEnvironment
from workbench.environments.base import BaseEnvironment, EnvironmentError_
from workbench.environments.checker import check_env

CHARSET = string.ascii_letters + string.digits + " :!.,"
WORDS = ["apple", "river", "stone", "cloud", "tiger", "piano"]


class ReverseWordEnv(gymnasium.Env):
    """Reply with the shown word reversed. 3 words per episode, +1 per correct reply."""

    metadata = {"render_modes": [], "system_prompt": "Reverse the word. Reply with the reversed word only."}

    def __init__(self, words_per_episode: int = 3):
        self.observation_space = spaces.Text(max_length=64, charset=CHARSET)
        self.action_space = spaces.Text(max_length=64, charset=CHARSET)
        self.words_per_episode = words_per_episode
        self.word, self.done_words = "", 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.done_words = 0
        self.word = str(self.np_random.choice(WORDS))
        return f"Reverse: {self.word}", {"word": self.word}

    def step(self, action):
        correct = action.strip().lower() == self.word[::-1]
        self.done_words += 1
        terminated = self.done_words >= self.words_per_episode
        self.word = str(self.np_random.choice(WORDS))
        obs = ("Correct! " if correct else "Wrong. ") + f"Reverse: {self.word}"
        return obs, float(correct), terminated, False, {"correct": correct}


def test_reset_passes_seed_and_returns_text():
    env = GymTextEnvironment(ReverseWordEnv())
    assert isinstance(env, BaseEnvironment)
    first = env.reset(seed=3)
    assert first.startswith("Reverse: ") and env.reset(seed=3) == first
    assert {GymTextEnvironment(ReverseWordEnv()).reset(seed=s) for s in range(10)} != {first}
    assert env.get_prompt_prefix().startswith("Reverse the word")
    assert env.max_steps == 100 and env.get_state_description() == first


def test_step_maps_terminated_and_truncated():
    env = GymTextEnvironment(ReverseWordEnv())
    obs = env.reset(seed=0)
    word = obs.split(": ")[1]
    obs, reward, done, info = env.step(word[::-1].upper())
    assert reward == 1.0 and not done and info["correct"] and info == {
        "correct": True, "terminated": False, "truncated": False, "action_span": [0, len(word)]}
    env.step("nope")
    obs, reward, done, info = env.step("nope")
    assert done and info["terminated"] and not info["truncated"] and reward == 0.0
    with pytest.raises(EnvironmentError_):
        env.step("again")


def test_workbench_max_steps_truncates():
    env = GymTextEnvironment(ReverseWordEnv(words_per_episode=10), {"max_steps": 2, "system_prompt": "Hi."})
    env.reset(seed=1)
    assert not env.step("x")[2]
    _, _, done, info = env.step("x")
    assert done and info["truncated"] and not info["terminated"]
    assert env.get_prompt_prefix() == "Hi."


def test_gym_id_and_time_limit():
    gymnasium.register("ReverseWord-v0", entry_point=ReverseWordEnv, max_episode_steps=2)
    try:
        env = GymTextEnvironment("ReverseWord-v0", words_per_episode=5)
        assert env.max_steps == 2 and "ReverseWord-v0" in repr(env)
        env.reset(seed=0)
        env.step("a")
        _, _, done, info = env.step("b")
        assert done and info["truncated"]
        env.close()
    finally:
        gymnasium.registry.pop("ReverseWord-v0", None)


def test_unseeded_reset_continues_gym_rng_and_adapter_passes_check_env():
    env = GymTextEnvironment(ReverseWordEnv(), {"seed": 5})
    seeded = env.reset()
    assert seeded == GymTextEnvironment(ReverseWordEnv()).reset(seed=5)
    assert all(r.passed for r in check_env(env))


def test_rejects_non_env():
    with pytest.raises(TypeError, match="gymnasium.Env"):
        GymTextEnvironment(object())
