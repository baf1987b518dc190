"""The hf engine's KV cache paths (kv_cache.py): one block for all layers, rows kept in
place, kept KV placed with room for the prefill and decode steps, bf16 decoding over the
bf16 cache, and the prefix cache superseding only the entry a row extended."""
from __future__ import annotations

import pytest
import torch

from workbench.engines.base import SamplingParams
from tests.numerics import assert_same_samples


def _plain_cache(model, ids: torch.Tensor, attention: torch.Tensor):
    with torch.no_grad():
        return model(input_ids=ids, attention_mask=attention, use_cache=True).past_key_values


@pytest.mark.parametrize("keep", [[0, 1, 2, 3, 4, 5, 6], [1, 2, 3, 4, 5, 6, 7], [0, 2, 5, 7], [6, 7], [3],
                                  [0, 1, 2, 3, 4, 5, 6, 7]])
def test_rows_kept_in_place_equal_an_index_select(tiny_model_and_tokenizer, keep):
    """Finished rows leaving the batch: moving kept rows up in place (runs of rows, pieces
    that never overlap) leaves every layer's keys/values equal to an index_select."""
    from workbench.engines.kv_cache import _grow_layers, _select_rows

    model, _ = tiny_model_and_tokenizer
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (8, 9), generator=g)  # (8, 9) real token ids
    cache = _plain_cache(model, ids, torch.ones_like(ids))
    want = [(layer.keys[keep].clone(), layer.values[keep].clone()) for layer in cache.layers]
    cache.layers = _grow_layers(cache.layers, room=4)
    block = cache.layers[0]._block
    assert all(layer._block is block for layer in cache.layers)  # one buffer for every layer
    ptr = block.buf.data_ptr()
    _select_rows(cache, torch.tensor(keep), keep)
    assert cache.layers[0]._block.buf.data_ptr() == ptr  # in place: no new buffer
    for layer, (k, v) in zip(cache.layers, want):
        assert torch.equal(layer.keys, k) and torch.equal(layer.values, v)
    # a repeated or unordered index (unique rows expanded to a group): index_select
    _select_rows(cache, torch.tensor([0, 0]), [0, 0])
    assert torch.equal(cache.layers[1].keys, torch.stack([want[1][0][0]] * 2))


def test_kept_kv_gets_room_for_prefill_and_decode(tiny_model_and_tokenizer):
    """`_build_cache` places kept rows right-aligned with room after them: the prefill of the
    new tokens and the decode steps write into it (no new buffer), and the logits equal a
    forward of the same positions over a plain cache."""
    from transformers import DynamicCache

    from workbench.engines.kv_cache import _build_cache, _grow_layers, _row_kv

    model, _ = tiny_model_and_tokenizer
    g = torch.Generator().manual_seed(1)
    a, b = torch.randint(3, 200, (1, 7), generator=g), torch.randint(3, 200, (1, 4), generator=g)
    kept = []
    for ids in (a, b):
        cache = _plain_cache(model, ids, torch.ones_like(ids))
        cache.layers = _grow_layers(cache.layers, room=0)
        kept.append(_row_kv(cache, 0, torch.arange(ids.shape[1])))
    assert len(kept[0]) == 1 and kept[0][0].shape[:2] == (model.config.num_hidden_layers, 2)
    C, S = 7, 3
    new = torch.randint(3, 200, (2, S), generator=g)  # (2, S): each row's new tokens
    past = _build_cache(kept, [7, 4], C, S + 2, torch.device("cpu"))
    ptr = past.layers[0]._block.buf.data_ptr()
    attention = torch.ones((2, C + S), dtype=torch.long)
    attention[1, : C - 4] = 0
    positions = torch.stack([torch.arange(7, 7 + S), torch.arange(4, 4 + S)])  # (2, S)
    with torch.no_grad():
        out = model(input_ids=new, attention_mask=attention, position_ids=positions, past_key_values=past,
                    use_cache=True)
        assert out.past_key_values.layers[0]._block.buf.data_ptr() == ptr  # the prefill wrote into the room
        for row, ids in enumerate((a, b)):
            ref = model(input_ids=torch.cat([ids, new[row : row + 1]], 1), past_key_values=DynamicCache()).logits
            assert torch.allclose(out.logits[row], ref[0, -S:], atol=1e-5)


