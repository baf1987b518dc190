"""`forward_logprobs(..., loss_mask=...)` runs the LM head only where tokens are trained;
on those positions it must equal the full computation (values and gradients)."""
from __future__ import annotations

import pytest
import torch

from workbench.training.policy import batch_logprobs, forward_logprobs

# numbers compared under dtype "auto": make test runs this file in both dtypes (WORKBENCH_AUTO_DTYPE)
pytestmark = pytest.mark.numerics


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


# -- shared prefix: a GRPO group's prompt runs once ---------------------------------------
def _group_batch(vocab: int):
    """4 rows: the same 12-token prompt, then different completions of different lengths."""
    g = torch.Generator().manual_seed(1)
    prompt = torch.randint(0, vocab, (12,), generator=g)
    ids = torch.randint(0, vocab, (4, 22), generator=g)  # (B, T)
    ids[:, :12] = prompt
    attn = torch.ones_like(ids)
    attn[1, 18:] = 0
    attn[3, 15:] = 0
    mask = attn.clone()
    mask[:, :12] = 0  # completions only
    return ids, attn, mask


def test_shared_prefix_length_hand_cases():
    from workbench.training.policy import shared_prefix_length

    ids = torch.tensor([[5, 6, 7, 8, 9, 1], [5, 6, 7, 3, 2, 4]])  # (2, 6): 3 shared ids
    attn = torch.ones_like(ids)
    mask = torch.tensor([[0, 0, 0, 0, 1, 1], [0, 0, 0, 1, 1, 1]])
    # The first trained token sits at 3, predicted from position 2: the prefix stops before 2.
    assert shared_prefix_length(ids, attn, mask) == 2
    mask2 = torch.tensor([[0, 0, 0, 0, 0, 1], [0, 0, 0, 0, 0, 1]])
    assert shared_prefix_length(ids, attn, mask2) == 3  # limited by the shared ids
    mask3 = torch.tensor([[0, 1, 1, 1, 1, 1], [0, 0, 0, 0, 0, 1]])
    assert shared_prefix_length(ids, attn, mask3) == 0  # token 1 trained: its logits come from position 0
    assert shared_prefix_length(ids[:1], attn[:1], mask[:1]) == 0  # one row: nothing to share
    assert shared_prefix_length(ids, attn, None) == 0
    left_padded = attn.clone()
    left_padded[1, 0] = 0
    assert shared_prefix_length(ids, left_padded, mask2) == 0


MODES = [dict(pack=True, share_prefix=True), dict(pack=True, share_prefix=False),
         dict(pack=False, share_prefix=True), dict(pack=False, share_prefix=False)]


@pytest.mark.parametrize("batch_fn", [_group_batch, _batch])
@pytest.mark.parametrize("mode", MODES, ids=lambda m: f"pack={m['pack']},share={m['share_prefix']}")
def test_packed_and_shared_prefix_match_the_plain_forward(tiny_model_and_tokenizer, mode, batch_fn):
    model, _ = tiny_model_and_tokenizer
    ids, attn, mask = batch_fn(model.config.vocab_size)
    with torch.no_grad():
        ref_lp, ref_ent = forward_logprobs(model, ids, attn, with_entropy=True)  # full forward, every row
        lp, ent = forward_logprobs(model, ids, attn, with_entropy=True, loss_mask=mask, **mode)
    m = mask.bool()
    assert torch.allclose(lp[m], ref_lp[m], atol=1e-5)
    assert torch.allclose(ent[m], ref_ent[m], atol=1e-5)
    assert (lp[:, ~m.any(0)] == 0).all()  # positions no row trains are skipped
    if mode["pack"]:
        assert (lp[~m] == 0).all()  # packed: exactly the trained tokens


