"""verifiers' evaluation results opened by the workbench: results.jsonl and metadata.json written
by verifiers 0.3.1's own writer (`state_to_output`, `save_outputs`, `save_metadata`), with the
trajectory column's token ids used as recorded."""
from __future__ import annotations

import pytest

from tests.peer_writers import VERIFIERS_WRITER, open_in_every_view, run_peer, tree_digest
from workbench.debug import diagnose, load_run

EXAMPLES, PER = 4, 4


def rollouts(tok):
    """Rollouts of EXAMPLES questions, PER each, two model calls per rollout (a tool result
    between): every rollout of an example gets the same reward (a planted dead signal), and
    examples 2 and 3's replies loop "Answer: 12 " until the token limit."""
    out = []
    for i in range(EXAMPLES * PER):
        ex = i // PER
        prompt = [{"role": "system", "content": "Use the calculator."}, {"role": "user", "content": f"What is {ex}*3?"}]
        first = {"role": "assistant", "content": f"calc({ex}*3)"}
        tool = {"role": "tool", "content": str(ex * 3), "tool_call_id": "c1"}
        final = "Answer: 12 " * 6 if ex >= 2 else f"The answer is {ex * 3} ({i % PER})."
        second = {"role": "assistant", "content": final}
        p1 = tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        ids1 = tok(p1, add_special_tokens=False)["input_ids"]
        c1 = tok(first["content"], add_special_tokens=False)["input_ids"] + [tok.convert_tokens_to_ids("<|im_end|>")]
        p2 = tok.apply_chat_template(prompt + [first, {"role": "user", "content": tool["content"]}],
                                     add_generation_prompt=True, tokenize=False)
        ids2 = tok(p2, add_special_tokens=False)["input_ids"]
        c2 = tok(final, add_special_tokens=False)["input_ids"]
        steps = [{"prompt": prompt, "completion": [first], "response": None, "reward": None, "advantage": 0.0,
                  "is_truncated": False, "trajectory_id": f"t{i}", "extras": {},
                  "tokens": {"prompt_ids": ids1, "prompt_mask": [0] * len(ids1), "completion_ids": c1,
                             "completion_mask": [1] * len(c1), "completion_logprobs": [-0.25] * len(c1),
                             "overlong_prompt": False, "is_truncated": False, "routed_experts": None}},
                 {"prompt": prompt + [first, tool], "completion": [second], "response": None, "reward": None,
                  "advantage": 0.0, "is_truncated": ex >= 2, "trajectory_id": f"t{i}", "extras": {},
                  "tokens": {"prompt_ids": ids2, "prompt_mask": [0] * len(ids2), "completion_ids": c2,
                             "completion_mask": [1] * len(c2), "completion_logprobs": [-0.5] * len(c2),
                             "overlong_prompt": False, "is_truncated": ex >= 2, "routed_experts": None}}]
        reward = float(ex % 2)
        out.append({"state": {"example_id": ex, "prompt": prompt, "completion": [first, tool, second],
                              "answer": str(ex * 3), "info": {}, "reward": reward, "metrics": {"correct": reward},
                              "is_completed": True, "is_truncated": ex >= 2, "trajectory": steps}})
    return out


@pytest.fixture(scope="module")
def results(tiny_model_and_tokenizer, tmp_path_factory):
    root = tmp_path_factory.mktemp("vf")
    folder = root / "evals" / "calc--tiny"
    metadata = {"env_id": "calc", "env_args": {}, "model": "tiny", "base_url": "http://127.0.0.1:1",
                "num_examples": EXAMPLES, "rollouts_per_example": PER, "sampling_args": {}, "time": 1.0,
                "avg_reward": 0.5, "avg_metrics": {}, "avg_error": 0.0, "pass_at_k": {}, "pass_all_k": {},
                "pass_threshold": 0.5, "usage": None, "state_columns": ["trajectory"], "tools": None}
    run_peer("verifiers", VERIFIERS_WRITER, {"rollouts": rollouts(tiny_model_and_tokenizer[1]),
                                             "state_columns": ["trajectory"], "metadata": metadata,
                                             "dir": str(folder)}, root)
    return folder


def test_verifiers_results_open_token_exact(results, tiny_model_and_tokenizer):
    tok = tiny_model_and_tokenizer[1]
    run = load_run(results)
    p = run.provenance
    assert p.format == "verifiers" and p.version and p.groups == "example_id" and run.steps == [0]
    assert run.config.environment.name == "calc"
    batch = run.batch(0)
    assert len(batch) == EXAMPLES * PER and len(set(batch.group_ids)) == EXAMPLES
    ep = batch[0]
    assert [t.action for t in ep.turns] == ["calc(0*3)", "The answer is 0 (0)."]
    assert ep.turns[0].tool_calls == [] and ep.turns[0].observation == "0" and ep.score == 0.0
    # the ids as recorded: the second call's prompt extends the first call's ids
    assert tok.decode(ep.token_ids[ep.turns[1].token_start:ep.turns[1].token_end]) == "The answer is 0 (0)."
    assert ep.rollout_logprobs[ep.turns[0].token_start] == -0.25 and ep.rollout_logprobs[0] == 0.0
    assert ep.response_length == sum(ep.loss_mask) and not ep.segments
    assert batch.has("advantages") and batch[12].turns[1].finish_reason == "length"
    assert "token_ids" not in p.absent and "logprobs" not in p.absent
    open_in_every_view(run)


def test_the_doctor_names_the_loop_and_the_flat_groups(results):
    before = tree_digest(results)
    findings = diagnose(str(results))
    by = {f.name: f for f in findings}
    loop = by["repetition-to-limit"]
    assert loop.value == 8 / 32 and all(e.episode_id >= 8 and e.turn == 1 for e in loop.evidence)
    flat = by["zero-variance-groups"]
    assert flat.value == 1.0 and len(flat.evidence) == 3
    assert findings.not_checked["reward-without-success"].startswith("verifiers records no success signal")
    assert findings.not_checked["entropy-collapse"].startswith("verifiers records no metrics file")
    assert "length-drift" not in findings.not_checked and "environment-errors" not in findings.not_checked
    assert tree_digest(results) == before


def test_the_token_view_shows_recorded_ids(results, tiny_model_and_tokenizer):
    from workbench.widgets import TokenView

    view = TokenView(load_run(results), tokenizer=tiny_model_and_tokenizer[1], field="rollout_logprobs")
    assert "recomputed" not in view.html and "episode 0" in view.html
    assert set(view.fields) >= {"advantages", "rollout_logprobs", "loss_mask"}
