"""Token views for runs recorded as text (`workbench.importers.recompute`): the text tokenized
through the chat template, teacher-forced in batches; the values checked against one episode
at a time through a plain forward pass (fp32, CPU)."""
from __future__ import annotations

import pytest
import torch

from workbench.importers.recompute import Recompute
from workbench.importers.source import message_episode, text_episode
from workbench.models import build_tiny_model
from workbench.trajectory import TrajectoryBatch


def episodes():
    flat = [text_episode(i, f"system\nBe brief.\nuser\nWhat is {i}+1?\nassistant\n", reply, score=1.0, group="p0")
            for i, reply in enumerate(["It is 1.", "Two, I think, because one and one make two."])]
    chat = message_episode(2, [{"role": "user", "content": "Name a colour."}],
                           [{"role": "assistant", "content": "Blue."}, {"role": "user", "content": "Another?"},
                            {"role": "assistant", "content": "Red, or green."}], score=0.0, group="p1")
    return flat + [chat]


@pytest.fixture(scope="module")
def recomputed(tiny_model_path):
    ref = build_tiny_model(seed=1)
    rc = Recompute(str(tiny_model_path), ref_model=str(ref), dtype="float32", max_batch_tokens=64)
    return rc, rc(TrajectoryBatch(episodes()))


def test_text_becomes_tokens_with_the_replies_marked(recomputed):
    rc, batch = recomputed
    tok = rc.tokenizer
    for ep in batch:
        assert ep.token_ids and not ep.recorded_as_text
        for t in ep.turns:
            assert tok.decode(ep.token_ids[t.token_start:t.token_end]) == t.action
            assert all(ep.loss_mask[t.token_start:t.token_end])
        assert sum(ep.loss_mask) == sum(t.token_end - t.token_start for t in ep.turns)
    chat = batch[2]
    rendered = tok.apply_chat_template(chat.messages, tokenize=False)
    assert tok.decode(chat.token_ids) == rendered  # the whole conversation, as the template renders it
    assert batch.meta["recomputed"]["fields"] == ["recomputed_logprobs", "recomputed_entropy", "recomputed_kl"]


def test_the_values_are_a_plain_forward_of_each_episode(recomputed):
    rc, batch = recomputed
    for b, ep in enumerate(batch):
        ids = torch.tensor([ep.token_ids])  # (1, T): this episode alone, no padding
        with torch.no_grad():
            logp = torch.log_softmax(rc.model(input_ids=ids).logits.float(), -1)[0]  # (T, V)
            ref = torch.log_softmax(rc.ref(input_ids=ids).logits.float(), -1)[0]  # (T, V)
        for t in range(1, ep.num_tokens):
            want = (float(logp[t - 1, ep.token_ids[t]]), float(-(logp[t - 1].exp() * logp[t - 1]).sum()),
                    float((logp[t - 1].exp() * (logp[t - 1] - ref[t - 1])).sum())) if ep.loss_mask[t] else (0, 0, 0)
            got = [float(batch.tensors[name][b, t]) for name in
                   ("recomputed_logprobs", "recomputed_entropy", "recomputed_kl")]
            assert got == pytest.approx(want, abs=1e-5), (b, t)
    kl = batch.tensors["recomputed_kl"][batch.tensors["loss_mask"] > 0]
    assert (kl > 0).all()  # two differently seeded models: their next-token distributions differ
