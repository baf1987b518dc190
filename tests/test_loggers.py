"""Experiment tracking: jsonl, TensorBoard, trackio and wandb (offline) files read back and
compared to the trainer's metrics and episodes."""
from __future__ import annotations

import json
import math
import os
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from envs import make_env
from tests.test_trainer import tiny_config
from workbench import ConfigError, Trainer
from workbench.training.loggers import EPISODE_COLUMNS, EPISODE_TABLE, episode_rows, episode_text, scalar_metrics


def trained(tiny_model_path, tmp_path, steps=2, **training) -> tuple[Trainer, dict]:
    """A trainer after `fit(steps=steps)`, and {0-based step: the batch it trained on}."""
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path, **training), environment=make_env("guess_number"))
    batches: dict = {}
    trainer.fit(steps=steps, callbacks=[lambda tr, m: batches.__setitem__(m["step"], tr.last_batch)])
    return trainer, batches


def same(a: float, b: float) -> bool:
    return (math.isnan(a) and math.isnan(b)) or a == pytest.approx(b, rel=1e-6, abs=1e-7)


def check_rows(rows: list[dict], batch, step: int) -> None:
    """An episode table of `batch`: best first, worst last, texts of its episodes."""
    texts = {str(ep.episode_id): episode_text(ep) for ep in batch}
    scores = sorted((ep.score for ep in batch), reverse=True)
    assert [r["step"] for r in rows] == [step] * len(rows)
    assert [r["rank"] for r in rows] == ["best 1", "best 2", "worst 1", "worst 2"]
    assert [r["score"] for r in rows] == [scores[0], scores[1], scores[-1], scores[-2]]
    assert len({r["episode_id"] for r in rows}) == 4
    for r in rows:
        assert r["text"] == texts[r["episode_id"]] and "assistant: " in r["text"]


def test_episode_rows_pick_best_and_worst_once(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path, batch_size=2, loggers=[]),
                      environment=make_env("guess_number"))
    batch = trainer.score(trainer.rollout())
    batch[0].score, batch[1].score = 1.0, -1.0
    rows = episode_rows(batch, step=7)
    assert [(r["rank"], r["score"]) for r in rows] == [("best 1", 1.0), ("best 2", -1.0)]  # no episode twice
    assert list(rows[0]) == list(EPISODE_COLUMNS) and rows[0]["step"] == 7


def test_jsonl_and_tensorboard_hold_every_steps_metrics(tiny_model_path, tmp_path):
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    trainer, batches = trained(tiny_model_path, tmp_path, steps=3, loggers=["jsonl", "tensorboard"],
                               log_episodes_every=2)
    history = trainer.metrics_history
    # jsonl: in checkpoint.output_dir (tmp_path/ckpt), one line per step, the same values.
    lines = [json.loads(line) for line in (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines] == [0, 1, 2]
    for row, metrics in zip(lines, history):
        assert row.keys() == {k for k, v in metrics.items() if isinstance(v, (int, float, str))}
        assert all(same(row[k], metrics[k]) for k in row)
    episodes = [json.loads(line) for line in (tmp_path / "ckpt" / "episodes.jsonl").read_text().splitlines()]
    # every 2 steps from the first: steps 0 and 2
    check_rows(episodes[:4], batches[0], step=0)
    check_rows(episodes[4:], batches[2], step=2)

    acc = EventAccumulator(str(tmp_path / "ckpt" / "tensorboard"), size_guidance={"scalars": 0, "tensors": 0})
    acc.Reload()
    expected = [scalar_metrics(m) for m in history]
    assert set(acc.Tags()["scalars"]) == set().union(*expected)
    assert {"reward/mean", "env/success_rate", "actor/pg_loss", "perf/step_seconds", "epoch"} <= set(expected[0])
    for tag in acc.Tags()["scalars"]:
        events = acc.Scalars(tag)
        assert [e.step for e in events] == [0, 1, 2]
        assert all(same(e.value, expected[e.step][tag]) for e in events), tag
    (text_tag,) = [t for t in acc.Tags()["tensors"] if t.startswith(EPISODE_TABLE)]
    events = acc.Tensors(text_tag)
    assert [event.step for event in events] == [0, 2]
    for event, rows in zip(events, (episodes[:4], episodes[4:])):
        table = event.tensor_proto.string_val[0].decode()
        for row in rows:  # each row's text, as a markdown table cell
            assert row["text"].replace("|", "\\|").replace("\n", "<br>") in table


def test_a_short_run_logs_the_episodes_of_its_first_step(tiny_model_path, tmp_path):
    # The demo's case: fewer steps than log_episodes_every (default 10) still gives a table.
    assert tiny_config(tiny_model_path, tmp_path).training.log_episodes_every == 10
    trainer, batches = trained(tiny_model_path, tmp_path, steps=2)
    episodes = [json.loads(line) for line in (tmp_path / "ckpt" / "episodes.jsonl").read_text().splitlines()]
    check_rows(episodes, batches[0], step=0)


def test_jsonl_after_resume_has_each_step_once(tiny_model_path, tmp_path):
    first = Trainer(tiny_config(tiny_model_path, tmp_path, log_episodes_every=1), environment=make_env("guess_number"))
    first.config.checkpoint.save_interval = 2
    first.fit(steps=3)  # checkpoint at step 2; the log has steps 0, 1, 2
    resumed = Trainer(tiny_config(tiny_model_path, tmp_path, log_episodes_every=1), environment=make_env("guess_number"))
    resumed.fit(until_step=4)  # resumes at 2, redoes step 2, then 3
    lines = [json.loads(line) for line in (tmp_path / "ckpt" / "metrics.jsonl").read_text().splitlines()]
    assert [row["step"] for row in lines] == [0, 1, 2, 3]
    assert lines[2]["perf/step_seconds"] == resumed.metrics_history[2]["perf/step_seconds"]  # the redone step
    episode_steps = [json.loads(line)["step"] for line in (tmp_path / "ckpt" / "episodes.jsonl").read_text().splitlines()]
    assert episode_steps == [0] * 4 + [1] * 4 + [2] * 4 + [3] * 4


def test_unknown_logger_is_a_config_error(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path, loggers=["jsonl", "mlflow"]),
                      environment=make_env("guess_number"))
    with pytest.raises(ConfigError, match="unknown logger.*mlflow"):
        trainer.fit(steps=1)
    assert trainer.global_step == 0


