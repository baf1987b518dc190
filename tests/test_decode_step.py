"""`DecodeStep` (the hf engine's decode step without transformers' modules) against the
model's own forward on the same KV cache: Llama with grouped KV heads, Qwen2 (biased
q/k/v), peft LoRA in fp32 and over bf16 weights, adapters switched off, in-place weight
updates; and `DecodeThreads`, which times the decode step's thread count."""
from __future__ import annotations

import copy

import pytest
import torch

from workbench.engines.decode_step import DecodeStep
from workbench.engines.decode_threads import DecodeThreads
from workbench.engines.kv_cache import _GrowingLayer


def _llama(dtype=torch.float32, **over):
    from transformers import LlamaConfig, LlamaForCausalLM

    kw = dict(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
              num_key_value_heads=2, max_position_embeddings=256, tie_word_embeddings=True)
    kw.update(over)
    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(**kw)).to(dtype).eval()


def _qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=1, max_position_embeddings=256,
                         tie_word_embeddings=False, use_sliding_window=False)
    model = Qwen2ForCausalLM(config).eval()
    with torch.no_grad():  # random biases, so a dropped bias shows
        for layer in model.model.layers:
            for proj in (layer.self_attn.q_proj, layer.self_attn.k_proj, layer.self_attn.v_proj):
                proj.bias.normal_(0, 0.5)
    return model


def _lora(model, dtype=torch.float32):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    lora = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules="all-linear",
                                            init_lora_weights=False))  # B != 0: the adapters matter
    return lora.to(dtype) if dtype != torch.float32 else lora


def _prefill(model, rows: list[list[int]]):
    """Left-padded prefill of `rows` through the model; the cache with growing layers as
    the engine makes it, the (B, T) mask, the next positions (B, 1)."""
    B, S = len(rows), max(map(len, rows))
    ids = torch.zeros((B, S), dtype=torch.long)
    mask = torch.zeros((B, S), dtype=torch.long)
    pos = torch.zeros((B, S), dtype=torch.long)
    for b, r in enumerate(rows):
        ids[b, S - len(r):] = torch.tensor(r)
        mask[b, S - len(r):] = 1
        pos[b, S - len(r):] = torch.arange(len(r))
    with torch.no_grad():
        out = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True)
    cache = out.past_key_values
    cache.layers = [_GrowingLayer(layer, 8) for layer in cache.layers]
    return cache, mask, pos[:, -1:] + 1


def _compare(model, steps: int = 3, atol: float = 1e-4, shared_prompt: bool = False, kernels=None,
             packed=None, split=None):
    """Decode `steps` tokens both ways from the same prefill; the largest logit gap.
    `shared_prompt`: every row holds the same prompt and the step reads it once.
    `kernels`: the step's (`DecodeStep.kernels`, the `cpu_kernels` module; None: torch's ops);
    `packed`, `split`: its products' packed weights and helper thread (None: plain products)."""
    rows = [[5, 9, 11, 3, 7], [4, 8], [6, 2, 1, 9, 10, 12, 13]]  # different lengths: padding matters
    if shared_prompt:
        rows = [[5, 9, 11, 3, 7, 2]] * 3
    cache, mask, pos = _prefill(model, rows)
    ref_cache = copy.deepcopy(cache)
    step = DecodeStep.build(model)
    assert step is not None
    step.kernels = kernels
    tokens = torch.tensor([3, 17, 42])
    worst = 0.0
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        with torch.no_grad():
            ref = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos, past_key_values=ref_cache,
                        use_cache=True).logits[:, -1].float()  # (B, V)
            if packed is not None:
                packed.begin_step(len(tokens))
            fast = step(tokens, mask, pos, cache, shared_prefix=6 if shared_prompt else 0, split=split,
                        packed=packed)  # (B, V)
        assert fast.dtype == torch.float32 and fast.shape == ref.shape
        worst = max(worst, float((fast - ref).abs().max()))
        assert torch.allclose(fast, ref, atol=atol, rtol=0), (fast - ref).abs().max()
        for a, b in zip(cache.layers, ref_cache.layers):  # the same keys/values appended
            assert torch.allclose(a.keys.float(), b.keys.float(), atol=atol * 10)
        tokens, pos = ref.argmax(-1), pos + 1
    return worst


