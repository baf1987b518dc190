# %% [markdown]
# # Reward tuning on a stored batch
#
# The reward decides what the model learns, and shaping it is trial and error. Rolling out again
# for every idea is slow; **re-scoring a stored batch** is instant. `RewardTuner` puts sliders on
# the weights of `RewardManager`
#
#     score = step_reward_weight * sum(env rewards)
#           + success_bonus * [succeeded]
#           - invalid_action_penalty * (#invalid replies)
#           + efficiency_bonus * (unused steps, on success)
#
# and shows how the scores, their ranks and the GRPO advantages (what the update really sees)
# change.

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
# ## A stored batch
#
# To make this notebook exact and quick we first build a batch from *scripted* players: a
# binary-search expert, a player that counts 1, 2, 3, ... and a sloppy one whose first reply has
# no number. They type their moves through a `Rollout` (as human turns), so the batch is a real,
# token-exact `TrajectoryBatch` like any model rollout. No model is needed, only its tokenizer.

# %%
# NBVAL_CHECK_OUTPUT
import tempfile
from pathlib import Path

from envs import get_expert, make_env
from workbench.models import load_tokenizer
from workbench.rollout import Rollout
from workbench.trajectory import TrajectoryBatch
from workbench.widgets import TokenizerOnlyEngine

tokenizer = load_tokenizer("smollm2-135m-instruct")
expert = get_expert("guess_number")


def scripted_move(kind, env, turn):
    if kind == "counter":
        return str(turn + 1)
    if kind == "sloppy" and turn == 0:
        return "hmm, let me think"
    return expert(env)


players = ["expert", "counter", "sloppy"] * 3
seeds = [0, 0, 0, 1, 1, 1, 2, 2, 2]                 # three GRPO groups of three players
rollout = Rollout(TokenizerOnlyEngine(tokenizer), [make_env("guess_number") for _ in seeds],
                  seeds=seeds, max_turns=6)
rollout.reset()
while rollout.live:
    rollout.step(human_actions={i: scripted_move(players[i], rollout.slots[i].env,
                                                 rollout.slots[i].episode.num_turns)
                                for i in rollout.live})
workdir = Path(tempfile.mkdtemp(prefix="wb-reward-"))
stored = TrajectoryBatch.load(rollout.batch.save(workdir / "scripted.jsonl"))
df = stored.to_pandas("episode")
df.insert(1, "player", players)
print(df[["episode_id", "player", "group_id", "turns", "env_reward", "success"]].to_string(index=False))

# %% [markdown]
# ## The tuner
#
# Move a slider: the histograms compare the reward and advantage distributions before (grey:
# the batch as stored) and after (red, same bins); the table lists the episodes whose rank changed.
# The tuner gets the environment the episodes ran with: the efficiency bonus counts the unused
# steps of its step budget (`max_steps`, 6 guesses here).

# %%
from workbench.widgets import RewardTuner

tuner = RewardTuner(stored, environment=make_env("guess_number"))
tuner

# %% [markdown]
# The seeds' shaping (`success_bonus=5`, `invalid_action_penalty=0.5`, `efficiency_bonus=0.1`)
# set from code, which is the same as moving the sliders:

# %%
# NBVAL_CHECK_OUTPUT
tuner.set_weights(success_bonus=5.0, invalid_action_penalty=0.5, efficiency_bonus=0.1)
cols = ["episode", "group", "score_before", "score_after", "rank_before", "rank_after", "adv_before", "adv_after"]
print(tuner.table[cols].round(3).to_string(index=False))


# %% [markdown]
# Look at the advantages, not just the scores: GRPO only compares episodes **within a group**. The
# big success bonus lifts every winner's score by the same 5 points, so it barely changes which
# sibling is better. What moves the advantages are the terms that separate siblings: the
# invalid-action penalty pushes the sloppy player (one reply without a number) below the siblings
# that also won (seeds 1 and 2), and the efficiency bonus adds 0.1 per unused guess, so of two
# wins the shorter scores higher (seed 1: the expert's 4-guess win 6.05, the counter's 5-guess
# win 5.90).
#
# A custom reward function from a code cell replaces the sliders. Outcome only, 1 for a win:

# %%
# NBVAL_CHECK_OUTPUT
def outcome_only(trajectory):
    return 1.0 if trajectory.success else 0.0


tuner.set_reward_fn(outcome_only)
print(tuner.table[cols].round(3).to_string(index=False))
print("episodes whose rank changed:", sorted(tuner.changed["episode"]))

# %% [markdown]
# In a group where every player wins, all advantages are 0: **nothing to learn from that group**.
# Outcome-only rewards need groups with both wins and losses, which is why group size and task
# difficulty matter so much for GRPO.
#
# ## On a model's batch
#
# The same on episodes the model played. They are sampled, but with the seed in
# `config.inference.seed` (0 by default), so rerunning the notebook gives the same episodes. The
# trainer takes the chosen reward function as `reward_fn`; `max_steps` gives the efficiency
# bonus its step budget there, and `environment=trainer.environment` gives it to the tuner.

# %%
from workbench import ConfigStore
from workbench.reward import RewardManager
from workbench.training import Trainer

tuner.set_reward_fn(None)   # back to the sliders
config = ConfigStore()
config.model.model_name = "smollm2-135m-instruct"
config.inference.max_tokens = 12 if SMOKE else 24
config.environment.max_steps = 3 if SMOKE else 5    # guesses the game allows ...
config.inference.max_turns = config.environment.max_steps   # ... and turns a rollout plays
config.training.batch_size = 4 if SMOKE else 8
config.training.group_size = 2 if SMOKE else 4
config.checkpoint.save_interval = 0
config.checkpoint.resume = False
trainer = Trainer(config, reward_fn=RewardManager(**tuner.weights, max_steps=config.environment.max_steps))
model_batch = trainer.rollout()
RewardTuner(model_batch, weights=tuner.weights, environment=trainer.environment)

# %%
trainer.score(model_batch)   # uses reward_fn: episode.score and token_level_scores
[(ep.episode_id, round(ep.score, 3)) for ep in model_batch]
