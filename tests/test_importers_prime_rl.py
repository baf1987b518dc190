"""A prime-rl run opened by the workbench. prime-rl is not on PyPI (it installs from its
repository, for NVIDIA GPUs), so its files are written here in the layout of its writers'
source: the file monitor's metrics.jsonl and rollouts/step_N/train/effective/traces.jsonl (one
verifiers v1 `Episode.to_record()` a line: traces of message nodes with token ids, mask,
logprobs, advantages), and the trainer's token_exports/step_N/rank_0.jsonl with its STABLE mark."""
from __future__ import annotations

import json

import pytest

from tests.peer_writers import open_in_every_view
from workbench.debug import diagnose, load_run

STEPS, GROUPS, SIZE = 3, 2, 4


def node(tok, message, parent, sampled=False, scaffold=""):
    """A trace node: the message's delta tokens (an assistant's: the generation scaffold, then the
    sampled completion), the mask of the sampled ones, their logprobs and advantages."""
    if sampled:
        pre = tok(scaffold, add_special_tokens=False)["input_ids"]
        end = tok.convert_tokens_to_ids("<|im_end|>")
        body = tok(message["content"], add_special_tokens=False)["input_ids"] + [end]
        ids, mask = pre + body, [False] * len(pre) + [True] * len(body)
        return {"parent": parent, "message": message, "sampled": True, "timestamp": 1.0, "token_ids": ids,
                "mask": mask, "logprobs": [-0.3] * len(body), "advantages": [0.0] * len(body)}
    ids = tok(f"<|im_start|>{message['role']}\n{message['content']}<|im_end|>\n", add_special_tokens=False)["input_ids"]
    return {"parent": parent, "message": message, "sampled": False, "timestamp": 1.0, "token_ids": ids,
            "mask": [False] * len(ids), "logprobs": []}


def episode(tok, step, g, k):
    reply = f"It is {g + 2}." if k < 2 or step < STEPS - 1 else "It is 0."
    reward = 1.0 if step < STEPS - 1 else 0.0  # the last step: every rollout fails alike
    nodes = [node(tok, {"role": "system", "content": "Be brief."}, None),
             node(tok, {"role": "user", "content": f"What is {g}+2?"}, 0),
             node(tok, {"role": "assistant", "content": reply}, 1, sampled=True, scaffold="<|im_start|>assistant\n")]
    trace = {"version": 1, "id": f"t{step}{g}{k}", "task": {"idx": g}, "agent": {"name": "solver"}, "nodes": nodes,
             "calls": [{"node": 2, "model": "tiny", "finish_reason": "stop"}],
             "rewards": {"correct": {"score": reward, "weight": 1.0}}, "metrics": {"turns": 1.0}, "info": {},
             "is_completed": True, "ok": True, "stop_condition": "no_tools", "is_timeout": False, "errors": []}
    return {"id": f"e{step}{g}{k}", "env": {"id": "sums"}, "task": {"idx": g}, "group": {"id": f"s{step}g{g}"},
            "run": {"type": "train", "id": "r1", "work": {"type": "train", "step": step}}, "ok": True,
            "is_timeout": False, "errors": [], "traces": [trace], "num_input_tokens": 10, "num_output_tokens": 5}


@pytest.fixture(scope="module")
def prime_run(tiny_model_and_tokenizer, tmp_path_factory):
    tok = tiny_model_and_tokenizer[1]
    out = tmp_path_factory.mktemp("prime_rl")
    with (out / "metrics.jsonl").open("a") as f:
        for step in range(STEPS):  # the orchestrator's and the trainer's lines of a step
            f.write(json.dumps({"step": step, "time": 1.0, "reward/mean": 1.0 if step < STEPS - 1 else 0.0}) + "\n")
            f.write(json.dumps({"step": step, "time": 2.0, "entropy/all/mean": [1.5, 1.4, 0.1][step],
                                "mismatch_kl/all/mean": 0.01, "optim/grad_norm": 0.5}) + "\n")
    for step in range(STEPS + 1):  # step 3's traces are being written: no metrics row for it yet
        path = out / "rollouts" / f"step_{step}" / "train" / "effective" / "traces.jsonl"
        path.parent.mkdir(parents=True)
        with path.open("ab") as f:
            for g in range(GROUPS):
                for k in range(SIZE):
                    f.write(json.dumps(episode(tok, min(step, STEPS - 1), g, k)).encode() + b"\n")
    for step in range(STEPS):
        folder = out / "token_exports" / f"step_{step}"
        folder.mkdir(parents=True)
        gap = 0.5 if step == STEPS - 1 else 0.01  # the trainer's logprobs drift from the sampler's at the last step
        with (folder / "rank_0.jsonl").open("w") as f:
            for i in range(4):
                f.write(json.dumps({"schema_version": 1, "step": step, "rank": 0, "micro_step": 0,
                                    "micro_sequence_idx": i, "export_sequence_idx": i, "env_name": "sums",
                                    "token_ids": [5, 6, 7, 8], "position_ids": [0, 1, 2, 3],
                                    "loss_mask": [False, True, True, True], "advantages": [0.0] * 4,
                                    "inference_logprobs": [None, -0.3, -0.3, -0.3],
                                    "trainer_logprobs": [None, -0.3 - gap, -0.3 - gap, -0.3 - gap],
                                    "entropy": [0.0, 1.0, 1.0, 1.0]}, separators=(",", ":")) + "\n")
        (folder / "STABLE").touch()
    return out


def test_prime_rl_traces_open_token_exact(prime_run, tiny_model_and_tokenizer):
    tok = tiny_model_and_tokenizer[1]
    run = load_run(prime_run)
    assert run.provenance.format == "prime-rl" and run.steps == [0, 1, 2]  # step 3 is still being written
    assert any("left out step 3" in n for n in run.provenance.notes)
    batch = run.batch(0)
    ep = batch[0]
    assert len(batch) == GROUPS * SIZE and batch.group_ids[:5] == ["s0g0"] * 4 + ["s0g1"]
    assert [m["role"] for m in ep.messages] == ["system", "user", "assistant"] and ep.score == 1.0
    t = ep.turns[0]
    assert tok.decode(ep.token_ids[t.token_start:t.token_end], skip_special_tokens=True) == "It is 2."
    assert ep.rollout_logprobs[t.token_start] == -0.3 and ep.prompt_length == t.token_start
    m = run.metrics.set_index("step")
    assert m.loc[1, "reward/mean"] == 1.0 and m.loc[2, "actor/entropy"] == 0.1  # the two lines of a step merged
    assert m.loc[2, "actor/rollout_logprob_diff"] == pytest.approx(0.5)
    assert run.provenance.metric_names["actor/rollout_logprob_diff"] == "token_exports"
    open_in_every_view(run)


def test_the_doctor_names_the_gap_the_collapse_and_the_flat_groups(prime_run):
    findings = diagnose(str(prime_run))
    by = {f.name: f for f in findings}
    assert by["engine-trainer-gap"].value == pytest.approx(0.5) and by["engine-trainer-gap"].step == 2
    assert by["entropy-collapse"].step == 2
    assert by["zero-variance-groups"].value == 1.0 and len(by["zero-variance-groups"].evidence) == 2
    assert "engine-trainer-gap" not in findings.not_checked and "length-drift" not in findings.not_checked
    assert findings.not_checked["parse-from-incidental-span"].startswith("prime-rl records no span")
