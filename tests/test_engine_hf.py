"""HFEngine: greedy == transformers generate, raw logprobs, stop ids, top-p/top-k, seeds."""
from __future__ import annotations

import pytest
import torch

from workbench.engines.base import SamplingParams
from workbench.rollout import stop_token_ids


@pytest.fixture(scope="module")
def prompts(tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    texts = [
        [{"role": "user", "content": "Guess the number between 1 and 16."}],
        [{"role": "system", "content": "You are playing a game on a grid."},
         {"role": "user", "content": "The grid is 4 by 4. Move up, down, left or right. You bumped into a wall."}],
        [{"role": "user", "content": "What is 2+3?"}],
    ]
    ids = [list(tok(tok.apply_chat_template(m, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"]) for m in texts]
    assert len({len(p) for p in ids}) == 3, "prompts must have different lengths"
    return ids


def _forward_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # (T, V)
    return torch.log_softmax(logits, dim=-1)  # (T, V): row t predicts token t+1


def test_greedy_equals_transformers_generate(tiny_model_and_tokenizer, tiny_engine, prompts):
    model, tok = tiny_model_and_tokenizer
    stops = stop_token_ids(tok)
    results = tiny_engine.generate_ids(prompts, SamplingParams(max_tokens=20, temperature=0.0, stop_token_ids=stops))
    assert len(results) == len(prompts)
    for p, r in zip(prompts, results):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=20, do_sample=False, eos_token_id=stops, pad_token_id=tok.pad_token_id)
        ref_new = ref[0, len(p):].tolist()
        for i, t in enumerate(ref_new):  # generate pads after a stop; keep up to the stop
            if t in stops:
                ref_new = ref_new[: i + 1]
                break
        assert r.token_ids == ref_new
        assert r.finish_reason == ("stop" if ref_new[-1] in stops else "length")
        assert len(r.logprobs) == len(r.token_ids)


def test_logprobs_equal_a_plain_forward(tiny_model_and_tokenizer, tiny_engine, prompts):
    model, _ = tiny_model_and_tokenizer
    # temperature and top-k change sampling, never the reported (raw) logprobs
    params = SamplingParams(max_tokens=12, temperature=0.7, top_k=50, seed=3)
    for r, p in zip(tiny_engine.generate_ids(prompts, params), prompts):
        full = p + r.token_ids
        lp = _forward_logprobs(model, full)
        ref = [lp[len(p) - 1 + i, t].item() for i, t in enumerate(r.token_ids)]
        assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(ref), atol=1e-4)


def test_stop_ids_end_generation(tiny_engine, prompts):
    free = tiny_engine.generate_ids(prompts, SamplingParams(max_tokens=16, temperature=0.0))
    for r in free:
        assert len(r.token_ids) == 16 and r.finish_reason == "length"
    # stop on the 6th greedy token of the first prompt: that row ends there, others unaffected
    # unless they also produce it
    stop = free[0].token_ids[5]
    stopped = tiny_engine.generate_ids(prompts, SamplingParams(max_tokens=16, temperature=0.0, stop_token_ids=[stop]))
    for f, s in zip(free, stopped):
        if stop in f.token_ids:
            cut = f.token_ids.index(stop) + 1
            assert s.token_ids == f.token_ids[:cut] and s.finish_reason == "stop"
            assert s.token_ids[-1] == stop  # the stop id is kept
        else:
            assert s.token_ids == f.token_ids and s.finish_reason == "length"
    assert stopped[0].finish_reason == "stop" and len(stopped[0].token_ids) <= 6


def _check_allowed(model, prompt, token_ids, allowed_fn):
    lp = _forward_logprobs(model, prompt + token_ids)
    for i, t in enumerate(token_ids):
        logits_row = lp[len(prompt) - 1 + i]
        assert allowed_fn(logits_row, t), f"token {t} at step {i} is outside the allowed set"


def test_top_k_only_picks_the_k_most_likely(tiny_model_and_tokenizer, tiny_engine, prompts):
    model, _ = tiny_model_and_tokenizer
    k = 3
    batch = [prompts[0]] * 16
    results = tiny_engine.generate_ids(batch, SamplingParams(max_tokens=4, temperature=1.0, top_k=k, seed=0))

    def in_top_k(row, t):
        return t in torch.topk(row, k).indices.tolist()

    for r in results:
        _check_allowed(model, prompts[0], r.token_ids, in_top_k)
    firsts = {r.token_ids[0] for r in results}
    assert 1 < len(firsts) <= k  # it samples, within the top k


@pytest.mark.parametrize("temperature", [1.0, 0.7])
def test_top_p_only_picks_the_nucleus(tiny_model_and_tokenizer, tiny_engine, prompts, temperature):
    model, _ = tiny_model_and_tokenizer
    top_p = 0.3
    batch = [prompts[1]] * 16
    results = tiny_engine.generate_ids(batch, SamplingParams(max_tokens=4, temperature=temperature, top_p=top_p, seed=1))

    def in_nucleus(row, t):
        probs = torch.softmax(row / temperature, dim=-1)
        mass_before = probs[probs > probs[t]].sum().item()  # mass of strictly more likely tokens
        return mass_before < top_p + 1e-6

    for r in results:
        _check_allowed(model, prompts[1], r.token_ids, in_nucleus)
    # the nucleus is a real restriction here: without it most draws would fall outside
    lp = _forward_logprobs(model, prompts[1])[-1]
    probs = torch.softmax(lp / temperature, dim=-1)
    sorted_p = probs.sort(descending=True).values
    nucleus = int(((sorted_p.cumsum(0) - sorted_p) < top_p).sum())
    assert sorted_p[:nucleus].sum() < 0.9 and nucleus < 100


def test_same_seed_same_output(tiny_engine, prompts):
    params = SamplingParams(max_tokens=10, temperature=1.0, seed=123)
    a = tiny_engine.generate_ids(prompts, params)
    b = tiny_engine.generate_ids(prompts, params)
    c = tiny_engine.generate_ids(prompts, SamplingParams(max_tokens=10, temperature=1.0, seed=124))
    assert [r.token_ids for r in a] == [r.token_ids for r in b]
    assert [r.logprobs for r in a] == [r.logprobs for r in b]
    assert [r.token_ids for r in a] != [r.token_ids for r in c]


def test_batch_order_and_chunking(tiny_model_and_tokenizer, prompts):
    """Results come back in prompt order, whatever the internal sort and chunk size."""
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    greedy = SamplingParams(max_tokens=8, temperature=0.0)
    one_chunk = HFEngine(model, tok).generate_ids(prompts, greedy)
    small_chunks = HFEngine(model, tok, max_batch_size=1).generate_ids(prompts, greedy)
    singles = [HFEngine(model, tok).generate_ids([p], greedy)[0] for p in prompts]
    assert [r.token_ids for r in one_chunk] == [r.token_ids for r in small_chunks] == [r.token_ids for r in singles]


def test_bad_input(tiny_engine):
    assert tiny_engine.generate_ids([], SamplingParams()) == []
    with pytest.raises(ValueError, match="prompt 1 is empty"):
        tiny_engine.generate_ids([[1, 2], []], SamplingParams())
    with pytest.raises(ValueError, match="top_p"):
        SamplingParams(top_p=0.0)
    with pytest.raises(ValueError, match="max_tokens"):
        SamplingParams(max_tokens=0)


# -- prefix cache (multi-turn KV reuse) ------------------------------------------------------

def _multi_turn(engine, temperature=0.0):
    from envs import make_env
    from workbench.rollout import Rollout

    names = ["guess_number", "grid", "wordle", "text_game"]  # different prompts in every turn
    rollout = Rollout(engine, [make_env(n) for n in names], seeds=[0, 1, 2, 3], max_turns=3,
                      max_tokens=10, temperature=temperature, seed=0)
    return rollout.run()


def test_prefix_cache_reuses_turns_and_changes_nothing(tiny_model_and_tokenizer):
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    cached, plain = HFEngine(model, tok), HFEngine(model, tok, prefix_cache=False)
    a, b = _multi_turn(cached), _multi_turn(plain)
    st = cached.stats()
    assert all(e.num_turns == 3 for e in a)
    assert st["prefix_cache_hits"] == 8 and st["prefix_cache_misses"] == 4  # turns 2 and 3 reuse turn 1, 2
    # every reused prefix is the whole previous context plus the previous turn's sampled ids but its last
    assert st["prefix_cache_reused_tokens"] == sum(
        t.token_end - 1 for e in a for t in e.turns[:-1])
    assert "prefix_cache_hits" not in plain.stats()
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids  # greedy: same tokens with and without reuse
        assert torch.allclose(torch.tensor(x.rollout_logprobs), torch.tensor(y.rollout_logprobs), atol=1e-4)
        assert x.warnings == []
    # sampled, with reuse: logprobs still equal a plain forward of the whole episode
    for ep in _multi_turn(cached, temperature=1.0):
        lp = _forward_logprobs(model, ep.token_ids)
        for t in ep.turns:
            ref = [lp[i - 1, ep.token_ids[i]].item() for i in range(t.token_start, t.token_end)]
            assert torch.allclose(torch.tensor(ep.rollout_logprobs[t.token_start:t.token_end]), torch.tensor(ref), atol=1e-4)


def test_the_last_possible_turn_keeps_no_kv(tiny_model_and_tokenizer):
    """A Rollout's call whose rows are all on their episode's last possible turn says
    `keep_kv=False`, and the engine then stores none of its rows in the prefix cache: the
    entries after a 3-turn run are the second turn's, not the third's. The samples are the
    same as with every turn kept."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    seen: list[bool] = []

    class Spy(HFEngine):  # the real engine, recording what each call asked
        def generate_ids(self, prompts, params):
            seen.append(params.keep_kv)
            return super().generate_ids(prompts, params)

    engine = Spy(model, tok)
    episodes = _multi_turn(engine, temperature=1.0)
    assert seen == [True, True, False]  # max_turns=3: the third call is every row's last
    lengths = {len(k) for k in engine.prefix_cache.entries}
    # kept: each episode's first two turns (prompt + sampled ids but the last), nothing longer
    assert lengths == {ep.turns[1].token_end - 1 for ep in episodes}
    kept_all = HFEngine(model, tok)
    kept_all.generate_ids = lambda prompts, params: HFEngine.generate_ids(  # type: ignore[method-assign]
        kept_all, prompts, SamplingParams(**{**params.__dict__, "keep_kv": True}))
    for a, b in zip(episodes, _multi_turn(kept_all, temperature=1.0)):
        assert a.token_ids == b.token_ids
    assert max(len(k) for k in kept_all.prefix_cache.entries) > max(lengths)  # there the third turn was kept


def test_prefix_cache_dropped_when_weights_change(tiny_model_path, prompts):
    """After an in-place weight update, no KV from the old weights may be reused."""
    from workbench.engines.hf import HFEngine
    from workbench.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(tiny_model_path), dtype="float32")  # own copy: we modify it; fp32 reference
    engine = HFEngine(model, tok)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    first = engine.generate_ids([prompts[0]], greedy)[0]
    follow = prompts[0] + first.token_ids + prompts[2]
    second = engine.generate_ids([follow], greedy)[0]
    assert engine.stats()["prefix_cache_hits"] == 1
    assert second.num_cached_tokens == len(prompts[0]) + len(first.token_ids) - 1 and first.num_cached_tokens == 0
    with torch.no_grad():  # an "optimizer step"
        for p in model.parameters():
            p.mul_(1.05)
    again = engine.generate_ids([follow], greedy)[0]
    assert engine.stats()["prefix_cache_hits"] == 1 and engine.stats()["prefix_cache_entries"] == 1
    lp = _forward_logprobs(model, follow + again.token_ids)
    ref = [lp[len(follow) - 1 + i, t].item() for i, t in enumerate(again.token_ids)]
    assert torch.allclose(torch.tensor(again.logprobs), torch.tensor(ref), atol=1e-4)
    engine.sync_weights(model)
    assert engine.stats()["prefix_cache_entries"] == 0


def test_prefix_cache_is_bounded(tiny_model_and_tokenizer, prompts):
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, prefix_cache_mb=0.05)  # ~50 KB: a couple of short rows
    for seed in range(6):
        engine.generate_ids(prompts, SamplingParams(max_tokens=8, temperature=1.0, seed=seed))
        assert engine.stats()["prefix_cache_mb"] <= 0.05


@pytest.mark.slow
def test_embedded_gqa_batch_matches_generate_and_forward(embedded_model_and_tokenizer, embedded_engine):
    """SmolLM2 has grouped KV heads (9 query, 3 KV): the engine's padded batch with
    `enable_gqa` attention must equal transformers' own generate and forward."""
    model, tok = embedded_model_and_tokenizer
    assert model.config.num_attention_heads != model.config.num_key_value_heads
    chats = [[{"role": "user", "content": "What is 2+3?"}],
             [{"role": "system", "content": "You are playing a number guessing game."},
              {"role": "user", "content": "Guess the secret number between 1 and 16. You have 6 guesses."}]]
    prompts = [list(tok(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                        add_special_tokens=False)["input_ids"]) for c in chats]
    stops = stop_token_ids(tok)
    results = embedded_engine.generate_ids(prompts, SamplingParams(max_tokens=8, temperature=0.0, stop_token_ids=stops))
    assert model.config._attn_implementation == "sdpa"  # restored after the engine's forwards
    for p, r in zip(prompts, results):
        with torch.no_grad():
            ref = model.generate(torch.tensor([p]), attention_mask=torch.ones(1, len(p), dtype=torch.long),
                                 max_new_tokens=8, do_sample=False, eos_token_id=stops, pad_token_id=tok.pad_token_id)
        assert r.token_ids == ref[0, len(p):len(p) + len(r.token_ids)].tolist()
        lp = _forward_logprobs(model, p + r.token_ids)
        want = [lp[len(p) - 1 + i, t].item() for i, t in enumerate(r.token_ids)]
        assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(want), atol=1e-4)


def test_growing_cache_layer_equals_concatenation():
    """The preallocated KV layer behaves like DynamicLayer's torch.cat, also past its room."""
    from transformers.cache_utils import DynamicLayer

    from workbench.engines.hf import _GrowingLayer

    g = torch.Generator().manual_seed(0)
    ref = DynamicLayer()
    ref.update(torch.randn(3, 2, 5, 4, generator=g), torch.randn(3, 2, 5, 4, generator=g))
    grow = _GrowingLayer(ref, room=2)
    ref = DynamicLayer()
    ref.update(grow.keys.clone(), grow.values.clone())
    for n in (1, 1, 3, 1):  # the 3 goes past the room: reallocation
        k, v = torch.randn(3, 2, n, 4, generator=g), torch.randn(3, 2, n, 4, generator=g)
        a, b = grow.update(k, v), ref.update(k, v)
        assert torch.equal(a[0], b[0]) and torch.equal(a[1], b[1])
        assert grow.get_seq_length() == ref.get_seq_length()
    idx = torch.tensor([2, 0])
    grow.batch_select_indices(idx)
    ref.batch_select_indices(idx)
    assert torch.equal(grow.keys, ref.keys) and torch.equal(grow.values, ref.values)
    k, v = torch.randn(2, 2, 1, 4, generator=g), torch.randn(2, 2, 1, 4, generator=g)
    assert torch.equal(grow.update(k, v)[0], ref.update(k, v)[0])


def test_inverse_cdf_draws_follow_the_weights():
    from workbench.engines.hf import _multinomial

    weights = torch.tensor([[0.1, 0.0, 0.6, 0.3, 0.0], [0.0, 0.0, 0.0, 0.0, 2.0]])  # (2, 5), unnormalised ok
    n = 20000
    gen = torch.Generator().manual_seed(0)
    draws = torch.stack([_multinomial(weights, gen) for _ in range(n)])  # (n, 2)
    freq = torch.bincount(draws[:, 0], minlength=5).float() / n
    expected = weights[0] / weights[0].sum()
    sigma = (expected * (1 - expected) / n).sqrt()
    assert ((freq - expected).abs() <= 5 * sigma + 1e-9).all(), freq
    assert freq[1] == 0 and freq[4] == 0  # zero weight: never drawn
    assert (draws[:, 1] == 4).all()
    # one generator per row: row b's draws depend on its own generator only
    a = _multinomial(weights, [torch.Generator().manual_seed(7), torch.Generator().manual_seed(8)])
    b = _multinomial(weights[:1], [torch.Generator().manual_seed(7)])
    assert a[0] == b[0]


def test_two_level_inverse_cdf_matches_the_whole_row_search():
    """Over more ids than a block (`_CDF_BLOCK`), the block-then-id search draws what a
    float64 cumulative sum of the whole row draws (a plain loop here), never a zero-weight
    id, even at uniforms next to 0 and 1 and weights on block edges; at temperature 1 the
    weights from the caller's logprobs give the same ids as the softmax."""
    from workbench.engines.base import SamplingParams
    from workbench.engines.sampling import _CDF_BLOCK, _inverse_cdf, _sample

    g = torch.Generator().manual_seed(5)
    N = 3 * _CDF_BLOCK + 17
    weights = torch.rand(6, N, generator=g) ** 8  # (6, N): a few ids hold most of the mass
    weights[1, : 2 * _CDF_BLOCK] = 0  # whole blocks without weight
    weights[2] = 0
    weights[2, [_CDF_BLOCK - 1, _CDF_BLOCK, N - 1]] = 1.0  # only block edges and the last id
    weights[3, ::2] = 0
    for trial in range(20):
        u = torch.rand(6, generator=g, dtype=torch.float64)
        if trial == 0:
            u = torch.tensor([0.0, 1 - 2**-53, 0.0, 1 - 2**-53, 0.5, 2**-60], dtype=torch.float64)
        draws = _inverse_cdf(weights, u)
        assert (weights.gather(1, draws[:, None]) > 0).all()
        for b in range(6):  # the plain loop: first id whose running float64 sum exceeds u * total
            row = weights[b].double().tolist()
            total, run, ref = sum(row), 0.0, N - 1
            for i, x in enumerate(row):
                run += x
                if run > u[b].item() * total:
                    ref = i
                    break
            while row[ref] == 0:  # a uniform at the very top: the last positive weight
                ref -= 1
            assert draws[b].item() == ref, (trial, b)
    logits = torch.randn(8, N, generator=g) * 3
    u = torch.rand(8, generator=g, dtype=torch.float64)
    params = SamplingParams(max_tokens=4, temperature=1.0)
    assert torch.equal(_sample(logits, params, u, torch.log_softmax(logits, -1)), _sample(logits, params, u))


def test_prompts_that_missed_the_prefix_cache_share_chunks(tiny_model_and_tokenizer, monkeypatch):
    """Over more prompts than one chunk holds, chunks go by the tokens each prompt has to
    prefill: the next turns of kept episodes (short new suffixes) fill one chunk and fresh
    prompts of the same lengths the other, instead of mixing (a chunk prefills every row to
    its longest new suffix). The tokens are those of an engine without a prefix cache."""
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, max_batch_size=4)
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    g = torch.Generator().manual_seed(5)
    first = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (6, 7, 8, 9)]
    turns = engine.generate_ids(first, greedy)
    nexts = [p + r.token_ids + [5, 6] for p, r in zip(first, turns)]  # kept episodes' next turns
    fresh = [torch.randint(3, 200, (len(p),), generator=g).tolist() for p in nexts]  # same lengths, nothing kept
    prompts = [p for pair in zip(nexts, fresh) for p in pair]
    chunks = []
    run_chunk = engine._generate_chunk
    monkeypatch.setattr(engine, "_generate_chunk",
                        lambda model, ps, params, gen, *rest: chunks.append(ps) or run_chunk(model, ps, params, gen, *rest))
    got = engine.generate_ids(prompts, greedy)
    assert sorted(map(sorted, [[tuple(p) for p in c] for c in chunks])) == sorted(
        [sorted(map(tuple, nexts)), sorted(map(tuple, fresh))])
    assert [len(c) for c in chunks] == [4, 4] and [len(p) for p in chunks[0]] == sorted(len(p) for p in chunks[0])
    plain = HFEngine(model, tok, max_batch_size=4, prefix_cache=False).generate_ids(prompts, greedy)
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]
    assert [r.num_cached_tokens > 0 for r in got] == [True, False] * 4


def test_chunk_rows_on_a_cpu_and_the_kv_bytes_they_are_sized_by(tiny_model_and_tokenizer):
    """`inference.max_batch_size` None: 64 rows a chunk on a CPU; on an accelerator chunks are
    sized by `kv_bytes_per_token`, which is what a prefill's cache holds per token."""
    from workbench.engines.kv_cache import chunk_rows, kv_bytes_per_token

    model, _ = tiny_model_and_tokenizer
    assert chunk_rows(model, torch.device("cpu"), 100, 64) == 64
    ids = torch.tensor([[5, 9, 11, 3, 7, 2, 8]])  # (1, 7)
    with torch.no_grad():
        cache = model(input_ids=ids, use_cache=True).past_key_values
    held = sum(t.numel() * t.element_size() for layer in cache.layers for t in (layer.keys, layer.values))
    assert kv_bytes_per_token(model) == held // 7
