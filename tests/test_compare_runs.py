"""`compare_runs`, `python -m workbench compare` and `RunComparisonView` on real runs: CLI
runs of the tiny model (two GRPO steps, held-out evaluation before and after on seeds
10000..), trained into tmp folders with one setting changed each.

    A  the baseline                       B  --lr 1e-2 --seed 1 (learning rate and seed differ)
    D  --doctor.min_samples 1000000       (no batch check can fire: A's batch findings are resolved)
    E  --eval-episodes 3                  (held-out seeds 10000-10002 against A's 10000-10003)
    C  --env arithmetic                   (another environment: not comparable)
"""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from workbench.debug import RunComparison, RunError, RunsNotComparable, compare_runs, diagnose, load_run
from workbench.doctor.findings import DoctorConfig
from workbench.trajectory import TrajectoryBatch

REPO = Path(__file__).resolve().parents[1]


def cli_run(model: Path, out: Path, *flags: str, eval_episodes: int = 4) -> Path:
    """Train a run the way `python -m workbench train` does, into `out`."""
    from workbench.cli import build_config, parse_args
    from workbench.cli.runner import train_and_report

    args = parse_args(["train", "--model", str(model), "--steps", "2", "--batch-size", "4", "--group-size", "2",
                       "--max-tokens", "6", "--max-turns", "2", "--lr", "1e-3", "--eval-episodes",
                       str(eval_episodes), "--output", str(out), *flags])
    train_and_report(build_config(args), out, eval_episodes=eval_episodes)
    return out


@pytest.fixture(scope="module")
def runs(tiny_model_path, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("compare")
    return {"A": cli_run(tiny_model_path, tmp / "a"),
            "B": cli_run(tiny_model_path, tmp / "b", "--lr", "1e-2", "--seed", "1"),
            "D": cli_run(tiny_model_path, tmp / "d", "--doctor.min_samples", "1000000"),
            "E": cli_run(tiny_model_path, tmp / "e", eval_episodes=3),
            "C": cli_run(tiny_model_path, tmp / "c", "--env", "arithmetic")}


def keys(findings) -> set[tuple[str, str]]:
    return {(f.name, f.source) for f in findings}


def statuses(cmp: RunComparison) -> dict[str, set[tuple[str, str]]]:
    return {s: {(c.name, c.source) for c in changes} for s, changes in cmp.findings.items()}


def test_the_config_diff_names_exactly_the_changed_fields(runs):
    cmp = compare_runs(runs["A"], runs["B"])
    # output_dir and log_dir differ too (each run writes into its own folder): left out.
    assert cmp.config_diff == {"training.learning_rate": (1e-3, 1e-2), "training.seed": (0, 1)}
    assert compare_runs(runs["A"], runs["D"]).config_diff == {"doctor.min_samples": (4, 1_000_000)}
    same = compare_runs(runs["A"], runs["A"])
    assert same.config_diff == {} and "The configs are the same." in same.to_markdown()
    # Runs given as reopened `Run`s compare the same as their folders.
    again = compare_runs(load_run(runs["A"]), load_run(runs["B"]))
    assert again.config_diff == cmp.config_diff and again.curves.equals(cmp.curves)


def test_the_curves_hold_each_runs_metrics_and_held_out_numbers(runs):
    cmp = compare_runs(runs["A"], runs["B"])
    assert set(cmp.curves["run"]) == {"A", "B"}
    rewards = {label: [json.loads(line)["reward/mean"] for line in (runs[label] / "metrics.jsonl").open()]
               for label in "AB"}
    assert rewards["A"] != rewards["B"]  # B's other seed samples other episodes: the curves can be told apart
    for label in ("A", "B"):
        folder = runs[label]
        metrics = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]
        evals = json.loads((folder / "evals.json").read_text())
        rows = {int(r["step"]): r for r in cmp.curves[cmp.curves["run"] == label].to_dict("records")}
        assert sorted(rows) == sorted({m["step"] for m in metrics} | {e["step"] for e in evals}) == [0, 1, 2]
        for m in metrics:
            assert rows[m["step"]]["reward/mean"] == m["reward/mean"]
            assert rows[m["step"]]["env/success_rate"] == m["env/success_rate"]
        for e in evals:
            assert rows[e["step"]]["eval/success_rate"] == e["eval/success_rate"]
            assert rows[e["step"]]["eval/reward_mean"] == e["eval/reward_mean"]
        assert [s for s, r in rows.items() if r["eval/success_rate"] == r["eval/success_rate"]] == [0, 2]  # not NaN
        assert cmp.final(label) == evals[-1]["eval/success_rate"]
        assert cmp.final(label, "reward/mean") == metrics[-1]["reward/mean"]


