"""TrajectoryBatch: lossless save/load, pandas views, render, select, devices, require."""
from __future__ import annotations

import math
import struct

import pytest
import torch

from envs import make_env
from workbench.rollout import Rollout
from workbench.trajectory import COLLATED, TOKEN_FIELDS, Episode, TrajectoryBatch, Turn


@pytest.fixture(scope="module")
def batch(tiny_engine):
    envs = [make_env("guess_number"), make_env("arithmetic"), make_env("grid"), make_env("guess_number", high=3)]
    rollout = Rollout(tiny_engine, envs, seeds=[0, 1, 2, 3], max_turns=3, max_tokens=10, seed=5)
    rollout.reset()
    rollout.step(human_actions={1: '<tool_call>{"name": "calculator", "arguments": {"expression": "2*3"}}</tool_call>'})
    return rollout.run()


def _bits(t: torch.Tensor) -> list[int]:
    return [struct.unpack("<I", struct.pack("<f", v))[0] for v in t.flatten().tolist()]


def test_batch_shapes(batch):
    B = len(batch)
    T = max(e.num_tokens for e in batch)
    for name in COLLATED:
        assert batch.tensors[name].shape == (B, T) and batch.tensors[name].dtype == TOKEN_FIELDS[name][0]
    assert sorted(batch.group_ids) == ["seed0", "seed1", "seed2", "seed3"]
    assert batch[1].num_tool_calls == 1


def test_save_load_round_trip_is_exact(batch, tmp_path):
    batch = batch.select(list(range(len(batch))))  # own tensors dict; the fixture stays clean
    B, T = batch.input_ids.shape
    g = torch.Generator().manual_seed(0)
    adv = torch.randn(B, T, generator=g) * batch.loss_mask  # (B, T); -0.0 where masked and negative
    # Padding is not stored (`save` writes each episode unpadded; `load` pads with +0.0).
    adv = adv.masked_fill(batch.attention_mask == 0, 0.0)
    adv[0, 0] = 1e-38  # subnormal-adjacent, shortest repr must survive
    adv[1, 0] = -0.0
    adv[2, 0] = 3.4028234663852886e38
    adv[3, 0] = 1 / 3
    batch.set("advantages", adv)
    batch.set("returns", torch.full((B, T), 0.1) * batch.attention_mask)
    batch.meta["step"] = 7
    path = batch.save(tmp_path / "sub" / "batch.jsonl")
    loaded = TrajectoryBatch.load(path)
    assert set(loaded.tensors) == set(batch.tensors)
    for name, t in batch.tensors.items():
        u = loaded.tensors[name]
        assert u.dtype == t.dtype and u.shape == t.shape, name
        assert torch.equal(u, t), name
        if t.is_floating_point():
            assert _bits(u) == _bits(t), f"{name} is not bit-identical"
    assert math.copysign(1.0, loaded.advantages[1, 0].item()) == -1.0
    assert loaded.meta == {"step": 7}
    for a, b in zip(batch, loaded):
        assert a.to_dict() == b.to_dict()
        assert isinstance(b.turns[0], Turn)
    assert loaded.summary() == batch.summary()
    # not our file
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"format": "something else"}\n')
    with pytest.raises(ValueError, match="not a workbench trajectory batch"):
        TrajectoryBatch.load(bad)


def test_to_pandas_levels(batch):
    ep_df = batch.to_pandas("episode")
    turn_df = batch.to_pandas("turn")
    tok_df = batch.to_pandas("token")
    assert len(ep_df) == len(batch)
    assert len(turn_df) == sum(e.num_turns for e in batch)
    assert len(tok_df) == sum(e.num_tokens for e in batch)
    assert ep_df["tokens"].tolist() == [e.num_tokens for e in batch]
    assert turn_df["action_tokens"].sum() == sum(t.token_end - t.token_start for e in batch for t in e.turns)
    assert (turn_df["source"] == "human").sum() == 1
    assert tok_df["loss_mask"].sum() == sum(e.response_length for e in batch)
    assert tok_df["token_id"].tolist() == [t for e in batch for t in e.token_ids]
    with pytest.raises(ValueError, match="level"):
        batch.to_pandas("step")


def test_render_marks_trained_tokens(batch, tiny_engine):
    tok = tiny_engine.tokenizer
    ep = batch[0]
    marks = ("\u27e6", "\u27e7")
    text = ep.render(tok, trained_marker=marks)
    assert text.count(marks[0]) == sum(t.source == "model" for t in ep.turns)
    # the marked spans are exactly the decoded sampled turns, in order
    spans = [part.split(marks[1])[0] for part in text.split(marks[0])[1:]]
    assert spans == [tok.decode(ep.token_ids[t.token_start:t.token_end], skip_special_tokens=False)
                     for t in ep.turns if t.source == "model"]
    assert text.replace(marks[0], "").replace(marks[1], "") == tok.decode(ep.token_ids, skip_special_tokens=False)
    # a human turn is not marked
    human = batch[1]
    assert human.turns[0].source == "human"
    assert "\u27e6<tool_call>" not in human.render(tok, trained_marker=marks)


