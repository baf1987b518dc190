"""Policy diff: two policies score the same tokens; checked against a plain per-episode loop.

Checkpoints are real: the tiny model trains one GRPO step on guess_number (LoRA, and full
weights) and saves it in the run-folder layout (RUN/config.yaml, RUN/checkpoints/step_000001,
RUN/rollouts/step_000000.jsonl.gz).
"""
from __future__ import annotations

import pytest
import torch

from envs import make_env
from workbench import ConfigStore
from workbench.cli import main
from workbench.debug import PolicyDiff, compare_policies
from workbench.models import load_model_and_tokenizer
from workbench.trajectory import TrajectoryBatch
from workbench.widgets import available_fields

# numbers compared under dtype "auto": make test runs this file in both dtypes (WORKBENCH_AUTO_DTYPE)
pytestmark = pytest.mark.numerics


def train_run(model_path, run, use_lora: bool):
    """One GRPO step saved as a run folder; returns (trainer, checkpoint folder, batch file)."""
    from workbench.training import Trainer

    c = ConfigStore()
    c.model.model_name = str(model_path)
    c.model.use_lora = use_lora
    c.model.dtype = "float32"  # compared with an fp32 plain loop below
    c.model.lora_rank = 4
    c.inference.max_tokens = 6
    c.inference.max_turns = 2
    c.training.batch_size, c.training.group_size, c.training.micro_batch_size = 4, 2, 4
    c.training.learning_rate = 5e-3
    c.checkpoint.output_dir = str(run / "checkpoints")
    c.checkpoint.save_interval = 1
    c.checkpoint.resume = False
    trainer = Trainer(c.validate(), environment=make_env("guess_number"))
    trainer.fit(steps=1)
    trainer.config.save(run / "config.yaml")
    batch_file = trainer.last_batch.save(run / "rollouts" / "step_000000.jsonl.gz")
    return trainer, run / "checkpoints" / "step_000001", batch_file


@pytest.fixture(scope="module", params=[True, False], ids=["lora", "full"])
def run(request, tiny_model_path, tmp_path_factory):
    folder = tmp_path_factory.mktemp("lora" if request.param else "full")
    return train_run(tiny_model_path, folder, request.param)


def plain_logprobs(model, batch: TrajectoryBatch) -> torch.Tensor:
    """(B, T) log p(token_t | tokens_<t) at trained tokens, one episode per forward, no padding."""
    out = torch.zeros(batch.input_ids.shape)
    model.eval()
    with torch.no_grad():
        for b, ep in enumerate(batch):
            ids = torch.tensor([ep.token_ids])  # (1, T_b)
            logits = model(input_ids=ids).logits[0].float()  # (T_b, V)
            for t in range(1, ep.num_tokens):
                if ep.loss_mask[t]:
                    out[b, t] = torch.log_softmax(logits[t - 1], -1)[ep.token_ids[t]]
    return out


def test_a_checkpoint_against_itself_is_exactly_zero(run):
    _, ckpt, batch_file = run
    batch = TrajectoryBatch.load(batch_file)
    diff = compare_policies(ckpt, ckpt, batch)
    mask = batch.loss_mask.bool()
    assert mask.sum() > 0 and (batch.diff_logprobs_a[mask] < 0).all()  # real logprobs on trained tokens
    assert torch.equal(batch.diff_delta, torch.zeros_like(batch.diff_delta))
    assert torch.equal(batch.diff_kl, torch.zeros_like(batch.diff_kl))
    assert diff.max_abs_delta == 0.0 and (diff.per_episode["delta"] == 0).all()


def test_base_vs_trained_equals_a_plain_loop(run, tiny_model_path):
    trainer, ckpt, batch_file = run
    batch = TrajectoryBatch.load(batch_file)
    diff = compare_policies("base", ckpt, batch)
    base, _ = load_model_and_tokenizer(str(tiny_model_path), dtype="float32", device="cpu")
    ref_a = plain_logprobs(base, batch)  # (B, T)
    ref_b = plain_logprobs(trainer.policy.model, batch)  # the trainer's weights are the checkpoint's
    ref_delta = ref_b - ref_a
    assert ref_delta.abs().max() > 1e-3  # training moved the policy: the checks below can fail
    for got, want in ((batch.diff_logprobs_a, ref_a), (batch.diff_logprobs_b, ref_b), (batch.diff_delta, ref_delta)):
        assert torch.allclose(got, want, atol=1e-5, rtol=0), float((got - want).abs().max())
    assert not torch.allclose(1.01 * batch.diff_delta, ref_delta, atol=1e-5, rtol=0)  # a scaled diff fails
    neg = ref_a - ref_b
    ref_kl = (torch.exp(neg) - neg - 1).clamp(max=10.0) * batch.loss_mask  # k3, capped at 10 as verl does
    # k3 multiplies a logprob error by exp(a - b) - 1 (large where the policies differ most), hence a relative tolerance
    assert torch.allclose(batch.diff_kl, ref_kl, atol=1e-5, rtol=1e-4)
    # Sums per episode and per turn.
    for b, row in diff.per_episode.iterrows():
        assert row["delta"] == pytest.approx(float(ref_delta[b].sum()), abs=1e-4)
        turns = diff.per_turn[diff.per_turn["episode"] == b]
        assert turns["delta"].sum() == pytest.approx(row["delta"], abs=1e-4)
        assert row["tokens"] == sum(batch[b].loss_mask)
    # The most changed tokens, largest |delta| first, with the decoded token.
    top = diff.top_tokens
    assert list(top["delta"].abs()) == sorted(top["delta"].abs(), reverse=True)
    assert abs(top["delta"].iloc[0]) == pytest.approx(float(ref_delta.abs().max()), abs=1e-5)
    first = top.iloc[0]
    tok = trainer.tokenizer
    assert first["token"] == tok.decode([batch[first["episode"]].token_ids[first["position"]]])
    assert isinstance(diff, PolicyDiff) and "Most changed tokens" in diff.to_markdown()
    assert {"diff_delta", "diff_kl"} <= set(available_fields(batch))  # the token view can colour them


def test_diff_command_on_a_run_folder(run, tmp_path, capsys):
    trainer, ckpt, batch_file = run
    run_dir = ckpt.parent.parent
    out = tmp_path / "diff.md"
    assert main(["diff", "base", "1", "--run", str(run_dir), "--step", "0", "--out", str(out), "--top", "3"]) == 0
    text = out.read_text()
    assert "step_000000.jsonl.gz" in text and "A = base" in text
    table = text.split("## Most changed tokens (top 3)")[1].split("##")[0]
    assert len([line for line in table.splitlines() if line.startswith("| ") and "episode" not in line]) == 3
    assert "Most changed tokens" in capsys.readouterr().out
    assert main(["diff", str(ckpt), str(ckpt), "--batch", str(batch_file)]) == 0
    assert "max |Δ| 0.0000" in capsys.readouterr().out
    evals = run_dir / "evals" / "step_000001.jsonl.gz"
    TrajectoryBatch.load(batch_file).save(evals)
    assert main(["diff", "base", "1", "--run", str(run_dir), "--eval", "1", "--top", "2"]) == 0
    assert str(evals) in capsys.readouterr().out
    assert main(["diff", "base", "1", "--run", str(run_dir), "--step", "7"]) == 2
    assert "step_000007.jsonl.gz does not exist" in capsys.readouterr().err
    assert main(["diff", "base", "9", "--run", str(run_dir)]) == 2
    assert "step_000009" in capsys.readouterr().err
