"""ART's model folder (OpenPipe ART), read as a workbench run.

What ART writes (its source, 0.5.18), under `.art/{project}/models/{model}/`:

    trajectories/{split}/{step:04d}.parquet   `Model.log(groups, split=...)` at the model's step:
                                             one row per trajectory: "group_index", "reward",
                                             "metrics" / "metadata" / "tools" (JSON strings),
                                             "logs", "group_metadata" / "group_metrics" /
                                             "group_logs", and "messages" (role, content,
                                             tool_calls as JSON, tool_call_id, and "trainable":
                                             True for the choices the policy sampled)
    history.jsonl                            one line per logged split and step: "step",
                                             "train/reward", "train/reward_std_dev",
                                             "train/exception_rate", "loss/entropy",
                                             "loss/kl_div", "loss/grad_norm", ... ("val/..." for
                                             evaluations)

ART's step (0 before the first update) is the run's step; "train" batches are the training
steps, "val" (or "test") batches the held-out ones. Groups: "group_index". The messages
before the first trainable one are the prompt; an assistant message ART did not train on is
shown as a turn not trained on. RULER keeps the reward it replaced in
`metrics["independent_reward"]` and its explanation in "logs": both are kept (`info["rewards"]`,
`info["extra"]["logs"]`). Success: a "success" metric, else none.

Point `workbench import` at the model folder, or at `.art` / a project folder holding one model.
"""
from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from workbench.importers.source import (
    Source, SourceError, absent_reason, group_by_key, map_metrics, message_episode, metric_frame, number,
    plain_messages, read_jsonl, success_of,
)
from workbench.trajectory import TrajectoryBatch

__all__ = ["ARTSource", "detect", "METRICS"]

_FILE = re.compile(r"(\d+)\.parquet")
TRAIN_SPLIT = "train"
EVAL_SPLITS = ("val", "test")
METRICS: dict[str, tuple[str, ...]] = {
    "reward/mean": ("train/reward",),
    "env/error_rate": ("train/exception_rate",),
    "actor/entropy": ("loss/entropy", "train/entropy"),
    "kl/mean": ("loss/kl_div", "train/kl_div"),
    "actor/grad_norm": ("loss/grad_norm", "train/grad_norm"),
    "actor/pg_loss": ("loss/train", "train/loss"),
}


def _split_files(model_dir: Path, split: str) -> dict[int, Path]:
    folder = model_dir / "trajectories" / split
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if (m := _FILE.fullmatch(p.name))}


def _model_dirs(path: Path) -> list[Path]:
    """ART model folders at `path`, or below it (a project folder, `.art`)."""
    if (path / "trajectories").is_dir():
        return [path]
    found = [m for m in path.glob("models/*") if (m / "trajectories").is_dir()]
    found += [m for m in path.glob("*/models/*") if (m / "trajectories").is_dir()]
    found += [m for m in path.glob(".art/*/models/*") if (m / "trajectories").is_dir()]
    return sorted(set(found))


def detect(path: Path) -> str | None:
    if not path.is_dir():
        return None
    dirs = _model_dirs(path)
    return f"ART trajectories in {dirs[0]}" if dirs else None


