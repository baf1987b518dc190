# %% [markdown]
# # Debugging a run: reopen it, fork an episode, see what training changed
#
# A training run leaves a folder behind. This notebook trains a few GRPO steps on the
# embedded model, then works only from that folder, as you would the morning after:
#
# 1. **reopen** the run: its config, its metrics, and every step's batch exactly as it was trained on;
# 2. **fork** a held-out episode at turn 1 with a guess typed in, and let the model go on from there;
# 3. **diff** the trained checkpoint against the base model on the same tokens, and list the tokens
#    whose probability moved most.

# %%
import os
import warnings

# Idle torch threads sleep instead of spinning: on a busy, shared CPU spinning threads
# fight each other and a forward pass can get up to 15x slower. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import torch
from transformers.utils import logging as hf_logging

SMOKE = os.environ.get("WORKBENCH_SMOKE") == "1"   # CI: smaller budgets, every cell still runs for real
torch.set_num_threads(int(os.environ.get("WORKBENCH_THREADS", 2)))
hf_logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=FutureWarning)
print("smoke mode" if SMOKE else "full mode")

# %% [markdown]
# ## Train a few steps
#
# The demo's game: guess a secret from 1 to 8 in 4 guesses. The run folder gets the config,
# `metrics.jsonl`, a checkpoint after every step (`checkpoint.save_interval = 1`; the newest 3 are
# kept, `checkpoint.keep_last_n`), and `rollouts/step_XXXXXX.jsonl.gz`: each step's scored batch
# (`training.save_rollouts_every`, default 1), every one of them kept.

# %%
import tempfile
from pathlib import Path

from workbench import ConfigStore, Trainer

run_dir = Path(tempfile.mkdtemp(prefix="wb-debugging-"))
config = ConfigStore()
config.environment.name = "guess_number"
config.environment.params = {"low": 1, "high": 8}
config.environment.max_steps = 4
config.environment.system_prompt = "Guess my secret number from 1 to 8. Answer with just the number."
config.update("inference", {"max_tokens": 8, "max_turns": 4})
config.update("training", {"batch_size": 4 if SMOKE else 8, "group_size": 2 if SMOKE else 4,
                           "micro_batch_size": 8, "learning_rate": 5e-4, "log_dir": str(run_dir)})
config.checkpoint.output_dir = str(run_dir / "checkpoints")
config.checkpoint.save_interval = 1
config.checkpoint.resume = False
trainer = Trainer(config)
history = trainer.fit(steps=2 if SMOKE else 4)
print(trainer)

# %% [markdown]
# ## 1. Reopen the run
#
# `load_run` reads only the folder. `run.batch(step)` is the batch of that step (the one whose
# metrics row has that `step`), with everything the update saw: rewards on tokens, advantages,
# old and new logprobs, the ratio, the entropy.

# %%
from workbench.debug import load_run

run = load_run(run_dir)
run

# %%
# NBVAL_CHECK_OUTPUT
last = run.steps[-1]
reopened = run.batch(last)
print("saved steps:", run.steps, "| checkpoints:", [p.name for p in run.checkpoints])
print("metrics rows:", len(run.metrics), "| fields of the reopened batch:", sorted(reopened.tensors))
same = all(torch.equal(reopened.tensors[k], trainer.last_batch.tensors[k]) for k in trainer.last_batch.tensors)
print("every tensor equal to the batch the trainer just trained on:", same)
print("every episode equal:", [e.to_dict() for e in reopened] == [e.to_dict() for e in trainer.last_batch])

# %% [markdown]
# Every view takes the run as it takes a batch (the last saved step, or `step=`): the conversation,
# the tokens coloured by advantage, the table, the reward tuner, and the dashboard from its metrics.

# %%
from workbench.widgets import ConversationView, TokenView, TrainingDashboard

TokenView(run, field="advantages")

# %%
TrainingDashboard(run)

# %% [markdown]
# ## 2. Fork a held-out episode
#
# The trainer plays 4 unseen secrets greedily. `trainer.fork(episode, turn=1, action="5")` rebuilds
# the environment from the run's config and seed, replays turn 0 exactly as recorded (checking that
# the environment answers the same: a difference would be a `ReplayMismatch` naming the turn), types
# "5" as the turn-1 guess (loss mask 0, marked "edited"), and lets the policy play on.

# %%
held_out = trainer.evaluate(list(range(10_000, 10_004)))
episode = next(ep for ep in trainer.last_eval_batch if ep.num_turns > 1)
branches = trainer.fork(episode, turn=1, action="5", n=2, temperature=1.0)
for b in branches:
    print(f"branch {b.episode_id}: return {b.outcome:+.2f}, turns {[t.action.strip() for t in b.turns]} "
          f"({[t.source for t in b.turns]})")
print(f"original: return {episode.outcome:+.2f}, turns {[t.action.strip() for t in episode.turns]}")

# %%
# NBVAL_CHECK_OUTPUT
cut = branches.meta["fork"]["token_position"]
print("fork point: turn", branches.meta["fork"]["turn"])
print("tokens before the fork equal the original's:",
      all(b.token_ids[:cut] == episode.token_ids[:cut] for b in branches))
print("the typed guess is not trained on:", all(
    b.turns[1].source == "edited" and not any(b.loss_mask[b.turns[1].token_start:b.turns[1].token_end])
    for b in branches))

# %% [markdown]
# In the conversation view, pick a turn, type an action or an observation and press
# **continue from here**: the branches appear beside the episode, with their returns and the turn
# where they part.

# %%
ConversationView(trainer.last_eval_batch, engine=trainer)

