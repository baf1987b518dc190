# %% [markdown]
# # workbench widgets demo
#
# A tiny model trained for two GRPO steps on guess_number; its last batch in the conversation and
# token views, and the training curves; below them the layouts of the tutorials: the episode
# table linked to two views (01), two token views side by side (05) and the reward tuner (04).
# Served by Voilà in `tests/test_browser.py`.

# %%
import os
import tempfile
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")   # before torch loads: no spinning threads
import torch
from transformers.utils import logging as hf_logging

from workbench import ConfigStore
from workbench.models import build_tiny_model
from workbench.training import Trainer
from ipywidgets import HTML, HBox, Layout, VBox, link

from workbench.widgets import ConversationView, RewardTuner, TokenView, TrainingDashboard, TrajectoryTable

torch.set_num_threads(int(os.environ.get("WORKBENCH_THREADS", 2)))
hf_logging.disable_progress_bar()
config = ConfigStore()
config.model.model_name = str(build_tiny_model())
config.model.lora_rank = 4
config.inference.max_tokens = 8
config.inference.max_turns = 2
config.training.batch_size, config.training.group_size = 4, 2
config.training.use_kl_loss = True
config.training.learning_rate = 5e-3
config.checkpoint.save_interval, config.checkpoint.resume = 0, False
# No progress bars: tqdm closes the bars of finished rollouts, and a closed widget in a saved
# page reads "Error displaying widget: model not found" (a known issue, reported separately).
config.training.progress = False
config.checkpoint.output_dir = tempfile.mkdtemp()
trainer = Trainer(config)
history = trainer.fit(steps=2)
batch = trainer.rollout()
trainer.score(batch)
trainer.compute_advantages(batch)
if os.environ.get("WORKBENCH_DEMO_DIR"):   # the browser test reads the batch it should see
    batch.save(Path(os.environ["WORKBENCH_DEMO_DIR"]) / "batch.jsonl")

# %%
main_conv = ConversationView(batch)
main_conv.add_class("demo-main")
main_conv

# %%
# the first episode whose advantage is not zero (a group where all scores tie has none)
shown = next((i for i in range(len(batch)) if batch.advantages[i].abs().sum() > 0), 0)
main_tokens = TokenView(batch, trainer.tokenizer, field="advantages", index=shown)
main_tokens.add_class("demo-main")
main_tokens

# %%
TrainingDashboard(history, title="2 GRPO steps, tiny model", height=560)

# %%
# 01: the episode table; a click on a row opens the episode in the two views below it
conv, toks = ConversationView(batch), TokenView(batch, trainer.tokenizer)
table = TrajectoryTable(batch, conversation=conv, tokens=toks)
linked = VBox([table, conv, toks])
linked.add_class("demo-table")
linked

# %%
# 05: two token views side by side, each in half the width
left = TokenView(batch, trainer.tokenizer, field="advantages")
right = TokenView(batch, trainer.tokenizer, field="kl")
link((left, "index"), (right, "index"))
half = Layout(width="50%", min_width="0", padding="0 6px 0 0")
pair = HBox([VBox([HTML("<b>left</b>"), left], layout=half), VBox([HTML("<b>right</b>"), right], layout=half)])
pair.add_class("demo-pair")
pair

# %%
# 04: the reward tuner on the same batch
tuner = RewardTuner(batch, environment=trainer.environment)
tuner.add_class("demo-tuner")
tuner