TRACKIO_SCRIPT = textwrap.dedent("""
    import json, sys
    from envs import make_env
    from tests.test_trainer import tiny_config
    from workbench import Trainer
    from workbench.training.loggers import episode_rows
    from trackio.sqlite_storage import SQLiteStorage
    from pathlib import Path

    model, tmp = Path(sys.argv[1]), Path(sys.argv[2])
    trainer = Trainer(tiny_config(model, tmp, loggers=["trackio"], log_episodes_every=2, run_name="tiny-run"),
                      environment=make_env("guess_number"))
    trainer.fit(steps=2)
    trainer.fit(steps=1)  # the same trackio run, continued
    json.dump({"history": trainer.metrics_history, "rows": episode_rows(trainer.last_batch, 1),
               "logs": SQLiteStorage.get_logs(project="workbench", run="tiny-run")},
              open(tmp / "out.json", "w"), default=str)
""")


def test_trackio_local_run_holds_every_steps_metrics(tiny_model_path, tmp_path):
    # trackio fixes its folder (TRACKIO_DIR) at import, so the run goes in a fresh process.
    env = {**os.environ, "TRACKIO_DIR": str(tmp_path / "trackio"), "CI": "1"}
    root = Path(__file__).resolve().parents[1]
    done = subprocess.run([sys.executable, "-c", TRACKIO_SCRIPT, str(tiny_model_path), str(tmp_path)], cwd=root,
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads((tmp_path / "out.json").read_text())
    assert (tmp_path / "trackio" / "workbench.db").exists()
    scalars = [log for log in out["logs"] if EPISODE_TABLE not in log]
    tables = [log for log in out["logs"] if EPISODE_TABLE in log]
    assert [log["step"] for log in scalars] == [0, 1, 2]
    for log, metrics in zip(scalars, out["history"]):
        expected = scalar_metrics(metrics)
        assert set(log) - {"step", "timestamp"} == set(expected)
        assert all(same(log[k], v) for k, v in expected.items())
    assert [table["step"] for table in tables] == [0, 2]  # the first step, then every 2nd (across both fits)
    for table in tables:
        assert table[EPISODE_TABLE]["_type"] == "trackio.table"
        rows = table[EPISODE_TABLE]["_value"]
        assert [r["rank"] for r in rows] == ["best 1", "best 2", "worst 1", "worst 2"]
        assert all(r["text"].startswith("system: ") for r in rows)


def wandb_records(path: Path):
    """The protobuf records of a `.wandb` file (a ':W&B' header, then LevelDB-log blocks)."""
    from wandb.proto import wandb_internal_pb2

    data, pos, block, chunks = path.read_bytes(), 7, 32768, b""
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        if block - pos % block < 7:  # block trailer padding
            pos += block - pos % block
            continue
        length, kind = struct.unpack("<HB", data[pos + 4:pos + 7])
        if kind == 0 and length == 0:
            break
        chunks += data[pos + 7:pos + 7 + length]
        pos += 7 + length
        if kind in (1, 4):  # FULL or LAST
            record = wandb_internal_pb2.Record()
            record.ParseFromString(chunks)
            chunks = b""
            yield record


def test_wandb_offline_run_holds_every_steps_metrics(tiny_model_path, tmp_path, monkeypatch):
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    trainer, batches = trained(tiny_model_path, tmp_path, loggers=["wandb"], log_episodes_every=2)
    (run_file,) = (tmp_path / "ckpt" / "wandb").glob("offline-run-*/run-*.wandb")
    # wandb's writer is a separate process: on a loaded machine its last blocks can land a
    # moment after `finish()` returns, so read until both steps are there (at most 30 s).
    deadline = time.monotonic() + 30
    while True:
        history, kinds = {}, []
        for record in wandb_records(run_file):
            kinds.append(record.WhichOneof("record_type"))
            if kinds[-1] == "history":
                items = {item.key or "/".join(item.nested_key): json.loads(item.value_json)
                         for item in record.history.item}
                history[items["_step"]] = items
        if sorted(history) == [0, 1] or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert sorted(history) == [0, 1], f"records in {run_file.name}: {kinds}"
    for step, metrics in enumerate(trainer.metrics_history):
        expected = scalar_metrics(metrics)
        assert all(same(float(history[step][k]), v) for k, v in expected.items() if math.isfinite(v))
    assert history[0][f"{EPISODE_TABLE}/_type"] == "table-file" and f"{EPISODE_TABLE}/_type" not in history[1]
    table = json.loads((run_file.parent / "files" / history[0][f"{EPISODE_TABLE}/path"]).read_text())
    assert table["columns"] == list(EPISODE_COLUMNS)
    check_rows([dict(zip(table["columns"], row)) for row in table["data"]], batches[0], step=0)
