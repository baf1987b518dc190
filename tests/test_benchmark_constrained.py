"""benchmarks/constrained.py's code path on the tiny model with WORKBENCH_SMOKE=1 counts: both
arms run through train_and_report; the constrained arm's replies are bare numbers from the
first held-out step (the untrained random model writes none by itself)."""
from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_both_arms_run_and_the_constrained_one_answers_bare_numbers(tiny_model_path, monkeypatch):
    monkeypatch.setenv("WORKBENCH_SMOKE", "1")
    spec = importlib.util.spec_from_file_location("bench_constrained", ROOT / "benchmarks" / "constrained.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    result = bench.main(["--model", str(tiny_model_path), "--dtype", "float32", "--device", "cpu", "--markdown"])
    arms = {r["arm"]: r for r in result["arms"]}
    assert set(arms) == {"strict+constrained", "strict+sft"}
    assert arms["strict+constrained"]["bare_number_share_before"] == 1.0
    assert arms["strict+sft"]["bare_number_share_before"] < 1.0
    assert arms["strict+constrained"]["parse_error_rate"] == [0.0] * arms["strict+constrained"]["rl_steps"]
    assert arms["strict+sft"]["sft_steps"] >= 1 and arms["strict+constrained"]["sft_steps"] == 0
    assert "constrained decoding (no SFT" in bench.markdown_row(result)
