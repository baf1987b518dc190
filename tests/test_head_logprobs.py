"""`head_logprobs` must give what log_softmax over the full logits gives: logprobs,
entropies, and the gradients of the head's input and weight, in float64 to float
rounding and in bf16 to bf16 rounding; `forward_logprobs` must take it exactly where
it applies."""
from __future__ import annotations

import pytest
import torch

import workbench.training.head_logprobs as hl
from workbench.training.head_logprobs import fused_head_weight, head_as_input, head_logprobs

# numbers compared under dtype "auto": make test runs this file in both dtypes (WORKBENCH_AUTO_DTYPE)
pytestmark = pytest.mark.numerics


def _reference(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, entropy_grad: bool):
    """The plain chain: (K, V) logits, float32/64 log_softmax, gather, -sum p log p."""
    logp_all = torch.log_softmax((hidden @ weight.t()).to(torch.promote_types(hidden.dtype, torch.float32)), -1)
    logp = logp_all.gather(-1, targets[:, None]).squeeze(-1)
    with torch.enable_grad() if entropy_grad else torch.no_grad():
        ent = -(logp_all.exp() * logp_all).sum(-1)
    return logp, ent


def _inputs(dtype: torch.dtype, K: int = 70, E: int = 24, V: int = 300):
    g = torch.Generator().manual_seed(0)
    hidden = torch.randn(K, E, generator=g, dtype=torch.float64).to(dtype)  # (K, E)
    weight = (torch.randn(V, E, generator=g, dtype=torch.float64) * 0.5).to(dtype)  # (V, E)
    targets = torch.randint(0, V, (K,), generator=g)
    g_logp = torch.randn(K, generator=g, dtype=torch.float64).float()  # upstream gradients
    g_ent = torch.randn(K, generator=g, dtype=torch.float64).float()
    return hidden, weight, targets, g_logp, g_ent


def _run(fn, hidden, weight, targets, g_logp, g_ent, entropy_grad):
    h = hidden.clone().requires_grad_()
    w = weight.clone().requires_grad_()
    logp, ent = fn(h, w, targets, entropy_grad)
    loss = (logp.float() * g_logp).sum() + ((ent.float() * g_ent).sum() if entropy_grad else 0)
    loss.backward()
    return logp.detach().float(), ent.detach().float(), h.grad.float(), w.grad.float()


def _fused(h, w, t, entropy_grad):
    return head_logprobs(h, w, t, with_entropy=True, entropy_grad=entropy_grad)


@pytest.mark.parametrize("entropy_grad", [False, True])
@pytest.mark.parametrize("dtype,atol", [(torch.float64, 1e-10), (torch.float32, 1e-5), (torch.bfloat16, None)])
def test_values_and_gradients_match_the_log_softmax_chain(monkeypatch, dtype, atol, entropy_grad):
    monkeypatch.setattr(hl, "CHUNK_ROWS", 32)  # 70 rows: two full chunks and a partial one
    args = _inputs(dtype)
    ref = _run(_reference, *args, entropy_grad)
    got = _run(_fused, *args, entropy_grad)
    assert ref[2].abs().max() > 0.1 and ref[3].abs().max() > 0.1
    for name, r, g in zip(["logp", "entropy", "grad hidden", "grad weight"], ref, got):
        if atol is None:  # bf16: both round the logits and the gradients to bf16; compare to its step
            tol = 2 ** -7 * r.abs().max().item()
        else:
            tol = atol * max(1.0, r.abs().max().item())
        assert (r - g).abs().max().item() <= tol, (name, (r - g).abs().max().item(), tol)


def test_without_entropy_and_under_no_grad():
    hidden, weight, targets, *_ = _inputs(torch.float32)
    logp, ent = head_logprobs(hidden, weight, targets)
    assert ent is None
    ref, _ = _reference(hidden, weight, targets, False)
    assert torch.allclose(logp, ref, atol=1e-5)
    with torch.no_grad():  # no graph: nothing kept, same values
        logp2, _ = head_logprobs(hidden.requires_grad_(), weight, targets)
    assert not logp2.requires_grad and torch.equal(logp, logp2)
    # (B, K, E) inputs come back (B, K)
    lp3, ent3 = head_logprobs(hidden.detach().reshape(2, 35, -1), weight, targets.reshape(2, 35), with_entropy=True)
    assert lp3.shape == ent3.shape == (2, 35) and torch.equal(lp3.reshape(-1), logp)


def test_a_second_backward_through_the_same_graph_raises():
    hidden, weight, targets, *_ = _inputs(torch.float32)
    logp, _ = head_logprobs(hidden.requires_grad_(), weight, targets)
    logp.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward ran twice"):
        logp.sum().backward()


def test_which_models_take_the_fused_head(tiny_model_and_tokenizer, tiny_model_path):
    from workbench.config import ModelConfig
    from workbench.models import load_model_and_tokenizer
    from workbench.training.policy import apply_lora

    model, _ = tiny_model_and_tokenizer
    assert model.config.model_type == "llama"
    assert fused_head_weight(model) is model.get_output_embeddings().weight
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert fused_head_weight(model) is None  # autocast computes the head differently
    lora_head = apply_lora(load_model_and_tokenizer(tiny_model_path, "float32", "cpu", False)[0],
                           ModelConfig(lora_rank=4, lora_alpha=8, lora_target_modules=["q_proj", "lm_head"]))
    assert fused_head_weight(lora_head) is None  # peft's layer on the head: the plain path
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad(), head_as_input(model):
        out = model(input_ids=ids).logits
    assert out.shape == (1, 4, model.config.hidden_size)  # the head's input, not (.., V) logits
    assert "forward" not in vars(model.get_output_embeddings())  # restored on exit
    with torch.no_grad():
        assert model(input_ids=ids).logits.shape[-1] == model.config.vocab_size


def test_forward_logprobs_uses_it_for_a_lora_policy(tiny_model_path, monkeypatch):
    """The packed GRPO path with LoRA runs `head_logprobs` and matches the plain forward."""
    from workbench.config import ModelConfig
    from workbench.models import load_model_and_tokenizer
    from workbench.training import policy
    from workbench.training.policy import apply_lora, forward_logprobs

    model = apply_lora(load_model_and_tokenizer(tiny_model_path, "float32", "cpu", False)[0],
                       ModelConfig(lora_rank=4, lora_alpha=8, lora_target_modules="all-linear"))
    calls = []
    monkeypatch.setattr(policy, "head_logprobs", lambda *a, **k: calls.append(1) or head_logprobs(*a, **k))
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, model.config.vocab_size, (4, 22), generator=g)  # (B, T)
    ids[:, :12] = ids[0, :12]  # one shared prompt
    attn = torch.ones_like(ids)
    mask = torch.zeros_like(ids)
    mask[:, 12:] = 1
    lp, ent = forward_logprobs(model, ids, attn, loss_mask=mask, with_entropy=True)
    assert calls == [1]
    ref, ref_ent = forward_logprobs(model, ids, attn, with_entropy=True)  # no mask: the plain chain
    m = mask.bool()
    assert torch.allclose(lp[m], ref[m], atol=1e-5) and torch.allclose(ent[m], ref_ent[m], atol=1e-5)
