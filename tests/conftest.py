"""Shared fixtures: the tiny test model and the embedded SmolLM2, loaded once per session.

    tiny_model_path               folder of the tiny random Llama + byte-level BPE (ChatML)
    tiny_model_and_tokenizer      (model, tokenizer) for that folder, eval mode, fp32, CPU
    tiny_engine                   HFEngine over the tiny model
    embedded_model_and_tokenizer  (model, tokenizer) of "smollm2-135m-instruct"
    embedded_engine               HFEngine over the embedded model

Models are session-scoped: tests must not change their weights. Torch uses 2 threads
(the machine is shared).
"""
from __future__ import annotations

import pytest
import torch

torch.set_num_threads(2)


@pytest.fixture(scope="session")
def tiny_model_path():
    from workbench.models import build_tiny_model

    return build_tiny_model()


@pytest.fixture(scope="session")
def tiny_model_and_tokenizer(tiny_model_path):
    from workbench.models import load_model_and_tokenizer

    return load_model_and_tokenizer(str(tiny_model_path))


@pytest.fixture(scope="session")
def tiny_engine(tiny_model_and_tokenizer):
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    return HFEngine(model, tok)


@pytest.fixture(scope="session")
def embedded_model_and_tokenizer():
    from workbench.config import EMBEDDED_MODEL
    from workbench.models import load_model_and_tokenizer

    return load_model_and_tokenizer(EMBEDDED_MODEL)


@pytest.fixture(scope="session")
def embedded_engine(embedded_model_and_tokenizer):
    from workbench.engines.hf import HFEngine

    model, tok = embedded_model_and_tokenizer
    return HFEngine(model, tok)


try:  # vLLM fixtures live in their own module (optional dependency)
    from tests.conftest_vllm import *  # noqa: F401,F403
except ImportError:
    pass
