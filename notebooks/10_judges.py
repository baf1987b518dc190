# %% [markdown]
# # Rewards from a judge: train on an LLM's verdict, audit the judge, and see what it was worth
#
# A task without a verifier (write a helpful reply, follow a rubric) can only be trained on a
# reward from a model: an LLM judge, or a reward model. This notebook does it on a task that *has*
# a verifier, the demo's game (guess a secret from 1 to 8 in 4 guesses, strict format), so every
# claim about the judge can be checked against the environment:
#
# 1. **serve a judge**: the embedded model (SmolLM2-135M-Instruct) behind the workbench's
#    OpenAI-compatible gateway on 127.0.0.1, the way a vLLM server or any endpoint would serve one;
# 2. **train on the judge's reward alone** (`reward.judge` = the server's URL, `reward.env_weight` 0):
#    every episode's verdict (score, reason, the exact prompt) is kept beside it in the run folder;
# 3. **audit the judge** on games whose outcome the environment knows (a training batch and held-out games)
#    (`workbench.reward.audit_judge`): does it agree with the environment, is it biased by position
#    or length, is it consistent, what does it cost, and is it fit to train on;
# 4. **the same run with the environment's reward + the judge's**, and held-out success of both.
#
# The outputs stored with this notebook come from a full-mode run on the embedded model (fp32);
# the sentences below describe those outputs. With `WORKBENCH_SMOKE=1` every cell runs on a tiny
# random model with small counts, and its numbers are different.

# %%
import os
import warnings

# Idle torch threads sleep instead of spinning: on a busy, shared CPU spinning threads
# fight each other and a forward pass can get 10x slower. Must be set before torch loads.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
import platform
import time

import torch
from transformers.utils import logging as hf_logging

SMOKE = os.environ.get("WORKBENCH_SMOKE") == "1"   # CI: a tiny model and small counts, every cell still runs
torch.set_num_threads(int(os.environ.get("WORKBENCH_THREADS", 2)))
hf_logging.disable_progress_bar()
warnings.filterwarnings("ignore", category=FutureWarning)
info = open("/proc/cpuinfo").read() if os.path.exists("/proc/cpuinfo") else ""
cpu = next((line.split(":", 1)[1].strip() for line in info.splitlines() if line.startswith("model name")),
           platform.processor())
bf16 = [flag for flag in ("avx512_bf16", "amx_bf16") if flag in info.split()]
print("smoke mode" if SMOKE else "full mode", "|", time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "|",
      cpu, bf16, f"| {os.cpu_count()} cores, {torch.get_num_threads()} torch threads | load {os.getloadavg()[0]:.1f}")

# %% [markdown]
# ## 1. A judge on a real server
#
# The judge is a model of its own, loaded once and served by `Gateway` (`workbench.gateway`) at
# `http://127.0.0.1:PORT/v1`; the trainer reaches it by URL, exactly as it would reach vLLM's
# server. With `reward.judge_json` the judge is asked for `{"reason": ..., "score": x}` and the
# server samples its reply under that JSON schema, so even a 135M model's reply holds a score on
# the scale (0 to 1); without it, the score is read from free text ("SCORE: x"), and a reply
# without one fails that judgment (the episode is left out of the update, never given a 0).

# %%
import warnings as _w

from workbench.config import EMBEDDED_MODEL
from workbench.engines.hf import HFEngine
from workbench.gateway import Gateway
from workbench.models import load_model_and_tokenizer

model = EMBEDDED_MODEL
if SMOKE:
    from workbench.models import build_tiny_model

    model = str(build_tiny_model())
judge_model, judge_tok = load_model_and_tokenizer(model, dtype="float32", device="cpu")
# Judge prompts differ from call to call, so the judge's engine keeps no KV between calls (prefix_cache=False).
server = Gateway(HFEngine(judge_model, judge_tok, prefix_cache=False), model_name="smollm2-judge",
                 max_context_tokens=4096).start()
JUDGE_URL = server.base_url
print("judge served at", JUDGE_URL)

# %%
from workbench import ConfigStore
from workbench.reward import Judge

judge_settings = ConfigStore().reward   # the default rubric and scale; the server's URL; JSON verdicts
judge_settings.judge, judge_settings.judge_json = JUDGE_URL, True
judge = Judge.from_config(judge_settings)
print("rubric:", judge.rubric)
print("scale:", judge.scale, "| JSON schema of a verdict:", judge.response_format()["json_schema"]["schema"])

# %% [markdown]
# ## 2. Training on the judge's reward alone
#
# `demo_config` is the config `make demo` trains (`workbench/cli/demo.py`): the strict format, an
# SFT warm-up on the scripted expert's games (here 1 step), then LoRA GRPO in batches of 16 in
# groups of 8, 8 steps. The reward
# is the judge's: `reward.judge` is the server's URL, `reward.env_weight` 0 (the environment's reward
# counts for nothing), `reward.judge_weight` 1. `train_and_report` evaluates 32 held-out secrets
# (greedy) before training, after the warm-up and at the end.