def test_llama_with_grouped_kv_heads_matches_the_model():
    _compare(_llama())


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.05)])
def test_shared_prompt_read_once_matches_the_model(dtype, atol):
    """A GRPO group's rows share their prefilled prompt: reading it from row 0 for every
    row's queries gives the model's logits (rows then diverge, so the tails differ)."""
    assert _compare(_llama(dtype), steps=4, atol=atol, shared_prompt=True) < atol


def test_qwen2_biases_match_the_model():
    _compare(_qwen2())


def _qwen3(dtype=torch.float32):
    """Qwen3: per-head RMSNorms on queries and keys (their weights random, so a skipped norm shows)."""
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(2)
    config = Qwen3Config(vocab_size=96, hidden_size=128, intermediate_size=192, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, head_dim=32, max_position_embeddings=256,
                         tie_word_embeddings=True, use_sliding_window=False)
    model = Qwen3ForCausalLM(config).eval()
    with torch.no_grad():
        for layer in model.model.layers:
            layer.self_attn.q_norm.weight.uniform_(0.5, 2.0)
            layer.self_attn.k_norm.weight.uniform_(0.5, 2.0)
    return model.to(dtype)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.05)])
def test_qwen3_query_key_norms_match_the_model(dtype, atol):
    from workbench.engines.decode_step import DecodeStep

    assert DecodeStep.build(_qwen3()) is not None
    assert _compare(_qwen3(dtype), steps=3, atol=atol) < atol


def test_tiny_model_matches(tiny_model_and_tokenizer):
    _compare(tiny_model_and_tokenizer[0])


def test_lora_fp32_matches_peft():
    _compare(_lora(_llama()))


def test_lora_over_bf16_weights_matches_peft():
    """bf16 base, fp32 adapters (peft's default cast): the logits agree to bf16 rounding
    (attention in bf16 in both, as the model's sdpa runs it)."""
    model = _lora(_llama(torch.bfloat16))
    assert {p.dtype for n, p in model.named_parameters() if "lora_" in n} == {torch.float32}
    assert _compare(model, atol=0.03) < 0.03


def test_adapters_switched_off_match_the_base_model():
    model = _lora(_llama())
    with model.disable_adapter():
        _compare(model)
    plain = _llama()
    cache, mask, pos = _prefill(plain, [[5, 6, 7]])
    mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
    with model.disable_adapter():
        off = DecodeStep.build(model)(torch.tensor([4]), mask, pos, copy.deepcopy(cache))
    on = DecodeStep.build(model)(torch.tensor([4]), mask, pos, copy.deepcopy(cache))
    base = DecodeStep.build(plain)(torch.tensor([4]), mask, pos, cache)
    assert torch.allclose(off, base, atol=1e-5) and not torch.allclose(on, base, atol=1e-2)


def test_fused_copies_follow_in_place_updates():
    """q/k/v and gate/up are fused into copies on a CPU; an optimizer-style in-place write
    to a weight makes the next build copy that group again, unchanged groups are kept."""
    model = _lora(_llama())
    first = DecodeStep.build(model)
    again = DecodeStep.build(model, first)
    assert again.layers[0].qkv.weight is first.layers[0].qkv.weight  # nothing changed: the same copies
    assert again.layers[0].qkv.lora_b is first.layers[0].qkv.lora_b
    with torch.no_grad():
        model.base_model.model.model.layers[0].self_attn.k_proj.lora_B["default"].weight.add_(0.3)
    second = DecodeStep.build(model, first)
    assert second.layers[0].qkv.lora_b is not first.layers[0].qkv.lora_b  # its LoRA B changed: fused again
    assert second.layers[0].qkv.weight is first.layers[0].qkv.weight  # the frozen base is not copied again
    assert second.layers[1].qkv.lora_b is first.layers[1].qkv.lora_b
    _compare(model)
    with torch.no_grad():
        model.base_model.model.model.layers[1].mlp.up_proj.base_layer.weight.mul_(1.5)  # a full-weight update
    third = DecodeStep.build(model, second)
    assert third.layers[1].gate_up.weight is not second.layers[1].gate_up.weight
    assert third.layers[0].gate_up.weight is second.layers[0].gate_up.weight
    _compare(model)


