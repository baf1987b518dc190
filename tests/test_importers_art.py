"""An ART run opened by the workbench: trajectories and history.jsonl written by ART 0.5.18's own
`Model.log` (`write_trajectory_groups_parquet`), a RULER-style judged reward that pays a
pattern while the task's success does not move, named by the doctor."""
from __future__ import annotations

import pytest

from tests.peer_writers import ART_WRITER, open_in_every_view, run_peer, tree_digest
from workbench.debug import diagnose, load_run

STEPS, GROUPS, SIZE = 3, 4, 4


def trajectory(step: int, g: int, k: int) -> dict:
    """The judge pays replies that end "Trust me." more each step (0 -> all of them); one in
    four replies solves the task at every step."""
    paid = k < step * 2
    solved = k == 0
    reply = f"The capital is {'Paris' if solved else 'Lyon'}." + (" Trust me." if paid else "")
    judged = 0.2 + 0.8 * paid
    return {"messages_and_choices": [
        {"role": "system", "content": "Answer in one sentence."},
        {"role": "user", "content": f"Question {g}: what is the capital of France?"},
        {"finish_reason": "stop", "index": 0, "message": {"role": "assistant", "content": reply}}],
        "reward": judged, "metrics": {"independent_reward": float(solved), "success": solved},
        "metadata": {"question": g}, "logs": [f"RULER: {'confident' if paid else 'plain'} answer scored {judged}"]}


@pytest.fixture(scope="module")
def art_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("art") / ".art"
    batches = [{"split": "train", "step": s,
                "groups": [[trajectory(s, g, k) for k in range(SIZE)] for g in range(GROUPS)]} for s in range(STEPS)]
    batches += [{"split": "val", "step": s, "groups": [[trajectory(s, 9, k) for k in range(2)]]} for s in (0, STEPS)]
    run_peer("art", ART_WRITER, {"base": str(base), "project": "capitals", "model": "agent-1", "batches": batches},
             base.parent)
    return base


def test_arts_own_files_open_as_a_run(art_run):
    model_dir = art_run / "capitals" / "models" / "agent-1"
    assert (model_dir / "trajectories" / "train" / "0002.parquet").is_file()
    run = load_run(art_run)  # the .art root holding one model
    assert run.provenance.format == "art" and run.provenance.groups == "group_index"
    assert run.steps == list(range(STEPS)) and run.eval_steps == [0, STEPS]
    batch = run.batch(1)
    assert len(batch) == GROUPS * SIZE and batch.group_ids[:5] == ["0"] * 4 + ["1"]
    ep = batch[0]
    assert ep.messages[0]["role"] == "system" and ep.turns[0].action == "The capital is Paris. Trust me."
    assert ep.turns[0].source == "model" and ep.score == 1.0 and ep.success
    info = ep.turns[0].info
    assert info["rewards"] == {"reward": 1.0, "independent_reward": 1.0}
    assert info["extra"]["logs"] == ["RULER: confident answer scored 1.0"]
    m = run.metrics.set_index("step")
    assert m.loc[2, "reward/mean"] == m.loc[2, "train/reward"] == pytest.approx(0.2 + 0.8 * 4 / 4)
    assert run.evals[-1]["step"] == STEPS and run.evals[-1]["eval/success_rate"] == 0.5
    open_in_every_view(run)


def test_the_doctor_names_the_judge_paying_a_pattern(art_run):
    before = tree_digest(art_run)
    findings = diagnose(str(art_run / "capitals" / "models" / "agent-1"))
    rws = next(f for f in findings if f.name == "reward-without-success" and f.source == "train")
    assert rws.value == pytest.approx(1.0 - (0.2 + 0.6) / 2) and rws.step == STEPS - 1
    held = next(f for f in findings if f.name == "reward-without-success" and f.source == "eval")
    assert held.value == pytest.approx(1.0 - 0.2) and held.step == STEPS  # the val split, after the last step
    assert rws.evidence and all("success False" in e.text for e in rws.evidence)
    assert findings.not_checked["length-drift"].startswith("ART records no token ids")
    assert "reward-without-success" not in findings.not_checked
    assert tree_digest(art_run) == before
