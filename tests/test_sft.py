"""SFT warm-up from a scripted expert's demonstrations (`workbench.training.sft`).

The references are independent: the NLL is recomputed with a plain forward of the whole
sequences (`model(input_ids).logits`, log-softmax, gathered at the trained positions), and
"only loss-mask-1 tokens train" is checked by weights: a step on a batch in which one
episode's mask is zeroed equals a step on the batch without that episode.
"""
from __future__ import annotations

import copy
import json

import pytest
import torch

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.cli import main
from workbench.config import ConfigError
from workbench.environments.base import BaseEnvironment
from workbench.rollout.chat import check_token_alignment
from workbench.training.sft import DEMONSTRATION_SEED_BASE


def _trainer(tiny_model_path, tmp_path, **sft):
    config = tiny_config(tiny_model_path, tmp_path, learning_rate=1e-3)
    config.model.dtype = "float32"
    config.environment.params = {"low": 1, "high": 8}
    config.environment.max_steps = config.inference.max_turns = 4
    for k, v in {"episodes": 6, **sft}.items():
        setattr(config.sft, k, v)
    return Trainer(config.validate(), environment=make_env("guess_number", low=1, high=8, max_steps=4))


def plain_nll(model, batch) -> float:
    """Mean -log p of the trained tokens, from a plain forward of each whole episode."""
    total, count = 0.0, 0
    with torch.no_grad():
        for b, ep in enumerate(batch):
            n = ep.num_tokens
            ids = batch.input_ids[b:b + 1, :n]
            logp = torch.log_softmax(model(input_ids=ids).logits.float(), -1)[0]  # (n, V)
            for t in range(1, n):
                if ep.loss_mask[t]:
                    total -= float(logp[t - 1, ids[0, t]])
                    count += 1
    return total / count


def test_the_expert_plays_token_exact_model_turns(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path)
    batch = trainer.demonstrations()
    assert len(batch) == 6 and all(ep.success for ep in batch)  # binary search wins 1..8 in 4 guesses
    assert [ep.env_seed for ep in batch] == [DEMONSTRATION_SEED_BASE + i for i in range(6)]
    tok = trainer.tokenizer
    for ep in batch:
        assert all(t.source == "expert" and t.action.strip().isdigit() for t in ep.turns)
        assert check_token_alignment(ep, tok).ok and not ep.warnings
        trained = [tid for tid, m in zip(ep.token_ids, ep.loss_mask) if m]
        replies = [tok.encode(t.action, add_special_tokens=False) for t in ep.turns]
        assert sum(len(r) + 1 for r in replies) == len(trained)  # each reply + its end-of-turn id, nothing else
        assert set(ep.rollout_logprobs[i] for i, m in enumerate(ep.loss_mask) if m) == {0.0}
    assert trainer.demonstrations() is batch  # played once


def test_sft_lowers_the_nll_of_the_expert_tokens(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path, learning_rate=3e-3)
    batch = trainer.demonstrations()
    start = plain_nll(trainer.policy.model, batch)
    history = trainer.sft(steps=6)
    assert history[0]["sft/nll"] == pytest.approx(start, rel=1e-4)  # the reported NLL is the plain one
    assert history[0]["sft/tokens"] == float(batch.loss_mask.sum())
    end = plain_nll(trainer.policy.model, batch)
    assert end < start - 0.5, (start, end)
    assert trainer.global_step == 6 and [m["step"] for m in trainer.metrics_history] == list(range(6))


def test_only_loss_mask_1_tokens_are_trained(tiny_model_path, tmp_path):
    trainer = _trainer(tiny_model_path, tmp_path)
    batch = trainer.demonstrations()
    masked = copy.deepcopy(batch)
    masked.tensors["loss_mask"][2] = 0.0  # episode 2's trained tokens no longer count
    reference = batch.select([i for i in range(len(batch)) if i != 2])
    start = copy.deepcopy(trainer.policy.trainable_state_dict())
    opt = copy.deepcopy(trainer.optimizer.state_dict())
    trainer.sft(masked)
    got = copy.deepcopy(trainer.policy.trainable_state_dict())
    trainer.policy.load_trainable_state_dict(start)
    trainer.optimizer.load_state_dict(opt)
    trainer.sft(reference)
    expected = trainer.policy.trainable_state_dict()
    assert max(float((expected[k] - start[k]).abs().max()) for k in start) > 1e-5
    assert max(float((got[k] - expected[k]).abs().max()) for k in start) <= 1e-6


