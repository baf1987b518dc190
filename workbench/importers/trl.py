"""TRL's `GRPOTrainer(log_completions=True)` output folder, read as a workbench run.

What TRL writes (its source, 1.16):

    output_dir/completions/completions_{step:05d}.parquet
                              written by `GRPOTrainer.log` at each logging step: "step"
                              (`state.global_step`, 1 after the first optimizer step), "prompt"
                              and "completion" (message lists for conversational data, else
                              strings), one column per reward function (NaN where it returned
                              None), the columns added with `log_extra`, and "advantage"
    output_dir/trainer_state.json (or the newest checkpoint-N/trainer_state.json)
                              `log_history`: one dict per logging step ("reward", "reward_std",
                              "frac_reward_zero_std", "completions/mean_length",
                              "completions/clipped_ratio", "kl", "entropy", "clip_ratio/*",
                              "rewards/<func>/mean", ...)

TRL's step S is the run's step S-1. The reward functions are the "rewards/<func>/mean" names
of the log history (without one, every numeric column but "advantage"); an episode's score is
their sum (TRL's `reward_weights` are not in the files: where the logged "reward" differs from
that sum, a note says so). Groups: the same prompt within a step (TRL keeps no group key).
Success: a "success" column (one a reward function or `log_extra` wrote), else none.
A parquet file that does not read (TRL writing it now, or cut short) is skipped with a count.
"""
from __future__ import annotations

import json
import math
import re
from pathlib import Path
from typing import Any

from workbench.importers.source import (
    Provenance, Source, SourceError, absent_reason, group_by_prompt, map_metrics, message_episode, metric_frame,
    number, plain_messages, success_of, text_episode,
)
from workbench.trajectory import TrajectoryBatch

__all__ = ["TRLSource", "detect", "METRICS", "read_log_history", "completion_files", "provenance"]

_FILE = re.compile(r"completions_(\d+)\.parquet")
METRICS: dict[str, tuple[str, ...]] = {
    "reward/mean": ("reward",),
    "reward/std": ("reward_std",),
    "reward/zero_std_group_rate": ("frac_reward_zero_std",),
    "rollout/response_length_mean": ("completions/mean_length",),
    "actor/entropy": ("entropy",),
    "kl/mean": ("kl",),
    "actor/pg_clipfrac": ("clip_ratio/region_mean",),
    "actor/grad_norm": ("grad_norm",),
    "perf/step_seconds": ("step_time",),
}
_NOT_REWARDS = ("step", "prompt", "completion", "advantage", "image", "images")


def _root(path: Path) -> Path:
    return path.parent if path.name == "completions" and not (path / "completions").is_dir() else path


def completion_files(root: Path) -> dict[int, Path]:
    """TRL's step -> its completions parquet file."""
    folder = root / "completions"
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if (m := _FILE.fullmatch(p.name))}


def detect(path: Path) -> str | None:
    if path.is_dir() and completion_files(_root(path)):
        return f"TRL completions in {_root(path) / 'completions'}"
    return None