def _stop_heavy(model, tok):
    """Two turns of 16 rows (the second reusing the first's KV), rows ending at many steps."""
    from workbench.engines.hf import HFEngine

    stops = list(range(0, model.config.vocab_size, 12))  # ~1/12 of the ids
    engine = HFEngine(model, tok)
    g = torch.Generator().manual_seed(2)
    prompts = [torch.randint(3, 200, (n,), generator=g).tolist() for n in range(5, 21)]
    first = engine.generate_ids(prompts, SamplingParams(max_tokens=16, temperature=1.0, seed=4, stop_token_ids=stops))
    nexts = [p + r.token_ids + [7, 8, 9][: 1 + i % 3] for i, (p, r) in enumerate(zip(prompts, first))]
    second = engine.generate_ids(nexts, SamplingParams(max_tokens=16, temperature=1.0, seed=5, stop_token_ids=stops))
    assert all(r.num_cached_tokens > 0 for r in second)
    return [(r.token_ids, r.logprobs) for r in first + second]


def test_rows_leaving_in_place_change_no_sample(tiny_model_and_tokenizer, monkeypatch):
    """Two turns with rows finishing at many steps: the same ids, and logprobs within fp32
    rounding (`tests/numerics.py`), whether kept rows move in place or are gathered into a
    new buffer."""
    from workbench.engines import kv_cache

    model, tok = tiny_model_and_tokenizer
    in_place = _stop_heavy(model, tok)
    original = kv_cache._KVBlock.keep_rows
    monkeypatch.setattr(kv_cache._KVBlock, "keep_rows",
                        lambda self, index, keep, length: original(self, index, None, length))
    assert_same_samples(_stop_heavy(model, tok), in_place)


def test_bf16_decode_reads_the_bf16_cache(tiny_model_path, monkeypatch):
    """bf16: the decode step's attention reads the cache in bf16 (as the model's own sdpa;
    no fp32 copy of it), so the cache the prefix cache keeps rows of stays bf16; the ids
    are those of the engine decoding with the model's forward, logprobs to bf16 rounding.
    With torch's sdpa on both sides (`cpu_kernels=False`): the compiled kernel rounds once in
    fp32 where sdpa rounds its probabilities to bf16, so a near-tie of the tiny model may draw
    another id (its logprobs against the forward: tests/test_cpu_kernels.py)."""
    from workbench.engines import decode_step, hf
    from workbench.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(str(tiny_model_path), dtype="bfloat16", device="cpu")
    seen = []
    attention = decode_step.DecodeStep._attention
    monkeypatch.setattr(decode_step.DecodeStep, "_attention",
                        lambda self, q, k, *a: seen.append(k.dtype) or attention(self, q, k, *a))
    engine = hf.HFEngine(model, tok, cpu_kernels=False)  # sdpa, as the model's forward
    prompts = [[5, 6, 7, 8], [9, 10, 11], [12, 13, 14, 15, 16]]
    params = SamplingParams(max_tokens=8, temperature=1.0, seed=2)
    fast = engine.generate_ids(prompts, params)
    fast += engine.generate_ids([p + r.token_ids + [3] for p, r in zip(prompts, fast)], params)
    assert seen and set(seen) == {torch.bfloat16}
    assert {t.dtype for kv, _ in engine.prefix_cache.entries.values() for t in kv} == {torch.bfloat16}
    slow_engine = hf.HFEngine(model, tok, fast_decode=False)
    slow = slow_engine.generate_ids(prompts, params)
    slow += slow_engine.generate_ids([p + r.token_ids + [3] for p, r in zip(prompts, slow)], params)
    for a, b in zip(fast, slow):
        assert a.token_ids == b.token_ids
        assert max(abs(x - y) for x, y in zip(a.logprobs, b.logprobs)) < 0.05