def _json(value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        return value
    if isinstance(value, (str, bytes)) and value:
        try:
            out = json.loads(value)
        except ValueError:
            return {}
        return out if isinstance(out, dict) else {}
    return {}


class ARTSource(Source):
    """An ART model folder: trajectories per split and step, and history.jsonl."""

    format = "art"

    def __init__(self, path: str | Path, success_key: str | None = None):
        super().__init__(path)
        dirs = _model_dirs(self.path) if self.path.is_dir() else []
        if not dirs:
            raise SourceError(f"{self.path}: no ART model folder (trajectories/{{split}}/NNNN.parquet)")
        if len(dirs) > 1:
            raise SourceError(f"{self.path} holds {len(dirs)} ART models (" + ", ".join(str(d) for d in dirs)
                              + "); point at one model folder")
        self.model_dir = dirs[0]
        self.success_keys = (success_key, "success") if success_key else ("success",)
        p = self.provenance
        p.estimator = "grpo"
        p.groups = "group_index"
        p.steps = "ART's step (0 before the first update) is the step here; val/test batches are held out"
        p.absent = {name: absent_reason("ART", name, hint) for name, hint in (
            ("token_ids", "import with --model to tokenize the messages"),
            ("logprobs", "import with --model to recompute them"),
            ("advantages", ""), ("action_span", ""), ("finish_reason", ""), ("parse_errors", ""),
            ("environment_errors", "its exceptions are counted (train/exception_rate), not kept"),
            ("env_seed", ""), ("held_out", ""), ("alignment", ""))}
        p.absent["success"] = absent_reason("ART", "success", f"no {' or '.join(map(repr, self.success_keys))} "
                                            "metric")
        if not (self.model_dir / "history.jsonl").is_file():
            p.absent["metrics"] = absent_reason("ART", "metrics", "no history.jsonl in the model folder")

    def _train_files(self) -> dict[int, Path]:
        return {s: p for s, p in _split_files(self.model_dir, TRAIN_SPLIT).items()
                if self.readable_parquet(p, f"trajectories/{TRAIN_SPLIT}")}

    def _eval_files(self) -> dict[int, Path]:
        for split in EVAL_SPLITS:
            files = _split_files(self.model_dir, split)
            if files:
                return {s: p for s, p in files.items() if self.readable_parquet(p, f"trajectories/{split}")}
        return {}

    def _batch(self, where: Path, step: int, split: str) -> TrajectoryBatch:
        import pandas as pd

        try:
            rows = pd.read_parquet(where).to_dict("records")
        except Exception as exc:  # noqa: BLE001 - a file ART is writing, or cut short
            self.skipped.add(f"trajectories/{where.parent.name}/{where.name}", f"{type(exc).__name__}: {exc}")
            return TrajectoryBatch([])
        groups = group_by_key(r.get("group_index") for r in rows)
        episodes = []
        for i, (row, group) in enumerate(zip(rows, groups)):
            messages = plain_messages(row.get("messages"))
            first = next((k for k, m in enumerate(messages) if m.get("trainable")), None)
            if first is None:
                first = next((k for k, m in enumerate(messages) if m.get("role") == "assistant"), len(messages))
            prompt, completion = messages[:first], messages[first:]
            trained = [bool(m.get("trainable")) for m in completion]
            metrics = _json(row.get("metrics"))
            success = success_of(metrics, self.success_keys)
            if success is not None:
                self.provenance.absent.pop("success", None)
            score = number(row.get("reward"))
            rewards = {"reward": score, **{k: number(v) for k, v in metrics.items()
                                           if k == "independent_reward"}}
            extra = {"metrics": metrics, "metadata": _json(row.get("metadata")),
                     "logs": list(row.get("logs") if row.get("logs") is not None else []),
                     "group_metrics": _json(row.get("group_metrics"))}
            clean = [{k: v for k, v in m.items() if k != "trainable"} for m in prompt + completion]
            ep = message_episode(i, clean[:len(prompt)], clean[len(prompt):], score=score, group=group,
                                 rewards=rewards, success=success, extra=extra, trained=trained)
            episodes.append(ep)
        return TrajectoryBatch(episodes)

    def read_metrics(self) -> Any:
        path = self.model_dir / "history.jsonl"
        rows = []
        if path.is_file():
            for r in read_jsonl(path, self.skipped, "history.jsonl"):
                if isinstance(r.get("step"), int) and any(k.startswith(("train/", "loss/")) for k in r):
                    rows.append({**{k: v for k, v in r.items() if not k.startswith(("val/", "test/"))},
                                 "source_step": r["step"]})
        rows, used = map_metrics(rows, METRICS)
        self.provenance.metric_names = used
        return metric_frame(rows)
