"""The hf engine's decode step on CUDA (skipped without it; CI has no GPU): the step's
logits against the model's forward on the same cache, with and without the one read of
a prompt every row shares (the engine's default on accelerators), and the engine's ids
against its model-forward path."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.test_decode_step import _llama, _qwen2, _qwen3

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]


def _prefill(model, rows: list[list[int]]):
    """`tests.test_decode_step._prefill` on the model's device: the cache with growing
    layers, the (B, T) mask, the (B, 1) next positions."""
    from workbench.engines.kv_cache import _GrowingLayer

    B, S = len(rows), max(map(len, rows))
    ids, mask, pos = (torch.zeros((B, S), dtype=torch.long) for _ in range(3))
    for b, r in enumerate(rows):
        ids[b, S - len(r):], mask[b, S - len(r):], pos[b, S - len(r):] = torch.tensor(r), 1, torch.arange(len(r))
    ids, mask, pos = ids.cuda(), mask.cuda(), pos.cuda()
    with torch.no_grad():
        cache = model(input_ids=ids, attention_mask=mask, position_ids=pos, use_cache=True).past_key_values
    cache.layers = [_GrowingLayer(layer, 8) for layer in cache.layers]
    return cache, mask, pos[:, -1:] + 1


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-3), (torch.bfloat16, 0.05)])
@pytest.mark.parametrize("shared", [False, True])
@pytest.mark.parametrize("make", [_llama, _qwen2, _qwen3], ids=["llama", "qwen2-biases", "qwen3-qk-norms"])
def test_decode_step_on_cuda_matches_the_model(make, shared, dtype, atol):
    from workbench.engines.decode_step import DecodeStep

    model = make().to("cuda", dtype)
    rows = [[5, 9, 11, 3, 7, 2]] * 4 if shared else [[5, 9, 11, 3, 7], [4, 8], [6, 2, 1, 9, 10, 12, 13], [7, 7]]
    cache, mask, pos = _prefill(model, rows)
    ref_cache = copy.deepcopy(cache)
    step = DecodeStep.build(model)
    assert step is not None
    tokens = torch.tensor([3, 17, 42, 5], device="cuda")
    for _ in range(3):
        mask = torch.cat([mask, torch.ones_like(mask[:, :1])], dim=-1)
        with torch.no_grad():
            ref = model(input_ids=tokens[:, None], attention_mask=mask, position_ids=pos, past_key_values=ref_cache,
                        use_cache=True).logits[:, -1].float()  # (B, V)
            fast = step(tokens, mask, pos, cache, shared_prefix=6 if shared else 0)  # (B, V)
        assert torch.allclose(fast, ref, atol=atol, rtol=0), (fast - ref).abs().max()
        tokens, pos = ref.argmax(-1), pos + 1


def test_engine_on_cuda_samples_the_model_forward_ids(tiny_model_and_tokenizer):
    """A GRPO group (one prompt, 6 rows: the shared-prompt read) and rows of different
    prompts, two turns (the prefix cache), fp32 on CUDA: the ids of the model's forward."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model).to("cuda")
    group = [list(tok("Guess the number between 1 and 100.")["input_ids"])] * 6
    mixed = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in (4, 16, 128, 9)]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3)
    fast_engine, slow_engine = HFEngine(model, tok), HFEngine(model, tok, fast_decode=False)
    for prompts in (group, mixed):
        fast = fast_engine.generate_ids(prompts, params)
        slow = slow_engine.generate_ids(prompts, params)
        nexts = [p + r.token_ids + [9, 8] for p, r in zip(prompts, fast)]
        fast += fast_engine.generate_ids(nexts, params)
        slow += slow_engine.generate_ids(nexts, params)
        for a, b in zip(fast, slow):
            assert a.token_ids == b.token_ids
            assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 1e-3
    assert fast_engine.stats()["fast_decode_steps"] > 0 and slow_engine.stats()["fast_decode_steps"] == 0


def test_engine_on_cuda_samples_a_large_call_in_one_chunk(tiny_model_and_tokenizer):
    """`max_batch_size` None on CUDA: 200 prompts of a tiny model fit one chunk (free memory
    decides), so the call takes one decode step per token, not one per token per 64 rows."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine
    from workbench.engines.kv_cache import chunk_rows

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model).to("cuda")
    assert chunk_rows(model, torch.device("cuda"), 32, 8) >= 200
    prompts = [list(tok(f"Guess the number between 1 and {n}.")["input_ids"]) for n in range(200)]
    engine = HFEngine(model, tok)
    engine.generate_ids(prompts, SamplingParams(max_tokens=8, temperature=1.0, seed=0, stop_token_ids=[]))
    s = engine.stats()
    assert s["fast_decode_steps"] + s["model_decode_steps"] == 7  # 8 tokens: a prefill, then 7 steps
    chunked = HFEngine(model, tok, max_batch_size=64)
    chunked.generate_ids(prompts, SamplingParams(max_tokens=8, temperature=1.0, seed=0, stop_token_ids=[]))
    s = chunked.stats()
    assert s["fast_decode_steps"] + s["model_decode_steps"] == 4 * 7  # 64 + 64 + 64 + 8 rows


def test_a_learner_on_cuda_joins_its_group_with_device_cuda(tiny_model_path):
    """`model.device="cuda"` (no index, what "auto" resolves to) is a learner's own GPU: the
    FSDP2 learner sets it, joins an nccl group of one and gathers only the trained weights."""
    import socket

    import torch.distributed as dist

    from workbench.config import ConfigStore
    from workbench.distributed.learners import LearnerWorker

    config = ConfigStore()
    config.model.model_name, config.model.device, config.model.lora_rank = str(tiny_model_path), "cuda", 2
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    learner = LearnerWorker(config, 0, 1)
    try:
        assert learner.setup("127.0.0.1", port) == "nccl"
        state = learner.state_dict()["policy"]
        assert state and all("lora_" in k for k in state)
    finally:
        dist.destroy_process_group()
