"""The run doctor on whole runs: a run folder in the contract layout, a reopened-run
object, the `diagnose` command, `Trainer.fit`'s per-step hook and the CLI's summary.md."""
from __future__ import annotations

import json
import math

import pandas as pd
import pytest

from envs import make_env
from tests.doctor_policies import count_up_from_4, expert, roll, roll_steps
from tests.test_doctor_checks import GUESS, diverse
from tests.test_trainer import tiny_config
from workbench import ConfigStore, Trainer
from workbench.cli import main
from workbench.debug.doctor import diagnose, findings_markdown, findings_table


@pytest.fixture(scope="module")
def run_dir(tiny_model_and_tokenizer, tmp_path_factory):
    """A run folder like a CLI run writes it: three training steps whose policy drifts from
    diverse guesses to the counting trick, held-out batches before (expert) and after (trick)."""
    tok = tiny_model_and_tokenizer[1]
    run = tmp_path_factory.mktemp("run")
    steps = roll_steps(tok, "guess_number", [diverse, diverse, count_up_from_4], groups=8, **GUESS)
    rows = []
    for step, batch in enumerate(steps):
        batch.save(run / "rollouts" / f"step_{step:06d}.jsonl.gz")
        rows.append({"step": step, **batch.summary(), "actor/entropy": [2.0, 1.9, 0.1][step]})
    (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    ConfigStore().save(run / "config.yaml")
    roll(tok, "guess_number", expert("guess_number"), first_seed=10_000, group_size=1, groups=8,
         **GUESS).save(run / "evals" / "step_000000.jsonl.gz")
    roll(tok, "guess_number", count_up_from_4, first_seed=10_000, group_size=1, groups=8,
         **GUESS).save(run / "evals" / "step_000003.jsonl.gz")
    return run


def test_diagnose_a_run_folder_names_the_trick_on_held_out_episodes(run_dir):
    findings = diagnose(str(run_dir))
    names = [(f.name, f.source) for f in findings]
    # the trick wins secrets 4 to 7 only: of the expert's 8 wins, seeds 10004 and 10005 (secret 8) are lost
    assert names[:2] == [("heldout-regression", "eval"), ("parse-from-incidental-span", "eval")]
    regressed = findings[0]
    assert regressed.value == 2 / 8 and regressed.step == 3
    assert [e.seed for e in regressed.evidence] == [10004, 10005] and "2 of 8 games won at step 0" in regressed.message
    assert ("parse-from-incidental-span", "train") in names
    assert ("template-collapse", "train") in names and ("entropy-collapse", "train") in names
    held_out = findings[1]
    after = pytest.importorskip("workbench.trajectory").TrajectoryBatch.load(run_dir / "evals" / "step_000003.jsonl.gz")
    winners = [e.episode_id for e in after if e.success]
    assert held_out.value == 1.0 and held_out.step == 3
    assert [e.episode_id for e in held_out.evidence] == winners[:3]
    assert all(e.source == "eval" and e.seed >= 10_000 for e in held_out.evidence)
    assert "held-out episode" in held_out.line() and "You have [[" in held_out.line()


class ReopenedRun:
    """The duck type `load_run` returns: steps, batch(step), metrics DataFrame, eval batches."""

    def __init__(self, path):
        from workbench.trajectory import TrajectoryBatch

        self.path, self.load = path, TrajectoryBatch.load
        self.steps = [0, 1, 2]
        self.metrics = pd.read_json(path / "metrics.jsonl", lines=True)
        self.evals = [{"step": 0}, {"step": 3}]

    def batch(self, step):
        return self.load(self.path / "rollouts" / f"step_{step:06d}.jsonl.gz")

    def eval_batch(self, step):
        return self.load(self.path / "evals" / f"step_{step:06d}.jsonl.gz")


def test_a_reopened_run_gives_the_same_findings_as_its_folder(run_dir):
    by_folder = [(f.name, f.source, f.value, f.step) for f in diagnose(run_dir)]
    assert [(f.name, f.source, f.value, f.step) for f in diagnose(ReopenedRun(run_dir))] == by_folder


def test_diagnose_command_prints_a_table_and_json(run_dir, capsys):
    assert main(["diagnose", str(run_dir)]) == 0
    table = capsys.readouterr().out
    assert table.splitlines()[0].split() == ["check", "severity", "value", "threshold", "where"]
    assert "parse-from-incidental-span  warning" in table and "held-out episode" in table
    assert main(["diagnose", str(run_dir), "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert [d["name"] for d in data[:2]] == ["heldout-regression", "parse-from-incidental-span"]
    assert data[1]["evidence"][0]["source"] == "eval" and data[0]["evidence"][0]["seed"] == 10004


def test_a_run_is_judged_with_the_thresholds_of_its_config(run_dir, tmp_path, capsys):
    """The `doctor` section of a run's config.yaml is what `diagnose` and the command compare with;
    an explicit config, or a --doctor.FIELD flag, goes over it."""
    import shutil

    from workbench.doctor.findings import DoctorConfig

    strict = tmp_path / "strict"
    shutil.copytree(run_dir, strict)
    config = ConfigStore()
    config.doctor.incidental_coverage = 0.0  # no span covers less than 0% of its reply: none is incidental
    config.save(strict / "config.yaml")
    default = {f.name for f in diagnose(run_dir)}
    assert "parse-from-incidental-span" in default
    assert {f.name for f in diagnose(strict)} == default - {"parse-from-incidental-span"}
    assert {f.name for f in diagnose(strict, DoctorConfig())} == default  # an explicit config wins
    assert main(["diagnose", str(strict), "--json"]) == 0
    assert "parse-from-incidental-span" not in {f["name"] for f in json.loads(capsys.readouterr().out)}
    assert main(["diagnose", str(run_dir), "--json", "--doctor.incidental_coverage", "0"]) == 0
    assert "parse-from-incidental-span" not in {f["name"] for f in json.loads(capsys.readouterr().out)}
    assert main(["diagnose", str(strict), "--json", "--doctor.incidental_coverage", "0.5"]) == 0
    assert "parse-from-incidental-span" in {f["name"] for f in json.loads(capsys.readouterr().out)}
    assert ConfigStore.load(strict / "config.yaml").doctor.incidental_coverage == 0.0  # the flag wrote nothing
    assert main(["diagnose", str(run_dir), "--doctor.incidental_coverage", "2"]) == 2
    assert "doctor.incidental_coverage is a share and must be in [0, 1], got 2" in capsys.readouterr().err


def test_reports_say_so_when_nothing_is_found():
    assert findings_table([]) == "doctor: no findings"
    assert "No findings." in findings_markdown([])


def test_diagnose_refuses_what_it_cannot_read(tmp_path):
    from workbench.debug import RunError

    with pytest.raises(RunError, match="nope"):
        diagnose(str(tmp_path / "nope"))
    with pytest.raises(TypeError):
        diagnose(42)


def test_fit_runs_the_checks_each_step_and_records_them(tiny_model_path, tmp_path, capsys):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"))
    trainer.fit(steps=2)
    rows = trainer.metrics_history
    assert all("diagnose/format-errors" in r and "diagnose/tokenization-mismatch" in r for r in rows)
    # Every check's name on every step; a drift check measures nothing on the first (NaN).
    assert math.isnan(rows[0]["diagnose/length-drift"]) and not math.isnan(rows[1]["diagnose/length-drift"])
    batch = trainer.last_batch
    turns = [t for e in batch for t in e.turns]
    invalid = sum(bool(t.parse_error or t.info.get("invalid_action")) for t in turns) / len(turns)
    assert rows[1]["diagnose/format-errors"] == pytest.approx(invalid)
    printed = capsys.readouterr().out
    fired = {f.name for f in trainer.doctor.findings}
    assert all(printed.count(f"doctor: {name} ") == 1 for name in fired)  # once, however many steps
    assert trainer.doctor.config is trainer.config.doctor  # the config's thresholds, not a copy
    trainer.config.doctor.min_samples = 10**6  # no batch holds that many turns: the batch checks measure nothing
    trainer.fit(steps=1)
    rows = trainer.metrics_history
    assert not math.isnan(rows[1]["diagnose/format-errors"]) and math.isnan(rows[2]["diagnose/format-errors"])
    trainer.doctor = None  # off
    trainer.fit(steps=1)
    assert not any(k.startswith("diagnose/") for k in trainer.metrics_history[-1])


def test_cli_train_writes_the_findings_into_summary(tmp_path, tiny_model_path):
    out = tmp_path / "out"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "2", "--eval-episodes", "2", "--save-interval", "0",
                 "--output", str(out)]) == 0
    summary = (out / "summary.md").read_text()
    assert "## Run doctor" in summary
