"""`Trainer.export_merged`: a plain Hugging Face folder that computes what the LoRA policy computes."""
from __future__ import annotations

import torch

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.models import load_model_and_tokenizer


def test_export_merged_matches_the_lora_policy_and_loads_without_peft(tiny_model_path, tmp_path):
    config = tiny_config(tiny_model_path, tmp_path)
    config.model.dtype = "float32"  # the export is compared with the policy's logits to 1e-4: fp32
    trainer = Trainer(config, environment=make_env("guess_number"),
                      reward_fn=lambda trajectory: float(sum(trajectory.token_ids) % 7))
    trainer.train_step()
    # LoRA B starts at zero; make the adapters matter so "merged" is a real test.
    with torch.no_grad():
        for name, p in trainer.policy.model.named_parameters():
            if "lora_B" in name:
                p.add_(0.05 * torch.randn_like(p))
    out = trainer.export_merged(tmp_path / "merged")
    assert (out / "model.safetensors").exists() and (out / "config.json").exists()
    model, tok = load_model_and_tokenizer(str(out), dtype="float32", device="cpu")
    assert not any("lora" in n for n, _ in model.named_parameters())
    ids = torch.tensor([tok.encode("Guess a number between 1 and 8.")])
    with torch.no_grad():
        want = trainer.policy.model(input_ids=ids).logits
        got = model(input_ids=ids).logits
        base = trainer.policy.model.get_base_model()
        with trainer.policy.model.disable_adapter():
            without = trainer.policy.model(input_ids=ids).logits
    assert float((want - without).abs().max()) > 1e-3  # the adapters change the outputs
    assert float((want - got).abs().max()) < 1e-4
    assert base is not None and any("lora" in n for n, _ in trainer.policy.model.named_parameters())
