"""Trainer with `inference.backend = "vllm"`: rollouts sampled by vLLM, weights synced every step.

Reuses the session engine `vllm_tiny_engine` through `Trainer(config, engine=...)` (the
trainer loads its policy weights into it at once). Two train steps (the first with the
lock-step `Rollout`, the second with `AsyncRollout`); after each:

* the rollout's logprobs (sampled by vLLM) equal the policy's recomputed
  `old_logprobs` -- at step 2 that is only true if update 1 reached the engine;
* the engine's greedy logprobs on probe prompts equal the updated HF policy's, and
  are far from the policy before the update (the update mattered, so matching it
  proves the sync).

Tolerance 1e-4: engine (float32) and transformers (float32) compute the same function
and differ only in kernels and summation order; measured max |diff| ~1e-6 (printed),
while one update moves logprobs by > 1e-2 (asserted as MIN_UPDATE_EFFECT), so a stale
engine cannot pass. Same numbers as tests/test_vllm_engine.py.
"""
from __future__ import annotations

import copy

import pytest
import torch

from envs import make_env
from workbench.engines.base import SamplingParams

pytestmark = pytest.mark.vllm

LOGPROB_TOL = 1e-4
MIN_UPDATE_EFFECT = 1e-2


def _reward(trajectory) -> float:
    """Varied, deterministic scores, so GRPO advantages are non-zero and every update moves the policy."""
    return float(sum(trajectory.token_ids) % 7)


def _probe_prompts(tokenizer) -> list[list[int]]:
    chats = ["Guess the number between 1 and 16.", "Higher. Lower. Try again.", "What is 2+3?"]
    return [list(tokenizer.apply_chat_template([{"role": "user", "content": c}], add_generation_prompt=True,
                                               return_dict=False)) for c in chats]


@torch.no_grad()
def _policy_logprobs(model, prompt: list[int], ids: list[int]) -> torch.Tensor:
    model.eval()
    logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()
    return torch.log_softmax(logits, -1)[torch.arange(len(ids)), torch.tensor(ids)]


def _max_diff(results, prompts, model) -> float:
    return max((torch.tensor(r.logprobs) - _policy_logprobs(model, p, r.token_ids)).abs().max().item()
               for p, r in zip(prompts, results))


@pytest.fixture
def restore_checkpoint(vllm_tiny_engine, vllm_tiny_model_path):
    yield
    from workbench.models.loading import load_model

    vllm_tiny_engine.sync_weights(load_model(str(vllm_tiny_model_path)))


def test_trainer_vllm_backend_syncs_weights_every_step(vllm_tiny_engine, vllm_tiny_model_path, tmp_path,
                                                      restore_checkpoint):
    from workbench import ConfigStore, Trainer

    engine = vllm_tiny_engine
    c = ConfigStore()
    c.model.model_name = str(vllm_tiny_model_path)
    c.model.dtype = "float32"  # the fp32 vLLM engine's logprobs are compared with the trainer's
    c.model.lora_rank = 4
    c.inference.backend = "vllm"
    c.inference.max_tokens, c.inference.max_turns = 8, 2
    c.training.batch_size, c.training.group_size, c.training.micro_batch_size = 4, 2, 2
    c.training.learning_rate = 2e-2
    c.checkpoint.output_dir, c.checkpoint.save_interval = str(tmp_path / "ckpt"), 0
    syncs = engine.stats()["weight_syncs"]
    trainer = Trainer(c.validate(), environment=make_env("guess_number"), reward_fn=_reward, engine=engine)
    assert trainer.engine is engine and engine.stats()["weight_syncs"] == syncs + 1  # synced at start
    model = trainer.policy.model
    prompts = _probe_prompts(trainer.tokenizer)
    greedy = SamplingParams(max_tokens=16, temperature=0.0)

    initial = _max_diff(engine.generate_ids(prompts, greedy), prompts, model)
    print(f"\nstart: engine vs policy {initial:.2e}")
    assert initial <= LOGPROB_TOL
    for step in range(2):
        trainer.config.inference.async_rollout = step == 1
        before = copy.deepcopy(model)
        metrics = trainer.train_step()
        batch = trainer.last_batch
        mask = batch.loss_mask.bool()
        rollout_vs_old = (batch.rollout_logprobs - batch.old_logprobs)[mask].abs().max().item()
        results = engine.generate_ids(prompts, greedy)
        after = _max_diff(results, prompts, model)
        stale = _max_diff(results, prompts, before)
        print(f"step {step + 1} ({'AsyncRollout' if step else 'Rollout'}): rollout vs old_logprobs "
              f"{rollout_vs_old:.2e} over {int(mask.sum())} tokens | after update: engine vs policy "
              f"{after:.2e}, vs policy before the update {stale:.2e} | reward {metrics['reward/mean']:.2f}")
        assert metrics["actor/skipped_updates"] == 0
        assert rollout_vs_old <= LOGPROB_TOL, f"step {step + 1}: rollout sampled from other weights"
        assert after <= LOGPROB_TOL, f"step {step + 1}: engine not synced (max |diff| {after:.2e})"
        assert stale > MIN_UPDATE_EFFECT, f"step {step + 1}: the update did not move the policy ({stale:.2e})"
    assert engine.stats()["weight_syncs"] == syncs + 3
    trainer.cleanup()  # a passed-in engine stays open
    assert engine.generate_ids(prompts[:1], SamplingParams(max_tokens=2))[0].finish_reason == "length"