def test_packing_layout_by_hand():
    """Two rows sharing the ids [7, 8]; lengths 4 and 3 (one pad)."""
    from workbench.training.packing import plan_packing
    from workbench.training.policy import shared_prefix_length

    ids = torch.tensor([[7, 8, 1, 2], [7, 8, 5, 0]])
    attn = torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]])
    only_last = torch.tensor([[0, 0, 0, 1], [0, 0, 0, 0]])  # token 2 of row 0 trained
    assert shared_prefix_length(ids, attn, only_last) == 2
    plan = plan_packing(ids, attn, only_last, shared=2)
    assert plan.input_ids.tolist() == [[7, 8, 1, 2, 5]]
    assert plan.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert plan.allowed[0, 0].int().tolist() == [[1, 0, 0, 0, 0],
                                                 [1, 1, 0, 0, 0],
                                                 [1, 1, 1, 0, 0],
                                                 [1, 1, 1, 1, 0],
                                                 [1, 1, 0, 0, 1]]  # row 1's token: the prompt, not row 0
    assert (plan.rows.tolist(), plan.cols.tolist(), plan.source.tolist(), plan.targets.tolist()) == (
        [0], [3], [2], [2])

    both = torch.tensor([[0, 0, 0, 1], [0, 0, 1, 0]])  # row 1's token 5 is predicted from position 1
    assert shared_prefix_length(ids, attn, both) == 1
    with pytest.raises(ValueError, match="shared prefix"):
        plan_packing(ids, attn, both, shared=2)
    plan1 = plan_packing(ids, attn, both, shared=1)
    assert plan1.input_ids.tolist() == [[7, 8, 1, 2, 8, 5]]
    assert plan1.position_ids.tolist() == [[0, 1, 2, 3, 1, 2]]
    assert (plan1.rows.tolist(), plan1.cols.tolist(), plan1.source.tolist(), plan1.targets.tolist()) == (
        [0, 1], [3, 2], [2, 4], [2, 5])
    left = torch.tensor([[1, 1, 1, 1], [0, 1, 1, 1]])
    assert plan_packing(ids, left, both, shared=0) is None  # left padding: not packed


def test_packed_and_shared_prefix_gradients_equal_the_plain_one(tiny_model_path):
    """The prompt's KV is shared by every row: its gradient must collect from all of them
    (LoRA adapters and full weights alike)."""
    from workbench.config import ModelConfig
    from workbench.models import load_model_and_tokenizer
    from workbench.training.policy import apply_lora

    for lora in (False, True):
        model, _ = load_model_and_tokenizer(tiny_model_path, "float32", "cpu", False)
        if lora:
            model = apply_lora(model, ModelConfig(lora_rank=4, lora_alpha=8, lora_target_modules="all-linear"))
            for n, p in model.named_parameters():  # B starts at 0: move it so A gets a gradient too
                if "lora_B" in n:
                    torch.nn.init.normal_(p, std=0.02, generator=torch.Generator().manual_seed(3))
        ids, attn, mask = _group_batch(model.config.vocab_size)
        adv = torch.linspace(-1, 1, ids.numel()).reshape(ids.shape)  # (B, T) distinct weights per token
        from workbench.training.packing import plan_packing
        from workbench.training.policy import _n_params

        assert plan_packing(ids, attn, mask, 11, model.config, _n_params(model)) is not None  # packing is taken
        grads = []
        for mode in [dict(pack=False, share_prefix=False)] + MODES[:3]:
            model.zero_grad()
            lp, ent = forward_logprobs(model, ids, attn, loss_mask=mask, with_entropy=True, **mode)
            (lp * adv * mask).sum().backward()
            assert ent.requires_grad  # entropy_grad=True (default): usable as a loss term
            _, metric_ent = forward_logprobs(model, ids, attn, loss_mask=mask, with_entropy=True,
                                             entropy_grad=False, **mode)
            assert not metric_ent.requires_grad and torch.allclose(metric_ent, ent.detach(), atol=1e-6)
            grads.append(torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None]))
        assert grads[0].abs().max() > 0
        for mode, g in zip(MODES[:3], grads[1:]):
            assert torch.allclose(grads[0], g, atol=1e-5, rtol=1e-4), (lora, mode, (grads[0] - g).abs().max())


