"""`graphed.GraphedDecode`: the decode step's static form (writes at a device-held column,
attention over the whole cache buffer under a mask) against its ordinary form, on the CPU;
and on CUDA (gpu marker) the engine with its steps replayed from CUDA graphs against the
engine launching them from Python."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.test_decode_step import _llama, _prefill, _qwen3
from workbench.engines.decode_step import DecodeStep
from workbench.engines.graphed import GraphedDecode, usable
from workbench.engines.kv_cache import _grow_layers

ROWS = [[5, 9, 11, 3, 7], [4, 8], [6, 2, 1, 9, 10, 12, 13]]  # different lengths: left padding matters


@pytest.mark.parametrize("make", [_llama, _qwen3], ids=["llama", "qwen3"])
def test_static_step_matches_the_ordinary_step(make):
    """Five steps both ways from the same prefill: the same logits (fp32, 1e-5), the same keys
    and values in the filled part of every layer, and the lengths advanced by one a step."""
    model = make()
    cache, mask, pos = _prefill(model, ROWS)
    T = mask.shape[1]
    cache.layers = _grow_layers(cache.layers, 6)  # room for 6 decode steps
    ref_cache = copy.deepcopy(cache)
    step = DecodeStep.build(model)
    static = GraphedDecode(step, cache, mask.clone(), capture=False)
    assert static.room == 6
    tokens, ref_mask = torch.tensor([3, 17, 42]), mask
    for k in range(5):
        ref_mask = torch.cat([ref_mask, torch.ones_like(ref_mask[:, :1])], dim=-1)
        with torch.no_grad():
            ref = step(tokens, ref_mask, pos, ref_cache)  # (B, V)
            got = static(tokens, pos)  # (B, V)
        assert torch.allclose(got, ref, atol=1e-5, rtol=0), (got - ref).abs().max()
        assert static.length == T + k + 1 and static.room == 5 - k
        for a, b in zip(cache.layers, ref_cache.layers):
            assert a.keys.shape == b.keys.shape
            assert torch.allclose(a.keys, b.keys, atol=1e-6) and torch.allclose(a.values, b.values, atol=1e-6)
        assert torch.equal(static.mask[:, : T + k + 1], ref_mask)  # the step marked its own column
        assert not static.mask[:, T + k + 1:].any()
        tokens, pos = ref.argmax(-1), pos + 1


def test_room_garbage_is_cleared_before_the_whole_buffer_is_read():
    """The static step reads the room too (masked): NaN left there by an earlier use of the
    buffer would turn every logit into NaN (0 x NaN); GraphedDecode zeroes it first."""
    model = _llama()
    cache, mask, pos = _prefill(model, ROWS)
    cache.layers = _grow_layers(cache.layers, 4)
    for layer in cache.layers:
        layer._kbuf[:, :, mask.shape[1]:] = float("nan")
        layer._vbuf[:, :, mask.shape[1]:] = float("nan")
    static = GraphedDecode(DecodeStep.build(model), cache, mask.clone(), capture=False)
    with torch.no_grad():
        logits = static(torch.tensor([3, 17, 42]), pos)
    assert torch.isfinite(logits).all()


def test_room_used_up_and_uneven_layers_are_refused():
    model = _llama()
    cache, mask, pos = _prefill(model, ROWS)
    cache.layers = _grow_layers(cache.layers, 1)
    static = GraphedDecode(DecodeStep.build(model), cache, mask.clone(), capture=False)
    with torch.no_grad():
        static(torch.tensor([3, 17, 42]), pos)
        with pytest.raises(RuntimeError, match="room is used up"):
            static(torch.tensor([3, 17, 42]), pos + 1)
    with pytest.raises(ValueError, match="prefill's positions"):
        GraphedDecode(DecodeStep.build(model), cache, mask.clone(), capture=False)  # layers hold T + 1 now


def test_graphs_only_on_cuda():
    step = DecodeStep.build(_llama())
    assert not usable(step, torch.device("cpu")) and not usable(None, torch.device("cuda"))


# -- on CUDA ------------------------------------------------------------------------------
cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.gpu
@cuda
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-3), (torch.bfloat16, 0.1)])
def test_engine_with_cuda_graphs_samples_the_ids_of_the_engine_without(tiny_model_and_tokenizer, dtype, tol):
    """Two turns (the prefix cache), rows of different prompts and a GRPO group: with graphs
    the same ids as without (fp32; bf16 too here: both read the same bf16 kernels' logits to
    a tolerance), logprobs within `tol`, and the steps after each chunk's first replayed."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model).to("cuda", dtype)
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128, 9)]
    prompts += [list(tok("Guess the number between 1 and 100.")["input_ids"])] * 4
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    graphed, plain = HFEngine(model, tok, cuda_graphs=True), HFEngine(model, tok)
    a = graphed.generate_ids(prompts, params)
    b = plain.generate_ids(prompts, params)
    nexts = [p + r.token_ids + [9, 8] for p, r in zip(prompts, a)]
    a += graphed.generate_ids(nexts, params)
    b += plain.generate_ids(nexts, params)
    same = sum(x.token_ids == y.token_ids for x, y in zip(a, b))
    assert same == len(a) if dtype == torch.float32 else same >= len(a) - 2
    for x, y in zip(a, b):
        if x.token_ids == y.token_ids:
            assert max(abs(p - q) for p, q in zip(x.logprobs, y.logprobs)) < tol
    assert graphed.stats()["graphed_decode_steps"] > 0 and plain.stats()["graphed_decode_steps"] == 0
    assert graphed.graph_error is None


@pytest.mark.gpu
@cuda
def test_graphed_steps_see_weights_changed_in_place(tiny_model_and_tokenizer):
    """An optimizer step changes the weights in place; the graphs of the next call sample from
    the new weights: greedy ids change, and equal those of an engine without graphs."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model).to("cuda")
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128)]
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    engine = HFEngine(model, tok, cuda_graphs=True)
    before = [r.token_ids for r in engine.generate_ids(prompts, greedy)]
    with torch.no_grad():
        for layer in model.model.layers:
            layer.mlp.down_proj.weight.mul_(-3.0)  # in place, as AdamW writes
    after = [r.token_ids for r in engine.generate_ids(prompts, greedy)]
    plain = [r.token_ids for r in HFEngine(model, tok).generate_ids(prompts, greedy)]
    assert after == plain and after != before
    assert engine.stats()["graphed_decode_steps"] > 0
