"""`PackedWeights` (MKL's packed fp32 products for the decode step, packed_matmul.py):
the products against `F.linear`, rows independent of the padding, packed again after a
weight changes, buckets bounded; the decode step and the engine with packed weights
against the model's forward."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from workbench.engines import packed_matmul
from workbench.engines.decode_step import DecodeStep
from workbench.engines.packed_matmul import PACKED_MIN_ROWS, PackedWeights, bucket

from tests.test_decode_step import _llama, _prefill, _qwen2, split_gives_the_same_logits

pytestmark = pytest.mark.skipif(not packed_matmul.available(0), reason="this torch has no MKL packed GEMM")


def _close(a: torch.Tensor, b: torch.Tensor) -> bool:
    return torch.allclose(a, b, rtol=1e-5, atol=1e-5)


def test_buckets_are_powers_of_two_from_the_minimum():
    assert [bucket(n) for n in (1, 3, 4, 5, 8, 9, 33, 64)] == [4, 4, 4, 8, 8, 16, 64, 64]


@pytest.mark.parametrize("with_bias", [False, True])
def test_products_match_f_linear_and_rows_ignore_the_padding(with_bias):
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 96, generator=g)  # (N, K)
    b = torch.randn(300, generator=g) if with_bias else None
    packed = PackedWeights()
    for rows in range(1, 10):
        x = torch.randn(rows, 96, generator=g)
        y = packed.linear(x, w, b)
        if rows < PACKED_MIN_ROWS:
            assert y is None  # the caller runs the plain product
            continue
        assert y.shape == (rows, 300) and _close(y, F.linear(x, w, b))
        # the same rows inside a full bucket of other rows: the same bits (rows are independent)
        full = torch.randn(bucket(rows), 96, generator=g)
        full[:rows] = x
        assert torch.equal(packed.linear(full, w, b)[:rows], y)
    assert packed.stats()["decode_packed_weights"] == 3  # buckets 4, 8, 16: one pack each
    # one input buffer per padded shape, its padding rows left from earlier calls: same bits
    assert sorted(p for p, *_ in packed._inputs) == [8, 16]  # 4 and 8 rows need no padding
    x = torch.randn(5, 96, generator=g)
    assert torch.equal(packed.linear(x, w, b), packed.linear(x.clone(), w, b))


def test_a_changed_or_replaced_weight_is_packed_again():
    g = torch.Generator().manual_seed(1)
    w = torch.randn(64, 32, generator=g)
    x = torch.randn(5, 32, generator=g)
    packed = PackedWeights()
    before = packed.linear(x, w, None)
    assert torch.equal(packed.linear(x, w, None), before) and packed.packs == 1  # reused
    with torch.no_grad():
        w.add_(0.5)  # an optimizer step, in place
    after = packed.linear(x, w, None)
    assert packed.packs == 2 and _close(after, F.linear(x, w)) and not _close(after, before)
    for _ in range(3):  # new tensors, some possibly at a freed one's address
        del w
        w = torch.randn(64, 32, generator=g)
        assert _close(packed.linear(x, w, None), F.linear(x, w))


def test_at_most_max_buckets_are_kept():
    w = torch.randn(64, 32)
    packed = PackedWeights(max_buckets=2)
    for rows in (4, 8, 16, 4):
        packed.linear(torch.randn(rows, 32), w, None)
    assert list(packed._buckets) == [16, 4] and packed.packs == 4  # 4 was dropped, then packed again


def _steps(packed: PackedWeights, x: torch.Tensor, w: torch.Tensor, n: int = 1) -> torch.Tensor:
    for _ in range(n):
        packed.begin_step(x.shape[0])
        y = packed.linear(x, w, None)
    return y


def test_steps_and_packs_are_timed_by_bucket():
    g = torch.Generator().manual_seed(4)
    w = torch.randn(256, 64, generator=g)
    packed = PackedWeights()
    _steps(packed, torch.randn(8, 64, generator=g), w, 3)
    _steps(packed, torch.randn(4, 64, generator=g), w, 3)
    packed.weights_changed()
    assert set(packed.product_seconds) == {4, 8} and all(t > 0 for t in packed.product_seconds.values())
    assert set(packed.pack_seconds) == {4, 8} and all(t > 0 for t in packed.pack_seconds.values())


def test_after_a_weight_change_a_step_runs_one_bucket_up_while_that_costs_less_than_a_pack():
    """New weights (a training step): 8-row steps pack bucket 8; 4-row steps then run in it
    (padded, nothing packed) while steps x (bucket 8's product time - bucket 4's) stays
    below bucket 4's pack time, then bucket 4 is packed. Before any change (inference),
    and before both buckets were timed, every step runs in its own bucket."""
    g = torch.Generator().manual_seed(3)
    w = torch.randn(64, 32, generator=g)
    x8, x4 = torch.randn(8, 32, generator=g), torch.randn(4, 32, generator=g)
    packed = PackedWeights()
    _steps(packed, x4, w)
    assert list(packed._buckets) == [4] and packed.packs == 1  # no change yet: its own bucket
    packed.weights_changed()
    with torch.no_grad():
        w.add_(0.25)  # what the change was
    _steps(packed, x8, w)
    _steps(packed, x4, w)
    assert packed.packs == 3  # bucket 8 was never timed: bucket 4 packed again
    packed.weights_changed()
    with torch.no_grad():
        w.add_(0.25)
    _steps(packed, x8, w, 2)  # packs bucket 8 (the first step), then times it
    assert packed.packs == 4

    def fixed_timings() -> None:  # 2 ms more per step in bucket 8; a pack of bucket 4 costs ~10 steps
        packed._end_step()  # the last step's timing, recorded now rather than at the next step
        packed.product_seconds.update({4: 0.010, 8: 0.012})
        packed.pack_seconds[4] = 0.0205

    for _ in range(10):
        fixed_timings()
        y = _steps(packed, x4, w)
        assert packed.packs == 4 and y.shape == (4, 64) and _close(y, F.linear(x4, w))
    full = torch.cat([x4, x8[4:]])  # the same rows in a full 8-row product: the same bits
    assert torch.equal(y, packed.product(full, w, None)[:4])
    fixed_timings()
    assert _close(_steps(packed, x4, w), F.linear(x4, w))
    assert packed.packs == 5 and list(packed._buckets)[-1] == 4  # the eleventh would cost more: packed
    packed.begin_step(2)
    assert packed.linear(x4[:2], w, None) is None  # below the minimum: the plain product


@pytest.mark.parametrize("make", [_llama, _qwen2], ids=["llama", "qwen2-biases"])
def test_decode_step_with_packed_weights_matches_the_model(make):
    """Five rows of different lengths (padded to a bucket of 8), three steps: the logits
    and appended keys of the model's own forward on the same cache."""
    model = make()
    rows = [[5, 9, 11, 3, 7], [4, 8], [6, 2, 1, 9, 10, 12, 13], [7, 7], [1, 2, 3, 4]]
    cache, mask, pos = _prefill(model, rows)
    ref_cache = copy.deepcopy(cache)
    step = DecodeStep.build(model)
    assert step.packed_bytes() > 0
    packed = PackedWeights()
    tokens = torch.tensor([3, 17, 42, 5, 8])
    for _ in range(3):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        with torch.no_grad():
            ref = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos, past_key_values=ref_cache,
                        use_cache=True).logits[:, -1]  # (B, V)
            fast = step(tokens, mask, pos, cache, packed=packed)  # (B, V)
        assert torch.allclose(fast, ref, atol=1e-4, rtol=0), (fast - ref).abs().max()
        for a, b in zip(cache.layers, ref_cache.layers):
            assert torch.allclose(a.keys, b.keys, atol=1e-4)
        tokens, pos = ref.argmax(-1), pos + 1
    assert packed.packs == 4 * len(step.layers) + 1  # q/k/v, o, gate/up, down per layer; the head