# %%
import argparse
import tempfile
from pathlib import Path

from workbench.cli.demo import counts, demo_config
from workbench.cli.runner import train_and_report

n = counts()
EVAL = n["eval_episodes"]
RL_STEPS = n["steps"] if SMOKE else 8
root = Path(tempfile.mkdtemp(prefix="wb-judges-"))


def judged_config(name, env_weight):
    config = demo_config(argparse.Namespace(model=model, device="cpu", dtype="float32"), root / name)
    config.update("sft", {"steps": 1})
    config.update("training", {"num_iters_per_epoch": RL_STEPS})
    config.update("reward", {"judge": JUDGE_URL, "judge_json": True, "env_weight": env_weight, "judge_weight": 1.0})
    return config.validate()


start = time.time()
with _w.catch_warnings():
    _w.simplefilter("ignore")  # GRPO's "identical rewards" warning: the doctor's lines say it below
    judge_only = train_and_report(judged_config("judge-only", 0.0), root / "judge-only", eval_episodes=EVAL)
judge_only_seconds = time.time() - start
judge_only["trainer"].cleanup()
print(f"\njudge-only run: 1 SFT + {RL_STEPS} GRPO steps in {judge_only_seconds:.0f} s")

# %% [markdown]
# Every step's metrics carry the judge's numbers: `reward/judge_score_mean` (its mean score),
# `reward/env_score_mean` (the environment's reward it replaced, as RULER keeps it),
# `reward/judge_failed` (judgments that failed and whose episodes were left out) and
# `perf/judge_seconds` beside the rollout's and the update's seconds:

# %%
from workbench.debug import load_run

run = load_run(root / "judge-only")
cols = ["reward/judge_score_mean", "reward/env_score_mean", "env/success_rate", "reward/judge_failed",
        "reward/zero_std_group_rate", "perf/rollout_seconds", "perf/judge_seconds", "perf/update_seconds"]
metrics = run.metrics.set_index("step")[[c for c in cols if c in run.metrics.columns]]
metrics = metrics.dropna(subset=["reward/judge_score_mean"])  # step 0 is the SFT step: nothing judged
metrics.T.round(2)  # a metric a row, a GRPO step a column

# %% [markdown]
# Each episode keeps what the judge said of it (`Episode.judgments`: score, reason, the judge
# model's name, the exact prompt), and the conversation view shows it beside the environment's
# reward:

# %%
from workbench.widgets import ConversationView

last = run.batch()
ep = last[0]
j = ep.judgments[0]
print(f"episode {ep.episode_id}: success {ep.success}, env reward {ep.env_score:+.2f}, judge {j['model']} "
      f"score {j['score']}, reason {j['reason']!r}\n")
import json

for message in json.loads(j["prompt"]):  # the exact prompt the judge was sent
    print(f"[{message['role']}]\n{message['content']}\n")
ConversationView(last)

# %%
# NBVAL_CHECK_OUTPUT
print("every trained episode of the last step has a judgment:",
      all(e.judgments for e in last if e.response_length and not e.environment_error))
print("each judgment records its exact prompt and the judge's name:",
      all(jd["prompt"] and jd["model"] == "smollm2-judge" for e in last for jd in e.judgments))

# %% [markdown]
# What the judge-only policy plays on the 32 held-out secrets at the end (its most common games),
# and what the judge says of eight of them:

# %%
from collections import Counter

games = Counter(" ".join(t.action.strip() for t in e.turns) + (" W" if e.success else " L") for e in judge_only["after"])
print("most common held-out games (guesses, W won / L lost):", games.most_common(3))
sample = judge_only["after"].episodes[:8]
verdicts = judge.judge(sample, use_cache=False)
print("won:         ", [e.success for e in sample])
print("judge scores:", [v.score for v in verdicts])

# %% [markdown]
# ## 3. The judge audit
#
# `audit_judge(batch, judge)` judges a batch afresh (no cache) and measures the judge against the
# environment, which says which games were won. The verdict uses the `doctor` section's `judge_*`
# thresholds (settings, like every threshold), the same ones the run doctor's `judge-unreliable`
# check applies. Two batches: the first GRPO step's (16 games sampled at temperature 1 by the
# policy after the SFT step: what the judge was asked to score in training), and the 32 held-out
# games after the SFT step (greedy). A group judge (`GroupJudge`, `reward.group_judge`) is
# audited for position bias too: each group shown twice in shuffled orders.

# %%
from workbench.reward import GroupJudge, audit_judge
from workbench.widgets import JudgeAuditView

first_step = run.batch(1)   # the judge-only run's first GRPO step
held_out = judge_only["after_sft"]
batches = {"the first GRPO step's batch": first_step, "the held-out games after SFT": held_out}
audits = {}
for name, batch in batches.items():
    audits[name] = audit_judge(batch, judge)
    print(f"== the judge on {name}\n{audits[name].text()}\n")
