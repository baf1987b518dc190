# %% [markdown]
# # Quickstart: play, roll out, look inside, train
#
# This notebook is the whole loop of **workbench** in a few minutes on a CPU:
#
# 1. play the *guess the number* environment yourself,
# 2. let a small language model (SmolLM2-135M-Instruct, shipped inside the package) play a batch of games,
# 3. read those games as a chat and token by token, with the numbers RL puts on each token,
# 4. train the model with GRPO for a few steps while a dashboard draws the curves.
#
# Run the cells from top to bottom. With the environment variable `WORKBENCH_SMOKE=1` the
# budgets shrink (fewer episodes, shorter answers, fewer steps); every cell still runs for real.

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

# %%
from ipywidgets import VBox

from envs import make_env
from workbench import ConfigStore
from workbench.training import Trainer
from workbench.widgets import ConversationView, PlayWidget, TokenView, TrainingDashboard, TrajectoryTable

# %% [markdown]
# ## 1. The environment
#
# An environment is a plain Python object: `reset()` returns the first observation (text),
# `step(action)` takes the model's reply (text) and returns `(observation, reward, done, info)`.
# In `guess_number` the environment picks a secret number between 1 and 16 and answers
# "higher"/"lower". A right guess earns 1.0, a wrong one costs 0.05, a reply without a number 0.1.
# It allows 6 guesses unless its config says otherwise (`max_steps`; the trainer below sets fewer).
# The same seed always gives the same secret:

# %%
# NBVAL_CHECK_OUTPUT
env = make_env("guess_number")
print(env.reset(seed=0))
for guess in ["8", "12", "14", "13"]:
    obs, reward, done, info = env.step(guess)
    print(f"{guess:>3} -> {obs!r:45} reward={reward:+.2f} done={done}")

# %% [markdown]
# ## 2. A trainer, and with it the model
#
# All settings live in one `ConfigStore` with a section per concern (`model`, `inference`,
# `training`, `checkpoint`, `environment`). `"smollm2-135m-instruct"` is the embedded model:
# nothing is downloaded. The trainer loads it once (with LoRA adapters, so only a few
# parameters train) and builds a generation engine around it (`trainer.engine`).
#
# GRPO samples several episodes from the same starting point (a *group*, here episodes with the
# same environment seed) and asks: which of them did better than their siblings?

# %%
import tempfile

config = ConfigStore()
config.model.model_name = "smollm2-135m-instruct"
config.environment.name = "guess_number"
config.inference.max_tokens = 12 if SMOKE else 24     # tokens per model turn
config.environment.max_steps = 3 if SMOKE else 5     # guesses the game allows (it tells the model) ...
config.inference.max_turns = config.environment.max_steps   # ... and turns a rollout plays
config.training.adv_estimator = "grpo"
config.training.batch_size = 4 if SMOKE else 8       # episodes per training step ...
config.training.group_size = 2 if SMOKE else 4       # ... in groups sharing a seed
config.training.learning_rate = 3e-4
config.training.use_kl_loss = True                   # stay close to the original model
config.checkpoint.save_interval = 0                  # no checkpoints in this tour ...
config.checkpoint.resume = False
config.checkpoint.output_dir = tempfile.mkdtemp(prefix="wb-quickstart-")   # ... and the run's log in a temp folder
trainer = Trainer(config)
trainer

# %% [markdown]
# ## 3. Play a few turns yourself
#
# `PlayWidget` shows the conversation; type a guess and press Enter or click **Send**. **Ask model** fills the box
# with what the model would say (edit it or send it). Your game is recorded exactly like a model's,
# token by token, but your turns get *loss mask 0*: the trainer never learns from text it did not
# sample.

# %%
play = PlayWidget(make_env("guess_number", max_steps=config.environment.max_steps), engine=trainer.engine,
                  seed=0, max_tokens=config.inference.max_tokens)
play

# %% [markdown]
# So that this notebook also runs unattended, we play two turns from code: `play.send("8")` does
# exactly what typing 8 and pressing Enter does (the widget above updates).

# %%
for guess in ["8", "12"]:
    play.send(guess)

# %%
# NBVAL_CHECK_OUTPUT
ep = play.episode
for t in ep.turns:
    print(f"turn {t.index} [{t.source}] {t.action!r} -> {t.observation!r} reward={t.reward:+.2f}")
print("tokens in the episode:", ep.num_tokens, "| trained on (loss_mask = 1):", ep.response_length)

# %% [markdown]
# What would the model guess next? `ask_model` samples with a fresh random seed on every call, so
# the suggestion can change from run to run. (The rollouts below are seeded by
# `config.inference.seed`, 0 by default, so they repeat.)

# %%
play.ask_model()

# %% [markdown]
# ## 4. Let the model play a batch
#
# `trainer.rollout()` plays `batch_size` episodes in lock-step: one batched generation call per
# turn for all live episodes. The result is a `TrajectoryBatch`: the episodes plus per-token
# tensors (token ids, loss mask, the sampler's logprobs).

