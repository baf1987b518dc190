"""A verl run opened by the workbench: dumps written by verl 0.9.1's own writer
(`RayPPOTrainer._write_generations`, `FileLogger`), read in place and imported, with planted
pathologies the doctor must name, and the checks verl's files cannot feed listed as not checked."""
from __future__ import annotations

import shutil

import pytest

from tests.peer_writers import VERL_WRITER, open_in_every_view, run_peer, tree_digest
from workbench.cli import main
from workbench.debug import RunError, diagnose, load_run

GROUPS, SIZE, STEPS = 8, 4, 6
PROMPT = "system\nReply with the sum.\nuser\nWhat is {a}+{b}?\nassistant\n"


def rollout(step: int, g: int, k: int) -> tuple[str, str, bool, bool]:
    """(input, output, acc, pattern) of rollout k of group g at 0-based step `step`: the share of
    replies in the paid pattern "Answer: N" grows 0 -> 1 over the steps (short replies), the rest
    reason at length; one in four replies is right, and at the last step only group 0's."""
    a, b = g + 2, 3
    pattern = (g * SIZE + k) < round(GROUPS * SIZE * step / (STEPS - 1))
    right = k == 0 and (step < STEPS - 1 or g == 0)
    guess = a + b if right else a + b + 1
    if pattern:
        out = f"Answer: {guess}"
    else:
        out = (f"Let me think about {a} plus {b} step by step. First I take {a}, then I count {b} more, "
               f"one at a time, and I check the count twice before I say it, so the sum is {guess}.")
    return PROMPT.format(a=a, b=b), out, right, pattern


def dump(step: int, folder: str, uid: bool = False) -> dict:
    rows = [rollout(min(step, STEPS - 1), g, k) for g in range(GROUPS) for k in range(SIZE)]
    extra = {"acc": [r[2] for r in rows], "pred": [r[1][-2:] for r in rows]}
    if uid:
        extra["uid"] = [f"u{i // SIZE}" for i in range(len(rows))]
    return {"dir": folder, "step": step + 1, "inputs": [r[0] for r in rows], "outputs": [r[1] for r in rows],
            "gts": [str(int(r[0].split("is ")[1].split("+")[0]) + 3) for r in rows],
            "scores": [float(r[2]) + 1.0 * r[3] for r in rows], "extra": extra}


@pytest.fixture(scope="module")
def verl_runs(tmp_path_factory):
    """Two verl runs written by verl's code: `main` (rollout dumps of 6 steps, validation dumps at
    steps 0 and 6, the file logger's metrics) and `uid` (a dump whose reward returned a uid)."""
    root = tmp_path_factory.mktemp("verl")
    main_dir, uid_dir = root / "main", root / "uid"
    dumps = [dump(s, str(main_dir / "rollout")) for s in range(STEPS)]
    for verl_step in (0, STEPS):  # validation before training and after the last step (4 rows each)
        d = dump(min(verl_step, STEPS - 1), str(main_dir / "validation"))
        d = {**{k: (v[:4] if isinstance(v, list) else v) for k, v in d.items()}, "step": verl_step,
             "extra": {k: v[:4] for k, v in d["extra"].items()}}
        dumps.append(d)
    dumps += [{**dump(s, str(uid_dir / "rollout"), uid=True)} for s in range(2)]
    metrics = [{"step": 0, "data": {"val-core/sum/reward/mean@1": 0.25}}]
    for s in range(STEPS):
        scores = dumps[s]["scores"]
        metrics.append({"step": s + 1, "data": {"critic/score/mean": sum(scores) / len(scores),
                                                "actor/entropy": [1.2, 1.0, 0.8, 0.5, 0.2, 0.05][s],
                                                "actor/pg_clipfrac": 0.01, "response_length/mean": 40.0 - 6 * s,
                                                "timing_s/gen": 3.0}})
    run_peer("verl", VERL_WRITER, {"dumps": dumps, "metrics": metrics,
                                   "metrics_path": str(main_dir / "metrics.jsonl")}, root)
    return {"main": main_dir, "uid": uid_dir}


def test_verls_own_dump_opens_as_a_run(verl_runs):
    run = load_run(verl_runs["main"])
    assert run.provenance.format == "verl" and run.steps == list(range(STEPS)) and run.eval_steps == [0, STEPS]
    batch = run.batch(0)
    assert len(batch) == GROUPS * SIZE and len(set(batch.group_ids)) == GROUPS
    ep = batch[1]
    text_in, text_out, acc, pattern = rollout(0, 0, 1)
    assert ep.messages == [{"role": "prompt", "content": text_in}, {"role": "assistant", "content": text_out}]
    assert ep.turns[0].action == text_out and ep.score == float(acc) + 1.0 * pattern
    assert ep.turns[0].info["success"] is acc and ep.turns[0].info["extra"]["gts"] == "5"
    assert ep.recorded_as_text and not ep.token_ids and ep.turns[0].finish_reason == "unknown"
    # the metrics: verl's names kept, the workbench's beside them, verl's step S is step S - 1
    m = run.metrics.set_index("step")
    assert m.loc[2, "reward/mean"] == m.loc[2, "critic/score/mean"] and m.loc[2, "source_step"] == 3
    assert m.loc[5, "actor/entropy"] == 0.05 and run.provenance.metric_names["reward/mean"] == "critic/score/mean"
    assert m.loc[0, "env/success_rate"] == 0.25  # from the batches' acc: verl logs no success rate
    assert run.evals[0]["step"] == 0 and len(run.eval_batch(STEPS)) == 4
    assert "same prompt and ground truth" in run.provenance.groups
    assert "not recorded" in run._summary() and "verl" in repr(run)
    open_in_every_view(run)


