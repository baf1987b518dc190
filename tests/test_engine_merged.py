"""The HF engine samples a LoRA policy through a merged copy (`engines/merged.py`):
it must give the peft model's logprobs, follow every weight change, and respect
disabled adapters."""
from __future__ import annotations

import pytest
import torch

from workbench.config import ModelConfig
from workbench.engines.base import SamplingParams
from workbench.engines.hf import HFEngine
from workbench.engines.merged import merged_copy
from workbench.training.policy import apply_lora

PROMPTS = [[5, 17, 30, 41, 2], [9, 9, 12], [100, 3, 7, 250, 61, 18, 4]]


def _lora_model(tiny_model_path, **lora):
    from workbench.models import load_model_and_tokenizer

    base, tok = load_model_and_tokenizer(str(tiny_model_path), "float32", "cpu", False)
    model = apply_lora(base, ModelConfig(lora_rank=4, lora_alpha=8, lora_target_modules="all-linear", **lora))
    with torch.no_grad():  # lora_B starts at 0: give the adapters an effect
        g = torch.Generator().manual_seed(0)
        for n, p in model.named_parameters():
            if "lora_B" in n:
                p.copy_(torch.randn(p.shape, generator=g) * 0.2)
    return model.eval(), tok


def _policy_logprobs(model, prompt, ids):
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0].float()  # (T, V)
    lp = torch.log_softmax(logits, -1)
    return torch.tensor([lp[len(prompt) - 1 + i, t].item() for i, t in enumerate(ids)])


def _max_diff(engine, model, params):
    worst = 0.0
    for p, r in zip(PROMPTS, engine.generate_ids(PROMPTS, params)):
        worst = max(worst, (torch.tensor(r.logprobs) - _policy_logprobs(model, p, r.token_ids)).abs().max().item())
    return worst


@pytest.mark.parametrize("optimizer", ["sgd", "adamw"])
def test_merged_copy_follows_the_policy(tiny_model_path, optimizer):
    """`adamw`: the trainer's AdamW, whose fused kernel does not bump the parameters'
    version counters by itself (the engine would sample stale weights)."""
    from workbench.training.models import AdamW

    model, tok = _lora_model(tiny_model_path)
    engine = HFEngine(model, tok)
    assert engine._merged is not None and engine.stats()["lora_merges"] == 1
    greedy = SamplingParams(max_tokens=10, temperature=0.0)
    sampled = SamplingParams(max_tokens=10, temperature=1.0, seed=4)
    assert _max_diff(engine, model, greedy) < 1e-4
    assert _max_diff(engine, model, sampled) < 1e-4
    assert engine.stats()["lora_merges"] == 1  # unchanged weights: no re-merge

    # An optimizer step on the adapters: the next generate re-merges.
    trained = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.SGD(trained, lr=0.5) if optimizer == "sgd" else AdamW(trained, lr=0.05)
    assert optimizer == "sgd" or opt.param_groups[0]["fused"]
    loss = model(input_ids=torch.tensor([PROMPTS[0]])).logits.float().logsumexp(-1).mean()
    loss.backward()
    opt.step()
    before = engine.generate_ids(PROMPTS, greedy)
    assert engine.stats()["lora_merges"] == 2
    assert _max_diff(engine, model, greedy) < 1e-4

    # Adapters disabled (the reference policy): the engine samples the base model.
    with model.disable_adapter():
        assert _max_diff(engine, model, greedy) < 1e-4
        base_out = engine.generate_ids(PROMPTS, greedy)
    assert [r.token_ids for r in base_out] != [r.token_ids for r in before]
    assert _max_diff(engine, model, greedy) < 1e-4  # adapters back on
    assert engine.stats()["lora_merges"] == 4


def test_unmergeable_models_decode_through_the_policy(tiny_model_path, tiny_model_and_tokenizer):
    plain, tok = tiny_model_and_tokenizer
    assert merged_copy(plain) is None  # no adapters
    from peft import LoraConfig, get_peft_model

    from workbench.models import load_model_and_tokenizer

    base, _ = load_model_and_tokenizer(str(tiny_model_path), "float32", "cpu", False)
    saved = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    assert merged_copy(saved) is None  # a trained lm_head is not an adapter
    engine = HFEngine(saved.eval(), tok)
    assert engine._merged is None
    assert _max_diff(engine, saved, SamplingParams(max_tokens=6, temperature=0.0)) < 1e-4