def test_prefix_cache_drops_only_the_entry_a_row_extended():
    """A group member that sampled the first ids of another's reply and stopped keeps its
    entry when the other row's longer one is stored; a row's own previous turn is dropped."""
    from workbench.engines.kv_cache import _PrefixCache

    cache = _PrefixCache(2**20)
    kv = [torch.zeros(2, 2, 1, 3, 4)]  # (L, 2, KV, n, D)
    short, long = (1, 2, 3, 4), (1, 2, 3, 4, 5, 6)  # both from prompt (1, 2, 3): `short` stopped earlier
    cache.store(short, kv)
    cache.store(long, kv)
    assert set(cache.entries) == {short, long}
    assert cache.lookup([1, 2, 3, 4, 9])[0] == 4  # the short row's next turn still reuses its own
    nxt = long + (7, 8, 9)
    cache.store(nxt, kv, extends=len(long))  # the long row's next turn, which reused `long`
    assert set(cache.entries) == {short, nxt}
    assert cache.bytes == 2 * kv[0].numel() * 4


def test_prefill_groups_split_kept_turns_from_lost_prompts():
    from workbench.engines.kv_cache import _prefill_groups

    new = [25, 250, 26, 251, 24, 27, 249, 25]  # next turns of kept episodes, and prompts the cache lost
    groups = _prefill_groups(new)
    assert groups == [[0, 2, 4, 5, 7], [1, 3, 6]]
    assert _prefill_groups([30, 31, 29, 30]) == [[0, 1, 2, 3]]  # splitting would save little: one group
    assert sorted(u for g in _prefill_groups(list(range(1, 60)) * 2) for u in g) == list(range(118))


def test_rows_prefilled_in_groups_meet_in_one_cache(tiny_model_and_tokenizer, monkeypatch):
    """One chunk holding next turns of kept episodes, fresh long prompts and a duplicate:
    prefilled in two groups, decoded together; the ids of an engine without a prefix cache
    and logprobs equal to a plain forward."""
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok)
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    g = torch.Generator().manual_seed(6)
    first = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (5, 6, 7)]
    turns = engine.generate_ids(first, greedy)
    nexts = [p + r.token_ids + [9, 8] for p, r in zip(first, turns)]
    fresh = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (40, 44)]
    prompts = [nexts[0], fresh[0], nexts[1], fresh[1], nexts[2], fresh[0]]  # fresh[0] twice
    calls = []
    run = engine._prefill
    monkeypatch.setattr(engine, "_prefill",
                        lambda model, ps, hits, room, **kw: calls.append(len(ps)) or run(model, ps, hits, room, **kw))
    from workbench.engines import hf

    def no_assembly(*args):
        raise AssertionError("groups prefilled into one buffer need no assembly")

    monkeypatch.setattr(hf, "_assemble_groups", no_assembly)
    got = engine.generate_ids(prompts, greedy)
    assert sorted(calls) == [2, 3]  # the kept turns and the fresh prompts apart (the duplicate once)
    plain = HFEngine(model, tok, prefix_cache=False).generate_ids(prompts, greedy)
    assert [r.token_ids for r in got] == [r.token_ids for r in plain]
    assert [r.num_cached_tokens > 0 for r in got] == [True, False, True, False, True, False]
    for p, r in zip(prompts, got):
        with torch.no_grad():
            lp = torch.log_softmax(model(input_ids=torch.tensor([p + r.token_ids])).logits[0].float(), -1)
        ref = [lp[len(p) - 1 + i, t].item() for i, t in enumerate(r.token_ids)]
        assert torch.allclose(torch.tensor(r.logprobs), torch.tensor(ref), atol=1e-4)


