# %% [markdown]
# # PPO and GRPO on the same episodes
#
# Both algorithms push up the probability of tokens with a positive **advantage** and down those
# with a negative one, and both keep the policy near a **reference** (the model before training)
# with a KL term. They differ in where the advantage comes from:
#
# * **GRPO**: no critic. Sample a group of episodes from the same start; an episode's advantage is
#   its score standardised within the group, the *same number on every token* it sampled.
#   KL enters as a loss term (`use_kl_loss`, the `low_var_kl` estimator).
# * **PPO with GAE**: a critic (a copy of the model with a value head) predicts the return at each
#   token; the advantage is built from the critic's errors token by token, so it can differ
#   *within* an episode (an early good guess vs a late bad one). KL enters the reward
#   (`use_kl_in_reward`, per-token penalty `kl_coef * (logp - ref_logp)`).
#
# Here both look at one batch of episodes with the same policy weights.

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
import tempfile
from pathlib import Path

from ipywidgets import HTML, HBox, VBox

from workbench import ConfigStore
from workbench.trajectory import TrajectoryBatch
from workbench.training import Trainer
from workbench.widgets import TokenView


def make_config(estimator):
    c = ConfigStore()
    c.model.model_name = "smollm2-135m-instruct"
    c.environment.name = "guess_number"
    c.inference.max_tokens = 12 if SMOKE else 24
    c.environment.max_steps = 3 if SMOKE else 4      # guesses the game allows ...
    c.inference.max_turns = c.environment.max_steps  # ... and turns a rollout plays
    c.training.batch_size = 4 if SMOKE else 8
    c.training.group_size = 2 if SMOKE else 4
    c.training.learning_rate = 1e-3
    c.training.adv_estimator = estimator
    if estimator == "grpo":
        c.training.use_kl_loss = True
    else:
        c.training.use_kl_in_reward = True
        c.training.kl_coef = 0.05
    c.checkpoint.save_interval = 0
    c.checkpoint.resume = False
    return c.validate()


# %% [markdown]
# What differs between the two configs:

# %%
# NBVAL_CHECK_OUTPUT
a, b = make_config("grpo").to_dict(), make_config("gae").to_dict()
for section in a:
    for key in a[section]:
        if a[section][key] != b[section][key]:
            print(f"{section}.{key}: grpo={a[section][key]!r}  ppo={b[section][key]!r}")

# %% [markdown]
# At the start the policy *is* the reference (LoRA adapters start at zero), so the KL is exactly 0.
# One GRPO step moves it away; the PPO trainer then gets the same adapter weights, so both compare
# the same policy with the same reference.

# %%
grpo = Trainer(make_config("grpo"))
grpo.fit(steps=1 if SMOKE else 2)
ppo = Trainer(make_config("gae"))
ppo.policy.load_trainable_state_dict(grpo.policy.trainable_state_dict())
ppo.engine.sync_weights(ppo.policy.model)
print(grpo, ppo, sep="\n")

# %% [markdown]
# One rollout, stored and loaded twice, so both trainers see identical tokens:

# %%
episodes = grpo.rollout()
path = episodes.save(Path(tempfile.mkdtemp(prefix="wb-ppo-grpo-")) / "episodes.jsonl")
batch_grpo, batch_ppo = TrajectoryBatch.load(path), TrajectoryBatch.load(path)
grpo.score(batch_grpo)
grpo.compute_advantages(batch_grpo)
ppo.score(batch_ppo)
ppo.compute_advantages(batch_ppo)
print(batch_grpo)
print(batch_ppo)

# %% [markdown]
# ## Per episode
#
# GRPO's advantage is one number per episode; PPO's varies along the episode (min / mean / max over
# the tokens the model sampled). The KL columns use each algorithm's estimator on the same logprobs.

# %%
import pandas as pd


def trained(batch, name, i):
    values = batch.token_values(i, name)
    return [v for v, m in zip(values, batch[i].loss_mask) if m]


rows = []
for i, ep in enumerate(batch_grpo):
    g, p = trained(batch_grpo, "advantages", i), trained(batch_ppo, "advantages", i)
    rows.append({"episode": i, "group": ep.group_id, "score": ep.score, "turns": ep.num_turns,
                 "grpo_adv": g[0] if g else 0.0,
                 "ppo_adv_min": min(p, default=0.0), "ppo_adv_mean": sum(p) / max(len(p), 1),
                 "ppo_adv_max": max(p, default=0.0),
                 "kl_grpo(k3)": sum(trained(batch_grpo, "kl", i)) / max(len(g), 1),
                 "kl_ppo(k1)": sum(trained(batch_ppo, "kl", i)) / max(len(p), 1)})
pd.DataFrame(rows).round(4)

# %% [markdown]
# ## Token by token
#
# Left GRPO, right PPO, same episode (the two episode dropdowns are linked: pick it in either).
# With **advantages**, GRPO paints every sampled token of an episode the same colour; PPO's colours
# change along the turns. Each view spans its colours over the shown episode's own values (the
# legend prints the range); click **batch scale** to use one range for the whole batch, so that
# colours compare across episodes. Switch both to **kl**: the same tokens stand out (where the
# trained policy and the reference disagree), with slightly different values from the two
# estimators.

# %%
from ipywidgets import Layout, link

left = TokenView(batch_grpo, grpo.tokenizer, field="advantages")
right = TokenView(batch_ppo, ppo.tokenizer, field="advantages")
link((left, "index"), (right, "index"))
half = Layout(width="50%", min_width="0", padding="0 6px 0 0")
HBox([VBox([HTML("<b>GRPO</b>"), left], layout=half), VBox([HTML("<b>PPO (GAE)</b>"), right], layout=half)])

# %% [markdown]
# Along one episode (x = token position, only sampled tokens). The dotted line is the PPO critic's
# value estimate. It is flat at 0 here: the critic's value head starts with zero weights and bias,
# and this notebook never trains the critic (only the GRPO trainer took a step), so GAE's
# advantages are built from rewards alone. After some `ppo.fit` steps the line moves.

# %%
import plotly.graph_objects as go

i = 0
positions = [t for t, m in enumerate(batch_grpo[i].loss_mask) if m]
fig = go.FigureWidget()
fig.add_scatter(x=positions, y=trained(batch_grpo, "advantages", i), mode="markers", name="GRPO advantage")
fig.add_scatter(x=positions, y=trained(batch_ppo, "advantages", i), mode="markers", name="PPO advantage")
fig.add_scatter(x=positions, y=trained(batch_ppo, "values", i), mode="lines",
                name="PPO critic value (untrained: 0)", line=dict(dash="dot"))
fig.update_layout(height=320, template="plotly_white", xaxis_title="token position",
                  yaxis_title="advantage / value", margin=dict(l=50, r=10, t=30, b=40))
print("largest |critic value| on the sampled tokens:", max(abs(v) for v in trained(batch_ppo, "values", i)))
fig

# %% [markdown]
# ## Which one?
#
# * GRPO needs groups (several episodes per start) but no critic: half the memory, simple, and
#   strong when the outcome is what matters.
# * PPO learns a critic (more memory and compute, another learning rate to tune) but gives credit
#   to individual turns, which helps in long episodes where the group comparison is too coarse.
#
# Switch in the config: `training.adv_estimator = "grpo"` or `"gae"` (also `"rloo"`,
# `"reinforce_plus_plus"`, `"reinforce_plus_plus_baseline"`).