def test_engine_multiplies_through_packed_weights_in_every_mode(tiny_model_and_tokenizer):
    """With `packed_decode` on (the default), the engine's fp32 decode steps (all threads
    here) sample the ids the model's forward gives, follow an in-place weight change
    (packed again), and say so in their stats; off, nothing is packed. (Without the CPU
    kernels: with them, steps of few rows run the skinny kernel, test_skinny_weights.py.)"""
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model)
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128, 9, 70, 3)]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    engine = HFEngine(model, tok, cpu_kernels=False)
    engine.generate_ids(prompts[:1], SamplingParams(max_tokens=2, temperature=0))  # makes the chooser
    engine.decode_threads.force(torch.get_num_threads())
    packs = []
    for change in (False, True):
        if change:
            with torch.no_grad():  # an optimizer step, in place
                for p in model.parameters():
                    p.mul_(1.05)
        fast = engine.generate_ids(prompts, params)
        packs.append(engine.stats()["decode_packed_weights"])
        slow = HFEngine(model, tok, fast_decode=False).generate_ids(prompts, params)
        for a, b in zip(fast, slow):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert 0 < packs[0] < packs[1]  # the changed weights were packed again
    assert isinstance(engine._packers[torch.float32], PackedWeights)
    engine.close()
    plain = HFEngine(model, tok, packed_decode=False)
    plain.generate_ids(prompts, params)
    assert not plain._packers and "decode_packed_weights" not in plain.stats()