def test_findings_are_resolved_persisting_or_new_by_check_and_source(runs):
    fa, fb, fd = (diagnose(runs[k]) for k in "ABD")  # each with its own run's thresholds
    assert ("format-errors", "train") in keys(fa)  # the untrained tiny model's replies do not parse
    assert ("format-errors", "train") not in keys(fd)  # D's thresholds judge no batch
    cmp = compare_runs(runs["A"], runs["D"])
    got = statuses(cmp)
    assert got == {"resolved": keys(fa) - keys(fd), "persisting": keys(fa) & keys(fd), "new": keys(fd) - keys(fa)}
    assert ("format-errors", "train") in got["resolved"]
    change = next(c for c in cmp.findings["resolved"] if c.name == "format-errors" and c.source == "train")
    assert change.b is None and change.a.value >= change.a.threshold and change.status == "resolved"
    back = statuses(compare_runs(runs["D"], runs["A"]))  # the other way round, it is new
    assert back == {"resolved": got["new"], "persisting": got["persisting"], "new": got["resolved"]}
    assert any("doctor thresholds differ (doctor.min_samples)" in n for n in cmp.notices)
    # Judged with one set of thresholds, the same two runs' findings are what that set finds.
    alike = compare_runs(runs["A"], runs["D"], doctor=DoctorConfig())
    fa0, fd0 = keys(diagnose(runs["A"], DoctorConfig())), keys(diagnose(runs["D"], DoctorConfig()))
    assert statuses(alike) == {"resolved": fa0 - fd0, "persisting": fa0 & fd0, "new": fd0 - fa0}
    assert not any("thresholds differ" in n for n in alike.notices)
    # Two runs judged alike, each with findings: the shared ones persist.
    ab = statuses(compare_runs(runs["A"], runs["B"]))
    assert ab["persisting"] == keys(fa) & keys(fb) and ("format-errors", "train") in ab["persisting"]


def by_seed(batch) -> dict[int, dict]:
    return {ep.env_seed: ep.to_dict() for ep in batch}


def test_the_same_held_out_seeds_are_paired(runs, tmp_path):
    cmp = compare_runs(runs["A"], runs["B"])
    a = TrajectoryBatch.load(runs["A"] / "evals" / "step_000002.jsonl.gz")  # the final policies' batches
    b = TrajectoryBatch.load(runs["B"] / "evals" / "step_000002.jsonl.gz")
    assert cmp.eval_steps == (2, 2) and cmp.same_heldout_seeds
    assert [p.seed for p in cmp.pairs] == [10000, 10001, 10002, 10003]
    for p in cmp.pairs:
        assert p.a.env_seed == p.b.env_seed == p.seed
        assert p.a.to_dict() == by_seed(a)[p.seed] and p.b.to_dict() == by_seed(b)[p.seed]
    assert cmp.episodes["seed"].tolist() == [10000, 10001, 10002, 10003]
    assert cmp.episodes["a_success"].tolist() == [bool(by_seed(a)[s]["success"]) for s in range(10000, 10004)]
    # B's held-out batch saved in another order (as an out-of-order rollout could leave it):
    # pairing goes by seed, not by position.
    shuffled = Path(shutil.copytree(runs["B"], tmp_path / "b_shuffled"))
    b.select([2, 0, 3, 1]).save(shuffled / "evals" / "step_000002.jsonl.gz")
    moved = compare_runs(runs["A"], shuffled)
    assert [(p.seed, p.b.env_seed, p.b.to_dict()) for p in moved.pairs] == [
        (s, s, by_seed(b)[s]) for s in range(10000, 10004)]


def test_different_held_out_seeds_are_said_plainly(runs):
    cmp = compare_runs(runs["A"], runs["E"])
    assert not cmp.same_heldout_seeds
    note = next(n for n in cmp.notices if n.startswith("NOT COMPARABLE on held-out episodes"))
    assert "seeds 10000-10003 (4)" in note and "10000-10002 (3)" in note and "3 are shared" in note
    assert [p.seed for p in cmp.pairs] == [10000, 10001, 10002]  # the shared seeds only
    assert f"**Note:** {note}" in cmp.to_markdown()
    assert cmp.config_diff == {}  # --eval-episodes is not a config field: the seeds are the difference


def test_runs_of_different_environments_are_not_compared(runs, capsys):
    with pytest.raises(RunsNotComparable) as err:
        compare_runs(runs["A"], runs["C"])
    message = str(err.value)
    assert "are not comparable" in message and str(runs["A"]) in message and str(runs["C"]) in message
    assert "'guess_number' (envs.guess_number:GuessNumberEnv)" in message
    assert "'arithmetic' (envs.arithmetic:ArithmeticEnv)" in message
    with pytest.raises(RunError, match="no such folder"):
        compare_runs(runs["A"], runs["A"].parent / "nowhere")
    with pytest.raises(TypeError, match="expected a run folder or a Run"):
        compare_runs(runs["A"], 42)


