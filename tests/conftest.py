"""Shared fixtures: the tiny test model and the embedded SmolLM2, loaded once per session.

    tiny_model_path               folder of the tiny random Llama + byte-level BPE (ChatML)
    tiny_model_and_tokenizer      (model, tokenizer) for that folder, eval mode, fp32, CPU
    tiny_engine                   HFEngine over the tiny model
    embedded_model_and_tokenizer  (model, tokenizer) of "smollm2-135m-instruct"
    embedded_engine               HFEngine over the embedded model
    ray_cluster                   one local Ray cluster for every `ray` test of the session

Models are session-scoped: tests must not change their weights. Torch uses 2 threads
(the machine is shared), or OMP_NUM_THREADS when set.
"""
from __future__ import annotations

import os
import sys

# OpenMP threads that spin at barriers are ruinous when the 2 cores are shared: measured
# here, 2 threads under load were ~15x slower than 1 with the default (active) wait
# policy, and as fast as 1 or faster with PASSIVE. It only takes effect if set before
# torch is imported; if torch came first (and nobody chose a policy), use 1 thread.
_PASSIVE = "torch" not in sys.modules or os.environ.get("OMP_WAIT_POLICY", "").upper() == "PASSIVE"
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import pytest  # noqa: E402
import torch  # noqa: E402

# OMP_NUM_THREADS, when set, wins (the suite also runs with 1 thread: `OMP_NUM_THREADS=1 make test`).
torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]) if os.environ.get("OMP_NUM_THREADS", "").isdigit()
                      else 2 if _PASSIVE else 1)


@pytest.fixture(scope="session")
def tiny_model_path():
    from workbench.models import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tiny_model_path):
    from workbench.models import load_model_and_tokenizer

    return load_model_and_tokenizer(str(tiny_model_path), dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_and_tokenizer):
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    return HFEngine(model, tok)


@pytest.fixture(scope="session")
def embedded_model_and_tokenizer():
    from workbench.config import EMBEDDED_MODEL
    from workbench.models import load_model_and_tokenizer

    return load_model_and_tokenizer(EMBEDDED_MODEL, dtype="float32", device="cpu")


@pytest.fixture(scope="session")
def embedded_engine(embedded_model_and_tokenizer):
    from workbench.engines.hf import HFEngine

    model, tok = embedded_model_and_tokenizer
    return HFEngine(model, tok)


try:  # vLLM fixtures live in their own module (optional dependency)
    from tests.conftest_vllm import *  # noqa: F401,F403
except ImportError:
    pass


@pytest.fixture(scope="session")
def ray_cluster():
    """One local Ray cluster (6 logical CPUs on the 2 real ones: a rollout worker or
    learner asks for 1 each) shared by the `ray` tests; started once, it costs ~20 s."""
    ray = pytest.importorskip("ray")
    os.environ.setdefault("RAY_raylet_start_wait_time_s", "120")
    # Ray 2.60 gives its raylet a fixed 30 s to register ("The current node timed out during
    # startup"); on a machine busy with other jobs that can pass, so a failed start is retried.
    for attempt in range(3):
        try:
            ray.init(num_cpus=6, include_dashboard=False, object_store_memory=150 * 2**20, log_to_driver=False,
                     runtime_env={"env_vars": {"PYTHONPATH": os.getcwd(), "OMP_WAIT_POLICY": "PASSIVE"}})
            break
        except Exception as exc:  # noqa: BLE001 (Ray raises a bare Exception for this)
            ray.shutdown()
            if attempt == 2 or "timed out during startup" not in str(exc):
                raise
    yield ray
    ray.shutdown()
