"""benchmarks/remedies.py's code path on the tiny model with WORKBENCH_SMOKE=1 counts: every
pair, two seeds, the run folders kept, and its numbers checked against the runs themselves
(the doctor on the reopened folder, evals.json) and against what each remedy must do."""
from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path
from statistics import median

import pytest

from workbench.debug.doctor import diagnose

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_remedies", ROOT / "benchmarks" / "remedies.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def result(bench, tiny_model_path, tmp_path_factory):
    mp = pytest.MonkeyPatch()
    mp.setenv("WORKBENCH_SMOKE", "1")
    out = tmp_path_factory.mktemp("remedies")
    try:
        assert bench.main(["--model", str(tiny_model_path), "--device", "cpu", "--dtype", "float32",
                           "--seeds", "0,1", "--out", str(out / "remedies.json"),
                           "--keep-runs", str(out / "runs")]) == 0
    finally:
        mp.undo()
    return json.loads((out / "remedies.json").read_text())


def runs_of(result, arm):
    return sorted((r for r in result["runs"] if r["arm"] == arm), key=lambda r: r["seed"])


def test_records_the_setting(result, bench):
    assert result["dtype"] == "float32" and result["device"] == "cpu"
    assert result["setting"]["seeds"] == [0, 1] and result["setting"]["smoke"] is True
    assert result["machine"]["cpu"] and isinstance(result["machine"]["flags"], list)
    assert [p["pair"] for p in result["pairs"]] == list(bench.PAIRS)
    assert {r["arm"] for r in result["runs"]} == set(bench.ARMS)
    assert all(r["rl_steps"] == bench.SMOKE["rl_steps"] for r in result["runs"])
    assert len(result["verdicts"]) == len(bench.PAIRS)


def test_each_run_agrees_with_its_folder(result):
    for r in result["runs"]:
        run_dir = Path(r["run_dir"])
        evals = json.loads((run_dir / "evals.json").read_text())
        assert r["success_before"] == evals[0]["eval/success_rate"]
        assert r["success_after"] == evals[-1]["eval/success_rate"]
        # The doctor on the reopened folder names what train_and_report's doctor named.
        assert sorted({f.name for f in diagnose(run_dir)}) == r["fired"], r["arm"]


def test_pair_medians_are_the_medians_of_the_seeds(result, bench):
    for s in result["pairs"]:
        for side in ("without", "with"):
            recs = runs_of(result, s[side]["arm"])
            stats = [bench.statistic(r, s["statistic"]) for r in recs]
            assert s[side]["statistic_train_per_seed"] == stats
            known = [x for x in stats if x is not None]
            assert s[side]["statistic_train"] == (median(known) if known else None)
            assert s[side]["success_after"] == median(r["success_after"] for r in recs)
            assert s[side]["fired"] == sum(s["finding"] in r["fired"] for r in recs)


def test_the_remedies_reached_their_runs(result):
    # The tiny random model never replies with a bare number: under the strict format every reply is refused.
    for r in runs_of(result, "strict"):
        assert r["train"]["format-errors"]["value"] == 1.0 and r["train"]["format-errors"]["fired"]
        assert r["diagnose_per_step"]["format-errors"] == [1.0] * r["rl_steps"]
    for r in runs_of(result, "strict+sft"):  # the warm-up ran and lowered the expert tokens' NLL
        assert len(r["sft_nll"]) == 4 and r["sft_nll"][-1] < r["sft_nll"][0]
        assert r["success_after_sft"] is not None and r["steps"] == 4 + r["rl_steps"]
    for r in runs_of(result, "g4+dynamic_sampling"):
        assert len(r["dynamic_zero_variance_rate"]) == r["rl_steps"]
        assert all(0 <= x <= 1 for x in r["dynamic_zero_variance_rate"])
    for r in runs_of(result, "g4"):
        assert r["dynamic_zero_variance_rate"] == []
    # Same weights and seeds: the first step's rollouts are the same, so the penalty alone lowers the reward.
    for plain, penalised in zip(runs_of(result, "verbose"), runs_of(result, "verbose+overlong_penalty")):
        assert plain["truncation_rate"] == 1.0  # every reply runs to 12 tokens
        assert penalised["train_reward"][0] < plain["train_reward"][0] - 0.5
        assert math.isfinite(penalised["train_reward"][0])


def test_table_and_verdicts_say_what_was_measured(result, bench):
    text = bench.table(result["pairs"])
    assert text.count("\n") == 1 + len(bench.PAIRS)
    for s, line in zip(result["pairs"], result["verdicts"]):
        assert line.startswith(f"{s['remedy']} vs {s['finding']}")
        if s["without"]["fired"] and s["with"]["fired"]:
            assert "did NOT remove it" in line


def test_resummarise_recomputes_the_same_pairs(result, bench, tmp_path):
    path = tmp_path / "again.json"
    path.write_text(json.dumps(result))
    assert bench.main(["--resummarise", "--out", str(path)]) == 0
    again = json.loads(path.read_text())
    assert [{k: v for k, v in p.items() if k != "seeds"} for p in again["pairs"]] == result["pairs"]
    assert all(p["seeds"] == [0, 1] for p in again["pairs"]) and again["verdicts"] == result["verdicts"]


def test_a_record_rebuilt_from_its_folder_is_the_record(result, bench):
    """--resummarise --keep-runs adds the finished runs of an unfinished round from their folders."""
    keys = ("success_before", "success_after", "success_after_sft", "fired", "fired_held_out", "train", "held_out",
            "truncation_rate", "held_out_truncation_rate", "train_reward", "sft_nll", "dynamic_zero_variance_rate",
            "diagnose_per_step", "first_replies_after", "steps", "rl_steps")
    for r in result["runs"]:
        again = bench.record_from_folder(r["arm"], r["seed"], Path(r["run_dir"]))
        assert {k: again[k] for k in keys} == {k: r[k] for k in keys}, r["arm"]
