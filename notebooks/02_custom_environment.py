# %% [markdown]
# # Write your own environment
#
# An environment is a subclass of `workbench.BaseEnvironment` with two methods:
#
# * `reset()` returns the first observation as text,
# * `step(action)` takes the model's reply and returns `(observation, reward, done, info)`.
#
# The base class does the bookkeeping: it counts steps, ends the episode after `max_steps`
# (with `info["truncated"] = True`), refuses steps after the end, and reseeds `self.rng` when you
# call `reset(seed=...)`. Draw **all** randomness from `self.rng`, so a seed reproduces an episode.
# Put `info["success"] = True` on the step that solves the task, and `info["invalid_action"] = True`
# on replies you cannot use (reward shaping and the dashboard read them).

# %%
import os
import warnings

# Idle torch threads sleep instead of spinning: on a busy, shared CPU spinning threads
# fight each other and a forward pass can get up to 15x slower. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch
from transformers.utils import logging as hf_logging

SMOKE = os.environ.get("WORKBENCH_SMOKE") == "1"   # CI: smaller budgets, every cell still runs for real
torch.set_num_threads(int(os.environ.get("WORKBENCH_THREADS", 2)))   # 2 threads suit a 135M model
hf_logging.disable_progress_bar()   # no "Loading weights" bars
warnings.filterwarnings("ignore", category=FutureWarning)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# Our example: an addition quiz. Each episode asks `questions` additions in a row; every right
# answer earns 1.0, a reply without a number costs 0.1 and the question is asked again.
# Settings come in through the config dict: `max_steps` and `seed` are fields of the config,
# anything else lands in `self.params`.

# %%
import re

from workbench import BaseEnvironment


class AdditionQuiz(BaseEnvironment):
    """Answer `questions` additions in a row; reward 1.0 per right answer."""

    def __init__(self, config=None):
        super().__init__(config)
        self.questions = int(self.params.get("questions", 3))
        self.max_number = int(self.params.get("max_number", 20))

    def get_prompt_prefix(self):
        return "You are taking an addition quiz. Reply with the sum only, as a number."

    def _ask(self):
        self.a = self.rng.randint(1, self.max_number)
        self.b = self.rng.randint(1, self.max_number)
        return f"Question {self.asked + 1} of {self.questions}: what is {self.a} + {self.b}?"

    def reset(self):
        self.asked, self.correct = 0, 0
        return self._ask()

    def step(self, action):
        numbers = re.findall(r"-?\d+", action)
        if not numbers:
            return (f"Please reply with a number. What is {self.a} + {self.b}?", -0.1, False,
                    {"invalid_action": True})
        right = int(numbers[0]) == self.a + self.b
        self.asked += 1
        self.correct += right
        feedback = "Correct!" if right else f"Wrong, {self.a} + {self.b} = {self.a + self.b}."
        if self.asked == self.questions:
            success = self.correct == self.questions
            return (f"{feedback} You got {self.correct} of {self.questions}.", float(right), True,
                    {"success": success})
        return f"{feedback} {self._ask()}", float(right), False, {"success": False}

    def get_state_description(self):
        return f"{self.correct} right out of {self.asked} asked; {self.questions - self.asked} to go."


# %% [markdown]
# Play it by hand: a right answer, a reply without a number, a wrong answer, a right answer.

# %%
# NBVAL_CHECK_OUTPUT
quiz = AdditionQuiz({"questions": 3, "max_steps": 6})
print(quiz.reset(seed=0))
for reply in [str(quiz.a + quiz.b), "no idea", "7", None]:
    reply = reply if reply is not None else f"It is {quiz.a + quiz.b}."
    obs, reward, done, info = quiz.step(reply)
    print(f"> {reply!r}\n  {obs}  (reward {reward:+.1f}, done={done}, info={info})")
print(quiz.get_state_description())

# %% [markdown]
# ## Check it
#
# `check_env` runs a list of small checks (reset returns text, same seed same episode, step
# returns the right types, done really ends the episode, `max_steps` is respected, garbage
# replies do not crash it, ...) and says what to fix when one fails.

# %%
# NBVAL_CHECK_OUTPUT
from workbench.environments.checker import check_env

for result in check_env(AdditionQuiz({"questions": 3})):
    print(result)

# %% [markdown]
# A classic bug: drawing numbers from the global `random` module instead of `self.rng`. Episodes
# can then never be reproduced, and GRPO groups (episodes from the same seed) would not even
# start from the same question. `check_env` catches it:

# %%
# NBVAL_CHECK_OUTPUT
import random


class SloppyQuiz(AdditionQuiz):
    def _ask(self):
        self.a, self.b = random.randint(1, 20), random.randint(1, 20)   # global RNG: not reproducible
        return f"What is {self.a} + {self.b}?"


random.seed(0)  # only so that this cell prints the same text every run
try:
    check_env(SloppyQuiz())
except AssertionError as err:
    print(err)

# %% [markdown]
# ## Register it
#
# `register_env` makes it available by name to `make_env`, the trainer's config
# (`config.environment.name`) and the command line. An optional *expert* (a scripted player) is
# handy for demonstrations and tests.

# %%
# NBVAL_CHECK_OUTPUT
from envs import get_expert, list_envs, make_env, register_env

register_env("addition_quiz", AdditionQuiz, expert=lambda env: str(env.a + env.b))
print(list_envs())
env = make_env("addition_quiz", questions=2, max_steps=4)
print(env.reset(seed=1), "| expert says", get_expert("addition_quiz")(env))

# %% [markdown]
# ## Roll it out with the model
#
# A `Rollout` plays many episodes in lock-step with one generation engine. Episodes that share a
# seed form a GRPO group. Each episode is recorded token by token, with a loss mask saying
# which tokens the model sampled.

# %%
from workbench.engines.hf import HFEngine
from workbench.models import load_model_and_tokenizer
from workbench.rollout import Rollout
from workbench.widgets import ConversationView, TokenView

model, tokenizer = load_model_and_tokenizer("smollm2-135m-instruct")
engine = HFEngine(model, tokenizer)
rollout = Rollout.from_env(engine, lambda: make_env("addition_quiz", questions=2, max_steps=4),
                           num_groups=2, group_size=2 if SMOKE else 4,
                           max_turns=3 if SMOKE else 4, max_tokens=8 if SMOKE else 16, seed=0)
batch = rollout.run()
batch

# %%
ConversationView(batch)

# %% [markdown]
# The summary has fixed metric names (the training dashboard plots the same ones), shown here
# to 3 decimals:

# %%
{name: round(value, 3) for name, value in batch.summary().items()}

# %% [markdown]
# And the raw token record: `render` wraps the tokens the model sampled in `[[...]]`, everything
# else (system prompt, observations, chat-template glue) is context. `TokenView` shows the same
# with colours.

# %%
print(batch[0].render(tokenizer)[-700:])

# %%
TokenView(batch, tokenizer, field="loss_mask")

# %% [markdown]
# To train on it: `Trainer(config, environment=AdditionQuiz({...}))` (the environment is copied
# for each episode), or `config.environment.name = "addition_quiz"` after registering it.
