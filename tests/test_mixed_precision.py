"""bf16 where the hardware has it: the "auto" dtype rule, and training over bf16 weights
with fp32 adapters, critic head, AdamW state and log-softmax (tiny model, this CPU)."""
from __future__ import annotations

import pytest
import torch

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.config import checks as config_checks
from workbench.config import resolve_dtype

# numbers compared under dtype "auto": make test runs this file in both dtypes (WORKBENCH_AUTO_DTYPE)
pytestmark = pytest.mark.numerics


@pytest.fixture
def fresh_announcements(monkeypatch):
    monkeypatch.setattr(config_checks, "_announced", set())
    monkeypatch.delenv(config_checks.AUTO_DTYPE_ENV, raising=False)  # these tests set the CPU's answer themselves


@pytest.mark.parametrize("bf16_cpu", [True, False])
def test_auto_dtype_rule(monkeypatch, capsys, fresh_announcements, bf16_cpu):
    monkeypatch.setattr(config_checks, "cpu_bf16_support", lambda: (bf16_cpu, "probe said so"))
    want = torch.bfloat16 if bf16_cpu else torch.float32
    assert resolve_dtype("auto", "cpu") == want
    assert resolve_dtype("auto", "cpu") == want
    said = capsys.readouterr().err
    assert said.count("model.dtype \"auto\"") == 1 and "probe said so" in said  # once per process
    assert resolve_dtype("auto", "cpu", trains_all_weights=True) == torch.float32  # no fp32 master copy
    assert "full fine-tuning keeps fp32" in capsys.readouterr().err or not bf16_cpu
    assert resolve_dtype("auto", "cuda") == torch.bfloat16
    assert resolve_dtype("float32", "cpu") == torch.float32 and resolve_dtype("bfloat16", "cpu") == torch.bfloat16


def test_cpu_probe_reads_the_cpu_flags():
    ok, why = config_checks.cpu_bf16_support()
    with open("/proc/cpuinfo") as f:
        flags = set(" ".join(line for line in f if line.startswith("flags")).split())
    has = bool(flags & {"avx512_bf16", "amx_bf16"}) and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    assert ok == has, why


def _trainer(tiny_model_path, tmp_path, **model):
    config = tiny_config(tiny_model_path, tmp_path)
    config.training.adv_estimator = "gae"  # a critic too
    for k, v in model.items():
        setattr(config.model, k, v)
    return Trainer(config, environment=make_env("guess_number"))


def test_bf16_training_keeps_adapters_head_adam_and_log_softmax_fp32(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, dtype="bfloat16")
    named = dict(trainer.policy.model.named_parameters())
    assert {p.dtype for n, p in named.items() if "lora_" in n} == {torch.float32}
    assert {p.dtype for n, p in named.items() if "lora_" not in n} == {torch.bfloat16}
    assert trainer.critic.value_head.weight.dtype == torch.float32
    assert {p.dtype for n, p in trainer.critic.named_parameters() if "lora_" in n} == {torch.float32}
    batch = trainer.score(trainer.rollout())
    trainer.compute_advantages(batch)  # old_logprobs from their own forward, before the update
    assert batch.old_logprobs.dtype == torch.float32
    trainer.update(batch)
    # One mini-batch (2 micro-batches of 2): every micro-batch sees the weights
    # old_logprobs saw, so the on-policy ratio is 1 on every trained token.
    assert trainer.config.training.mini_batch_size is None and trainer.config.training.ppo_epochs == 1
    ratio = batch.ratio[batch.loss_mask.bool()]
    assert ratio.numel() > 0 and (ratio - 1).abs().max() <= 1e-3, ratio
    for opt in (trainer.optimizer, trainer.critic_optimizer):
        moments = [v for s in opt.state.values() for k, v in s.items() if k in ("exp_avg", "exp_avg_sq")]
        assert moments and {m.dtype for m in moments} == {torch.float32}


