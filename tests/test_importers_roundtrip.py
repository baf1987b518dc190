"""The round trip: a workbench run, exported with `export-verl`, its steps written back the way
verl dumps them (verl 0.9.1's own `_write_generations` and `FileLogger`), then imported: the
doctor's findings equal the original run's for every check both have data for."""
from __future__ import annotations

import json

import pandas as pd
import pytest

from tests.doctor_policies import count_up_from_4, roll_steps
from tests.peer_writers import VERL_WRITER, run_peer
from tests.test_doctor_checks import diverse
from workbench import ConfigStore
from workbench.cli import main
from workbench.debug import compare_runs, diagnose, load_run

ENTROPY = [2.0, 1.9, 1.8, 0.1]


@pytest.fixture(scope="module")
def original(tiny_model_and_tokenizer, tmp_path_factory):
    """A single-turn guess_number run in the contract layout: three steps of varied sentences,
    then the counting trick, the update's entropy falling at the end (tests/test_doctor_run.py's
    way of writing a run, with scripted policies on the real environment and tokenizer)."""
    tok = tiny_model_and_tokenizer[1]
    run = tmp_path_factory.mktemp("workbench_run")
    config = ConfigStore()
    config.inference.max_turns, config.environment.max_steps = 1, 4
    config.environment.params = {"low": 1, "high": 8}
    config.save(run / "config.yaml")
    steps = roll_steps(tok, "guess_number", [diverse, diverse, diverse, count_up_from_4], groups=8, group_size=4,
                       low=1, high=8, max_steps=4, max_turns=1)
    rows = []
    for step, batch in enumerate(steps):
        batch.save(run / "rollouts" / f"step_{step:06d}.jsonl.gz")
        rows.append({"step": step, **batch.summary(), "actor/entropy": ENTROPY[step]})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    return run, tok


def verl_dump(batch, tok, step, folder):
    """What verl's `_log_rollout_data` hands `_write_generations` for this batch of a single-turn
    task: the prompt ids and the sampled response ids decoded with skip_special_tokens (the
    environment's feedback after the reply, which the workbench rollout records, is no part of a
    single-turn verl response), the summed scores, the ground truth (the seed, as export-verl's
    dataset gives it)."""
    inputs, outputs = [], []
    for ep in batch:
        turn = ep.turns[0]
        inputs.append(tok.decode(ep.token_ids[:turn.token_start], skip_special_tokens=True))
        outputs.append(tok.decode(ep.token_ids[turn.token_start:turn.token_end], skip_special_tokens=True))
    return {"dir": str(folder), "step": step + 1, "inputs": inputs, "outputs": outputs,
            "gts": [str(ep.env_seed) for ep in batch], "scores": [ep.outcome for ep in batch], "extra": {}}


def test_export_verl_then_verls_dump_then_import_gives_the_same_findings(original, tmp_path):
    run_dir, tok = original
    exported = tmp_path / "verl_job"
    assert main(["export-verl", "--config", str(run_dir / "config.yaml"), "--out", str(exported),
                 "--val-size", "1", "--train-size", "4"]) == 0
    data = pd.read_parquet(exported / "train.parquet")
    run = load_run(run_dir)
    first = run.batch(0)[0]
    # the exported job is the same task: its prompt is the episode's opening, its ground truth the seed
    assert data.iloc[0]["prompt"][-1]["content"] == first.messages[1]["content"]
    assert data.iloc[1]["reward_model"]["ground_truth"] == "1"

    dumps = exported / "rollout_dump"
    spec = {"dumps": [verl_dump(run.batch(s), tok, s, dumps) for s in run.steps],
            "metrics": [{"step": int(r["step"]) + 1, "data": {"critic/score/mean": r["reward/mean"],
                                                             "actor/entropy": r["actor/entropy"]}}
                        for r in run.metrics.to_dict("records")],
            "metrics_path": str(exported / "metrics.jsonl")}
    run_peer("verl", VERL_WRITER, spec, tmp_path)
    out = tmp_path / "imported"
    assert main(["import", str(exported), "--output", str(out)]) == 0
    back = load_run(out)
    assert back.steps == run.steps and [e.turns[0].action for e in back.batch(3)] == \
        [e.turns[0].action for e in run.batch(3)]

    before, after = diagnose(run), diagnose(back)
    both = [name for name in {f.name for f in before} | {f.name for f in after} if name not in after.not_checked]
    assert {"template-collapse", "zero-variance-groups", "entropy-collapse"} <= set(both)

    def key(findings):
        return {f.name: (f.fired, round(f.value, 9), f.step, [e.episode_id for e in f.evidence])
                for f in findings if f.name in both}

    assert key(after) == key(before)
    # what the dump cannot carry is listed, not passed: no success, no spans, no token ids
    assert {"reward-without-success", "parse-from-incidental-span", "length-drift"} <= set(after.not_checked)
    # compare: the workbench run against its verl twin, the same task though verl names none
    cmp = compare_runs(run_dir, out)
    assert {c.name for c in cmp.findings["persisting"]} >= {"template-collapse", "zero-variance-groups",
                                                              "entropy-collapse"}
    assert any("imported from verl" in n for n in cmp.notices)
    assert list(cmp.curves[cmp.curves["run"] == "B"]["reward/mean"]) == list(run.metrics["reward/mean"])