# %% [markdown]
# ## 3. What did training change?
#
# `compare_policies(a, b, batch)` scores the same sampled tokens under two policies: here the base
# model ("base": the adapters off) and the last checkpoint, on the held-out episodes. A policy
# compared with itself gives exactly 0.

# %%
# NBVAL_CHECK_OUTPUT
from workbench.debug import compare_policies

final = run.checkpoints[-1]
same = compare_policies(final, final, trainer.last_eval_batch)
print("a checkpoint against itself: max |Δ logprob| =", same.max_abs_delta)

# %%
diff = compare_policies("base", final, trainer.last_eval_batch, top=8)
print(diff)
diff.top_tokens

# %% [markdown]
# `Δ` is the logprob under the checkpoint minus under the base model: positive where training made
# that token more likely. The token view colours the same episodes by it:

# %%
TokenView(diff.batch, trainer.tokenizer, field="diff_delta")

# %% [markdown]
# ## 4. The run doctor
#
# `diagnose` runs small named checks over the reopened run, step by step: is the
# action the environment received a small part of the reply (a number pulled out of a sentence),
# do replies collapse to one template, run into the token limit, do groups carry no signal, ...
# Each finding names its number, its threshold and the episodes that show it. `FindingsPanel`
# lists them; picking one opens its evidence episode with the part of the reply that matters
# marked. What it finds depends on how far this short run got; docs/debugging.md shows a longer run's
# findings (`parse-from-incidental-span`, `truncation-surge`) as `diagnose` prints them.

# %%
from workbench.debug import diagnose
from workbench.widgets import FindingsPanel

findings = diagnose(run)
for f in findings:
    print(f.line())
print(f"{len(findings)} finding(s)")
panel = FindingsPanel(findings, run)   # evidence episodes come from the run's saved batches
if findings:
    panel.pick(0)
panel

# %% [markdown]
# The thresholds are the `doctor` section of the run's config (`DoctorConfig`, saved in its
# `config.yaml`): `fit` compared with them on every step, and `diagnose(run)` compares with them
# again. To try another, pass a changed copy; the run folder stays as it is. A threshold of 0 for
# `format_error_share` makes `format-errors` report the share it measured on the last step,
# however small.

# %%
import dataclasses

print("this run's doctor.format_error_share:", run.config.doctor.format_error_share)
strict = dataclasses.replace(run.config.doctor, format_error_share=0.0)
print(next(f for f in diagnose(run, strict) if f.name == "format-errors").line())
print("the run's own thresholds are unchanged:", run.config.doctor.format_error_share)

# %% [markdown]
# The same from a shell, on any run folder:
#
# ```bash
# python -m workbench diff base RUN/checkpoints/step_000004 --run RUN --step 3 --top 10
# python -m workbench diagnose RUN
# python -m workbench diagnose RUN --doctor.format_error_share 0   # another threshold, same run folder
# ```

# %% [markdown]
# ## 5. A run another trainer wrote
#
# The views and the doctor read runs trained by verl, TRL, ART, verifiers and prime-rl as they
# read this one (docs/open_any_run.md). Here TRL's `GRPOTrainer` trains a tiny random model two
# steps on this CPU with `log_completions=True`, and one reward function pays every completion the
# same: a dead signal planted on purpose. `load_run` opens TRL's output folder as it is (nothing
# is copied or written there).

# %%
import contextlib
import io

from datasets import Dataset
from transformers import AutoModelForCausalLM, AutoTokenizer
from trl import GRPOConfig, GRPOTrainer

from workbench.debug import load_run
from workbench.models import build_tiny_model

tiny = build_tiny_model()
trl_dir = run_dir / "trl"


def same_for_all(prompts, completions, **kwargs):  # every completion earns 1.0: no group can teach anything
    return [1.0 for _ in completions]


args = GRPOConfig(output_dir=str(trl_dir), per_device_train_batch_size=8, num_generations=4,
                  max_completion_length=12, max_steps=2, logging_steps=1, save_strategy="no", report_to="none",
                  use_cpu=True, log_completions=True, seed=0, dataloader_num_workers=0, disable_tqdm=True)
prompts = Dataset.from_list([{"prompt": [{"role": "user", "content": f"What is {i}+{i}?"}]} for i in range(8)])
trl_trainer = GRPOTrainer(model=AutoModelForCausalLM.from_pretrained(tiny, dtype=torch.float32),
                          reward_funcs=[same_for_all], args=args, train_dataset=prompts,
                          processing_class=AutoTokenizer.from_pretrained(tiny))
with contextlib.redirect_stdout(io.StringIO()):  # TRL prints each step's completions as a table
    trl_trainer.train()
trl_trainer.save_state()  # trainer_state.json: TRL's metrics, which the run's curves come from
trl_run = load_run(trl_dir)
print(trl_run)
print(trl_run.provenance.line())

# %% [markdown]
# `diagnose` names the dead signal with the groups that show it, and lists each check TRL's files
# could not feed, with why: TRL keeps text, not token ids, so `length-drift` is not checked
# (`workbench import --model FOLDER` tokenizes the text; docs/open_any_run.md), and it reports no
# success, so `reward-without-success` is not checked either. Nothing is passed in silence.

# %%
# NBVAL_CHECK_OUTPUT
trl_findings = diagnose(trl_run)
for f in trl_findings:
    print(f"{f.name}: {f.value:.2f} at step {f.step}; {f.evidence[0].where()}: {f.evidence[0].text}")
for line in trl_findings.not_checked_lines():
    print(line)

# %% [markdown]
# The same views as for a workbench run: an episode as a chat (its reward functions' values and
# TRL's advantage are in the last turn's info), and the run's curves from TRL's log.

# %%
print(trl_run.batch(1)[0].turns[-1].info)
ConversationView(trl_run, step=1)

# %%
TrainingDashboard(trl_run)
