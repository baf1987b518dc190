"""`cpu_kernels.skinny_linear` (csrc/skinny_linear.cpp) and `skinny_weights.SkinnyWeights`: the
product of a few rows through the panel layout against a float64 product, per dtype and row
count (every block size of the kernel, outputs that do not fill the last panel); its two-thread
form against the one-thread one, bit for bit; the packer's copies (made once, made again when
a weight changes, the fallback above its row count); and the decode step and the engine with it
against the model's forward."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.numerics import FP32_LOGPROB_TOL, assert_same_samples
from tests.test_cpu_kernels import _forward_logprobs, _sample
from tests.test_decode_step import _compare, _llama, _lora
from workbench.engines import cpu_kernels
from workbench.engines.decode_threads import SpinHelper
from workbench.engines.onednn_weights import OneDNNWeights, available as onednn_available
from workbench.engines.packed_matmul import PackedWeights
from workbench.engines.skinny_weights import PANEL, SkinnyWeights, pack

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"the CPU kernels do not build here: {cpu_kernels.why_unavailable()}")


def _operands(dtype, M, N, K, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(M, K, generator=g).to(dtype)
    w = torch.randn(N, K, generator=g).to(dtype)
    b = torch.randn(N, generator=g).to(dtype) if bias else None
    return x, w, b


def _reference(x, w, b):
    """x @ w.T + b in float64, and the bound on an fp32 sum's error: K * 2^-24 * sum |x_k w_k| (+|b|)."""
    exact = x.double() @ w.double().T + (b.double() if b is not None else 0)
    size = x.double().abs() @ w.double().abs().T + (b.double().abs() if b is not None else 0)
    return exact, x.shape[1] * 2.0 ** -24 * size


def test_pack_lays_out_panels_of_16_outputs_k_major():
    w = torch.arange(20 * 3, dtype=torch.float32).reshape(20, 3)  # N = 20: the second panel has 4 outputs
    p = pack(w)
    assert p.shape == (2, 3, PANEL) and p.is_contiguous()
    assert torch.equal(p[0, :, 5], w[5]) and torch.equal(p[1, :, 3], w[19])
    assert torch.equal(p[1, :, 4:], torch.zeros(3, 12))  # padding outputs are zeros


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("M", [1, 2, 5, 6, 7, 8, 13, 16, 17, 40])  # every block size, and several blocks
def test_skinny_linear_matches_a_float64_product(dtype, M):
    """fp32: within the fp32 sum's error bound; bf16: the float64 result rounded once to bf16
    (half an ulp) plus that bound."""
    x, w, b = _operands(dtype, M, N=100, K=72)
    y = cpu_kernels.skinny_linear(x, pack(w), b, 100)
    assert y.dtype == dtype and y.shape == (M, 100)
    exact, bound = _reference(x, w, b)
    half_ulp = exact.abs() * 2.0 ** -8 if dtype == torch.bfloat16 else 0
    assert ((y.double() - exact).abs() <= bound + half_ulp + 1e-30).all()
    y_nobias = cpu_kernels.skinny_linear(x, pack(w), None, 100)
    exact0, bound0 = _reference(x, w, None)
    assert ((y_nobias.double() - exact0).abs() <= bound0 + (exact0.abs() * 2.0 ** -8 if dtype == torch.bfloat16
                                                           else 0) + 1e-30).all()


def test_skinny_linear_reads_bf16_weights_for_fp32_rows():
    x, w, b = _operands(torch.float32, 8, N=48, K=40)
    w16 = w.to(torch.bfloat16)
    y = cpu_kernels.skinny_linear(x, pack(w16), b, 48)
    exact, bound = _reference(x, w16.float(), b)
    assert y.dtype == torch.float32 and ((y.double() - exact).abs() <= bound).all()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_the_two_threads_give_the_one_thread_product_bit_for_bit(dtype):
    """`skinny_halves`: each panel's sums are the same on either thread, in the same order."""
    x, w, b = _operands(dtype, 8, N=16 * 7 + 5, K=96)
    packed = pack(w)
    cpu_kernels.helper_begin()
    try:
        halves = cpu_kernels.skinny_halves(x, packed, b, w.shape[0])
    finally:
        cpu_kernels.helper_end()
    assert torch.equal(halves, cpu_kernels.skinny_linear(x, packed, b, w.shape[0]))