def _state_file(root: Path) -> Path | None:
    if (root / "trainer_state.json").is_file():
        return root / "trainer_state.json"
    checkpoints = sorted((p for p in root.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
                         key=lambda p: int(p.name.rpartition("-")[2]) if p.name.rpartition("-")[2].isdigit() else -1)
    return checkpoints[-1] / "trainer_state.json" if checkpoints else None


def read_log_history(path: Path) -> list[dict[str, Any]]:
    """`log_history` of a trainer_state.json (the training rows: those with a "step")."""
    data = json.loads(path.read_text(encoding="utf-8"))
    return [r for r in data.get("log_history", []) if isinstance(r, dict) and isinstance(r.get("step"), int)]


def provenance(path: Path, metrics: bool = True) -> Provenance:
    """What a TRL run's files hold and do not (`metrics`: a trainer_state.json was found)."""
    p = Provenance(format="trl", source=str(Path(path).resolve()), estimator="grpo",
                   groups="same prompt within a step",
                   steps="TRL's global step S (1 after the first optimizer step) is step S-1 here")
    p.absent = {name: absent_reason("TRL", name, hint) for name, hint in (
        ("token_ids", "import with --model to tokenize the text"),
        ("logprobs", "import with --model to recompute them"),
        ("action_span", ""), ("finish_reason", "its log has the share cut (completions/clipped_ratio), not which "
                                               "replies"),
        ("parse_errors", ""), ("environment_errors", ""), ("env_seed", ""), ("held_out", ""),
        ("alignment", ""), ("success", "no \"success\" column"))}
    if not metrics:
        p.absent["metrics"] = absent_reason("TRL", "metrics", "no trainer_state.json beside the completions "
                                            "(trainer.save_state() writes one; checkpoints hold one too)")
    return p


class TRLSource(Source):
    """A TRL GRPOTrainer output folder: its completions parquet files and trainer_state.json."""

    format = "trl"

    def __init__(self, path: str | Path):
        super().__init__(path)
        self.root = _root(self.path)
        if not completion_files(self.root):
            raise SourceError(f"{self.path}: no completions/completions_NNNNN.parquet (GRPOTrainer writes them with "
                              "log_completions=True)")
        self.state_file = _state_file(self.root)
        self._history: list[dict[str, Any]] | None = None
        self.provenance = provenance(self.path, metrics=self.state_file is not None)

    def history(self) -> list[dict[str, Any]]:
        if self._history is None:
            try:
                self._history = read_log_history(self.state_file) if self.state_file else []
            except (OSError, ValueError) as exc:
                self.skipped.add(str(self.state_file), f"{type(exc).__name__}: {exc}")
                self._history = []
        return self._history

    def reward_names(self, columns: list[str]) -> list[str]:
        named = {k.split("/")[1] for r in self.history() for k in r if k.startswith("rewards/") and k.count("/") == 2}
        if named:
            return [c for c in columns if c in named]
        return [c for c in columns if c not in _NOT_REWARDS]

    def _train_files(self) -> dict[int, Path]:
        return {s - 1: p for s, p in completion_files(self.root).items()
                if s >= 1 and self.readable_parquet(p, "completions")}

    def _batch(self, where: Path, step: int, split: str) -> TrajectoryBatch:
        import pandas as pd

        try:
            frame = pd.read_parquet(where)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many kinds for a file being written or cut
            self.skipped.add(f"completions/{where.name}", f"{type(exc).__name__}: {exc}")
            return TrajectoryBatch([])
        columns = [c for c in frame.columns]
        rewards = self.reward_names(columns)
        numeric = [c for c in rewards if pd.api.types.is_numeric_dtype(frame[c])]
        extras = [c for c in columns if c not in _NOT_REWARDS and c not in numeric]
        if "success" in columns:
            self.provenance.absent.pop("success", None)
        rows = frame.to_dict("records")
        groups = group_by_prompt(r.get("prompt") for r in rows)
        episodes = []
        for i, (row, group) in enumerate(zip(rows, groups)):
            values = {c: number(row[c]) for c in numeric}
            present = [v for v in values.values() if v is not None]
            score = sum(present) if present else None
            advantage = number(row.get("advantage"))
            success = success_of(row, ("success",)) if "success" in columns else None
            extra = {c: _plain(row[c]) for c in extras}
            common = dict(score=score, group=group, rewards=values, advantage=advantage, success=success, extra=extra)
            prompt, completion = row.get("prompt"), row.get("completion")
            as_text = isinstance(prompt, str) and not isinstance(completion, (list, tuple)) \
                and not hasattr(completion, "tolist")  # parquet gives message lists as arrays
            if as_text:
                episodes.append(text_episode(i, prompt, str(completion or ""), **common))  # TRL's standard format
            else:  # conversational: message lists (a completion string after messages is one assistant message)
                reply = [{"role": "assistant", "content": completion}] if isinstance(completion, str) else completion
                episodes.append(message_episode(i, prompt, reply, **common))
        self._check_weights(step, episodes)
        return TrajectoryBatch(episodes)

    def _check_weights(self, step: int, episodes: list) -> None:
        logged = next((number(r.get("reward")) for r in self.history() if r["step"] == step + 1 and "reward" in r),
                      None)
        scores = [e.score for e in episodes if e.score is not None]
        if logged is None or not scores:
            return
        mean = sum(scores) / len(scores)
        if not math.isclose(mean, logged, rel_tol=1e-3, abs_tol=1e-4):
            note = (f"the summed reward columns (mean {mean:.4g} at step {step}) differ from TRL's logged reward "
                    f"({logged:.4g}): the run weighted its reward functions (reward_weights), which the files do not "
                    "hold; scores here are unweighted sums")
            if not any(n.startswith("the summed reward columns") for n in self.provenance.notes):
                self.provenance.notes.append(note)

    def read_metrics(self) -> Any:
        rows = [{**r, "source_step": r["step"], "step": r["step"] - 1} for r in self.history() if r["step"] >= 1]
        rows, used = map_metrics(rows, METRICS)
        self.provenance.metric_names = used
        return metric_frame(rows)


def _plain(value: Any) -> Any:
    if hasattr(value, "tolist"):
        return value.tolist()
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return value