# %%
batch = trainer.rollout()
batch

# %%
episodes = batch.to_pandas("episode")
episodes["first_action"] = episodes["first_action"].str.slice(0, 30)   # the first 30 characters of each
episodes[["episode_id", "group_id", "turns", "trained_tokens", "env_reward", "success", "first_action"]]

# %% [markdown]
# ## 5. Read an episode
#
# `ConversationView` shows one episode as a chat: the system prompt (folded), the environment's
# messages, the model's turns with their reward, tool calls and errors. Step through the batch
# with the arrows or the dropdown.

# %%
ConversationView(batch)

# %% [markdown]
# ## 6. Rewards, advantages, and what each token gets
#
# `trainer.score` puts the rewards on tokens; `trainer.compute_advantages` recomputes the policy's
# logprobs, the reference logprobs and the KL between them, and the **advantage**: for GRPO, the
# episode's score standardised within its group, copied onto every token the model sampled.

# %%
trainer.score(batch)
trainer.compute_advantages(batch)
print(batch)

# %% [markdown]
# `TokenView` colours each token by one of these numbers: red = positive advantage (these tokens
# will be made more likely), blue = negative. Grey italic tokens were not sampled by the model
# (prompt, observations, chat template) and get no gradient. Hover a token to read its value, and
# switch the quantity in the dropdown (advantage, KL, logprobs, loss mask). The line above the
# tokens says where the advantage comes from: the episode's score beside its group's mean and
# std, so a lost game is red when it lost by less than its siblings. Before any training the
# policy *is* the reference, so the KL is 0 on every token here; section 7 shows it after training.

# %%
TokenView(batch, trainer.tokenizer, field="advantages")

# %% [markdown]
# `TrajectoryTable` lists the episodes; sort by a column, filter with a pandas query such as
# `success == True` or `turns > 2`, and click a row of the table (or an entry of the list above
# it) to open that episode in the two views below.

# %%
conv, toks = ConversationView(batch), TokenView(batch, trainer.tokenizer)
table = TrajectoryTable(batch, conversation=conv, tokens=toks)
table.sort_by, table.ascending = "reward", False
VBox([table, conv, toks])

# %% [markdown]
# ## 7. Train with a live dashboard
#
# `trainer.fit(steps=N)` repeats rollout → score → advantages → update N more times (run the cell
# again and it trains N more). The dashboard's `callback` receives
# each step's metrics and redraws (at most twice a second, so it never slows training down).

# %%
dash = TrainingDashboard(title="GRPO on guess_number")
display(dash)
history = trainer.fit(steps=2 if SMOKE else 8, callbacks=[dash.callback])
dash.flush()

# %%
trainer.metrics_df()[["step", "reward/mean", "env/success_rate", "kl/mean", "actor/entropy",
                      "rollout/response_length_mean", "perf/step_seconds"]].round(4)

# %% [markdown]
# The last training batch, coloured by the KL to the reference: now that the policy has been
# updated, its sampled tokens have moved away from the original model, some more than others
# (switch "colour by" to `advantages` to see what pushed them).

# %%
TokenView(trainer.last_batch, trainer.tokenizer, field="kl")

# %% [markdown]
# A handful of steps on a CPU will not teach the model much: the reward curve is noisy at this
# size. What you should see is the machinery working: the KL to the reference moving off zero,
# the entropy and response length changing. With `use_kl_loss=True` (and no KL in the reward) the
# KL panel plots the KL loss's estimator, `training.kl_loss_type`: k3 (`low_var_kl`), which is
# never negative. With `use_kl_in_reward=True` it plots `training.kl_penalty`'s estimator, by
# default k1 (`logp - ref_logp` averaged over the sampled tokens), which over a few tokens can go
# below zero although the true KL cannot: such a point is noise, not a bug. Greedy evaluation
# on held-out seeds:

# %%
import pandas as pd

held_out = trainer.evaluate(seeds=range(1000, 1002 if SMOKE else 1008))
pd.Series(held_out, name="held-out (greedy)").round(3).to_frame()

# %% [markdown]
# ## Next
#
# * `02_custom_environment` - write your own environment and check it.
# * `03_tools_and_parsers` - a calculator tool, the three tool-call formats, the multi-turn manager.
# * `04_reward_tuning` - reshape rewards on a stored batch and see the advantages change.
# * `05_ppo_vs_grpo` - per-token advantages and KL of both algorithms on the same episodes.
# * `06_scaling_up` - what changes in the config for vLLM and several GPUs.
# * `07_debugging` - reopen a run from its folder, fork an episode, diff two checkpoints, the run doctor.
# * `08_bring_your_agent` - an agent written with the plain OpenAI client, its episodes trained through the gateway.
# * `09_finding_to_fix` - a doctor's finding, its remedy, a branched run, the two runs side by side.