def test_bad_input_says_what_is_wrong():
    x, w, b = _operands(torch.float32, 4, N=32, K=24)
    with pytest.raises(RuntimeError, match="packed"):
        cpu_kernels.skinny_linear(x, w, b, 32)  # not packed
    with pytest.raises(RuntimeError, match="do not fill"):
        cpu_kernels.skinny_linear(x, pack(w), b[:10], 10)  # 10 outputs: one panel, not two
    with pytest.raises(RuntimeError, match="bias"):
        cpu_kernels.skinny_linear(x, pack(w), b[:8], 32)


def test_the_packer_packs_once_and_again_after_a_change():
    """A weight is packed on its first product and reused; an in-place change (an optimizer step)
    makes a new copy."""
    x, w, b = _operands(torch.float32, 8, N=64, K=32)
    packer = SkinnyWeights(PackedWeights(), cpu_kernels)
    y = packer.linear(x, w, b)
    assert torch.allclose(y, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    packer.linear(x, w, b)
    assert packer.packs == 1
    with torch.no_grad():
        w.mul_(2)
    y2 = packer.linear(x, w, b)
    assert packer.packs == 2 and torch.allclose(y2, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    assert packer.stats()["decode_skinny_weights"] == 2.0


def test_larger_buckets_keep_the_way_timed_faster():
    """Above `always_rows` rows, the first product of each weight shape in a row bucket times the
    panels against the fallback (MKL's packed GEMM), and that shape and bucket keep the faster;
    either way the product is right."""
    x, w, b = _operands(torch.float32, 24, N=512, K=64)
    packer = SkinnyWeights(PackedWeights(), cpu_kernels, always_rows=8)
    packer.begin_step(24)
    y = packer.linear(x, w, b)
    assert torch.allclose(y, torch.nn.functional.linear(x, w, b), rtol=1e-5, atol=1e-5)
    skinny_s, fallback_s = packer.timings[(32, 512, 64)]
    assert skinny_s > 0 and fallback_s > 0 and packer.choice[(32, 512, 64)] == (skinny_s <= fallback_s)
    assert packer.fallback.packs >= 1  # the fallback packed to be timed
    other = torch.randn(16, 64)
    assert torch.allclose(packer.linear(x, other, None), x @ other.T, rtol=1e-5, atol=1e-5)
    assert (32, 16, 64) in packer.choice and len(packer.timings) == 2  # each shape timed once
    assert packer.skinny(x[:8], w, b) and (8, 512, 64) not in packer.choice  # up to always_rows: the panels
    share = packer.stats()["decode_skinny_rows_32"]
    assert share == sum(packer.choice.values()) / 2
    y_again = packer.linear(x, w, b)  # the chosen way from now on, nothing timed again
    assert torch.allclose(y_again, y, rtol=1e-5, atol=1e-5) and len(packer.timings) == 2


@pytest.mark.parametrize("split", [False, True])
def test_decode_step_through_the_panels_matches_the_model(split):
    helper = SpinHelper() if split else None
    try:
        _compare(_llama(), atol=1e-4, kernels=cpu_kernels, packed=SkinnyWeights(PackedWeights(), cpu_kernels),
                 split=helper)
        _compare(_lora(_llama()), atol=1e-4, kernels=cpu_kernels,
                 packed=SkinnyWeights(PackedWeights(), cpu_kernels), split=helper)
    finally:
        if helper is not None:
            helper.close()


@pytest.mark.skipif(not onednn_available(torch.bfloat16), reason="no oneDNN bf16 products on this CPU")
def test_bf16_decode_step_through_the_panels_matches_the_model():
    _compare(_llama(torch.bfloat16), atol=0.05, kernels=cpu_kernels,
             packed=SkinnyWeights(OneDNNWeights(), cpu_kernels))


def test_engine_decodes_through_the_panels_with_the_forward_logprobs(tiny_model_and_tokenizer):
    """fp32: the engine's packer is the skinny one and its products ran; every sampled id's
    logprob is the model's forward's, before and after an in-place weight change (packed again)."""
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model)
    prompts = [tok("hello there")["input_ids"], tok("a longer prompt of several words")["input_ids"]]
    engine = HFEngine(model, tok)
    packs = []
    for change in (False, True):
        if change:
            with torch.no_grad():  # an optimizer step, in place
                for p in model.parameters():
                    p.mul_(1.05)
        samples = _sample(engine, prompts)
        packer = engine._packers[torch.float32]
        assert isinstance(packer, SkinnyWeights)
        packs.append(packer.packs)
        reference = [(ids, _forward_logprobs(model, p, ids)) for p, (ids, _) in zip(prompts, samples)]
        assert_same_samples(samples, reference, tol=FP32_LOGPROB_TOL)
    assert 0 < packs[0] < packs[1]
    assert engine.stats()["decode_skinny_weights"] == packs[1]
