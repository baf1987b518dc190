"""verifiers' evaluation results (`vf-eval`, verifiers 0.1-0.3), read as a workbench run.

What verifiers writes (its source, 0.3.1 `verifiers.legacy.utils.save_utils`):

    results.jsonl     one line per rollout (`state_to_output`, appended by `save_outputs`):
                      "example_id", "prompt" and "completion" (message lists), "answer", "info",
                      "reward", "metrics" (each reward function's value, also flattened into the
                      row), "error" (an error's "error"/"message"), "is_completed", "is_truncated",
                      "stop_condition", "timing", "token_usage"; with `state_columns=["trajectory"]`
                      a "trajectory" list with one step per model call: "prompt", "completion",
                      "tokens" ("prompt_ids", "prompt_mask", "completion_ids",
                      "completion_mask", "completion_logprobs"), "reward", "advantage",
                      "is_truncated"
    metadata.json     "env_id", "model", "num_examples", "rollouts_per_example",
                      "sampling_args", "avg_reward", "avg_metrics", "version_info"
                      ({"vf_version", ...}), "state_columns"

An evaluation is one batch: its rollouts are step 0. Groups: "example_id" (the rollouts of
one example). Where the trajectory column holds token ids, the episode is token-exact: ids,
loss mask, sampling logprobs and per-token advantages as recorded (a step whose prompt does
not extend the ids before it starts a new sequence, `Episode.segments`). A reply is "length"
when its step (or the rollout, for its last reply) is truncated. Success: a "success"
metric, else none.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from workbench.importers.source import (
    Source, SourceError, absent_reason, append_recorded, batch_with_fields, group_by_key, message_episode, number,
    read_jsonl, success_of,
)
from workbench.trajectory import Episode, TrajectoryBatch

__all__ = ["VerifiersSource", "detect"]


def _results(path: Path) -> Path | None:
    if path.is_file() and path.name == "results.jsonl":
        return path
    if (path / "results.jsonl").is_file() and (path / "metadata.json").is_file():
        return path / "results.jsonl"
    return None


def detect(path: Path) -> str | None:
    found = _results(path)
    return f"verifiers results in {found}" if found else None


class VerifiersSource(Source):
    """A vf-eval results folder (results.jsonl, metadata.json)."""

    format = "verifiers"

    def __init__(self, path: str | Path, success_key: str | None = None):
        super().__init__(path)
        self.results = _results(self.path)
        if self.results is None:
            raise SourceError(f"{self.path}: no results.jsonl with metadata.json (vf-eval writes them)")
        self.metadata: dict[str, Any] = {}
        try:
            self.metadata = json.loads((self.results.parent / "metadata.json").read_text(encoding="utf-8"))
        except (OSError, ValueError) as exc:
            self.skipped.add("metadata.json", f"{type(exc).__name__}: {exc}")
        self.success_keys = (success_key, "success") if success_key else ("success",)
        p = self.provenance
        p.version = (self.metadata.get("version_info") or {}).get("vf_version")
        p.groups = "example_id"
        p.steps = "an evaluation: its rollouts are step 0"
        p.absent = {name: absent_reason("verifiers", name) for name in (
            "action_span", "parse_errors", "env_seed", "held_out", "alignment")}
        p.absent["metrics"] = absent_reason("verifiers", "metrics", "an evaluation has no training history")
        p.absent["success"] = absent_reason("verifiers", "success", "no \"success\" metric")
        p.notes.append(f"environment {self.metadata.get('env_id', '?')}, model {self.metadata.get('model', '?')}, "
                       f"{self.metadata.get('rollouts_per_example', '?')} rollouts per example")

    def build_config(self, task: str = "", model: str = "") -> Any:
        return super().build_config(task or str(self.metadata.get("env_id", "")), model)

    def _train_files(self) -> dict[int, Path]:
        return {0: self.results}

    def _batch(self, where: Path, step: int, split: str) -> TrajectoryBatch:
        rows = list(read_jsonl(where, self.skipped, "results.jsonl"))
        groups = group_by_key(r.get("example_id") for r in rows)
        episodes, fields = [], []
        tokens = any(_token_steps(r) for r in rows)
        for name in ("token_ids", "logprobs", "advantages"):
            if tokens:
                self.provenance.absent.pop(name, None)
            else:
                self.provenance.absent[name] = absent_reason(
                    "verifiers", name, "its results hold no \"trajectory\" column (vf-eval --state-columns "
                                       "trajectory)" + ("; --model tokenizes the text" if name == "token_ids" else ""))
        for i, (row, group) in enumerate(zip(rows, groups)):
            metrics = row.get("metrics") if isinstance(row.get("metrics"), dict) else {}
            success = success_of(metrics, self.success_keys)
            if success is not None:
                self.provenance.absent.pop("success", None)
            score = number(row.get("reward"))
            steps = _token_steps(row)
            reasons = [("length" if s.get("is_truncated") else "stop") for s in steps] if steps else None
            if reasons is None:
                n = sum(1 for m in row.get("completion") or [] if isinstance(m, dict) and m.get("role") == "assistant")
                reasons = ["stop"] * max(n - 1, 0) + (["length" if row.get("is_truncated") else "stop"] if n else [])
            extra = {k: row.get(k) for k in ("answer", "info", "stop_condition", "is_completed") if k in row}
            ep = message_episode(i, row.get("prompt") or [], row.get("completion") or [], score=score, group=group,
                                 env_name=str(self.metadata.get("env_id", "")), rewards=metrics, success=success,
                                 extra=extra, finish_reasons=reasons)
            error = row.get("error")
            if error:
                text = error.get("message") or error.get("error") if isinstance(error, dict) else str(error)
                ep.error = f"environment error: {text}"
            per_token: dict[str, list[float]] = {}
            if steps:
                _add_tokens(ep, steps, per_token)
            episodes.append(ep)
            fields.append(per_token)
        return batch_with_fields(episodes, fields)


def _token_steps(row: dict[str, Any]) -> list[dict[str, Any]]:
    steps = row.get("trajectory")
    if not isinstance(steps, list):
        return []
    return [s for s in steps if isinstance(s, dict) and isinstance(s.get("tokens"), dict)
            and s["tokens"].get("completion_ids") is not None]


def _add_tokens(ep: Episode, steps: list[dict[str, Any]], per_token: dict[str, list[float]]) -> None:
    """The trajectory's token ids, step by step: each step's prompt after the ids so far (its new
    part, or a new sequence where it does not extend them), then its completion."""
    for k, step in enumerate(steps):
        tok = step["tokens"]
        prompt, completion = list(tok.get("prompt_ids") or []), list(tok.get("completion_ids") or [])
        context = ep.context_ids()
        shared = 0
        while shared < min(len(context), len(prompt)) and context[shared] == prompt[shared]:
            shared += 1
        if ep.num_tokens and shared < len(context):
            ep.start_sequence(shared)
        new = prompt[shared:]
        zeros = [0.0] * len(new)
        append_recorded(ep, new, [0] * len(new), None, k - 1 if k else -1, per_token, {"advantages": zeros})
        advantage = number(step.get("advantage"))
        mask = tok.get("completion_mask") or [1] * len(completion)
        start, end = append_recorded(ep, completion, mask, tok.get("completion_logprobs"), k, per_token,
                                     {"advantages": [advantage or 0.0] * len(completion)})
        if k < len(ep.turns):
            ep.turns[k].token_start, ep.turns[k].token_end = start, end
        if k == 0:
            ep.prompt_length = len(new)