def test_packing_is_skipped_when_quadratic_attention_outweighs_padding():
    from workbench.training.packing import _packed_is_cheaper

    smollm = dict(n_params=134_500_000, hidden=576, layers=30)
    assert _packed_is_cheaper(74 + 8 * 45, b=8, T=74 + 64, **smollm)  # a GRPO group: prompt once, no padding
    assert not _packed_is_cheaper(4 * 3000, b=4, T=3000, **smollm)  # long multi-turn rows, no shared prompt


def test_untrained_positions_are_zero_in_ragged_micro_batches(tiny_model_and_tokenizer):
    """With a loss mask, a row's untrained positions are exactly 0 even where another row
    of its micro-batch trains that position."""

    model, tok = tiny_model_and_tokenizer
    text = "Guess my secret number from 1 to 8. Answer with just the number: 4, then 6."
    ids = torch.tensor([tok.encode(text)[:12], tok.encode(text[::-1])[:12]])  # (2, 12)
    attn = torch.ones(2, 12, dtype=torch.long)
    loss = torch.zeros(2, 12)
    loss[0, 4:10] = 1  # row 0 trains 4..9
    loss[1, 8:12] = 1  # row 1 trains 8..11: positions 4..7 are trained only in row 0
    both = batch_logprobs(model, ids, attn, [12, 12], micro_batch_size=2, loss_mask=loss)
    assert torch.all(both[loss == 0] == 0)
    assert torch.all(both[loss == 1] < 0)
    # each row alone gives the same values on its own trained positions
    for r in range(2):
        alone = batch_logprobs(model, ids[r:r + 1], attn[r:r + 1], [12], micro_batch_size=1, loss_mask=loss[r:r + 1])
        assert torch.allclose(alone[0], both[r], atol=1e-5)


