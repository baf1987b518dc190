"""`cpu_kernels` (the CPU decode step's compiled attention): its output against a float64
softmax written out by hand and against torch's sdpa, per dtype; the decode step and the
engine with it against the model's forward and against the engine without it; and what
happens where it cannot be built (no compiler: a warning, torch's attention, the same tokens)."""
from __future__ import annotations

import copy
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from tests.numerics import BF16_LOGPROB_TOL, FP32_LOGPROB_TOL, assert_same_samples
from tests.test_decode_step import _compare, _llama, _lora
from workbench.engines import cpu_kernels

ROOT = Path(__file__).resolve().parents[1]

pytestmark = pytest.mark.skipif(not cpu_kernels.available(),
                                reason=f"the CPU kernels do not build here: {cpu_kernels.why_unavailable()}")

#: |output difference| allowed against the float64 reference: fp32 sums in another order; bf16 is
#: rounded once at the end (8 bits of mantissa: half an ulp of outputs below 4 is under 0.008).
ATOL = {torch.float32: 1e-5, torch.bfloat16: 1e-2}


def _by_hand(q, keys, values, bias, scale):
    """The attention as a plain loop over rows and heads in float64 (the reference)."""
    B, KV, G, D = q.shape
    out = torch.zeros(B, KV, G, D, dtype=torch.float64)
    for b in range(B):
        for h in range(KV):
            for g in range(G):
                s = [float(q[b, h, g].double() @ keys[b, h, t].double()) * scale + float(bias[b, 0, 0, t])
                     for t in range(keys.shape[2])]
                top = max(s)
                w = [0.0 if x == float("-inf") else pow(2.718281828459045, x - top) for x in s]
                total = sum(w)
                for t, wt in enumerate(w):
                    out[b, h, g] += wt / total * values[b, h, t].double()
    return out


