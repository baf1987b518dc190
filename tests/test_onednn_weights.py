"""`OneDNNWeights` (bf16 decode weights packed once for oneDNN, onednn_weights.py): the
products against `F.linear`, packed again only after a weight changed; the decode step
through them against the model's forward; the engine's sampled logprobs against a plain
forward of the sampled sequence, before and after a full-weight update (packed again) and
an adapter update of a LoRA policy (its frozen base not packed again); and `DecodeModes`,
the decode mode per row bucket."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from workbench.engines import onednn_weights
from workbench.engines.decode_step import DecodeStep
from workbench.engines.onednn_weights import OneDNNWeights

from tests.numerics import BF16_LOGPROB_TOL
from tests.test_decode_step import _llama, _lora, _prefill, _qwen2

needs_onednn = pytest.mark.skipif(not onednn_weights.available(torch.bfloat16),
                                  reason="this torch or CPU has no oneDNN bf16 products")


def _bf16_close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to bf16 rounding of the output (another kernel may sum in another order)."""
    return torch.allclose(a.float(), b.float(), rtol=2 ** -7, atol=2 ** -7 * float(b.float().abs().max()))


def test_only_bf16_is_packed():
    assert not onednn_weights.available(torch.float32)
    assert not onednn_weights.available(torch.bfloat16, weight_bytes=onednn_weights.MAX_WEIGHT_BYTES + 1)


@needs_onednn
@pytest.mark.parametrize("with_bias", [False, True])
def test_products_match_f_linear_at_every_row_count(with_bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 96, generator=g).to(torch.bfloat16)  # (N, K)
    b = torch.randn(300, generator=g).to(torch.bfloat16) if with_bias else None
    packed = OneDNNWeights()
    for rows in (1, 2, 3, 5, 8, 13, 64):
        x = torch.randn(rows, 96, generator=g).to(torch.bfloat16)
        y = packed.linear(x, w, b)
        assert y.shape == (rows, 300) and y.dtype == torch.bfloat16 and _bf16_close(y, F.linear(x, w, b))
        halves = torch.cat([packed.product(x, w, b, (0, 150)), packed.product(x, w, b, (150, 300))], dim=1)
        assert _bf16_close(halves, y)
    assert packed.packs == 3  # one copy for every row count; each half packed apart


@needs_onednn
def test_a_changed_or_replaced_weight_is_packed_again_a_frozen_one_never():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 32, generator=g).to(torch.bfloat16)
    x = torch.randn(5, 32, generator=g).to(torch.bfloat16)
    packed = OneDNNWeights()
    before = packed.linear(x, w, None)
    for _ in range(3):
        assert torch.equal(packed.linear(x, w, None), before)
    assert packed.packs == 1  # frozen: packed once
    with torch.no_grad():
        w.mul_(2.0)  # a full-weight optimizer step, in place
    after = packed.linear(x, w, None)
    assert packed.packs == 2 and _bf16_close(after, F.linear(x, w)) and not _bf16_close(after, before)
    for _ in range(3):  # new tensors, some possibly at a freed one's address
        del w
        w = torch.randn(64, 32, generator=g).to(torch.bfloat16)
        assert _bf16_close(packed.linear(x, w, None), F.linear(x, w))


@needs_onednn
@pytest.mark.parametrize("make", [lambda: _llama(torch.bfloat16), lambda: _qwen2().to(torch.bfloat16),
                                  lambda: _lora(_llama(torch.bfloat16))],
                         ids=["llama-bf16", "qwen2-biases-bf16", "lora-over-bf16"])
def test_decode_step_through_packed_weights_matches_the_model(make):
    """Five rows of different lengths, three steps: the logits and appended keys of the
    model's own forward on the same cache, to bf16 rounding (the tolerance of the unpacked
    step's bf16 tests, test_decode_step.py)."""
    model = make()
    rows = [[5, 9, 11, 3, 7], [4, 8], [6, 2, 1, 9, 10, 12, 13], [7, 7], [1, 2, 3, 4]]
    cache, mask, pos = _prefill(model, rows)
    ref_cache = copy.deepcopy(cache)
    step = DecodeStep.build(model)
    assert step.packed_bytes() > 0 and step.dtype == torch.bfloat16
    packed = OneDNNWeights()
    tokens = torch.tensor([3, 17, 42, 5, 8])
    for _ in range(3):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        with torch.no_grad():
            ref = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos, past_key_values=ref_cache,
                        use_cache=True).logits[:, -1].float()  # (B, V)
            fast = step(tokens, mask, pos, cache, packed=packed)  # (B, V)
        assert torch.allclose(fast, ref, atol=0.05, rtol=0), (fast - ref).abs().max()
        for a, b in zip(cache.layers, ref_cache.layers):
            assert torch.allclose(a.keys.float(), b.keys.float(), atol=0.5)
        tokens, pos = ref.argmax(-1), pos + 1
    assert packed.packs == 4 * len(step.layers) + 1  # q/k/v, o, gate/up, down per layer; the head


