"""fp32 products of a LoRA policy's frozen bf16 base weights in the update
(`workbench/training/fp32_products.py`): peft's bf16 logits and gradients to bf16
rounding, one layer against a float64 hand computation, copies
made once and again after a write, and the setting's choices."""
from __future__ import annotations

import copy

import pytest
import torch

from tests.test_decode_step import _llama
from tests.test_lora_linear import _peft, _run
from workbench.config import ConfigError, ConfigStore
from workbench.training.fp32_products import Fp32BaseWeights, use_fp32_products, wants_fp32_products
from workbench.training.lora_linear import LoraLinearFunction, use_lean_lora

#: bf16 logits and gradients of two computations that round at other places (the existing
#: lean-LoRA bf16 check's tolerance, relative to the largest value).
BF16_TOL = 0.05


def _lean_fp32(model):
    lean = copy.deepcopy(model)
    use_lean_lora(lean)
    store = Fp32BaseWeights(min_rows=1)  # the tiny batches here have tens of rows
    assert use_fp32_products(lean, store) == 7 * 2  # 7 linears in each of 2 layers
    return lean, store


def test_fp32_products_give_pefts_bf16_logits_and_gradients():
    plain = _peft(_llama(torch.bfloat16)).train()
    lean, store = _lean_fp32(plain)
    ids = torch.randint(1, 96, (3, 11), generator=torch.Generator().manual_seed(4))
    logits_p, grads_p = _run(plain, ids)
    logits_l, grads_l = _run(lean, ids)
    assert store.copies_made == 14 and store.bytes == sum(
        m.get_base_layer().weight.numel() * 4 for m in lean.modules() if type(m).__name__ == "LeanLoraLinear")
    # the copies were made, so the fp32 path ran (its sums may round to the very bf16 values peft gets)
    assert (logits_p - logits_l).abs().max() <= BF16_TOL * float(logits_p.abs().max())
    assert grads_p.keys() == grads_l.keys() and len(grads_p) == 28
    for name, g in grads_p.items():
        scale = float(g.abs().max())
        assert scale > 0 and (g - grads_l[name]).abs().max() <= BF16_TOL * scale, name
    _run(lean, ids)
    assert store.copies_made == 14  # unchanged weights: the same copies


def test_products_of_few_rows_stay_bf16():
    lean = copy.deepcopy(_peft(_llama(torch.bfloat16)))
    use_lean_lora(lean)
    store = Fp32BaseWeights()  # MIN_ROWS = 64
    use_fp32_products(lean, store)
    with torch.no_grad():
        lean(input_ids=torch.ones(2, 31, dtype=torch.long))  # 62 rows: a decode step's size
        assert store.copies_made == 0
        lean(input_ids=torch.ones(2, 32, dtype=torch.long))  # 64 rows
    assert store.copies_made == 14


def test_one_layer_by_hand_to_bf16_rounding():
    """out = bf16(x W^T) in fp32 + s (x A^T) B^T, then bf16; grad x = bf16(g W) + bf16(s (g B) A)."""
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(5, 8, generator=gen).to(torch.bfloat16).requires_grad_(True)
    w = torch.randn(6, 8, generator=gen).to(torch.bfloat16)
    a = torch.randn(2, 8, generator=gen, requires_grad=True)
    b = torch.randn(6, 2, generator=gen, requires_grad=True)
    out = LoraLinearFunction.apply(x, w, None, a, b, 0.5, w.float())
    x64, w64 = x.detach().double(), w.double()
    base = (x64 @ w64.T).to(torch.bfloat16).double()  # the base layer's output, rounded as a bf16 product's
    ref = (base + 0.5 * (x64 @ a.detach().double().T) @ b.detach().double().T).to(torch.bfloat16)
    assert out.dtype == torch.bfloat16
    # equal up to one bf16 rounding step (the sums may run in another order than float64's)
    assert torch.allclose(out.double(), ref.double(), rtol=2 ** -7, atol=1e-3)
    g = torch.linspace(-1, 1, 30).reshape(5, 6).to(torch.bfloat16)
    out.backward(g)
    g64 = g.double()
    gh = 0.5 * (g64 @ b.detach().double())  # (5, 2)
    ref_x = (g64 @ w64).to(torch.bfloat16) + (gh @ a.detach().double()).to(torch.bfloat16)
    assert torch.allclose(x.grad.double(), ref_x.double(), rtol=2 ** -7, atol=1e-2)
    assert torch.allclose(a.grad.double(), gh.T @ x64, rtol=1e-5, atol=1e-5)


def test_a_written_weight_is_copied_again():
    model = _peft(_llama(torch.bfloat16))
    lean, store = _lean_fp32(model)
    ids = torch.randint(1, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    before = lean(input_ids=ids).logits
    q = lean.base_model.model.model.layers[0].self_attn.q_proj.get_base_layer()
    with torch.no_grad():
        q.weight.mul_(0)  # an in-place write bumps its version
    after = lean(input_ids=ids).logits
    assert store.copies_made == 15 and not torch.equal(before, after)
    assert torch.equal(store.get(q.weight), torch.zeros_like(q.weight, dtype=torch.float32))


def test_a_copied_or_pickled_model_gets_a_store_of_its_own():
    import pickle

    lean, store = _lean_fp32(_peft(_llama(torch.bfloat16)))
    ids = torch.randint(1, 96, (2, 7), generator=torch.Generator().manual_seed(1))
    want = lean(input_ids=ids).logits
    for clone in (copy.deepcopy(lean), pickle.loads(pickle.dumps(lean))):
        stores = {id(m.fp32_base_weights) for m in clone.modules() if type(m).__name__ == "LeanLoraLinear"}
        assert len(stores) == 1 and id(store) not in stores
        other = next(m.fp32_base_weights for m in clone.modules() if type(m).__name__ == "LeanLoraLinear")
        assert torch.allclose(clone(input_ids=ids).logits, want, rtol=1e-3, atol=1e-3) and other.copies_made == 14


def test_the_setting_decides_and_only_for_bf16_weights_on_a_cpu():
    bf16, fp32 = _peft(_llama(torch.bfloat16)), _peft(_llama())
    assert wants_fp32_products("on", bf16)[0] and not wants_fp32_products("off", bf16)[0]
    assert wants_fp32_products("on", fp32) == (False, "the weights are not bf16 on a CPU")
    chosen, why = wants_fp32_products("auto", bf16)  # timed here: either answer, said with its numbers
    assert f"({'fp32' if chosen else 'bf16'} chosen)" in why and "bf16 " in why and " ms" in why
    with pytest.raises(ValueError, match="model.fp32_base_products must be one of"):
        wants_fp32_products("yes", bf16)
    c = ConfigStore()
    c.model.fp32_base_products = "maybe"
    with pytest.raises(ConfigError, match="model.fp32_base_products"):
        c.validate()


@pytest.mark.parametrize("setting", ["on", "off"])
def test_the_policy_takes_the_setting(tiny_model_path, setting):
    from workbench.training.policy import Policy

    c = ConfigStore()
    c.model.local_path, c.model.dtype, c.model.fp32_base_products = str(tiny_model_path), "bfloat16", setting
    policy = Policy(c.model, with_reference=False)
    held = {type(getattr(m, "fp32_base_weights", None)).__name__
            for m in policy.model.modules() if type(m).__name__ == "LeanLoraLinear"}
    assert held == ({"Fp32BaseWeights"} if setting == "on" else {"NoneType"})
