"""The hf engine's decode loop stops a GPU at most twice per token (counted on the CPU), with
a grammar constraint on every row too (its masks go up without waiting).

`tests/host_sync.py` counts the operations that would wait for the device on a GPU
(host reads of device values, blocking uploads) and every ATen op; a forward pre-hook on
the model's rotary embedding, which every forward calls once (the model's own forward
and the engine's `DecodeStep` alike), splits the counts by decode step (step k = from the
k-th forward to the next). Both decode paths are counted.
"""
from __future__ import annotations

import pytest

from tests.host_sync import Counts, SyncCounter
from workbench.engines.base import SamplingParams
from workbench.engines.constraints import Constraint

#: Host reads allowed per decode step in the steady state: the sampled ids (and, with
#: top-p, whether the top candidates hold the nucleus).
MAX_READS_PER_STEP = 2


def _per_step(engine, model, prompts, params) -> tuple[list[Counts], list, list[int]]:
    """Counts of each decode step (the prefill forward and what follows the last forward
    excluded), the results, and the batch size of every forward."""
    marks: list[Counts] = []
    rows: list[int] = []

    def hook(module, args, kwargs):
        marks.append(counter.snapshot())
        rows.append(args[0].shape[0])

    with SyncCounter(model) as counter:
        handle = model.model.rotary_emb.register_forward_pre_hook(hook, with_kwargs=True)
        try:
            results = engine.generate_ids(prompts, params)
        finally:
            handle.remove()
    marks.append(counter.snapshot())
    steps = [b - a for a, b in zip(marks[1:-2], marks[2:-1])]  # forward k .. forward k+1, k >= 1
    return steps, results, rows


@pytest.fixture(scope="module")
def prompts_64(tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    chats = [[{"role": "user", "content": f"Guess the number between 1 and {n}."}] for n in range(8, 72)]
    return [list(tok(tok.apply_chat_template(c, tokenize=False, add_generation_prompt=True),
                     add_special_tokens=False)["input_ids"]) for c in chats]


@pytest.mark.parametrize("params", [
    SamplingParams(max_tokens=16, temperature=1.0, seed=0),
    SamplingParams(max_tokens=16, temperature=1.0, top_p=0.9, seed=0),
    SamplingParams(max_tokens=16, temperature=0.0),
    SamplingParams(max_tokens=16, temperature=1.0, seed=0, constraint=Constraint.json_object()),
], ids=["sampled", "top_p", "greedy", "constrained"])
@pytest.mark.parametrize("fast_decode", [True, False], ids=["decode_step", "model_forward"])
def test_decode_step_reads_the_host_at_most_twice(tiny_model_and_tokenizer, prompts_64, params, fast_decode):
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, prefix_cache=False, fast_decode=fast_decode)
    steps, results, _ = _per_step(engine, model, prompts_64, params)
    assert engine.decode_steps["fast" if fast_decode else "model"] == params.max_tokens - 1
    assert len(steps) == params.max_tokens - 2 and all(len(r.token_ids) == 16 for r in results)
    reads = [s.reads for s in steps]
    ops = [s.ops for s in steps]
    print(f"\n{len(prompts_64)} rows: host reads per decode step {reads}, ATen ops {ops}, "
          f"uploads {[s.uploads for s in steps]}, first step's reads {steps[0].where}")
    assert max(reads) <= MAX_READS_PER_STEP, steps[0].where
    assert max(s.uploads for s in steps) == 0, steps[0].where


def test_finishing_rows_leave_in_batches_without_extra_reads(tiny_model_and_tokenizer, prompts_64):
    """Rows ending on stop ids at different steps: the steps where rows finish (their KV
    kept in the prefix cache, the batch compacted) stay within the limit too, and with an
    accelerator's `compact_fraction` the batch shrinks fewer times than there are steps
    where some row finished."""
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    engine = HFEngine(model, tok, compact_fraction=0.25)  # the accelerator's rule (the CPU's: 0)
    stops = list(range(0, model.config.vocab_size, 12))  # ~1/12 of the ids: rows end anywhere
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=1, stop_token_ids=stops)
    steps, results, rows = _per_step(engine, model, prompts_64, params)
    ends = {len(r.token_ids) for r in results if r.finish_reason == "stop"}
    assert len(ends) >= 8, ends  # rows finish at many different steps
    reads = [s.reads for s in steps]
    print(f"\nbatch rows per forward {rows}; rows finished at {len(ends)} different steps; reads per step {reads}")
    assert max(reads) <= MAX_READS_PER_STEP, [s.where for s in steps if s.reads > MAX_READS_PER_STEP][0]
    shrinks = sum(b < a for a, b in zip(rows, rows[1:]))
    assert 1 <= shrinks < len([n for n in ends if n < len(rows)])


def test_counter_counts_what_would_wait_for_a_gpu(tiny_model_and_tokenizer):
    """The counter itself: reads of values computed from the model count, host tensors don't."""
    import torch

    model, _ = tiny_model_and_tokenizer
    ids = torch.tensor([[1, 5, 9, 13]])
    with SyncCounter(model) as counter:
        with torch.no_grad():
            logits = model(input_ids=ids).logits  # (1, 4, V), a device tensor
        forward = counter.snapshot()  # (transformers' forward itself makes a few small uploads)
        assert forward.ops > 100 and forward.reads == 0
        host = torch.arange(4)
        host.tolist(), int(host.sum()), host[host > 1]  # host work: nothing counted
        assert counter.counts.reads == 0 and counter.counts.uploads == forward.uploads
        logits.argmax(-1).tolist()  # 1: Python-level read
        bool((logits > 0).any())  # 2: _local_scalar_dense
        logits[logits > 0]  # 3: nonzero (boolean mask)
        copy = logits.cpu()  # 4: a copy to the host...
        copy.sum().item()  # ...which is then a host tensor
        torch.zeros(3, device=ids.device).tolist()  # 5: made on the device, then read
        assert counter.counts.reads == 5, counter.counts.where
        host.to(ids.device)  # blocking upload
        host.to(ids.device, non_blocking=True)  # not waited for
        assert counter.counts.uploads == forward.uploads + 1


def test_on_the_cpu_finished_rows_leave_at_once(tiny_model_and_tokenizer, prompts_64):
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    stops = list(range(0, model.config.vocab_size, 12))
    params = SamplingParams(max_tokens=24, temperature=1.0, seed=1, stop_token_ids=stops)
    steps, results, rows = _per_step(HFEngine(model, tok), model, prompts_64, params)
    alive = [sum(len(r.token_ids) > k for r in results) for k in range(len(rows))]  # rows fed at forward k
    assert rows[1:] == alive[1:]  # forward k >= 1 feeds exactly the rows not finished after k ids
    assert max(s.reads for s in steps) <= MAX_READS_PER_STEP