def test_unsupported_models_fall_back_to_the_model_forward(tiny_model_and_tokenizer):
    from transformers import MistralConfig, MistralForCausalLM

    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    windowed = MistralForCausalLM(MistralConfig(vocab_size=96, hidden_size=64, intermediate_size=128,
                                                num_hidden_layers=1, num_attention_heads=2,
                                                num_key_value_heads=1, sliding_window=4))
    assert DecodeStep.build(windowed) is None
    assert DecodeStep.build(_llama(hidden_act="gelu")) is None
    from peft import LoraConfig, get_peft_model

    biased = get_peft_model(_llama(), LoraConfig(r=4, lora_alpha=8, target_modules="all-linear", lora_bias=True))
    assert DecodeStep.build(biased) is None  # a bias on B: peft's forward, not an adapter dropped silently
    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, fast_decode=False)
    engine.generate_ids([[5, 6, 7]], SamplingParams(max_tokens=4, temperature=0))
    assert engine.stats()["model_decode_steps"] == 3 and engine.stats()["fast_decode_steps"] == 0


def test_engine_gives_the_same_tokens_either_way(tiny_model_and_tokenizer):
    """Greedy and seeded sampling through the engine: the same ids with and without the
    decode step, logprobs equal to float rounding."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128, 1000)]
    for params in (SamplingParams(max_tokens=12, temperature=0), SamplingParams(max_tokens=12, temperature=1.0, seed=3)):
        fast = HFEngine(model, tok, fast_decode=True).generate_ids(prompts, params)
        slow = HFEngine(model, tok, fast_decode=False).generate_ids(prompts, params)
        for a, b in zip(fast, slow):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_engine_group_sharing_a_prompt_gives_the_same_tokens_either_way(tiny_model_and_tokenizer, monkeypatch):
    """A GRPO group (one prompt, 4 rows, sampled), the decode step told to read the shared
    prompt once (the default on accelerators): the ids are those of the model's forward,
    logprobs equal to float rounding."""
    from workbench.engines import decode_step
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    prompts = [list(tok("Guess the number between 1 and 100.")["input_ids"])] * 4
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    engine = HFEngine(model, tok, fast_decode=True)
    engine.share_prompt_reads = True
    seen = []
    call = decode_step.DecodeStep.__call__
    monkeypatch.setattr(decode_step.DecodeStep, "__call__",
                        lambda self, *a, **kw: seen.append(a[4]) or call(self, *a, **kw))
    fast = engine.generate_ids(prompts, params)
    assert seen and all(n == len(prompts[0]) for n in seen)  # every step read the prompt once
    slow = HFEngine(model, tok, fast_decode=False).generate_ids(prompts, params)
    assert len({tuple(r.token_ids) for r in fast}) > 1  # the rows diverge after the prompt
    for a, b in zip(fast, slow):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4


def test_decode_threads_keeps_the_faster_count():
    threads = DecodeThreads(torch.device("cpu"), trial_steps=3)
    full = torch.get_num_threads()
    if full == 1:
        assert threads.chosen == 1
        return
    assert threads.candidates == [full, 1]
    fake = {full: 0.050, 1: 0.030}  # one thread faster (the passive-wait bf16 case)
    while threads.chosen is None:
        n = threads.next_threads()
        threads.record(n, fake[n])
    assert threads.chosen == 1 and threads.stats()["decode_threads"] == 1
    assert threads.stats()[f"decode_step_ms_{full}_threads"] == pytest.approx(50)
    assert DecodeThreads(torch.device("meta")).candidates == [full]  # accelerators: no trial


def test_engine_restores_the_thread_count(tiny_model_and_tokenizer):
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    before = torch.get_num_threads()
    engine = HFEngine(model, tok)
    for seed in range(3):  # enough decode steps to finish the trial
        engine.generate_ids([[5, 6, 7]] * 4, SamplingParams(max_tokens=8, temperature=1.0, seed=seed))
        assert torch.get_num_threads() == before
    stats = engine.stats()
    assert stats["decode_threads"] in (before, 1)
    # prefills: the first warms the model, then one timed call per candidate for the size (3 new tokens)
    assert stats["prefill_threads_upto_4_tokens"] in (before, 1)


def test_large_prefills_share_one_thread_choice(tiny_model_and_tokenizer, monkeypatch):
    """Prefills of more than LARGE_PREFILL new tokens, whatever their size, are timed per
    token under one choice: two calls (one per candidate) settle it for all of them."""
    from workbench.engines import decode_threads
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, prefix_cache=False)
    recorded = []
    record = decode_threads.DecodeThreads.record
    monkeypatch.setattr(decode_threads.DecodeThreads, "record",
                        lambda self, n, seconds: recorded.append((self, seconds)) or record(self, n, seconds))
    greedy = SamplingParams(max_tokens=1, temperature=0.0)
    g = torch.Generator().manual_seed(0)
    for n in (5, 300, 700, 1100):  # the first warms the model (untimed)
        engine.generate_ids([torch.randint(3, 200, (n,), generator=g).tolist()], greedy)
    stats = engine.stats()
    large = [k for k in stats if k.startswith("prefill_threads_")]
    if torch.get_num_threads() > 1:
        assert large == ["prefill_threads_over_256_tokens"]  # chosen after 300 and 700; 1100 used it
        assert len({id(c) for c, _ in recorded}) == 1 and len(recorded) == 3  # one chooser for all three


def test_decode_threads_without_warm_up_times_every_call():
    threads = DecodeThreads(torch.device("cpu"), trial_steps=1, warm_up=False)
    full = torch.get_num_threads()
    if full == 1:
        return
    fake = {full: 0.2, 1: 0.1}
    for _ in range(2):
        n = threads.next_threads()
        threads.record(n, fake[n])
    assert threads.chosen == 1


@pytest.mark.parametrize("rows", [1, 3])
def test_lm_head_gets_its_input_with_fresh_strides(rows):
    """`logits_to_keep=1` hands the head a (B, 1, E) view of the (B, T, E) hidden states;
    inside `dense_head_input` it gets a fresh tensor (the CPU bf16 matmul copied the head
    weight per row for the view), and the logits do not change."""
    from workbench.engines.model_hooks import dense_head_input

    model = _llama(torch.bfloat16)
    seen = []
    head = model.get_output_embeddings()
    hook = head.register_forward_hook(lambda m, args, out: seen.append(args[0].stride()))  # after pre-hooks
    ids = torch.randint(1, 96, (rows, 7), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        plain = model(input_ids=ids, logits_to_keep=1).logits
        with dense_head_input(model):
            dense = model(input_ids=ids, logits_to_keep=1).logits
    hook.remove()
    assert seen[0] == (7 * 128, 128, 1)  # the view
    assert seen[1] == (128, 128, 1)  # fresh
    assert torch.equal(plain, dense)
    assert not head._forward_pre_hooks  # removed on the way out


# -- large matmuls split over a helper thread --------------------------------------------
@pytest.mark.parametrize("make", [lambda: _llama(), lambda: _qwen2(), lambda: _qwen2().to(torch.bfloat16),
                                  lambda: _lora(_llama(torch.bfloat16))],
                         ids=["llama-fp32", "qwen2-biases-fp32", "qwen2-biases-bf16", "lora-bf16"])
def test_split_matmuls_give_the_same_logits(monkeypatch, make):
    """With every weight split in two halves over the helper (threshold 0), the logits
    and the appended keys are those without, to the dtype's rounding: fp32 (W @ x.T) and bf16
    (x @ W.T) matmuls, with q/k/v biases, with LoRA adapters. (A half-width product may run
    another kernel than the whole one, so equal bits are not promised: `tests/numerics.py`.)"""
    from workbench.engines import decode_step
    from workbench.engines.decode_threads import MatmulHelper

    monkeypatch.setattr(decode_step, "SPLIT_MIN_BYTES", 0)
    model = make()
    rows = [[5, 9, 11, 3, 7], [4, 8], [6, 2, 1, 9, 10, 12, 13]]
    cache, mask, pos = _prefill(model, rows)
    split_cache = copy.deepcopy(cache)
    step = DecodeStep.build(model)
    helper = MatmulHelper()
    try:
        split_gives_the_same_logits(step, (cache, split_cache), mask, pos, torch.tensor([3, 17, 42]), helper)
    finally:
        helper.close()


def split_gives_the_same_logits(step, caches, mask, pos, tokens, helper, packed=None, steps: int = 3) -> None:
    """Decode `steps` tokens from two copies of one cache, the second with the large
    matmuls split over `helper` (both through `packed`, if given): the logits and the
    appended keys and values agree to the cache dtype's rounding (fp32 1e-5, bf16 3e-2, relative
    to the largest logit), and the greedy ids are the same."""
    whole_cache, split_cache = caches
    tol = 1e-5 if whole_cache.layers[0].keys.dtype == torch.float32 else 3e-2
    for _ in range(steps):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        with torch.no_grad():
            whole = step(tokens, mask, pos, whole_cache, packed=packed)
            split = step(tokens, mask, pos, split_cache, split=helper, packed=packed)
        scale = float(whole.abs().max())
        assert torch.allclose(whole, split, atol=tol * scale, rtol=0), (whole - split).abs().max()
        assert torch.equal(whole.argmax(-1), split.argmax(-1))
        for a, b in zip(whole_cache.layers, split_cache.layers):
            assert torch.allclose(a.keys.float(), b.keys.float(), atol=tol * 10, rtol=tol)
            assert torch.allclose(a.values.float(), b.values.float(), atol=tol * 10, rtol=tol)
        tokens, pos = whole.argmax(-1), pos + 1


def test_matmul_helper_hands_back_errors_and_keeps_the_thread_default():
    import threading

    from workbench.engines.decode_threads import MatmulHelper

    before = torch.get_num_threads()
    helper = MatmulHelper()
    seen = []
    t = threading.Thread(target=lambda: seen.append(torch.get_num_threads()))  # a thread started afterwards
    t.start()
    t.join()
    assert torch.get_num_threads() == before and seen == [before]
    ran = []
    helper.run(lambda: ran.append("mine"), lambda: ran.append(torch.get_num_threads()))
    assert sorted(map(str, ran)) == ["1", "mine"]  # the helper's half runs on one thread
    with pytest.raises(ValueError, match="helper half"):
        helper.run(lambda: None, lambda: (_ for _ in ()).throw(ValueError("helper half")))
    helper.run(lambda: None, lambda: None)  # still serving after an error
    helper.close()


def test_engine_in_split_mode_gives_the_model_forward_tokens(tiny_model_and_tokenizer, monkeypatch):
    """The engine's "one thread + helper" decode (chosen here, every weight split)
    samples the ids the model's forward gives, and says so in its stats."""
    from workbench.engines import decode_step
    from workbench.engines.base import SamplingParams
    from workbench.engines.decode_threads import SPLIT
    from workbench.engines.hf import HFEngine

    if torch.get_num_threads() < 2:
        pytest.skip("the split mode needs two threads")
    monkeypatch.setattr(decode_step, "SPLIT_MIN_BYTES", 0)
    monkeypatch.setattr(decode_step, "COMPILED_SPLIT_MIN_BYTES", 0)
    model, tok = tiny_model_and_tokenizer
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128)]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    engine = HFEngine(model, tok)
    engine.generate_ids(prompts[:1], SamplingParams(max_tokens=2, temperature=0))  # makes the chooser and helper
    assert SPLIT in engine.decode_threads.candidates and engine._helper is not None
    engine.decode_threads.force(SPLIT)  # every row bucket
    calls = []  # halves the helper ran: Python callables (`run`), or the compiled helper's products
    monkeypatch.setattr(engine._helper, "run", lambda mine, theirs, run=engine._helper.run: calls.append(1) or
                        run(mine, theirs))
    for name in ("linear_halves", "skinny_halves"):
        for owner in (engine._helper, *engine._packers.values()):
            if hasattr(owner, name):
                monkeypatch.setattr(owner, name, lambda *a, f=getattr(owner, name): calls.append(1) or f(*a))
    fast = engine.generate_ids(prompts, params)
    slow = HFEngine(model, tok, fast_decode=False).generate_ids(prompts, params)
    assert calls  # the helper ran halves
    for a, b in zip(fast, slow):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-4
    assert engine.stats()["decode_split_matmuls"] == 1.0 and engine.stats()["decode_threads"] == 1.0
    engine.close()
    assert engine._helper is None
