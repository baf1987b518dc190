"""`benchmarks/gpu.py`, the GPU check, rehearsed on the CPU (`--dry-run`: the tiny Qwen3-shaped
model, a few episodes and steps, float32) so that it cannot rot between the times a GPU is
available; and the Qwen3 shapes it times, against transformers' own parameter count."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.gpu import DEFAULT_TOKENIZER  # noqa: E402
from benchmarks.gpu_models import SHAPES, parameter_count, qwen3_config  # noqa: E402

needs_tokenizer = pytest.mark.skipif(not (DEFAULT_TOKENIZER / "tokenizer.json").is_file(),
                                     reason=f"Qwen3's tokenizer is not in {DEFAULT_TOKENIZER}: run `make tokenizers`")

#: Published sizes of Qwen3 (total parameters), for the shapes' sanity.
PUBLISHED = {"0.6B": 0.6e9, "1.7B": 1.7e9, "4B": 4.0e9, "8B": 8.2e9}


@pytest.mark.parametrize("shape", sorted(SHAPES))
def test_shapes_count_what_transformers_builds(shape):
    import torch
    from transformers import AutoModelForCausalLM

    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(qwen3_config(shape))
    built = sum(p.numel() for p in model.parameters())  # tied weights are counted once
    assert parameter_count(shape) == built
    if shape in PUBLISHED:
        assert abs(built - PUBLISHED[shape]) / PUBLISHED[shape] < 0.05, (shape, built)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out = tmp_path_factory.mktemp("gpu_check")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--dry-run", "--out", str(out),
                           "--models", str(out / "models")], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads((out / "gpu.json").read_text()), (out / "gpu.md").read_text(), proc.stdout


@needs_tokenizer
def test_dry_run_measures_every_part(dry_run):
    res, md, _ = dry_run
    failed = {k: v["error"][-600:] for k, v in res.items() if isinstance(v, dict) and "error" in v}
    assert not failed, failed
    assert res["env"]["dry_run"] and res["env"]["dtype"] == "float32"
    # pytest -m gpu found the GPU tests and, without CUDA, skipped every one
    p = res["pytest"]
    assert "tests/test_engine_cuda.py" in p["files"] and p["rc"] == 0
    assert p["counts"].get("skipped", 0) >= 10 and not p["counts"].get("passed") and not p["counts"].get("failed")


@needs_tokenizer
def test_dry_run_rollout_counts_tokens_on_both_sides(dry_run):
    r = dry_run[0]["rollout"]
    assert [t["turn"] for t in r["per_turn"]] == [0, 1]
    for t in r["per_turn"]:
        assert t["episodes"] == 16
        # random weights rarely stop: both sides sample (close to) the turn's 8 tokens per row
        assert 16 * 6 <= t["ours_tokens"] <= 16 * 8 and 16 * 6 <= t["generate_tokens"] <= 16 * 8
        assert t["ratio"] == pytest.approx(t["ours_tokens_per_s"] / t["generate_tokens_per_s"], rel=0.02)
    # a later turn's prompt holds the first turn's prompt, reply and the observation
    assert r["per_turn"][1]["mean_context_tokens"] > r["per_turn"][0]["mean_context_tokens"] + 8
    assert r["ours_tokens"] == sum(t["ours_tokens"] for t in r["per_turn"])
    # the same rollout with inference.cuda_graphs on: on a CPU no step is graphed
    assert r["cuda_graphs"]["graphed_decode_steps"] == 0 and r["cuda_graphs"]["graph_error"] is None
    assert len(r["cuda_graphs"]["per_turn_tokens_per_s"]) == 2 and r["cuda_graphs"]["tokens_per_s"] > 0
    syncs = r["host_syncs"]["project_counter"]
    assert syncs["steps"] >= 5 and syncs["max"] <= 2 and syncs["whole_call"] >= syncs["steps"]


@needs_tokenizer
def test_dry_run_grpo_step_against_trl(dry_run):
    g = dry_run[0]["grpo"]
    for mode in ("lora", "full"):
        row = g[mode]
        assert "ours_error" not in row and "trl_error" not in row, row
        assert row["ours"]["step_seconds"] > 0 and row["trl"]["step_seconds"] > 0
        assert row["speedup"] == pytest.approx(row["trl"]["step_seconds"] / row["ours"]["step_seconds"], rel=0.01)
        # the rehearsal's short step (16-token completions, no warm-up) reached both sides
        assert g["warmup_steps"] == 0 and g["config"]["max_new_tokens"] == 16
        assert 0 < row["ours"]["completion_tokens"] <= 8 * 16 and 0 < row["trl"]["completion_tokens"] <= 8 * 16
        assert row["engine_trainer_gap"] < 1e-3  # fp32: trainer and engine compute the same logprobs
        graphed = g[f"{mode}_graphs"]  # ours again with inference.cuda_graphs, against the same TRL run
        assert graphed["trl"] == row["trl"] and graphed["ours"]["step_seconds"] > 0


@needs_tokenizer
def test_dry_run_memory_and_report(dry_run):
    res, md, _ = dry_run
    m = res["memory"]
    assert m["shapes"][0]["shape"] == "tiny" and m["shapes"][0]["fits"] and m["largest_fitting"] == "tiny"
    assert m["shapes"][0]["grad_norm"] > 0  # the update computed a gradient from the batch's advantages
    assert "| all |" in md and "## Targets" in md and "GRPO step (lora) >= 3x TRL" in md
    assert set(res["targets"]) >= {"rollout >= 1.0x generate", "host syncs per decode step <= 2",
                                   "GRPO step (lora) >= 3x TRL", "GRPO step (full) >= 3x TRL"}


def test_refuses_to_time_without_cuda_unless_dry_run(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    proc = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--out", str(tmp_path)], cwd=ROOT,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2 and "no CUDA device" in proc.stderr and "--dry-run" in proc.stderr