@pytest.mark.parametrize("make", [_llama, _qwen2], ids=["llama", "qwen2-biases"])
def test_split_halves_packed_apart_give_the_packed_bits(monkeypatch, make):
    """The "one thread + helper" mode with packing on: every weight's two halves of outputs
    packed apart, one per thread; the logits and keys are the bits of the packed step."""
    from workbench.engines import decode_step
    from workbench.engines.decode_threads import MatmulHelper

    monkeypatch.setattr(decode_step, "SPLIT_MIN_BYTES", 0)
    model = make()
    rows = [[5, 9, 11, 3, 7], [4, 8], [6, 2, 1, 9, 10, 12, 13], [7, 7], [1, 2, 3, 4]]
    cache, mask, pos = _prefill(model, rows)
    split_cache = copy.deepcopy(cache)
    step = DecodeStep.build(model)
    helper, packed = MatmulHelper(), PackedWeights()
    try:
        split_gives_the_same_logits(step, (cache, split_cache), mask, pos, torch.tensor([3, 17, 42, 5, 8]), helper,
                                  packed)
    finally:
        helper.close()
    assert packed.packs == 3 * (4 * len(step.layers) + 1)  # each weight whole and in two halves


def _bf16_close(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal to bf16 rounding of the output (another kernel sums in another order)."""
    return torch.allclose(a.float(), b.float(), rtol=2 ** -7, atol=2 ** -7 * float(b.float().abs().max()))


@pytest.mark.parametrize("with_bias", [False, True])
def test_fp32_products_of_bf16_weights_match_the_bf16_product(with_bias):
    """`Fp32Products`: bf16 weights packed in fp32, bf16 inputs widened, bf16 outputs; the
    rows padded to their bucket as in fp32, below the minimum the caller's plain product."""
    from workbench.engines.packed_matmul import Fp32Products

    g = torch.Generator().manual_seed(6)
    w = torch.randn(300, 96, generator=g).to(torch.bfloat16)
    b = torch.randn(300, generator=g).to(torch.bfloat16) if with_bias else None
    packed = Fp32Products()
    for rows in (2, 4, 5, 8, 64, 70):
        x = torch.randn(rows, 96, generator=g).to(torch.bfloat16)
        packed.begin_step(rows)
        y = packed.linear(x, w, b)
        if rows < PACKED_MIN_ROWS:
            assert y is None
            continue
        assert y.dtype == torch.bfloat16 and y.shape == (rows, 300) and _bf16_close(y, F.linear(x, w, b))
    stats = packed.stats()  # buckets 4, 8, 64, 128: one pack each; the last two kept
    assert stats["decode_fp32_packed_weights"] == 4 and stats["decode_fp32_packed_buckets"] == 2
    with torch.no_grad():
        w.mul_(2.0)  # a full-weight update: packed again
    x = torch.randn(5, 96, generator=g).to(torch.bfloat16)
    assert _bf16_close(packed.linear(x, w, b), F.linear(x, w, b))


def test_engine_in_fp32_products_mode_matches_the_plain_forward(tiny_model_and_tokenizer):
    """bf16 weights, every decode step forced into `FP32` (products in fp32 from 4 rows up):
    each sampled id's logprob equals a plain forward's to bf16 tolerance."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.decode_threads import FP32
    from workbench.engines.hf import HFEngine
    from workbench.engines.onednn_weights import available as onednn_available

    from tests.test_onednn_weights import _assert_engine_matches_forward

    if not onednn_available(torch.bfloat16):
        pytest.skip("no oneDNN bf16 products: the engine offers no fp32-products mode")
    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model).to(torch.bfloat16)
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128, 9, 70, 3)]
    engine = HFEngine(model, tok, prefix_cache=False)
    engine.generate_ids(prompts[:1], SamplingParams(max_tokens=2, temperature=0))  # makes the chooser
    assert engine.decode_threads.fp32
    engine.decode_threads.force(FP32)
    _assert_engine_matches_forward(engine, model, prompts, SamplingParams(max_tokens=10, temperature=1.0, seed=4))
    stats = engine.stats()
    assert stats["decode_fp32_packed_weights"] > 0  # the products ran through Fp32Products
    engine.close()
