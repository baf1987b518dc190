"""`Rollout`: batched stepwise episodes, loss mask, logprobs, human turns, seeds, groups."""
from __future__ import annotations

import pytest
import torch

from tests.numerics import assert_same_samples
from envs import make_env
from workbench.engines.base import EngineError, GenerationResult
from workbench.engines.hf import HFEngine
from workbench.rollout import Rollout
from workbench.trajectory import TrajectoryBatch


class RecordingEngine(HFEngine):
    """A real HF engine that also keeps every (prompt, result) pair it returned."""

    name = "hf"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[list[tuple[list[int], GenerationResult]]] = []

    def generate_ids(self, prompts, params):
        results = super().generate_ids(prompts, params)
        self.calls.append([(list(p), r) for p, r in zip(prompts, results)])
        return results


@pytest.fixture
def recording_engine(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    return RecordingEngine(model, tok)


def _result_for(engine: RecordingEngine, prefix: list[int]) -> GenerationResult:
    matches = [r for call in engine.calls for p, r in call if p == prefix]
    assert len(matches) == 1, f"expected exactly one engine call with this prompt, found {len(matches)}"
    return matches[0]


def _reference_logprobs(model, ids: list[int]) -> torch.Tensor:
    """log p(ids[i] | ids[:i]) from one plain forward (position 0 gets 0)."""
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([ids])).logits[0].float()  # (T, V)
    lp = torch.log_softmax(logits[:-1], dim=-1).gather(-1, torch.tensor(ids[1:])[:, None]).squeeze(-1)  # (T-1,)
    return torch.cat([torch.zeros(1), lp])


def test_loss_mask_marks_exactly_the_sampled_tokens(recording_engine, tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    envs = [make_env("guess_number"), make_env("grid"), make_env("arithmetic"), make_env("guess_number")]
    rollout = Rollout(recording_engine, envs, seeds=[0, 1, 2, 3], max_turns=3, max_tokens=10, seed=7)
    rollout.reset()
    rollout.step(human_actions={0: "8"})  # a typed turn: never trained on
    batch = rollout.run()
    n_model_turns = 0
    for ep in batch:
        assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.rollout_logprobs) == len(ep.turn_index)
        expected_mask = [0] * ep.num_tokens
        for turn in ep.turns:
            s, e = turn.token_start, turn.token_end
            if turn.source == "human":
                assert ep.loss_mask[s:e] == [0] * (e - s)
                assert ep.rollout_logprobs[s:e] == [0.0] * (e - s)
                continue
            n_model_turns += 1
            result = _result_for(recording_engine, ep.token_ids[:s])
            assert ep.token_ids[s:e] == result.token_ids  # appended exactly as returned
            assert ep.rollout_logprobs[s:e] == result.logprobs
            assert turn.finish_reason == result.finish_reason
            expected_mask[s:e] = [1] * (e - s)
        assert ep.loss_mask == expected_mask
        assert [lp != 0.0 for lp in ep.rollout_logprobs] == [bool(m) for m in expected_mask]
        assert ep.response_length == sum(expected_mask)
        # The engine's logprobs are the raw model's: compare with an unbatched forward.
        ref = _reference_logprobs(model, ep.token_ids)
        mask = torch.tensor(ep.loss_mask, dtype=torch.bool)
        got = torch.tensor(ep.rollout_logprobs)
        assert torch.allclose(got[mask], ref[mask], atol=1e-4), (got[mask] - ref[mask]).abs().max()
    assert n_model_turns >= 10
    # Collated tensors agree with the per-episode lists.
    for b, ep in enumerate(batch):
        n = ep.num_tokens
        assert batch.loss_mask[b, :n].tolist() == [float(m) for m in ep.loss_mask]
        assert batch.loss_mask[b, n:].sum() == 0 and batch.attention_mask[b].sum() == n


def test_human_turn(tiny_engine):
    tok = tiny_engine.tokenizer
    rollout = Rollout(tiny_engine, [make_env("guess_number") for _ in range(3)], seeds=[0, 0, 1], max_turns=3, max_tokens=6)
    rollout.reset()
    advanced = rollout.step(human_actions={0: "8"})
    assert advanced == [0, 1, 2]
    ep = rollout.slots[0].episode
    turn = ep.turns[0]
    assert turn.source == "human" and turn.finish_reason == "human" and turn.action == "8"
    ids = ep.token_ids[turn.token_start:turn.token_end]
    assert ids == list(tok("8", add_special_tokens=False)["input_ids"]) + [tok.eos_token_id]
    assert ep.loss_mask[turn.token_start:turn.token_end] == [0] * len(ids)
    assert ep.actions == ["8"] and ep.messages[-2] == {"role": "assistant", "content": "8"}
    assert ep.infos[0]["guess"] == 8
    assert all(t.source == "model" for t in (rollout.slots[1].episode.turns + rollout.slots[2].episode.turns))
    with pytest.raises(ValueError, match="not live"):
        rollout.step(human_actions={7: "1"})


