"""`LeanLoraLinear` (lora_linear.py): peft's LoRA linear as one autograd node, checked
against peft's own forward and backward on tiny Llama/Qwen2 models (fp32, and bf16
weights with fp32 adapters as `Policy` builds them), and its fallbacks to peft."""
from __future__ import annotations

import copy
import pickle

import pytest
import torch

from tests.test_decode_step import _llama, _qwen2
from workbench.training.lora_linear import LoraLinearFunction, use_lean_lora


def _peft(model, dropout=0.0):
    from peft import LoraConfig, get_peft_model

    torch.manual_seed(2)
    return get_peft_model(model, LoraConfig(r=4, lora_alpha=8, lora_dropout=dropout, target_modules="all-linear",
                                            init_lora_weights=False))  # B != 0: the adapters matter


def _run(model, ids):
    """Logits and every trained parameter's gradient of a fixed loss."""
    model.zero_grad()
    logits = model(input_ids=ids).logits.float()  # (B, T, V)
    weights = torch.linspace(-1, 1, logits.numel()).reshape(logits.shape)
    (logits * weights).sum().backward()
    grads = {n: p.grad.float().clone() for n, p in model.named_parameters() if p.requires_grad}
    return logits.detach(), grads


@pytest.mark.parametrize("make,dtype,tol", [(_llama, torch.float32, 1e-5), (_qwen2, torch.float32, 1e-5),
                                            (_llama, torch.bfloat16, 0.05)],
                         ids=["llama-fp32", "qwen2-biased-qkv-fp32", "llama-bf16-base-fp32-adapters"])
def test_lean_lora_gives_peft_logits_and_gradients(make, dtype, tol):
    base = make().to(dtype) if make is _qwen2 else make(dtype)
    plain = _peft(base).train()
    lean = copy.deepcopy(plain)
    assert use_lean_lora(lean) == 7 * base.config.num_hidden_layers
    a = next(m for m in lean.modules() if type(m).__name__ == "LeanLoraLinear")
    assert a.lora_A["default"].weight.dtype == torch.float32  # fp32 adapters over bf16 weights too
    ids = torch.randint(1, base.config.vocab_size, (3, 11), generator=torch.Generator().manual_seed(4))
    logits_p, grads_p = _run(plain, ids)
    logits_l, grads_l = _run(lean, ids)
    assert torch.allclose(logits_p, logits_l, atol=tol * max(1.0, float(logits_p.abs().max())))
    assert grads_p.keys() == grads_l.keys() and len(grads_p) == 2 * 7 * base.config.num_hidden_layers
    for name, g in grads_p.items():
        scale = float(g.abs().max())
        assert scale > 0, name
        assert (g - grads_l[name]).abs().max() <= tol * max(scale, 1e-3), name


def test_lean_lora_runs_as_one_node_and_falls_back_to_peft_where_it_would_differ():
    model = _peft(_llama(), dropout=0.5)
    use_lean_lora(model)
    q = model.base_model.model.model.layers[0].self_attn.q_proj
    x = torch.randn(2, 5, 128, requires_grad=True)
    model.eval()  # dropout off: the lean node
    assert type(q(x).grad_fn).__name__ == "LoraLinearFunctionBackward"
    model.train()  # dropout 0.5 in training: peft's forward, with its sampled mask
    assert type(q(x).grad_fn).__name__ != "LoraLinearFunctionBackward"
    model.eval()
    with model.disable_adapter():  # the base layer alone
        base = q.get_base_layer()
        assert torch.equal(q(x), base(x))


def test_lean_lora_modules_copy_and_pickle():
    model = _peft(_llama())
    use_lean_lora(model)
    clone = pickle.loads(pickle.dumps(model.base_model.model.model.layers[0].mlp))
    assert type(clone.down_proj).__name__ == "LeanLoraLinear"
    x = torch.randn(2, 128)
    assert torch.equal(clone(x), model.base_model.model.model.layers[0].mlp(x))


def test_lora_linear_function_matches_hand_computation():
    """One layer by hand: out = x W^T + b + s (x A^T) B^T, and its gradients."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 6, generator=g, dtype=torch.float64, requires_grad=True)
    w, b = torch.randn(5, 6, generator=g, dtype=torch.float64), torch.randn(5, generator=g, dtype=torch.float64)
    a = torch.randn(2, 6, generator=g, dtype=torch.float64, requires_grad=True)
    bb = torch.randn(5, 2, generator=g, dtype=torch.float64, requires_grad=True)
    out = LoraLinearFunction.apply(x, w, b, a, bb, 0.75)
    ref = x @ w.T + b + 0.75 * (x @ a.T) @ bb.T
    assert torch.allclose(out, ref)
    assert torch.autograd.gradcheck(lambda x, a, bb: LoraLinearFunction.apply(x, w, b, a, bb, 0.75), (x, a, bb))