def _case(dtype, B=3, KV=2, G=3, D=24, T=11, cap=16, seed=0):
    """q, and keys/values as views into a larger cache buffer (the engine's layout), with
    padding masked out at the start of row 1 and most of row 2."""
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(B, KV, G, D, generator=g).to(dtype)
    kbuf, vbuf = (torch.randn(B, KV, cap, D, generator=g).to(dtype) for _ in range(2))
    keys, values = kbuf[:, :, :T], vbuf[:, :, :T]
    real = torch.ones(B, T, dtype=torch.bool)
    real[1, :4] = False
    real[2, : T - 1] = False  # only the new token
    bias = torch.zeros(B, 1, 1, T, dtype=dtype).masked_fill_(~real[:, None, None, :], float("-inf"))
    return q, keys, values, bias


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("D", [64, 24])  # 24: not a multiple of the kernel's 16 lanes
def test_attention_matches_a_softmax_by_hand(dtype, D):
    q, keys, values, bias = _case(dtype, D=D)
    assert not keys.is_contiguous()
    ours = cpu_kernels.decode_attention(q, keys, values, bias, D ** -0.5)
    ref = _by_hand(q, keys, values, bias, D ** -0.5)
    assert ours.dtype == dtype and ours.shape == q.shape
    gap = float((ours.double() - ref).abs().max())
    assert gap <= ATOL[dtype], gap
    # row 2 sees only its last position: its output is exactly that value (rounded to the dtype)
    assert torch.allclose(ours[2].double(), values[2, :, -1:].double().expand(-1, q.shape[2], -1), atol=ATOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_agrees_with_sdpa(dtype):
    q, keys, values, bias = _case(dtype, B=5, KV=3, G=3, D=64, T=40, cap=64, seed=1)
    ours = cpu_kernels.decode_attention(q, keys, values, bias, 0.125)
    theirs = F.scaled_dot_product_attention(q, keys, values, attn_mask=bias, scale=0.125)
    assert float((ours.float() - theirs.float()).abs().max()) <= 2 * ATOL[dtype]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_attention_shared_with_the_helper_thread_gives_the_same_bits(dtype):
    """`helper=True`: half of the (row, KV head) pairs on the spinning helper; each pair's sums are
    the same on either thread."""
    q, keys, values, bias = _case(dtype, B=5)
    cpu_kernels.helper_begin()
    try:
        two = cpu_kernels.decode_attention(q, keys, values, bias, 0.2, helper=True)
    finally:
        cpu_kernels.helper_end()
    assert torch.equal(two, cpu_kernels.decode_attention(q, keys, values, bias, 0.2))


def test_a_row_with_no_real_position_gives_zeros_not_nan():
    q, keys, values, bias = _case(torch.float32)
    bias[0].fill_(float("-inf"))
    out = cpu_kernels.decode_attention(q, keys, values, bias, 0.2)
    assert torch.equal(out[0], torch.zeros_like(out[0])) and not out.isnan().any()


def test_bad_input_says_what_is_wrong():
    q, keys, values, bias = _case(torch.float32)
    with pytest.raises(RuntimeError, match="one dtype"):
        cpu_kernels.decode_attention(q.double(), keys, values, bias, 0.2)
    with pytest.raises(RuntimeError, match="shapes do not match"):
        cpu_kernels.decode_attention(q, keys[:, :, :-1], values, bias, 0.2)


def _ulps_apart(a: torch.Tensor, b: torch.Tensor) -> int:
    """The most units in the last place of their dtype between two same-sign tensors."""
    assert a.dtype == b.dtype and a.shape == b.shape
    bits = torch.int16 if a.dtype == torch.bfloat16 else torch.int32
    return int((a.view(bits).long() - b.view(bits).long()).abs().max())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("shape", [(8, 576), (3, 9, 64), (5, 40)])  # (3, 9, 64): qwen3's per-head norms
def test_rms_norm_matches_the_eager_ops(dtype, shape):
    """Against decode_step's eager `_rms_norm` (LlamaRMSNorm's math): the same rounding points, so
    a few units in the last place apart at most (the fp32 sum of squares adds in another order,
    which moves the scale by an fp32 ulp or two: one bf16 ulp, or a few fp32 ones)."""
    from workbench.engines.decode_step import _rms_norm

    g = torch.Generator().manual_seed(3)
    x = (torch.randn(*shape, generator=g) * 3).to(dtype)
    w = (1 + 0.1 * torch.randn(shape[-1], generator=g)).abs().to(dtype)  # positive: outputs keep x's signs
    ours, eager = cpu_kernels.rms_norm(x, w, 1e-5), _rms_norm(x, w, 1e-5)
    assert ours.dtype == dtype and ours.shape == x.shape
    assert _ulps_apart(ours, eager) <= (1 if dtype == torch.bfloat16 else 8)
    by_hand = w.double() * (x.double() / (x.double().pow(2).mean(-1, keepdim=True) + 1e-5).sqrt())
    assert float((ours.double() - by_hand).abs().max()) <= (0.05 if dtype == torch.bfloat16 else 1e-5)
    strided = torch.zeros(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]  # a view with a stride of 2
    strided.copy_(x)
    assert torch.equal(cpu_kernels.rms_norm(strided, w, 1e-5), ours)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_silu_mul_matches_the_eager_ops(dtype):
    """`F.silu(gate) * up` on the halves of a fused gate/up output (rows strided), big inputs
    included (silu of -100 is -0, of 100 is 100)."""
    g = torch.Generator().manual_seed(4)
    fused = (torch.randn(6, 2 * 96, generator=g) * 4).to(dtype)
    fused[0, :4] = torch.tensor([-100.0, 100.0, 0.0, -3.0]).to(dtype)
    gate, up = fused.split(96, dim=-1)
    ours, eager = cpu_kernels.silu_mul(gate, up), F.silu(gate) * up
    assert ours.dtype == dtype and ours.shape == (6, 96) and not ours.isnan().any()
    tol = {torch.float32: 1e-6, torch.bfloat16: 2 ** -7}[dtype]  # fp32 rounding; one bf16 ulp
    assert torch.allclose(ours.float(), eager.float(), rtol=tol, atol=1e-30), (ours.float() - eager.float()).abs().max()
    by_hand = gate.double() * torch.sigmoid(gate.double()) * up.double()
    assert torch.allclose(ours.double(), by_hand, rtol=2 * tol + 2 ** -8 * (dtype == torch.bfloat16), atol=1e-30)


@pytest.mark.parametrize("dtype,atol", [(torch.float32, 1e-4), (torch.bfloat16, 0.05)])
def test_decode_step_with_the_kernel_matches_the_model(dtype, atol):
    _compare(_llama(dtype), atol=atol, kernels=cpu_kernels)


def test_lora_decode_step_with_the_kernel_matches_peft():
    _compare(_lora(_llama()), atol=1e-4, kernels=cpu_kernels)


def _sample(engine, prompts):
    from workbench.engines.base import SamplingParams

    out = engine.generate_ids(prompts, SamplingParams(max_tokens=10, temperature=1.0, seed=7))
    return [(list(r.token_ids), list(r.logprobs)) for r in out]


def _forward_logprobs(model, prompt: list[int], ids: list[int]) -> list[float]:
    """The model's own forward over prompt + ids: each sampled id's logprob (the reference)."""
    seq = torch.tensor([prompt + ids])
    with torch.no_grad():
        logits = model(input_ids=seq).logits[0, len(prompt) - 1: -1].float()  # (len(ids), V)
    return logits.log_softmax(-1).gather(1, torch.tensor(ids)[:, None])[:, 0].tolist()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_engine_with_the_kernel_gives_the_model_forward_logprobs(tiny_model_and_tokenizer, dtype):
    """The engine's decode steps use the kernel, and each sampled id's logprob is the model's
    forward's within the dtype's tolerance; in fp32 the engine without the kernel samples the
    same ids (in bf16 a flat tiny model's near-ties may round either way)."""
    from workbench.engines.hf import HFEngine

    model, tok = tiny_model_and_tokenizer
    model = copy.deepcopy(model).to(dtype)  # the session's model stays fp32
    prompts = [tok("hello there")["input_ids"], tok("a longer prompt of several words")["input_ids"]]
    engine = HFEngine(model, tok)
    samples = _sample(engine, prompts)
    assert engine._decode_step.kernels is cpu_kernels
    assert engine.decode_steps["fast"] > 0
    reference = [(ids, _forward_logprobs(model, p, ids)) for p, (ids, _) in zip(prompts, samples)]
    assert_same_samples(samples, reference, tol=FP32_LOGPROB_TOL if dtype == torch.float32 else BF16_LOGPROB_TOL)
    if dtype == torch.float32:
        without = HFEngine(model, tok, cpu_kernels=False)
        assert_same_samples(samples, _sample(without, prompts))
        assert without._decode_step.kernels is None


def test_without_a_compiler_the_engine_warns_and_uses_torch_attention(tmp_path, tiny_model_path):
    """A fresh cache and CXX naming no compiler: `available()` False with the reason, the
    engine warns once and samples what an engine with `cpu_kernels=False` samples."""
    script = """
import sys, warnings, torch
from workbench.engines import cpu_kernels
from workbench.engines.base import SamplingParams
from workbench.engines.hf import HFEngine
from transformers import AutoModelForCausalLM, AutoTokenizer
path = sys.argv[1]
model, tok = AutoModelForCausalLM.from_pretrained(path).eval(), AutoTokenizer.from_pretrained(path)
assert not cpu_kernels.available()
print("why:", cpu_kernels.why_unavailable())
p = SamplingParams(max_tokens=6, temperature=1.0, seed=3)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    a = HFEngine(model, tok).generate_ids([[1, 2, 3]], p)
    HFEngine(model, tok).generate_ids([[1, 2, 3]], p)
b = HFEngine(model, tok, cpu_kernels=False).generate_ids([[1, 2, 3]], p)
said = [str(w.message) for w in caught if "CPU decode kernels" in str(w.message)]
print("warnings:", len(said), said[0] if said else "")
assert list(a[0].token_ids) == list(b[0].token_ids)
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "CXX": "/nonexistent/c++", "OMP_WAIT_POLICY": "PASSIVE",
           "WORKBENCH_CACHE": str(tmp_path / "cache"), "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", script, str(tiny_model_path)], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "why: no C++ compiler: '/nonexistent/c++' is not on PATH" in done.stdout
    assert "warnings: 2" in done.stdout  # once per engine
    assert not (tmp_path / "cache" / "kernels").exists() or not any((tmp_path / "cache" / "kernels").iterdir())


def test_the_build_is_cached_per_machine_and_source():
    folder = cpu_kernels.build_folder()
    assert (folder / cpu_kernels.LIBRARY).exists()
    assert folder.parent == cpu_kernels.cache_dir() / "kernels"
    assert not [p for p in folder.parent.iterdir() if p.name.startswith(f".{folder.name}-")]  # no scratch left
    assert cpu_kernels.build_key() == folder.name and len(folder.name) == 16


def _weight(n: int, k: int, dtype, seed: int) -> torch.Tensor:
    return (torch.randn(n, k, generator=torch.Generator().manual_seed(seed)) * 0.05).to(dtype)


@pytest.mark.parametrize("kind", [0, 1, 2])
def test_linear_halves_give_the_whole_product(kind):
    """The helper thread's half and the caller's, side by side, against the whole product of
    the same kernel: oneDNN's packed bf16 (0), MKL's packed fp32 (1), `F.linear` (2)."""
    from workbench.engines.onednn_weights import OneDNNWeights, available as onednn_available
    from workbench.engines.packed_matmul import PackedWeights, available as mkl_available

    dtype = torch.bfloat16 if kind == 0 else torch.float32
    if kind == 0 and not onednn_available(dtype):
        pytest.skip("no oneDNN bf16 kernels on this CPU")
    if kind == 1 and not mkl_available(1):
        pytest.skip("no MKL packed GEMM in this torch")
    w, b = _weight(200, 96, dtype, 5), torch.linspace(-1, 1, 200).to(dtype)
    x = torch.randn(8, 96, generator=torch.Generator().manual_seed(6)).to(dtype)
    whole = F.linear(x.double(), w.double(), b.double())
    if kind == 2:
        y = cpu_kernels.linear_halves(2, x, w[:120], w[120:], w[:120], w[120:], b[:120], b[120:], 0)
    else:
        packer = OneDNNWeights() if kind == 0 else PackedWeights()
        if kind == 1:
            packer.begin_step(8)
        xp = packer.pad(x)
        k, *operands = packer.half_operands(xp, w, b, 120)
        assert k == kind
        y = cpu_kernels.linear_halves(k, xp, *operands)[:8]
    assert y.shape == (8, 200)
    assert float((y.double() - whole).abs().max()) <= (0.02 if dtype == torch.bfloat16 else 1e-5)


def test_the_helper_runs_one_thread_and_hands_back_errors():
    from workbench.engines.decode_threads import SpinHelper

    before = torch.get_num_threads()
    helper = SpinHelper()
    assert cpu_kernels.helper_threads() == 1 and torch.get_num_threads() == before
    w = _weight(64, 32, torch.float32, 7)
    x = torch.randn(4, 32)
    with pytest.raises(RuntimeError, match="kind 0 .*, 1 .* or 2"):
        helper.linear_halves(5, x, w[:32], w[32:], w[:32], w[32:], None, None, 0)
    with pytest.raises(RuntimeError):  # the helper's half has the wrong inner size: raised here
        helper.linear_halves(2, x, w[:32], w[32:, :16], w[:32], w[32:, :16], None, None, 0)
    y = helper.linear_halves(2, x, w[:32], w[32:], w[:32], w[32:], None, None, 0)  # still works after
    assert torch.allclose(y, x @ w.T, atol=1e-5)


def test_the_helper_thread_spins_only_while_a_step_is_open():
    """Process CPU time over 0.3 s of wall time: ~0.3 s more while a step is open (the helper
    spins), next to nothing once it is closed (it sleeps); an open step left idle for long
    also ends in sleep."""
    import time

    from workbench.engines.decode_threads import SpinHelper

    helper = SpinHelper()

    def cpu_seconds_over(wall: float) -> float:
        c0 = time.process_time()
        time.sleep(wall)
        return time.process_time() - c0

    closed = cpu_seconds_over(0.3)
    helper.begin()
    w = _weight(64, 32, torch.float32, 8)
    helper.linear_halves(2, torch.randn(2, 32), w[:32], w[32:], w[:32], w[32:], None, None, 0)
    t0 = time.process_time()
    time.sleep(0.015)  # within the helper's 20 ms of spinning after a product
    spinning = time.process_time() - t0
    open_idle = cpu_seconds_over(0.3)  # past the helper's 20 ms of idle spinning
    helper.end()
    assert closed < 0.05, closed
    assert spinning > 0.003, spinning  # awake right after a product in an open step (a busy machine: less)
    assert open_idle < 0.1, open_idle  # ...but not for long without one


def test_a_forked_child_gets_a_helper_of_its_own(tmp_path):
    """The helper's thread does not survive a fork: a child that splits a product after its
    parent did starts its own helper instead of waiting for the parent's (which would hang).
    Like any torch op after a fork, it needs the child on one OpenMP thread: a parallel op
    there hangs in libgomp whatever this helper does."""
    script = """
import os, signal, sys, torch
from workbench.engines import cpu_kernels
assert cpu_kernels.available()
w, x = torch.randn(64, 32), torch.randn(4, 32)
def halves():
    return cpu_kernels.linear_halves(2, x, w[:32], w[32:], w[:32], w[32:], None, None, 0)
assert torch.allclose(halves(), x @ w.T, atol=1e-5)
torch.randn(1 << 20).sum()  # the parent's OpenMP pool is in use
pid = os.fork()
if pid == 0:
    signal.alarm(20)  # a hang fails the child, not the suite
    torch.set_num_threads(1)  # torch itself needs this after a fork (libgomp's pool stays in the parent)
    os._exit(0 if torch.allclose(halves(), x @ w.T, atol=1e-5) else 3)
_, status = os.waitpid(pid, 0)
print("child", os.waitstatus_to_exitcode(status))
"""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_WAIT_POLICY": "PASSIVE"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "child 0" in done.stdout, done.stdout