def test_reports_are_readable(runs):
    cmp = compare_runs(runs["A"], runs["B"])
    md = cmp.to_markdown()
    for heading in ("# Run comparison", "## Config differences", "## Results", "## Per step", "## Doctor findings",
                    "## Held-out episodes side by side"):
        assert heading in md
    assert "| training.learning_rate | 0.001 | 0.01 |" in md
    assert "| format-errors | train | persisting |" in md
    assert all(f"| {s} |" in md for s in range(10000, 10004))
    assert cmp.headline() in md and cmp.headline() in repr(cmp) and str(runs["B"]) in repr(cmp)
    page = cmp._repr_html_()
    assert "<table>" in page and "training.learning_rate" in page and str(runs["A"]) in page
    assert cmp.to_markdown(max_episodes=2).count("| both ") + cmp.to_markdown(max_episodes=2).count("| fixed") \
        + cmp.to_markdown(max_episodes=2).count("| broken") == 2


def compare_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "workbench", "compare", *args], capture_output=True, text=True,
                          timeout=300, cwd=REPO)


def test_compare_command_prints_the_report_and_exits_0(runs, tmp_path):
    out = compare_cli(str(runs["A"]), str(runs["B"]), "--out", str(tmp_path / "cmp.md"))
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == compare_runs(runs["A"], runs["B"]).to_markdown().strip()
    assert "| training.learning_rate | 0.001 | 0.01 |" in out.stdout
    assert (tmp_path / "cmp.md").read_text().strip() == out.stdout.strip()


def test_compare_command_exits_2_with_a_clear_error(runs):
    bad = compare_cli(str(runs["A"]), str(runs["A"].parent / "nowhere"))
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.startswith(f"compare: {runs['A'].parent / 'nowhere'}: no such folder")
    assert "Traceback" not in bad.stderr
    other = compare_cli(str(runs["A"]), str(runs["C"]))
    assert other.returncode == 2 and "are not comparable" in other.stderr and "Traceback" not in other.stderr


def test_the_widget_builds_without_a_kernel_and_holds_both_curves(runs):
    from workbench.widgets import RunComparisonView
    from workbench.widgets.compare import TRACES

    cmp = compare_runs(runs["A"], runs["B"])
    view = RunComparisonView(cmp)
    assert view.comparison is cmp
    names = {"A": runs["A"].name, "B": runs["B"].name}  # folder names, not paths
    assert view.names == names and str(runs["A"].parent) not in view._head.value
    traces = [t for t in view.figure.data]
    by_name = {t.name: t for t in traces}
    assert set(by_name) == {f"{run} {names[run]} · {text}" for run in "AB" for _, _, text in TRACES}
    for run in "AB":
        rows = cmp.curves[cmp.curves["run"] == run]
        for panel, column, text in TRACES:
            trace = next(t for t in traces if t.name == f"{run} {names[run]} · {text}"
                         and t.xaxis == ("x" if panel == 1 else "x2"))
            points = rows.dropna(subset=[column])  # every step of these runs has each training value
            assert list(trace.x) == points["step"].tolist()
            assert list(trace.y) == points[column].tolist()
            assert trace.legend == ("legend" if panel == 1 else "legend2")  # one legend per chart
    held = next(t for t in traces if t.name.startswith("A ") and t.name.endswith("held-out") and t.xaxis == "x2")
    assert list(held.x) == [0, 2]
    assert view.seed == 10000 and "seed 10000" in view.html
    view.seed = 10002
    pair = next(p for p in cmp.pairs if p.seed == 10002)
    assert "seed 10002" in view.html and view._pick.value == 10002
    from workbench.widgets._html import esc

    text = re.sub(r"<mark[^>]*>|</mark>", "", view.html)  # the action spans are marked
    assert text.count(esc(pair.a.turns[0].action)) >= 1 and esc(pair.b.turns[-1].action) in text
    built = RunComparisonView(runs["A"], runs["E"])  # from two folders; the notice is shown
    assert "NOT COMPARABLE on held-out episodes" in built._head.value
    with pytest.raises(TypeError, match="give two runs"):
        RunComparisonView(runs["A"])


def test_a_run_recorded_under_a_module_path_from_before_the_packages_is_comparable(runs, tmp_path):
    """A config.yaml that names its environment class by the module's old path (before the
    packages; `workbench._moved`) records the same environment as one that names the new path."""
    import yaml

    from workbench._moved import MOVED

    new = "workbench.environments.adapters.gym:GymTextEnvironment"
    old = next(k for k, v in MOVED.items() if v == new.partition(":")[0]) + ":GymTextEnvironment"
    other = "workbench.environments.adapters.textarena:TextArenaEnvironment"
    folders = {}
    for key, path in (("old", old), ("new", new), ("other", other)):
        folder = Path(shutil.copytree(runs["A"], tmp_path / key))
        config = yaml.safe_load((folder / "config.yaml").read_text())
        config["environment"]["import_path"] = path
        (folder / "config.yaml").write_text(yaml.safe_dump(config, sort_keys=False))
        folders[key] = folder
    assert load_run(folders["old"]).config.environment.import_path == old
    assert compare_runs(folders["old"], folders["new"]).pairs  # compared, seed by seed
    with pytest.raises(RunsNotComparable, match="TextArenaEnvironment"):
        compare_runs(folders["old"], folders["other"])