def test_bf16_log_softmax_is_fp32(tiny_model_path):
    """The trainer's logprobs of bf16 logits equal an fp32 log-softmax of the same logits
    (not a bf16 one, which rounds logprobs to ~3 significant digits)."""
    from workbench.models import load_model_and_tokenizer
    from workbench.training.policy import forward_logprobs

    model, _ = load_model_and_tokenizer(str(tiny_model_path), dtype="bfloat16", device="cpu")
    ids = torch.randint(3, model.config.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    mask = torch.ones_like(ids)
    with torch.no_grad():
        lp, _ = forward_logprobs(model, ids, mask)
        logits = model(input_ids=ids, attention_mask=mask).logits  # (B, T, V) bf16
    assert logits.dtype == torch.bfloat16 and lp.dtype == torch.float32
    ref = torch.log_softmax(logits[:, :-1].double(), -1).gather(-1, ids[:, 1:, None]).squeeze(-1)  # (B, T-1)
    assert torch.allclose(lp[:, 1:].double(), ref, atol=1e-5)


def test_full_fine_tuning_in_bf16_warns_and_auto_stays_fp32(tiny_model_path, tmp_path, monkeypatch,
                                                          fresh_announcements):
    with pytest.warns(UserWarning, match="no fp32 master copy"):
        trainer = _trainer(tiny_model_path, tmp_path, use_lora=False, dtype="bfloat16")
    assert {p.dtype for p in trainer.policy.trainable_parameters()} == {torch.bfloat16}
    monkeypatch.setattr(config_checks, "cpu_bf16_support", lambda: (True, "probe said so"))
    trainer = _trainer(tiny_model_path, tmp_path, use_lora=False)  # "auto"
    assert {p.dtype for p in trainer.policy.trainable_parameters()} == {torch.float32}


def test_bf16_lora_policy_is_sampled_through_its_fp32_adapters(tiny_model_path):
    """Merging LoRA into bf16 weights would round small updates away: the engine samples
    through peft instead, and then sees an adapter change far below bf16's resolution."""
    from workbench.config import ModelConfig
    from workbench.engines.base import SamplingParams
    from workbench.engines.hf import HFEngine
    from workbench.training.policy import Policy

    cfg = ModelConfig(model_name=str(tiny_model_path), dtype="bfloat16", lora_rank=4)
    policy = Policy(cfg, with_reference=False)
    engine = HFEngine(policy.model, policy.tokenizer)
    assert engine._merged is None
    prompt = [[1, 5, 9, 13, 17, 21]]
    greedy = SamplingParams(max_tokens=4, temperature=0.0)
    before = engine.generate_ids(prompt, greedy)[0]
    lora_b = [p for n, p in policy.model.named_parameters() if "lora_B" in n]
    with torch.no_grad():
        for p in lora_b:
            p.fill_(1e-5)  # a small first update of the adapters
        from workbench.engines.weights import is_lora_layer

        layers = [m for m in policy.model.modules() if is_lora_layer(m)]
        w = torch.cat([m.get_base_layer().weight.flatten() for m in layers])  # bf16
        delta = torch.cat([m.get_delta_weight("default").float().flatten() for m in layers])  # fp32
    assert (delta != 0).float().mean() > 0.99
    lost = ((w.float() + delta).to(torch.bfloat16) == w).float().mean()
    assert lost > 0.5, lost  # a bf16 merge would keep most weights as they were
    after = engine.generate_ids(prompt, greedy)[0]
    assert after.logprobs != before.logprobs  # the engine follows the fp32 adapters


@pytest.mark.parametrize("dtype,bound", [("float32", 1e-4), ("bfloat16", 0.2)])
def test_rollout_logprob_diff_reports_the_engine_trainer_gap(tiny_model_path, tmp_path, dtype, bound):
    """`actor/rollout_logprob_diff`: mean |trainer old logprob - engine logprob| over the
    trained tokens, within float rounding of the dtype; a shifted engine logprob shows."""
    trainer = _trainer(tiny_model_path, tmp_path, dtype=dtype)
    batch = trainer.score(trainer.rollout())
    trainer.compute_advantages(batch)
    metrics = trainer.update(batch)
    diffs = [abs(float(batch.old_logprobs[b, t]) - float(batch.rollout_logprobs[b, t]))
             for b in range(len(batch)) for t in range(batch.input_ids.shape[1])
             if batch.loss_mask[b, t] and batch.rollout_logprobs[b, t] != 0]
    assert len(diffs) > 10
    got = metrics["actor/rollout_logprob_diff"]
    assert got == pytest.approx(sum(diffs) / len(diffs), rel=1e-6, abs=1e-9)
    assert got < bound and (dtype == "float32" or got > 0)
    from workbench.training.update import rollout_logprob_diff

    batch.rollout_logprobs[batch.loss_mask.bool()] -= 0.5  # an engine sampling from other weights
    shifted, n = rollout_logprob_diff(batch)
    assert n == len(diffs) and shifted == pytest.approx(0.5, abs=bound)
