"""workbench.data and workbench.compat.verl_data: dataset items -> episodes, RLHFDataset files, collate_fn, the DataProto view."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
import torch

from workbench.compat.verl_data import DataProto, RLHFDataset, collate_fn
from workbench.data import EpisodeDataset, EpisodeSpec, PromptEnvironment, item_to_spec, make_episode_env
from workbench.environments.base import BaseEnvironment
from workbench.trajectory import Episode, TrajectoryBatch


def test_item_to_spec_forms():
    assert item_to_spec(5, 0) == EpisodeSpec(seed=5, index=0)
    spec = item_to_spec({"prompt": [{"role": "system", "content": "Be brief."},
                                    {"role": "user", "content": "2+3?"}],
                         "input_ids": torch.tensor([1, 2]), "answer": "5", "env_params": {"high": 9}}, 4)
    assert (spec.seed, spec.prompt, spec.system_prompt, spec.params, spec.extra) == \
        (4, "2+3?", "Be brief.", {"high": 9}, {"answer": "5"})
    assert item_to_spec({"env_seed": torch.tensor(11)}, 0).seed == 11
    with pytest.raises(TypeError, match=r"dataset item 2 is a float"):
        item_to_spec(1.5, 2)
    with pytest.raises(TypeError, match=r"dataset item 1\['prompt'\]: the prompt must be a str"):
        item_to_spec({"prompt": 3}, 1)
    with pytest.raises(ValueError, match=r"needs a message with role 'user'"):
        item_to_spec({"prompt": [{"role": "system", "content": "x"}]}, 0)
    with pytest.raises(TypeError, match=r"the seed must be an int"):
        item_to_spec({"seed": "abc"}, 0)


def test_episode_dataset_checks_first_item_and_indexes_lazily():
    reads = []

    class Logged(torch.utils.data.Dataset):
        def __len__(self):
            return 1000

        def __getitem__(self, i):
            reads.append(i)
            return {"seed": i * 2}

    ds = EpisodeDataset(Logged())
    assert reads == [0] and len(ds) == 1000
    assert ds[7].seed == 14 and reads == [0, 7]
    assert EpisodeDataset(iter([3, 4]))[1].seed == 4  # a generator of seeds is read once
    with pytest.raises(ValueError, match="dataset= is empty"):
        EpisodeDataset([])
    with pytest.raises(TypeError, match="use RLHFDataset"):
        EpisodeDataset("train.parquet")


class Echo(BaseEnvironment):
    def reset(self) -> str:
        return f"obs {self.params.get('k', 0)} seed {self._seed}"

    def step(self, action: str) -> tuple:
        return "done", 1.0, True, {"x": 1}


def test_make_episode_env_applies_params_prompt_and_extras():
    proto = Echo({"max_steps": 3})
    env = make_episode_env(lambda: proto, EpisodeSpec(seed=2, params={"k": 7}, initial_prompt="Hi.",
                                                      extra={"gt": "a"}, system_prompt="Sys."))
    assert env is not proto and proto.params == {}
    assert env.reset(seed=2) == "Hi.\n\nobs 7 seed 2"
    assert env.get_prompt_prefix() == "Sys."
    assert env.step("a")[3] == {"x": 1, "dataset_item": {"gt": "a"}}
    env = make_episode_env(lambda: Echo(), EpisodeSpec(seed=1, prompt="Replaced."))
    assert env.reset(seed=1) == "Replaced." and env.last_observation == "obs 0 seed 1"
    prompt_env = make_episode_env(lambda: PromptEnvironment(), EpisodeSpec(seed=0, prompt="2+3?"))
    assert prompt_env.reset() == "2+3?" and prompt_env.step("5") == ("", 0.0, True, {})


def test_rlhf_dataset_parquet_and_jsonl(tmp_path, tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    pq = tmp_path / "a.parquet"
    pd.DataFrame({"question": ["one?", "two?"], "answer": ["1", "2"]}).to_parquet(pq)
    jl = tmp_path / "b.jsonl"
    jl.write_text(json.dumps({"question": [{"role": "user", "content": "three?"}], "answer": "3"}) + "\n")
    ds = RLHFDataset([pq, jl], tok, config={"prompt_key": "question", "max_prompt_length": 64})
    assert len(ds) == 3 and ds[0]["prompt"] == "one?" and ds[2]["answer"] == "3" and ds[2]["index"] == 2
    expected = tok.apply_chat_template([{"role": "user", "content": "three?"}], add_generation_prompt=True)
    expected = expected["input_ids"] if isinstance(expected, dict) or hasattr(expected, "keys") else expected
    assert ds[2]["input_ids"].tolist() == list(expected)
    with pytest.raises(ValueError, match=r"row 0 has no 'prompt' field .*set config prompt_key"):
        RLHFDataset(pq)
    with pytest.raises(ValueError, match=r"prompt has \d+ tokens > max_prompt_length 3"):
        RLHFDataset(pq, tok, config={"prompt_key": "question", "max_prompt_length": 3})[0]
    assert len(RLHFDataset(pq, tok, config={"prompt_key": "question", "max_prompt_length": 3,
                                            "truncation": "left"})[0]["input_ids"]) == 3
    with pytest.raises(ValueError, match=r"unsupported file type '.csv'"):
        (tmp_path / "c.csv").write_text("x")
        RLHFDataset(tmp_path / "c.csv")


def test_collate_fn_left_pads_and_gathers():
    out = collate_fn([{"input_ids": torch.tensor([1, 2, 3]), "tag": "a"},
                      {"input_ids": torch.tensor([4]), "tag": {"k": 1}}])
    assert out["input_ids"].tolist() == [[1, 2, 3], [0, 0, 4]]
    assert isinstance(out["tag"], np.ndarray) and out["tag"].dtype == object and out["tag"][1] == {"k": 1}


def _episode(prompt, response, mask, group, score=None):
    ep = Episode(group_id=group, env_seed=0, score=score, actions=["a"], rewards=[1.0], infos=[{}],
                 messages=[{"role": "system", "content": "s"}, {"role": "user", "content": "u"}])
    ep.append_tokens(prompt, trained=False, logprobs=None, turn=-1)
    ep.prompt_length = len(prompt)
    for tok, m in zip(response, mask):
        ep.append_tokens([tok], trained=bool(m), logprobs=[-0.5] if m else None, turn=0)
    return ep


def test_dataproto_from_batch_verl_layout():
    eps = [_episode([5, 6, 7], [8, 9], [1, 1], "g0", 1.0), _episode([5], [10, 11, 12], [1, 0, 1], "g1", 2.0)]
    batch = TrajectoryBatch(eps)
    batch.set("advantages", torch.arange(10, dtype=torch.float32).reshape(2, 5))  # (B, T)
    data = DataProto.from_batch(batch, pad_token_id=0)
    b = data.batch
    assert len(data) == len(b) == 2
    assert b["prompts"].tolist() == [[5, 6, 7], [0, 0, 5]]            # left-padded
    assert b["responses"].tolist() == [[8, 9, 0], [10, 11, 12]]       # right-padded
    assert b["response_mask"].tolist() == [[1, 1, 0], [1, 0, 1]]
    assert b["input_ids"].tolist() == [[5, 6, 7, 8, 9, 0], [0, 0, 5, 10, 11, 12]]
    assert b["attention_mask"].tolist() == [[1, 1, 1, 1, 1, 0], [0, 0, 1, 1, 1, 1]]
    assert b["position_ids"].tolist() == [[0, 1, 2, 3, 4, 0], [0, 0, 0, 1, 2, 3]]
    assert b["advantages"].tolist() == [[3.0, 4.0, 0.0], [6.0, 7.0, 8.0]]  # response part of (B, T)
    assert b["rollout_log_probs"].tolist() == [[-0.5, -0.5, 0.0], [-0.5, 0.0, -0.5]]
    nt = data.non_tensor_batch
    assert list(nt["uid"]) == ["g0", "g1"] and list(nt["score"]) == [1.0, 2.0] and nt["episode"][1] is eps[1]
    row = data[1]
    assert row.batch["responses"].tolist() == [[10, 11, 12]] and list(row.non_tensor_batch["uid"]) == ["g1"]
    with pytest.raises(KeyError, match=r"'nope' is not in this batch"):
        b["nope"]
    with pytest.raises(ValueError, match="disagree on the batch size"):
        DataProto({"x": torch.zeros(2, 1)}, {"y": ["a"]})


def test_ray_rollout_worker_plays_dataset_items_locally(tiny_model_path):
    # The Ray rollout worker is a plain class; run in this process it gets `dataset=` items
    # (EpisodeSpecs) from the controller exactly as the single-process rollout does.
    from workbench.config import ConfigStore
    from workbench.distributed.rollout_workers import RolloutWorker

    config = ConfigStore()
    config.model.model_name, config.model.dtype = str(tiny_model_path), "float32"
    config.inference.max_tokens, config.inference.max_turns = 4, 1
    threads = torch.get_num_threads()
    try:
        worker = RolloutWorker(config, Echo({"max_steps": 2}))
        specs = [EpisodeSpec(seed=3, index=0, params={"k": 5}), EpisodeSpec(seed=4, index=1, prompt="Plain.")]
        events = list(worker.run([0, 1], specs, None, 0))
    finally:
        torch.set_num_threads(threads)  # the worker set its Ray actor's thread count, here in this process
    episodes = {i: payload[0] for kind, i, payload in events if kind == "episode"}
    assert episodes[0].messages[1]["content"] == "obs 5 seed 3" and episodes[0].group_id == "item0:seed3"
    assert episodes[1].messages[1]["content"] == "Plain." and episodes[1].env_seed == 4