def _forward_logprobs(model, prompts, results) -> list[list[float]]:
    """Each sampled id's logprob from one plain forward of its row (prompt + ids), fp32."""
    out = []
    for prompt, res in zip(prompts, results):
        ids = torch.tensor([prompt + res.token_ids])
        with torch.no_grad():
            logits = model(input_ids=ids).logits[0, len(prompt) - 1: -1].float()  # (n, V)
        lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(res.token_ids)[:, None]).squeeze(-1)
        out.append(lp.tolist())
    return out


def _assert_engine_matches_forward(engine, model, prompts, params) -> float:
    results = engine.generate_ids(prompts, params)
    worst = 0.0
    for res, ref in zip(results, _forward_logprobs(model, prompts, results)):
        assert len(res.logprobs) == len(ref) == params.max_tokens
        worst = max(worst, max(abs(a - b) for a, b in zip(res.logprobs, ref)))
    assert worst <= BF16_LOGPROB_TOL, worst
    return worst


@needs_onednn
def test_engine_logprobs_match_the_plain_forward_and_follow_a_full_weight_update(tiny_model_and_tokenizer):
    """bf16 weights, packed decode on: every sampled id's logprob equals a plain forward's
    to bf16 tolerance; after an in-place update of every weight (full fine-tuning) the
    engine packs again and matches the new weights' forward, not the old one's."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model).to(torch.bfloat16)
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128, 9, 70)]
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=3)
    engine = HFEngine(model, tok, prefix_cache=False)
    _assert_engine_matches_forward(engine, model, prompts, params)
    packs = engine.stats()["decode_packed_weights"]
    assert packs > 0 and isinstance(engine._packers[torch.bfloat16], OneDNNWeights)
    old = copy.deepcopy(model)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("proj.weight"):
                p.add_(torch.randn_like(p) * 0.5 * p.float().std().to(p.dtype))  # an update that shows
    results = engine.generate_ids(prompts, params)
    assert engine.stats()["decode_packed_weights"] > packs  # the changed weights were packed again
    new_ref, old_ref = _forward_logprobs(model, prompts, results), _forward_logprobs(old, prompts, results)
    gap_new = max(abs(a - b) for r, ref in zip(results, new_ref) for a, b in zip(r.logprobs, ref))
    gap_old = max(abs(a - b) for r, ref in zip(results, old_ref) for a, b in zip(r.logprobs, ref))
    assert gap_new <= BF16_LOGPROB_TOL < gap_old, (gap_new, gap_old)
    engine.close()


@needs_onednn
def test_lora_policy_packs_its_frozen_base_once(tiny_model_and_tokenizer):
    """A LoRA policy over bf16 weights (peft's fp32 adapters): an adapter update changes the
    samples' logprobs as the peft forward says, and packs nothing again."""
    from peft import LoraConfig, get_peft_model

    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    torch.manual_seed(4)
    policy = get_peft_model(copy.deepcopy(model).to(torch.bfloat16),
                            LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", init_lora_weights=False))
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128)]
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=5)
    engine = HFEngine(policy, tok, prefix_cache=False)
    _assert_engine_matches_forward(engine, policy, prompts, params)
    packs = engine.stats()["decode_packed_weights"]
    with torch.no_grad():  # an optimizer step on the adapters only
        for name, p in policy.named_parameters():
            if "lora_B" in name:
                p.add_(0.3)
    _assert_engine_matches_forward(engine, policy, prompts, params)
    assert engine.stats()["decode_packed_weights"] == packs  # the base was not packed again
    engine.close()


def test_decode_modes_choose_per_row_bucket():
    """One `DecodeThreads` per bucket of live rows (powers of two), each timed on its own
    steps: a few rows prefer one thread, many rows all threads (fake step times)."""
    from workbench.engines.decode_threads import DecodeModes, row_bucket

    assert [row_bucket(n) for n in (1, 2, 3, 8, 9, 64, 65)] == [1, 2, 4, 8, 16, 64, 128]
    full = torch.get_num_threads()
    if full == 1:
        pytest.skip("one thread: nothing to choose")
    modes = DecodeModes(torch.device("cpu"), trial_steps=2)
    fake = {8: {full: 0.05, 1: 0.03}, 128: {full: 0.3, 1: 0.5}}
    for _ in range(12):
        for rows in (7, 100):  # a step of each, alternately
            chooser = modes.chooser(rows)
            n = chooser.next_threads()
            chooser.record(n, fake[row_bucket(rows)][n])
    assert modes.buckets[8].chosen == 1 and modes.buckets[128].chosen == full
    stats = modes.stats()
    assert stats["decode_threads_rows_8"] == 1 and stats["decode_threads_rows_128"] == full
    modes.force(1)
    assert all(c.chosen == 1 for c in modes.buckets.values()) and modes.chooser(3).chosen == 1