def test_stepwise_api_and_max_turns(tiny_engine):
    rollout = Rollout(tiny_engine, [make_env("guess_number", high=64) for _ in range(3)], seeds=[0, 1, 2],
                      max_turns=2, max_tokens=6)
    rollout.reset()
    assert rollout.live == [0, 1, 2]
    assert all(s.episode.prompt_length == s.episode.num_tokens for s in rollout.slots)
    # a live episode ends with an open generation prompt and is aligned too
    rollout.step()
    assert all(len(s.episode.turns) == 1 for s in rollout.slots)
    batch = rollout.run()
    assert rollout.live == []
    for ep in batch:
        assert ep.done and ep.num_turns == 2 and len(ep.actions) == len(ep.rewards) == len(ep.dones) == 2
        if not ep.success:
            assert ep.truncated and ep.truncation_reason == "max_turns"
        assert ep.states[0].startswith("Guess the secret number between 1 and 64")
        assert ep.warnings == []
    with pytest.raises(ValueError, match="has ended"):
        rollout.suggest(0)


def test_same_seed_same_batch_and_groups(tiny_engine):
    def run(seed):
        r = Rollout.from_env(tiny_engine, lambda: make_env("wordle"), num_groups=2, group_size=2, max_turns=2,
                             max_tokens=8, seed=seed)
        return r.run()

    a, b, c = run(3), run(3), run(4)
    # the same ids; logprobs to fp32 rounding (the engine's timed decode mode may differ: tests/numerics.py)
    assert_same_samples([(e.token_ids, e.rollout_logprobs) for e in a], [(e.token_ids, e.rollout_logprobs) for e in b])
    assert [e.token_ids for e in a] != [e.token_ids for e in c]
    assert a.group_ids == ["seed0", "seed0", "seed1", "seed1"]
    assert [e.env_seed for e in a] == [0, 0, 1, 1]
    # same env seed -> same opening prompt; different seeds -> different secret word prompt ids
    assert a[0].token_ids[: a[0].prompt_length] == a[1].token_ids[: a[1].prompt_length]


def test_suggest_does_not_advance(tiny_engine):
    rollout = Rollout(tiny_engine, [make_env("grid") for _ in range(2)], seeds=[0, 1], max_turns=2, max_tokens=6)
    rollout.reset()
    before = list(rollout.slots[0].episode.token_ids)
    text = rollout.suggest(0)
    assert isinstance(text, str)
    assert rollout.slots[0].episode.token_ids == before and rollout.slots[0].episode.turns == []


def test_constructor_validation(tiny_engine):
    with pytest.raises(ValueError, match="at least one environment"):
        Rollout(tiny_engine, [])
    with pytest.raises(ValueError, match="max_turns"):
        Rollout(tiny_engine, [make_env("grid")], max_turns=0)
    with pytest.raises(ValueError, match="seeds"):
        Rollout(tiny_engine, [make_env("grid")], seeds=[0, 1])


class FailingEngine(HFEngine):
    """Works for `ok_calls` calls, then raises."""

    def __init__(self, *args, ok_calls: int = 1, **kwargs):
        super().__init__(*args, **kwargs)
        self.ok_calls = ok_calls

    def generate_ids(self, prompts, params):
        if self.ok_calls <= 0:
            raise RuntimeError("device lost")
        self.ok_calls -= 1
        return super().generate_ids(prompts, params)


def test_engine_failure_keeps_finished_episodes(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    engine = FailingEngine(model, tok, ok_calls=1)
    # episode 0 ends after one (typed) winning guess; the others need the engine twice
    env0 = make_env("guess_number", low=5, high=5)
    rollout = Rollout(engine, [env0, make_env("guess_number"), make_env("guess_number")], seeds=[0, 1, 2],
                      max_turns=3, max_tokens=6)
    rollout.reset()
    rollout.step(human_actions={0: "5"})
    assert rollout.slots[0].episode.done and rollout.slots[0].episode.success
    with pytest.raises(EngineError, match="hf backend failed during turn 1: device lost.*1 finished episodes"):
        rollout.step()
    batch = rollout.batch
    assert isinstance(batch, TrajectoryBatch)
    assert batch[0].error is None and batch[0].success
    for ep in batch.episodes[1:]:
        assert ep.done and "RuntimeError: device lost" in ep.error