@pytest.mark.parametrize("per_row", [True, False], ids=["one-call-per-row", "padded-rows"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_segmented_packed_attention_matches_the_padded_forward(monkeypatch, dtype, per_row):
    """Grouped KV heads (4 query heads over 2 KV heads), rows of different lengths (one
    untrained: it still holds the prompt's last token): the packed forward runs the segmented attention
    (prompt once, each row over [prompt | its own keys], one call per row or the rows as
    one padded batch) and gives the padded forward's logprobs and gradients."""
    from tests.test_decode_step import _llama
    from workbench.training import packing

    model = _llama(dtype)
    calls = []
    real = packing._segmented
    monkeypatch.setattr(packing, "PER_ROW_MAX_ROWS", 16 if per_row else 0)
    monkeypatch.setattr(packing, "_segmented",
                        lambda *a, **k: calls.append((a[3].R, a[3].per_row)) or real(*a, **k))
    P = 9
    lengths = [P + 7, P + 3, P, P + 12]  # row 2: the prompt alone, nothing trained
    g = torch.Generator().manual_seed(5)
    prompt = torch.randint(1, model.config.vocab_size, (P,), generator=g)
    T = max(lengths)
    ids = torch.zeros((len(lengths), T), dtype=torch.long)
    attn = torch.zeros_like(ids)
    mask = torch.zeros_like(ids)
    for i, n in enumerate(lengths):
        ids[i, :P] = prompt
        ids[i, P:n] = torch.randint(1, model.config.vocab_size, (n - P,), generator=g)
        attn[i, :n] = 1
        mask[i, P:n] = 1
    adv = torch.linspace(-1, 1, ids.numel()).reshape(ids.shape)
    results = []
    for pack in (False, True):
        model.zero_grad()
        lp, _ = forward_logprobs(model, ids, attn, loss_mask=mask, pack=pack, share_prefix=pack)
        (lp.float() * adv * mask).sum().backward()
        results.append((lp.detach(), torch.cat([p.grad.flatten().float() for p in model.parameters()
                                                if p.grad is not None])))
    assert len(calls) == model.config.num_hidden_layers and set(calls) == {(4, per_row)}  # shared: P - 1 tokens
    m = mask.bool()
    tol = 1e-5 if dtype == torch.float32 else 0.05
    assert torch.allclose(results[0][0][m], results[1][0][m], atol=tol)
    gtol = 1e-4 if dtype == torch.float32 else 0.05
    scale = results[0][1].abs().max()
    assert scale > 0 and (results[0][1] - results[1][1]).abs().max() <= gtol * max(1.0, float(scale))


# -- episodes of several sequences ("rendered" history) -----------------------------------
def _tree_episode(vocab: int, seed: int):
    """An episode of three sequences by hand: [A | a0] then [A[:6] | B | b1] then [(A[:6] B)[:9] | C | c2]
    (capitals: prompt, mask 0; lower case: sampled, mask 1), and each full sequence for reference."""
    from workbench.trajectory import Episode

    g = torch.Generator().manual_seed(seed)
    draw = lambda n: torch.randint(0, vocab, (n,), generator=g).tolist()  # noqa: E731
    ep = Episode()
    full = []
    a, a0 = draw(8), draw(3)
    ep.append_tokens(a, False, None, -1)
    ep.append_tokens(a0, True, [0.0] * 3, 0)
    full.append((a + a0, [0] * 8 + [1] * 3))
    b, b1 = draw(4), draw(2)
    ep.start_sequence(6)
    ep.append_tokens(b, False, None, 0)
    ep.append_tokens(b1, True, [0.0] * 2, 1)
    full.append((a[:6] + b + b1, [0] * 10 + [1] * 2))
    c, c2 = draw(2), draw(4)
    ep.start_sequence(9)
    ep.append_tokens(c, False, None, 1)
    ep.append_tokens(c2, True, [0.0] * 4, 2)
    full.append(((a[:6] + b)[:9] + c + c2, [0] * 11 + [1] * 4))
    return ep, full


def test_several_sequences_give_each_token_the_logprob_of_its_own_sequence(tiny_model_and_tokenizer):
    """A batch whose episodes hold several sequences: every trained token's logprob under the
    `position_ids` mask equals a plain forward of its own sequence alone (a loop over sequences)."""
    from workbench.trajectory import TrajectoryBatch

    model, _ = tiny_model_and_tokenizer
    vocab = model.config.vocab_size
    (ep0, full0), (ep1, full1) = _tree_episode(vocab, 0), _tree_episode(vocab, 1)
    ep1.truncate_tokens(ep1.segments[1][0])  # a shorter episode: two sequences (right padding in the batch)
    full1 = full1[:2]
    batch = TrajectoryBatch([ep0, ep1])
    assert batch.position_ids[0].tolist() == list(range(11)) + list(range(6, 12)) + list(range(9, 15))
    expected: dict[tuple[int, int], float] = {}
    with torch.no_grad():
        for row, (ep, fulls) in enumerate(((ep0, full0), (ep1, full1))):
            flat = 0
            for s, (ids, mask) in enumerate(fulls):
                logits = model(torch.tensor([ids])).logits[0]  # (L, V)
                lp = torch.log_softmax(logits.float(), -1)
                own = len(ids) - (ep.segments[s - 1][1] if s else 0)  # this sequence's own tokens
                for j in range(len(ids) - own, len(ids)):
                    if mask[j]:
                        expected[(row, flat)] = float(lp[j - 1, ids[j]])
                    flat += 1
        got, _ = forward_logprobs(model, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask,
                                  position_ids=batch.position_ids)
        plain = batch_logprobs(model, batch.input_ids, batch.attention_mask, [e.num_tokens for e in batch], 2,
                               loss_mask=batch.loss_mask, position_ids=batch.position_ids)
    assert len(expected) == int(batch.loss_mask.sum())
    for (row, col), value in expected.items():
        assert got[row, col].item() == pytest.approx(value, abs=1e-5), (row, col)
        assert plain[row, col].item() == pytest.approx(value, abs=1e-5), (row, col)
    # Without the position ids (one sequence per row) the later sequences' tokens come out otherwise.
    with torch.no_grad():
        wrong, _ = forward_logprobs(model, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask)
    assert abs(wrong[0, 15].item() - expected[(0, 15)]) > 1e-3
