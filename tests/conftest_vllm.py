"""Session fixtures for the vLLM engine tests (imported by tests/conftest.py).

    vllm_tiny_model_path  folder of the tiny model (`build_tiny_model()`)
    vllm_tiny_engine      the one in-process VLLMEngine of the session, float32, CPU

There is only ever one in-process engine per session: starting one costs ~10-20 s on
CPU, and it holds process-wide torch.distributed state. Tests that load other weights
into it must put the checkpoint back when they finish
(`engine.sync_weights(load_model(vllm_tiny_model_path))`).
"""
from __future__ import annotations

import os

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

import pytest  # noqa: E402


@pytest.fixture(scope="session")
def vllm_tiny_model_path():
    from workbench.models.tiny import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def vllm_tiny_engine(vllm_tiny_model_path):
    from workbench.engines.vllm_engine import VLLMEngine
    from workbench.models.loading import load_tokenizer

    engine = VLLMEngine(
        vllm_tiny_model_path,
        load_tokenizer(str(vllm_tiny_model_path)),
        dtype="float32",
        max_model_len=2048,
        kv_cache_memory_bytes=64 << 20,  # 64 MiB: ~130k tokens of KV for the tiny model
        seed=0,
    )
    yield engine
    engine.close()
