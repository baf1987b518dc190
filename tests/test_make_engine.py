"""`make_engine` for the vllm backend and `Trainer(engine=...)`, without starting vLLM.

`VLLMEngine` is replaced by a recorder, so these run in the plain unit suite; the real
engine is covered by tests/test_vllm_engine.py and tests/test_vllm_trainer.py.
"""
from __future__ import annotations

import pytest

from workbench.engines.base import GenerationEngine


class RecordingEngine(GenerationEngine):
    name = "vllm"

    def __init__(self, model_path=None, tokenizer=None, **kwargs):
        super().__init__(tokenizer)
        self.model_path, self.kwargs = model_path, kwargs
        self.synced: list = []
        self.closed = False

    def generate_ids(self, prompts, params):  # pragma: no cover - not called here
        raise AssertionError("not used")

    def sync_weights(self, model):
        self.synced.append(model)

    def close(self):
        self.closed = True


@pytest.fixture
def fake_vllm(monkeypatch):
    import workbench.engines.vllm_engine as vllm_engine

    monkeypatch.setattr(vllm_engine, "VLLMEngine", RecordingEngine)


def _config(path):
    from workbench import ConfigStore

    c = ConfigStore()
    c.model.model_name = str(path)
    c.model.lora_rank = 4
    c.inference.backend = "vllm"
    c.inference.max_context_tokens = 1024
    c.training.batch_size, c.training.group_size = 4, 2
    return c.validate()


def test_make_engine_vllm_syncs_the_model_or_keeps_the_checkpoint(fake_vllm, tiny_model_path,
                                                                 tiny_model_and_tokenizer):
    from workbench.engines import make_engine

    model, tok = tiny_model_and_tokenizer
    engine = make_engine(_config(tiny_model_path), model, tok)
    assert isinstance(engine, RecordingEngine) and engine.synced == [model]
    assert engine.kwargs["dtype"] == "float32" and engine.kwargs["max_model_len"] == 1024  # "auto" on CPU
    # The seeds' create_inference_engine passes no model: the engine serves the checkpoint.
    assert make_engine(_config(tiny_model_path), None, tok).synced == []


def test_trainer_uses_a_passed_engine_and_leaves_it_open(tiny_model_path, tmp_path):
    from envs import make_env
    from workbench import Trainer

    engine = RecordingEngine()
    config = _config(tiny_model_path)
    config.checkpoint.output_dir = str(tmp_path / "ckpt")
    trainer = Trainer(config, environment=make_env("guess_number"), engine=engine)
    assert trainer.engine is engine and engine.synced == [trainer.policy.model]  # synced at start
    trainer.cleanup()
    assert not engine.closed