def test_select_and_to(batch):
    sub = batch.select([2, 0])
    assert [e.episode_id for e in sub] == [2, 0]
    T = max(batch[2].num_tokens, batch[0].num_tokens)
    for name, t in sub.tensors.items():
        assert t.shape == (2, T)
        assert torch.equal(t[0], batch.tensors[name][2, :T]) and torch.equal(t[1], batch.tensors[name][0, :T])
    assert sub.to("cpu") is sub and all(t.device.type == "cpu" for t in sub.tensors.values())
    assert sub.to(torch.device("cpu")).input_ids.device == torch.device("cpu")


def test_require_names_the_stage(batch):
    with pytest.raises(ValueError, match=r"batch\.advantages is missing: run trainer\.compute_advantages\(\) first"):
        batch.require("input_ids", "advantages")
    with pytest.raises(AttributeError, match=r"ref_logprobs .*trainer\.compute_logprobs"):
        batch.ref_logprobs
    batch.require("input_ids", "loss_mask")  # present: no error
    with pytest.raises(KeyError, match="unknown token field"):
        batch.set("advantage", torch.zeros_like(batch.loss_mask))
    with pytest.raises(ValueError, match="must have shape"):
        batch.set("values", torch.zeros(1, 1))


def test_episode_lists_stay_aligned():
    ep = Episode()
    ep.append_tokens([1, 2], trained=False, logprobs=None, turn=-1)
    ep.append_tokens([3], trained=True, logprobs=[-0.5], turn=0)
    assert ep.loss_mask == [0, 0, 1] and ep.rollout_logprobs == [0.0, 0.0, -0.5] and ep.turn_index == [-1, -1, 0]
    with pytest.raises(ValueError, match="2 ids but 1 logprobs"):
        ep.append_tokens([4, 5], trained=True, logprobs=[-1.0], turn=1)
    assert TrajectoryBatch([ep]).input_ids.tolist() == [[1, 2, 3]]


def test_sequences_of_an_episode_match_a_plain_walk_and_survive_save(tmp_path):
    """`segments` bookkeeping against a walk written out by hand, and through save/load."""
    ep = Episode()
    ep.append_tokens([10, 11, 12, 13, 14], False, None, -1)
    ep.append_tokens([15, 16], True, [-0.5, -0.25], 0)
    ep.start_sequence(3)  # follows 10 11 12
    ep.append_tokens([20, 21], False, None, 0)
    ep.append_tokens([22], True, [-1.0], 1)
    ep.start_sequence(ep.context_length)  # the whole sequence: no new one, the tokens follow
    ep.append_tokens([23], False, None, 1)
    assert ep.segments == [[7, 3]]
    assert ep.positions() == [0, 1, 2, 3, 4, 5, 6, 3, 4, 5, 6]
    assert ep.context_ids() == [10, 11, 12, 20, 21, 22, 23] and ep.context_length == 7
    assert ep.sequence_indices(7) == [0, 1, 2] and ep.sequence_indices(6) == [0, 1, 2, 3, 4, 5]
    assert ep.sequence_indices(9) == [0, 1, 2, 7, 8]
    with pytest.raises(ValueError, match="shared must be in 0..7"):
        ep.start_sequence(8)
    one = Episode(token_ids=[1, 2], loss_mask=[0, 1], rollout_logprobs=[0.0, -1.0], turn_index=[-1, 0])
    batch = TrajectoryBatch([ep, one])
    assert batch.position_ids.tolist() == [ep.positions(), [0, 1] + [0] * 9]
    loaded = TrajectoryBatch.load(batch.save(tmp_path / "b.jsonl.gz"))
    assert loaded[0].segments == [[7, 3]] and torch.equal(loaded.position_ids, batch.position_ids)
    assert "position_ids" not in TrajectoryBatch([one]).tensors  # one-sequence batches are as before
    ep.truncate_tokens(7)
    assert ep.segments == [] and ep.context_ids() == ep.token_ids[:7]


def test_to_dict_is_what_asdict_gives(tiny_model_and_tokenizer):
    import dataclasses

    from tests.doctor_policies import count_up_from_4, roll

    batch = roll(tiny_model_and_tokenizer[1], "guess_number", count_up_from_4, groups=2, group_size=2)
    ep = batch[0]
    ep.turns[0].info["nested"] = {"a": [1, (2, 3)], "b": {"c": None}}
    ep.forked_from = {"turn": 1, "text": "x"}
    assert ep.to_dict() == dataclasses.asdict(ep)
    copy = ep.to_dict()
    copy["turns"][0]["info"]["nested"]["a"].append(9)  # a copy, as asdict's: the episode is unchanged
    assert ep.turns[0].info["nested"]["a"] == [1, (2, 3)]