def test_groups_come_from_the_uid_when_the_dump_has_one(verl_runs):
    run = load_run(verl_runs["uid"])
    assert run.provenance.groups == "uid" and run.batch(1).group_ids[:5] == ["u0"] * 4 + ["u1"]
    assert run.provenance.absent["metrics"].startswith("verl records no metrics file")


def test_the_doctor_names_the_planted_pathologies_and_what_it_could_not_check(verl_runs):
    findings = diagnose(str(verl_runs["main"]))
    by = {(f.name, f.source): f for f in findings}
    rws = by[("reward-without-success", "train")]  # the "Answer: N" pattern pays, success does not move
    assert rws.value == pytest.approx(1 + 1 / 32 - (0.25 + 0.25 + 6 / 32) / 2) and rws.step == STEPS - 1
    assert all("success False" in e.text for e in rws.evidence)
    flat = by[("zero-variance-groups", "train")]  # at the last step only group 0 has a right answer
    assert flat.value == 7 / 8 and flat.evidence[0].text.startswith("group p1: all 4 rewards +1.000")
    collapse = by[("entropy-collapse", "train")]  # from verl's actor/entropy
    assert collapse.step == STEPS - 1 and collapse.evidence and collapse.evidence[0].text == "Answer: 7"
    missing = findings.not_checked
    assert missing["length-drift"].startswith("verl records no token ids; import with --model")
    assert missing["engine-trainer-gap"] == "verl records no actor/rollout_logprob_diff metric"
    assert missing["repetition-to-limit"].startswith("verl records no finish reasons")
    assert "reward-without-success" not in missing and "zero-variance-groups" not in missing


def test_import_writes_a_run_folder_and_leaves_the_source_as_it_was(verl_runs, tmp_path, capsys):
    before = tree_digest(verl_runs["main"])
    out = tmp_path / "runs" / "verl"
    assert main(["import", str(verl_runs["main"]), "--output", str(out), "--task", "sums"]) == 0
    printed = capsys.readouterr().out
    assert f"{STEPS} steps, {STEPS * GROUPS * SIZE} episodes, 2 held-out batches imported from verl" in printed
    assert "verl records no sampling logprobs" in printed
    assert tree_digest(verl_runs["main"]) == before
    imported, direct = load_run(out), load_run(verl_runs["main"])
    assert imported.config.environment.name == "sums" and imported.provenance.format == "verl"
    assert [e.to_dict() for e in imported.batch(3)] == [e.to_dict() for e in direct.batch(3)]
    a, b = diagnose(imported), diagnose(direct)
    assert [(f.name, f.value, f.step, [e.episode_id for e in f.evidence]) for f in a] == \
        [(f.name, f.value, f.step, [e.episode_id for e in f.evidence]) for f in b]
    assert a.not_checked == b.not_checked
    assert main(["diagnose", str(out)]) == 0
    assert "not checked: length-drift: verl records no token ids" in capsys.readouterr().out


def test_with_a_model_the_text_is_tokenized_and_length_drift_is_checked(verl_runs, tiny_model_path, tmp_path):
    from workbench.widgets import TokenView

    run = load_run(verl_runs["main"], model=str(tiny_model_path))
    batch = run.batch(0)
    ep = batch[1]
    assert ep.token_ids and ep.response_length and ep.turns[0].token_end > ep.turns[0].token_start
    tok = run.tokenizer()
    assert tok.decode(ep.token_ids[ep.turns[0].token_start:ep.turns[0].token_end]) == ep.turns[0].action
    assert batch.has("recomputed_logprobs") and batch.has("recomputed_entropy")
    lp = batch.tensors["recomputed_logprobs"][1]
    assert (lp[batch.tensors["loss_mask"][1] > 0] < 0).all() and (lp[batch.tensors["loss_mask"][1] == 0] == 0).all()
    findings = diagnose(run)
    drift = next(f for f in findings if f.name == "length-drift")
    assert drift.value < 0.5 and "length-drift" not in findings.not_checked
    view = TokenView(run, step=0, field="recomputed_logprobs")
    assert "recomputed, not sampled" in view.html


def test_a_run_still_being_written_and_damaged_lines(verl_runs, tmp_path):
    live = tmp_path / "live"
    shutil.copytree(verl_runs["main"], live)
    last = live / "rollout" / f"{STEPS}.jsonl"
    text = last.read_bytes()
    last.write_bytes(text[: len(text) // 2])  # verl is writing the newest step: it ends mid-line
    run = load_run(live)
    assert run.steps == list(range(STEPS - 1))
    middle = live / "rollout" / "3.jsonl"
    lines = middle.read_text().splitlines(keepends=True)
    middle.write_text("".join(lines[:5]) + lines[5][:40] + "\n" + "".join(lines[6:]))  # one damaged line
    run = load_run(live)
    batch = run.batch(2)
    assert len(batch) == GROUPS * SIZE - 1
    assert run.source.skipped.count >= 1 and run.source.skipped.first.startswith("rollout/3.jsonl line 6: ")


def test_folders_it_cannot_read_get_one_line(tmp_path, capsys):
    (tmp_path / "notes.txt").write_text("hello")
    with pytest.raises(RunError, match="not a run folder any reader knows .*verl: .*trl: .*prime-rl"):
        load_run(tmp_path)
    assert main(["import", str(tmp_path), "--output", str(tmp_path.parent / "x")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("import: ") and err.count("\n") == 1 and "verl" in err
    assert main(["import", str(tmp_path / "nope"), "--output", str(tmp_path.parent / "y")]) == 2
    assert "no such file or folder" in capsys.readouterr().err
