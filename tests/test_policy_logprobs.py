"""`forward_logprobs(..., loss_mask=...)` runs the LM head only where tokens are trained;
on those positions it must equal the full computation (values and gradients)."""
from __future__ import annotations

import torch

from workbench.training.policy import batch_logprobs, forward_logprobs


def _batch(vocab: int):
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (3, 20), generator=g)  # (B, T)
    attn = torch.ones_like(ids)
    attn[2, 15:] = 0  # a shorter row (right padding)
    mask = torch.zeros_like(ids)
    mask[0, 5:9] = 1
    mask[1, 12:18] = 1
    mask[2, 8:11] = 1
    return ids, attn, mask


def test_masked_positions_equal_the_full_forward(tiny_model_and_tokenizer):
    model, _ = tiny_model_and_tokenizer
    ids, attn, mask = _batch(model.config.vocab_size)
    with torch.no_grad():
        full_lp, full_ent = forward_logprobs(model, ids, attn, with_entropy=True)
        lp, ent = forward_logprobs(model, ids, attn, with_entropy=True, loss_mask=mask)
    m = mask.bool()
    assert torch.allclose(lp[m], full_lp[m], atol=1e-5)
    assert torch.allclose(ent[m], full_ent[m], atol=1e-5)
    batched = batch_logprobs(model, ids, attn, [20, 20, 15], micro_batch_size=2, loss_mask=mask)
    assert torch.allclose(batched[m], full_lp[m], atol=1e-5)


def test_masked_loss_gradient_equals_the_full_one(tiny_model_path):
    from workbench.models import load_model_and_tokenizer

    model, _ = load_model_and_tokenizer(tiny_model_path, "float32", "cpu", False)  # own copy: we backprop
    ids, attn, mask = _batch(model.config.vocab_size)
    grads = []
    for lm in (None, mask):
        model.zero_grad()
        lp, _ = forward_logprobs(model, ids, attn, loss_mask=lm)
        (lp * mask).sum().backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
    assert torch.allclose(grads[0], grads[1], atol=1e-5)