def test_frozen_weight_writes_and_adapter_switches_reach_the_copy_and_the_prefix_cache(tiny_model_path):
    """Any in-place write to the policy (frozen weights too) is followed; a multi-turn
    prompt decoded with adapters off must not reuse KV kept with adapters on."""
    model, tok = _lora_model(tiny_model_path)
    engine = HFEngine(model, tok)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    with torch.no_grad():
        norm = next(p for n, p in model.named_parameters() if "norm" in n and not p.requires_grad)
        norm.mul_(1.5)  # a frozen weight, written in place
    assert _max_diff(engine, model, greedy) < 1e-4

    first = engine.generate_ids(PROMPTS[:1], greedy)[0]
    longer = PROMPTS[0] + first.token_ids + [3, 4]  # the next turn: extends the kept sequence
    hits = engine.stats()["prefix_cache_hits"]
    with model.disable_adapter():
        result = engine.generate_ids([longer], greedy)[0]
        ref = _policy_logprobs(model, longer, result.token_ids)  # the base model's logprobs
    assert engine.stats()["prefix_cache_hits"] == hits  # kept KV came from other weights: not used
    assert (torch.tensor(result.logprobs) - ref).abs().max().item() < 1e-4


def test_in_place_refresh_writes_what_the_generic_merge_gives(tiny_model_path):
    """`refresh` writes LoRA layers as one addmm and other tensors only when they changed:
    after adapter updates, a frozen write and adapters switched off and on, every tensor of
    the copy equals `hf_weight_items`' merge (float rounding), and an untouched tensor is
    not written again."""
    from workbench.engines.weights import hf_weight_items

    model, _ = _lora_model(tiny_model_path)
    merged = merged_copy(model)
    copy = merged.model.state_dict()

    def assert_matches() -> None:
        merged.refresh()
        ref = dict(hf_weight_items(model))
        assert set(ref) == set(copy)
        for name, tensor in ref.items():
            assert torch.allclose(copy[name], tensor, rtol=0, atol=1e-6), name

    lora_b = [p for n, p in model.named_parameters() if "lora_B" in n]
    embed = model.get_input_embeddings().weight
    with torch.no_grad():
        for p in lora_b:
            p.add_(0.1)  # an optimizer step on the adapters
    embed_version = embed._version
    copy_embed = copy[next(n for n in copy if "embed_tokens" in n)]
    written = copy_embed._version
    assert_matches()
    assert embed._version == embed_version and copy_embed._version == written  # frozen: not copied again
    with torch.no_grad():
        embed.mul_(1.01)  # a frozen tensor written in place: copied
    assert_matches()
    assert copy_embed._version > written
    with model.disable_adapter():  # the base weights (the generic merge's path)
        assert_matches()
        q = next(n for n in copy if n.endswith("q_proj.weight"))
        base = dict(model.named_parameters())[f"base_model.model.{q.replace('q_proj.', 'q_proj.base_layer.')}"]
        assert torch.equal(copy[q], base)
    assert_matches()  # adapters back on: merged again


def test_a_frozen_modules_to_save_copy_is_refreshed_by_the_generic_merge(tiny_model_path):
    """peft's `modules_to_save` copies are renamed only by `hf_weight_items`: a refresh sends
    everything through it, and a write to the saved copy reaches the merged copy."""
    from peft import LoraConfig, get_peft_model

    from workbench.engines.weights import hf_weight_items
    from workbench.models import load_model_and_tokenizer

    base, _ = load_model_and_tokenizer(str(tiny_model_path), "float32", "cpu", False)
    model = get_peft_model(base, LoraConfig(r=4, target_modules=["q_proj"], modules_to_save=["lm_head"]))
    for n, p in model.named_parameters():
        if "modules_to_save" in n:
            p.requires_grad_(False)  # frozen: the copy may be merged
    merged = merged_copy(model)
    assert merged is not None
    saved = next(p for n, p in model.named_parameters() if "modules_to_save" in n and n.endswith("weight"))
    with torch.no_grad():
        saved.mul_(2.0)
    merged.refresh()
    copy = merged.model.state_dict()
    for name, tensor in hf_weight_items(model):
        assert torch.allclose(copy[name], tensor, rtol=0, atol=1e-6), name
    assert torch.equal(copy["lm_head.weight"], saved)
