"""prime-rl's output folder, read as a workbench run.

What prime-rl writes (its source, 2026; the file monitor is on by default):

    metrics.jsonl                       one line per step from the trainer and the orchestrator:
                                        {"step", "time", ...} ("reward/mean", "entropy/all/mean",
                                        "mismatch_kl/all/mean", "optim/grad_norm", "loss/mean",
                                        "time/step", ...)
    rollouts/step_N/{train,eval}/{all,effective}/traces.jsonl
                                        one line per episode, `Episode.to_record()` of verifiers
                                        v1: "env", "group" {"id"}, "ok", "errors", "traces"; each
                                        trace's "nodes" are the conversation as a tree, each node
                                        a message with its token ids, "mask" (sampled tokens),
                                        "logprobs" and "advantages" (over the sampled tokens);
                                        "calls" ({"node", "finish_reason"}), "rewards" ({name:
                                        {"score", "weight"}}), "metrics". "effective" holds what
                                        was trained on (written per finalized batch), "all" grows
                                        one episode at a time
    token_exports/step_N/rank_R.jsonl   with trainer.enable_token_export: one record per trained
                                        sequence: "token_ids", "loss_mask", "advantages",
                                        "inference_logprobs", "trainer_logprobs", "entropy", ...;
                                        a "STABLE" file marks a step whose ranks all finished

prime-rl's step N is the run's step N. Episodes come from the traces, token-exact (each trace's
last sampled node and its ancestors: ids, mask, sampling logprobs, advantages as recorded);
`effective` traces where a step has them, else `all`. Groups: the episode's "group" id. From
a step's token export (only one marked STABLE), the mean |trainer - inference| logprob of the
trained tokens becomes `actor/rollout_logprob_diff` and their mean entropy `actor/entropy`
when metrics.jsonl has none. A step is complete when metrics.jsonl has a row for it or a later
step's traces exist: `load_run` on a run still training leaves out the step being written.
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from workbench.importers.source import (
    Source, SourceError, absent_reason, append_recorded, batch_with_fields, group_by_key, map_metrics, metric_frame,
    number, read_jsonl, success_of,
)
from workbench.trajectory import Episode, TrajectoryBatch, Turn

__all__ = ["PrimeRLSource", "detect", "METRICS"]

_STEP = re.compile(r"step_(\d+)")
METRICS: dict[str, tuple[str, ...]] = {
    "reward/mean": ("reward/mean",),
    "actor/entropy": ("entropy/all/mean",),
    "actor/grad_norm": ("optim/grad_norm",),
    "actor/pg_loss": ("loss/mean",),
    "perf/step_seconds": ("time/step",),
}


def _step_dirs(folder: Path) -> dict[int, Path]:
    if not folder.is_dir():
        return {}
    return {int(m.group(1)): p for p in folder.iterdir() if p.is_dir() and (m := _STEP.fullmatch(p.name))}


def _traces(step_dir: Path, kind: str) -> Path | None:
    for subset in ("effective", "all"):
        path = step_dir / kind / subset / "traces.jsonl"
        if path.is_file():
            return path
    return None


def detect(path: Path) -> str | None:
    if not path.is_dir():
        return None
    steps = _step_dirs(path / "rollouts")
    if any(_traces(d, k) for d in steps.values() for k in ("train", "eval")):
        return f"prime-rl traces in {path / 'rollouts'}"
    if _step_dirs(path / "token_exports"):
        return f"prime-rl token exports in {path / 'token_exports'}"
    return None


class PrimeRLSource(Source):
    """A prime-rl output folder: metrics.jsonl, rollouts/step_N/.../traces.jsonl, token_exports/."""

    format = "prime-rl"

    def __init__(self, path: str | Path, success_key: str | None = None):
        super().__init__(path)
        if not detect(self.path):
            raise SourceError(f"{self.path}: no prime-rl rollouts/step_N/{{train,eval}}/.../traces.jsonl")
        if not any(_traces(d, "train") for d in _step_dirs(self.path / "rollouts").values()):
            raise SourceError(f"{self.path}: prime-rl token exports but no traces (rollouts/step_N/train/.../"
                              "traces.jsonl, the file monitor's): the rewards and messages are in the traces")
        self.success_keys = (success_key, "success") if success_key else ("success",)
        p = self.provenance
        p.estimator = "grpo"
        p.groups = "the episode's group id"
        p.steps = "prime-rl's step N is step N here"
        p.absent = {name: absent_reason("prime-rl", name) for name in (
            "action_span", "parse_errors", "env_seed", "held_out", "alignment")}
        p.absent["success"] = absent_reason("prime-rl", "success", "no \"success\" metric")
        if not (self.path / "metrics.jsonl").is_file():
            p.absent["metrics"] = absent_reason("prime-rl", "metrics", "no metrics.jsonl (monitors.file)")
        self._metrics_cache: list[dict[str, Any]] | None = None

    def _rows(self) -> list[dict[str, Any]]:
        if self._metrics_cache is None:
            path = self.path / "metrics.jsonl"
            self._metrics_cache = list(read_jsonl(path, self.skipped, "metrics.jsonl")) if path.is_file() else []
        return self._metrics_cache

    def _files(self, kind: str) -> dict[int, Path]:
        found = {s: t for s, d in _step_dirs(self.path / "rollouts").items() if (t := _traces(d, kind))}
        if not found:
            return {}
        logged = {r.get("step") for r in self._rows()}
        last = max(found)
        if last not in logged and not any(isinstance(s, int) and s > last for s in logged):
            found.pop(last)  # the orchestrator is still writing it
            self.provenance.notes = [n for n in self.provenance.notes if not n.startswith("left out")] + [
                f"left out step {last}: no metrics row for it yet (prime-rl is still writing it)"]
        return found

    def _train_files(self) -> dict[int, Path]:
        return self._files("train")

    def _eval_files(self) -> dict[int, Path]:
        return self._files("eval")

    def _batch(self, where: Path, step: int, split: str) -> TrajectoryBatch:
        episodes, fields = [], []
        for record in read_jsonl(where, self.skipped, f"{where.parents[2].name}/{where.parent.parent.name}/"
                                                      f"{where.parent.name}/traces.jsonl"):
            group = str((record.get("group") or {}).get("id", record.get("id", "")))
            env = str((record.get("env") or {}).get("id", ""))
            errors = record.get("errors") or []
            for trace in record.get("traces") or []:
                per_token: dict[str, list[float]] = {}
                ep = self._episode(len(episodes), trace, group, env, per_token)
                if errors and not ep.error:
                    first = errors[0]
                    ep.error = f"environment error: {first.get('message', first) if isinstance(first, dict) else first}"
                episodes.append(ep)
                fields.append(per_token)
        groups = group_by_key(e.group_id for e in episodes)
        for ep, g in zip(episodes, groups):
            ep.group_id = g
        return batch_with_fields(episodes, fields)

    def _episode(self, index: int, trace: dict[str, Any], group: str, env: str,
                 per_token: dict[str, list[float]]) -> Episode:
        nodes = [n for n in trace.get("nodes") or [] if isinstance(n, dict)]
        sampled = [i for i, n in enumerate(nodes) if n.get("sampled")]
        path: list[int] = []
        here = sampled[-1] if sampled else (len(nodes) - 1 if nodes else None)
        while here is not None and 0 <= here < len(nodes) and here not in path:
            path.append(here)
            here = nodes[here].get("parent")
        path.reverse()
        finish = {c.get("node"): c.get("finish_reason") for c in trace.get("calls") or [] if isinstance(c, dict)}
        recorded = trace.get("rewards") or {}
        rewards = {k: v.get("score") if isinstance(v, dict) else v for k, v in recorded.items()}
        score = sum((number((v or {}).get("score")) or 0.0) * (number((v or {}).get("weight")) or 1.0)
                    for v in (trace.get("rewards") or {}).values() if isinstance(v, dict))
        metrics = trace.get("metrics") or {}
        success = success_of(metrics, self.success_keys)
        if success is not None:
            self.provenance.absent.pop("success", None)
        ep = Episode(episode_id=index, group_id=group, env_name=env)
        turns: list[Turn] = []
        for k in path:
            node = nodes[k]
            message = node.get("message") or {}
            ep.messages.append({key: v for key, v in message.items() if v is not None})
            turn_no = len(turns) - 1 if not node.get("sampled") else len(turns)
            start, end = append_recorded(ep, node.get("token_ids") or [], node.get("mask") or [],
                                         node.get("logprobs"), turn_no, per_token,
                                         {"advantages": node.get("advantages")})
            if node.get("sampled"):
                reason = finish.get(k)
                turns.append(Turn(index=len(turns), action=str(message.get("content") or ""),
                                  token_start=start, token_end=end,
                                  finish_reason=reason if reason in ("stop", "length") else "stop"))
                if len(turns) == 1:
                    ep.prompt_length = start
            elif turns:
                turns[-1].messages.append({"role": message.get("role", "user"),
                                           "content": str(message.get("content") or "")})
                turns[-1].observation = "\n".join(m["content"] for m in turns[-1].messages)
        ep.turns = turns
        if turns:
            turns[-1].reward, turns[-1].done = score, True
            turns[-1].info.update({"rewards": rewards, **({"success": success} if success is not None else {}),
                                   "extra": {"metrics": metrics, "stop_condition": trace.get("stop_condition")}})
        ep.rewards, ep.actions = [t.reward for t in turns], [t.action for t in turns]
        ep.dones, ep.infos = [t.done for t in turns], [t.info for t in turns]
        ep.score, ep.done, ep.success = score, True, bool(success)
        return ep

    # -- metrics -----------------------------------------------------------------------------------
    def read_metrics(self) -> Any:
        rows = [{**r, "source_step": r["step"]} for r in self._rows() if isinstance(r.get("step"), int)]
        by_step: dict[int, dict[str, Any]] = {}
        for r in rows:  # the trainer's and the orchestrator's lines of a step, merged
            by_step.setdefault(r["step"], {}).update(r)
        merged, used = map_metrics(list(by_step.values()), METRICS)
        for row in merged:
            for k, v in self._token_export_metrics().get(row["step"], {}).items():
                if k not in row:
                    row[k] = v
                    used.setdefault(k, "token_exports")
        have = {r["step"] for r in merged}
        for step, values in self._token_export_metrics().items():
            if step not in have:
                merged.append({"step": step, "source_step": step, **values})
                for k in values:
                    used.setdefault(k, "token_exports")
        self.provenance.metric_names = used
        return metric_frame(merged)

    def _token_export_metrics(self) -> dict[int, dict[str, float]]:
        if getattr(self, "_exported", None) is not None:
            return self._exported
        out: dict[int, dict[str, float]] = {}
        for step, folder in _step_dirs(self.path / "token_exports").items():
            if not (folder / "STABLE").exists():
                continue
            gap = ent = 0.0
            n = 0
            for rank_file in sorted(folder.glob("rank_*.jsonl")):
                for rec in read_jsonl(rank_file, self.skipped, f"token_exports/{folder.name}/{rank_file.name}"):
                    mask = rec.get("loss_mask") or []
                    inf, tr, en = rec.get("inference_logprobs") or [], rec.get("trainer_logprobs") or [], \
                        rec.get("entropy") or []
                    for i, m in enumerate(mask):
                        if m and i < len(inf) and i < len(tr) and inf[i] is not None and tr[i] is not None:
                            gap += abs(tr[i] - inf[i])
                            ent += en[i] if i < len(en) and en[i] is not None else 0.0
                            n += 1
            if n:
                out[step] = {"actor/rollout_logprob_diff": gap / n, "actor/entropy": ent / n}
        self._exported = out
        return out