def _grouped_turns(model, tok):
    """Next turns of kept episodes and fresh long prompts in one chunk (prefilled in groups),
    sampled with one shared generator, rows ending at many steps: (ids, logprobs) per row."""
    from workbench.engines.hf import HFEngine

    stops = list(range(0, model.config.vocab_size, 12))
    engine = HFEngine(model, tok)
    g = torch.Generator().manual_seed(7)
    first = [torch.randint(3, 200, (n,), generator=g).tolist() for n in range(5, 17)]
    params = SamplingParams(max_tokens=12, temperature=1.0, seed=3, stop_token_ids=stops)
    turns = engine.generate_ids(first, params)
    nexts = [p + r.token_ids + [9, 8, 7][: 1 + i % 3] for i, (p, r) in enumerate(zip(first, turns))]
    fresh = [torch.randint(3, 200, (n,), generator=g).tolist() for n in (40, 44, 47, 50)]
    got = engine.generate_ids(nexts[:6] + fresh + nexts[6:], SamplingParams(**{**vars(params), "seed": 4}))
    return [(r.token_ids, r.logprobs) for r in turns + got]


def test_holes_filled_from_the_tail_and_groups_in_one_buffer_change_no_sample(tiny_model_and_tokenizer,
                                                                              monkeypatch):
    """Rows leaving by filling holes from the tail (the batch order then differs from the
    prompt order) and groups prefilled straight into one buffer give the same ids, and
    logprobs within fp32 rounding, as rows moved up in order and groups assembled by a copy
    (the batch layout changes the kernels' rounding on some CPUs: `tests/numerics.py`)."""
    from workbench.engines import hf
    from workbench.engines.kv_cache import _tail_fill

    assert _tail_fill([True, False, True, False, True, True]) == [0, 4, 2, 5]
    assert _tail_fill([False, False, True]) == [2]
    model, tok = tiny_model_and_tokenizer
    calls = []
    into_one = hf.HFEngine._prefill_into_one
    monkeypatch.setattr(hf.HFEngine, "_prefill_into_one",
                        lambda self, *a: calls.append(1) or into_one(self, *a))
    new = _grouped_turns(model, tok)
    assert calls  # the chunk was prefilled in groups, into one buffer
    from workbench.engines import decode_state

    monkeypatch.setattr(decode_state, "_tail_fill", lambda live: [i for i, x in enumerate(live) if x])
    monkeypatch.setattr(hf.HFEngine, "_prefill_into_one", lambda self, *a: None)
    assert_same_samples(_grouped_turns(model, tok), new)


def _thp_setting() -> str | None:
    """The kernel's transparent-huge-page mode ("always", "madvise", "never"), None off Linux."""
    try:
        text = open("/sys/kernel/mm/transparent_hugepage/enabled").read()
    except OSError:
        return None
    return text[text.index("[") + 1 : text.index("]")]


def _huge_kib_under(t: torch.Tensor) -> int:
    """AnonHugePages (KiB) of the mappings overlapping `t`'s bytes (/proc/self/smaps; the
    advice splits a mapping at the 2 MiB boundaries)."""
    start = t.data_ptr()
    end, total, inside = start + t.numel() * t.element_size(), 0, False
    for line in open("/proc/self/smaps"):
        head = line.split()[0]
        if "-" in head and ":" not in head:  # a mapping's first line: "start-end perms ..."
            lo, hi = (int(x, 16) for x in head.split("-"))
            inside = lo < end and start < hi
        elif inside and head == "AnonHugePages:":
            total += int(line.split()[1])
    return total


@pytest.mark.skipif(_thp_setting() not in ("always", "madvise"), reason="no transparent huge pages here")
def test_cache_buffers_sit_on_huge_pages():
    """A KV buffer asks for huge pages before it is written (kv_cache.py's docstring: the
    decode steps' writes into fresh room faulted in a 4 KiB page at a time)."""
    from workbench.engines.kv_cache import _advise_huge_pages, _kv_buffer

    buf = _kv_buffer((30, 2, 64, 3, 64, 64), torch.float32, torch.device("cpu"))  # 180 MiB, untouched
    buf[:, :, :, :, 0].fill_(1.0)  # one position of every row and head, as a decode step writes
    assert _huge_kib_under(buf) >= 64 * 1024  # mostly huge pages (4 KiB pages: 0 here)
    assert not _advise_huge_pages(torch.empty(1000))  # no whole 2 MiB page under it: nothing advised