def test_an_environment_without_an_expert_is_a_clear_error(tiny_model_path, tmp_path):
    class NoExpert(BaseEnvironment):
        def reset(self):
            return "hi"

        def step(self, action):
            return "ok", 0.0, True, {}

    config = tiny_config(tiny_model_path, tmp_path)
    trainer = Trainer(config, environment=NoExpert())
    with pytest.raises(ConfigError, match="NoExpert has no scripted expert.*expert_action"):
        trainer.sft(steps=1)


def test_cli_sft_steps_run_first_and_are_saved_like_any_step(tiny_model_path, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "4", "--eval-episodes", "2", "--save-interval", "2",
                 "--env-param", "low=1", "--env-param", "high=8", "--sft.steps", "2", "--sft.episodes", "3",
                 "--sft.learning_rate", "0.003", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert all("sft/nll" in r and "reward/mean" not in r for r in rows[:2])
    assert all("reward/mean" in r and "sft/nll" not in r for r in rows[2:])
    assert rows[0]["sft/learning_rate"] == 0.003
    assert (out / "demonstrations.jsonl.gz").exists()
    assert sorted(p.name for p in (out / "rollouts").iterdir()) == ["step_000002.jsonl.gz", "step_000003.jsonl.gz"]
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_")) == \
        ["step_000002", "step_000004"]
    evals = json.loads((out / "evals.json").read_text())
    assert [e["step"] for e in evals] == [0, 2, 4]  # before, after SFT, after RL


def _cli_run(tiny_model_path, out, *extra):
    assert main(["train", "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "4", "--eval-episodes", "2", "--save-interval", "1",
                 "--env-param", "low=1", "--env-param", "high=8", "--sft.episodes", "3", *extra,
                 "--output", str(out)]) == 0


def test_a_branch_that_sets_sft_steps_warms_up_first_from_its_step(tiny_model_path, tmp_path):
    """The format-errors remedy ({"sft.steps": N}) applied to a branch: its first N steps are SFT
    steps (not none, as when sft.steps counted from step 0), then `--steps` RL steps."""
    parent = tmp_path / "parent"
    _cli_run(tiny_model_path, parent)
    out = tmp_path / "branch"
    assert main(["train", "--from", str(parent / "checkpoints" / "step_000002"), "--sft.steps", "2",
                 "--environment.strict_format", "true", "--steps", "1", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3, 4]
    assert all("reward/mean" in r and "sft/nll" not in r for r in rows[:2])  # the parent's RL steps
    assert all("sft/nll" in r and "reward/mean" not in r for r in rows[2:4])  # the branch's warm-up
    assert "reward/mean" in rows[4] and "sft/nll" not in rows[4]
    assert (out / "demonstrations.jsonl.gz").exists()
    evals = json.loads((out / "evals.json").read_text())
    assert [e["step"] for e in evals] == [2, 4, 5]  # at the branch step, after SFT, after RL
    origin = json.loads((out / "branch.json").read_text())
    assert origin["overrides"]["sft.steps"] == 2 and origin["overrides"]["sft.start_step"] == 2
    assert origin["until_step"] == 5
    assert sorted(p.name for p in (out / "checkpoints").iterdir() if p.name.startswith("step_"))[-1] == "step_000005"


def test_a_branch_of_a_run_with_sft_trains_only_the_steps_asked(tiny_model_path, tmp_path):
    """The parent's warm-up (steps 0, 1) is done: `--steps 1` from its step 3 is one RL step, to step 4."""
    parent = tmp_path / "parent"
    _cli_run(tiny_model_path, parent, "--sft.steps", "2")
    out = tmp_path / "branch"
    assert main(["train", "--from", str(parent / "checkpoints" / "step_000003"), "--training.learning_rate",
                 "0.002", "--steps", "1", "--output", str(out)]) == 0
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [0, 1, 2, 3]
    assert "reward/mean" in rows[3] and "sft/nll" not in rows[3]
    assert json.loads((out / "branch.json").read_text())["until_step"] == 4
    assert [e["step"] for e in json.loads((out / "evals.json").read_text())] == [3, 4]