JudgeAuditView(audit=audits["the first GRPO step's batch"])

# %% [markdown]
# The group judge on the same two batches (a group's prompt holds its 8 trajectories and the reply
# 8 verdicts, so each request gets 10 minutes here instead of `reward.judge_timeout_s`'s 60 s; the
# second pass in the same order is skipped, `repeat=False`):

# %%
group_judge = GroupJudge.from_config(judge_settings, backend=JUDGE_URL, timeout=600)
for name, batch in batches.items():
    audits[name, "group"] = audit_judge(batch, group_judge, repeat=False)
    print(f"== the group judge on {name}\n{audits[name, 'group'].text()}\n")

# %% [markdown]
# What the stored audits find, plainly. On the batch the judge was asked to score in training (16
# games sampled at temperature 1 after the SFT step, 10 of them won), the 135M judge gave every game
# the same score, 1.0: ROC AUC 0.50, chance, and accuracy 0.62, which is just the share of games
# won. Not fit to train on. On the 32 held-out games after SFT (greedy, 24 won) the same judge looks
# good: accuracy 0.91, ROC AUC 0.94, rank correlation 0.77, and the audit calls it fit. Both are
# true, of their batches: an audit says how a judge does on the games it was shown, and the
# games a policy plays in training (sampled, and later the policy's own new tricks) are not the
# held-out games of the policy before training. Audit on batches like the ones it will score.
#
# The group judge is worse on both: ROC AUC 0.40 and 0.33 (below chance), no rank correlation with
# the environment's reward (-0.03, -0.02), and on the training batch its scores of the same groups
# shown in another order do not correlate at all (position consistency 0.00): where a trajectory
# sits in the prompt decides its score as much as what it did.
#
# Section 2's run says which audit to believe: the doctor named `judge-unreliable` at the first
# GRPO step (ROC AUC 0.50 on that step's batch), and the policy trained on the judge alone ended up
# playing 1, 1, 1, 1 on every held-out secret, losing all 32, while the judge scored eight of those
# lost games 1.0 each (above).
#
# The same audit from a shell, on a run folder's saved batch:
#
# ```bash
# python -m workbench audit-judge RUN --judge http://127.0.0.1:8000/v1 --reward.judge_json true --step 1
# ```

# %% [markdown]
# ## 4. The same run with the environment's reward + the judge's
#
# `reward.env_weight` 1: each episode's score is the environment's reward plus the judge's score.

# %%
start = time.time()
with _w.catch_warnings():
    _w.simplefilter("ignore")
    both = train_and_report(judged_config("env-and-judge", 1.0), root / "env-and-judge", eval_episodes=EVAL)
both_seconds = time.time() - start
both["trainer"].cleanup()
print(f"\nenv + judge run: 1 SFT + {RL_STEPS} GRPO steps in {both_seconds:.0f} s")

# %% [markdown]
# Held-out success of the two runs, on the same 32 unseen secrets (computed from the runs' own
# evaluations):

# %%
def success(report, k):
    return report["evals"][k]["eval/success_rate"]


print(f"held-out success: before training {success(judge_only, 0):.2f}, after the SFT step "
      f"{success(judge_only, 1):.2f}")
print(f"  after {RL_STEPS} GRPO steps on the judge's reward alone: {success(judge_only, -1):.2f}")
print(f"  after {RL_STEPS} GRPO steps on the environment's reward + the judge's: {success(both, -1):.2f}")
print(f"wall time: judge-only {judge_only_seconds:.0f} s, env + judge {both_seconds:.0f} s")
server.stop()

# %%
# NBVAL_CHECK_OUTPUT
print("both runs evaluated the same held-out seeds:",
      [e.env_seed for e in judge_only["after"]] == [e.env_seed for e in both["after"]])

# %% [markdown]
# In the stored run held-out success was 0.75 after the SFT step in both runs (the same warm-up).
# After 8 GRPO steps on the judge's reward alone it was 0.00: the policy collapsed onto 1, 1, 1, 1,
# which the judge pays for, and the run's doctor named `heldout-regression` (24 of 24 games won
# after SFT lost) and `template-collapse` at the end, and `judge-unreliable` during training. After 8
# steps on the environment's reward plus the judge's it was 0.75, where it started: with the
# environment's reward in the score the policy did not collapse, and 8 steps taught it nothing new
# (its doctor still names `judge-unreliable`). The judge was the largest part of every step: 26 to
# 58 s per step through the gateway (180 s at the last step, when the shared machine was busiest)
# against 4 to 15 s of rollout and 16 to 30 s of update (the table in section 2). The lesson is the audit's, on
# the right batch: this 135M judge is at chance on the games it is asked to score, and a policy
# trained on it alone gets worse.
