"""What every reader of another trainer's files shares: `Source` (a foreign run presented as a
workbench run: steps, batches, metrics, provenance), `Provenance` (where it came from and what
the trainer did not record), and the builders that turn a recorded row into an `Episode`.

An imported episode is what the source kept, placed where a workbench episode keeps it:

    Episode.messages      the conversation as messages where the source keeps messages; else a
                          "prompt" message and an "assistant" message holding the text as
                          written (a multi-turn conversation flattened by its trainer stays
                          one string: it is never re-split by guessing)
    Episode.turns         one `Turn` per assistant message (tool calls, the tool and user
                          messages after it in `Turn.messages`); text sources: one turn
    Episode.score         the source's total reward (what its advantages were computed from)
    Turn.info (last turn) "rewards": each reward function's value; "advantage": the source's
                          advantage of the episode, where it has one; "success": the source's
                          success signal, only where it has one (never an invented False);
                          "extra": the row's other columns (ground truth, request ids, ...)
    Turn.finish_reason    "length" / "stop" where the source says whether a reply was cut,
                          else "unknown"
    Episode.token_ids     empty unless the source recorded token ids (or `--model` tokenized
                          the text: `workbench.importers.recompute`)

`Provenance.absent` names every field the source did not record, with the sentence the
doctor and the views print ("verl records no sampling logprobs").
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Iterable, Iterator, Mapping, Sequence

from workbench.trajectory import Episode, TrajectoryBatch, Turn

__all__ = ["Source", "SourceError", "Provenance", "Skipped", "FIELDS", "absent_reason", "text_episode",
           "message_episode", "group_by_prompt", "group_by_key", "prompt_key", "map_metrics", "read_jsonl",
           "number", "metric_frame", "batch_metrics", "success_of", "TRAINERS", "plain_messages"]

#: The fields a source may leave out -> what the sentence "<format> records no ..." says.
FIELDS: dict[str, str] = {
    "token_ids": "token ids",
    "logprobs": "sampling logprobs",
    "advantages": "advantages",
    "success": "success signal",
    "action_span": "span of the reply that was read as the action",
    "finish_reason": "finish reasons (which replies were cut at the length limit)",
    "parse_errors": "parse errors",
    "environment_errors": "environment errors",
    "tool_calls": "tool calls",
    "env_seed": "environment seeds",
    "held_out": "held-out evaluations by seed",
    "alignment": "token alignment check",
    "messages": "chat messages (its text is one flat string)",
    "metrics": "metrics file",
}


#: Format name -> the trainer's name as its users write it.
TRAINERS = {"verl": "verl", "trl": "TRL", "art": "ART", "verifiers": "verifiers", "prime-rl": "prime-rl"}


class SourceError(ValueError):
    """A folder (or a file in it) that cannot be read as a run of a known trainer; the
    message names the path, what was looked for and what to do."""


def absent_reason(fmt: str, name: str, hint: str = "") -> str:
    """"verl records no sampling logprobs" (+ "; " + hint)."""
    return f"{fmt} records no {FIELDS.get(name, name)}" + (f"; {hint}" if hint else "")


@dataclass
class Skipped:
    """Lines or files of the source that could not be read and were skipped."""

    count: int = 0
    """How many lines (or whole files) were skipped."""
    first: str = ""
    """The first one's place and error, e.g. "rollout/3.jsonl line 12: Expecting ',' ..."."""

    def add(self, where: str, error: Any) -> None:
        if not self.count:
            self.first = f"{where}: {error}"
        self.count += 1

    def line(self) -> str:
        return f"skipped {self.count} unreadable line(s) or file(s); the first: {self.first}" if self.count else ""


@dataclass
class Provenance:
    """Where an imported run came from (saved as RUN/provenance.json by `workbench import`)."""

    format: str
    """The source format: "verl", "trl", "art", "verifiers" or "prime-rl"."""
    source: str
    """The folder it was read from (absolute)."""
    version: str | None = None
    """The trainer's version where the files say it, else None."""
    absent: dict[str, str] = field(default_factory=dict)
    """Field -> the sentence saying the source did not record it (`FIELDS`; `metric:NAME` for a
    metric the source did not log)."""
    groups: str = ""
    """How episodes were put into groups: the source's key (e.g. "uid", "group_index") or
    "same prompt within a step"."""
    metric_names: dict[str, str] = field(default_factory=dict)
    """Workbench metric name -> the source's metric it was mapped from (both are kept)."""
    steps: str = ""
    """How the source's step numbers map to the run's 0-based steps."""
    skipped: dict[str, Any] = field(default_factory=dict)
    """{"count", "first"}: what could not be read (`Skipped`); {} when all was read."""
    notes: list[str] = field(default_factory=list)
    """Other facts a reader needs (how the score was summed, which key gave success)."""
    estimator: str | None = None
    """The trainer's advantage estimator where its files or its design say it ("grpo"), else None."""
    recomputed: dict[str, Any] = field(default_factory=dict)
    """With `--model`: {"model", "ref_model", "fields"}: per-token values recomputed by teacher
    forcing, not sampled."""

    @property
    def trainer(self) -> str:
        """The trainer's name as its users write it ("TRL" for "trl")."""
        return TRAINERS.get(self.format, self.format)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Provenance":
        known = {f for f in cls.__dataclass_fields__}
        return cls(**{k: v for k, v in data.items() if k in known})

    def line(self) -> str:
        """One line: format, version, source, groups."""
        version = f" {self.version}" if self.version else ""
        return f"imported from {self.trainer}{version} ({self.source}); groups: {self.groups}"


class Source:
    """A run written by another trainer, read from its own files: subclasses (one per format)
    fill `provenance` and implement `_train_files`/`_eval_files` (0-based step -> file),
    `_read(file, split)` (-> rows) and `_episodes(rows, step, split)`; `metrics` and `config`
    are read at open. Nothing in the source folder is written or moved."""

    format = ""

    def __init__(self, path: str | Path):
        self.path = Path(path).resolve()
        self.provenance = Provenance(format=self.format, source=str(self.path))
        self.skipped = Skipped()
        self.tokenizer: Any = None
        """A tokenizer when `--model` gave one (token views decode with it)."""
        self.recompute: Any = None
        """`workbench.importers.recompute.Recompute` when `--model` was given."""
        self._parquet_ok: set[Path] = set()
        self._parquet_bad: set[Path] = set()

    # -- what subclasses give ----------------------------------------------------------------
    def _train_files(self) -> dict[int, Any]:
        raise NotImplementedError

    def _eval_files(self) -> dict[int, Any]:
        return {}

    def _batch(self, where: Any, step: int, split: str) -> TrajectoryBatch:
        raise NotImplementedError

    def read_metrics(self) -> Any:
        """The source's own metric history (a DataFrame, one row per 0-based step, "step" and
        "source_step" columns), with the workbench names added (`map_metrics`); empty for a source
        that logs none (an evaluation)."""
        return metric_frame([])

    def read_evals(self) -> list[dict[str, Any]]:
        """Held-out numbers per evaluation step (`[{"step", "eval/reward_mean", ...}]`), from the
        held-out batches ("eval/success_rate" only where success is reported)."""
        out = []
        for step in self.eval_steps:
            m = batch_metrics(self.eval_batch(step))
            out.append({"step": step, "eval/reward_mean": m["reward/mean"],
                        **({"eval/success_rate": m["env/success_rate"]} if "env/success_rate" in m else {})})
        return out

    def read_all_metrics(self, per_step: list[dict[str, Any]] | None = None) -> Any:
        """`read_metrics` with each step's batch numbers (`batch_metrics`) filled in where the
        source logged none of that name for that step; reads every batch once (`per_step`: those
        numbers already taken, `[{"step", ...}]`)."""
        import pandas as pd

        frame = self.read_metrics()
        if per_step is None:
            per_step = [{"step": s, **batch_metrics(self.batch(s))} for s in self.steps]
        if not per_step:
            return frame
        derived = pd.DataFrame(per_step)
        if not len(frame):
            return derived
        merged = frame.merge(derived, on="step", how="outer", suffixes=("", "__batch"))
        for col in [c for c in merged.columns if c.endswith("__batch")]:
            name = col[: -len("__batch")]
            merged[name] = merged[name].where(merged[name].notna(), merged[col])
            merged = merged.drop(columns=col)
        return merged.sort_values("step", ignore_index=True)

    def build_config(self, task: str = "", model: str = "") -> Any:
        """A `ConfigStore` for the run: the defaults, with `environment.name` = `task` (the source
        names none: "" unless given) and `model.model_name` = `model` (the model the text was
        tokenized with, when given), `training.adv_estimator` the source's where known.
        `Provenance` says which of these the source recorded."""
        from workbench.config import ConfigStore

        config = ConfigStore()
        config.environment.name = task
        config.model.model_name = model
        if self.provenance.estimator:
            config.training.adv_estimator = self.provenance.estimator
        return config

    def readable_parquet(self, path: Path, label: str) -> bool:
        """Whether the parquet file's footer reads; one that does not (a writer still at work, a
        file cut short) is left out of the steps and counted in `skipped` once."""
        import pyarrow.parquet as pq

        if path in self._parquet_ok:
            return True
        try:
            pq.read_metadata(path)
        except Exception as exc:  # noqa: BLE001 - pyarrow raises several kinds for a file cut short
            if path not in self._parquet_bad:
                self._parquet_bad.add(path)
                self.skipped.add(f"{label}/{path.name}", f"{type(exc).__name__}: {exc}")
            return False
        self._parquet_ok.add(path)
        return True

    # -- the run's face --------------------------------------------------------------------------
    @property
    def steps(self) -> list[int]:
        return sorted(self._train_files())

    @property
    def eval_steps(self) -> list[int]:
        return sorted(self._eval_files())

    def batch(self, step: int) -> TrajectoryBatch:
        files = self._train_files()
        if step not in files:
            raise SourceError(f"{self.path}: no {self.format} training batch of step {step} (steps: "
                              f"{self.steps or 'none'})")
        return self._finish(self._batch(files[step], step, "train"), step)

    def eval_batch(self, step: int) -> TrajectoryBatch:
        files = self._eval_files()
        if step not in files:
            raise SourceError(f"{self.path}: no {self.format} held-out batch of step {step} (steps: "
                              f"{self.eval_steps or 'none'})")
        return self._finish(self._batch(files[step], step, "eval"), None)

    def _finish(self, batch: TrajectoryBatch, step: int | None) -> TrajectoryBatch:
        if self.recompute is not None:
            batch = self.recompute(batch)
        batch.meta.update({"source_format": self.format, "source_trainer": self.provenance.trainer,
                           "absent": dict(self.provenance.absent)})
        if step is not None:
            batch.meta["step"] = step
        self.provenance.skipped = asdict(self.skipped) if self.skipped.count else {}
        return batch


# -- episodes -------------------------------------------------------------------------------------
def number(value: Any) -> float | None:
    """A finite float from a number (numpy too), a bool or a numeric string; else None."""
    if isinstance(value, bool):
        return float(value)
    try:
        out = float(value)
    except (TypeError, ValueError):
        return None
    return out if math.isfinite(out) else None


def success_of(values: Mapping[str, Any], keys: Sequence[str]) -> bool | None:
    """The first of `keys` in `values` whose value reads as a success flag (a bool, or a number
    that is 0 or 1), as a bool; None when there is none (the source reports no success)."""
    for key in keys:
        if key not in values:
            continue
        v = values[key]
        if isinstance(v, bool):
            return v
        x = number(v)
        if x in (0.0, 1.0):
            return bool(x)
    return None


def _last_info(score: float | None, rewards: Mapping[str, Any] | None, advantage: float | None,
               success: bool | None, extra: Mapping[str, Any] | None) -> dict[str, Any]:
    info: dict[str, Any] = {}
    if rewards:
        info["rewards"] = {k: number(v) for k, v in rewards.items()}
    if advantage is not None:
        info["advantage"] = advantage
    if success is not None:
        info["success"] = bool(success)
    if extra:
        info["extra"] = dict(extra)
    return info


def _finish_episode(ep: Episode, score: float | None, info: dict[str, Any]) -> Episode:
    if ep.turns:
        ep.turns[-1].info.update(info)
        ep.turns[-1].done = True
        ep.turns[-1].reward = score if score is not None else 0.0
    ep.rewards = [t.reward for t in ep.turns]
    ep.actions = [t.action for t in ep.turns]
    ep.dones = [t.done for t in ep.turns]
    ep.infos = [t.info for t in ep.turns]
    ep.score = score
    ep.done = True
    ep.success = bool(info.get("success", False))
    return ep


def text_episode(index: int, prompt: str, response: str, *, score: float | None, group: str, env_name: str = "",
                 rewards: Mapping[str, Any] | None = None, advantage: float | None = None,
                 success: bool | None = None, extra: Mapping[str, Any] | None = None,
                 finish_reason: str = "unknown") -> Episode:
    """An episode from a prompt and a response kept as text: one turn, the text as written."""
    turn = Turn(index=0, action=response, finish_reason=finish_reason)
    ep = Episode(episode_id=index, group_id=group, env_name=env_name,
                 messages=[{"role": "prompt", "content": prompt}, {"role": "assistant", "content": response}],
                 turns=[turn], states=[prompt])
    return _finish_episode(ep, score, _last_info(score, rewards, advantage, success, extra))


def _content(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, (list, tuple)):  # OpenAI content parts: keep the text parts
        return "".join(str(p.get("text", "")) if isinstance(p, Mapping) else str(p) for p in content)
    return str(content)


def _tool_calls(message: Mapping[str, Any]) -> list[dict[str, Any]]:
    calls = message.get("tool_calls") or []
    if isinstance(calls, str):
        try:
            calls = json.loads(calls)
        except json.JSONDecodeError:
            return [{"name": "?", "arguments": calls, "success": None, "result": None}]
    out = []
    for call in calls if isinstance(calls, (list, tuple)) else []:
        if not isinstance(call, Mapping):
            continue
        fn = call.get("function") if isinstance(call.get("function"), Mapping) else call
        args = fn.get("arguments", "")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        out.append({"name": str(fn.get("name", "?")), "arguments": args, "id": call.get("id"),
                    "success": None, "result": None})
    return out


def plain_messages(messages: Any) -> list[dict[str, Any]]:
    """Messages from what a file holds (numpy arrays of dicts from parquet, lists, a string)."""
    if messages is None:
        return []
    if isinstance(messages, str):
        return [{"role": "user", "content": messages}]
    out = []
    for m in list(messages):
        if isinstance(m, Mapping):
            d = {k: (v.tolist() if hasattr(v, "tolist") else v) for k, v in m.items() if v is not None}
            out.append(d)
    return out


def message_episode(index: int, prompt: Sequence[Mapping[str, Any]], completion: Sequence[Mapping[str, Any]], *,
                    score: float | None, group: str, env_name: str = "", rewards: Mapping[str, Any] | None = None,
                    advantage: float | None = None, success: bool | None = None,
                    extra: Mapping[str, Any] | None = None, finish_reasons: Sequence[str] | None = None,
                    trained: Sequence[bool] | None = None) -> Episode:
    """An episode from chat messages: `prompt` before the first reply, `completion` from it on.
    Each assistant message of `completion` is a turn (`trained[i]` False: a message the source
    did not train on, kept as a "human" turn); the messages after it (tool results, user
    turns) are that turn's `messages`; a tool message answering a call fills the call's result."""
    prompt, completion = plain_messages(prompt), plain_messages(completion)
    turns: list[Turn] = []
    states = ["\n".join(_content(m) for m in prompt if m.get("role") != "system")]
    for k, m in enumerate(completion):
        role = m.get("role")
        if role == "assistant":
            i = len(turns)
            reason = finish_reasons[i] if finish_reasons is not None and i < len(finish_reasons) else "unknown"
            source = "model" if trained is None or k >= len(trained) or trained[k] else "human"
            turns.append(Turn(index=i, action=_content(m), tool_calls=_tool_calls(m), finish_reason=reason,
                              source=source))
        elif turns:
            turn = turns[-1]
            turn.messages.append({"role": role or "user", "content": _content(m),
                                  **({"name": m["name"]} if m.get("name") else {})})
            turn.observation = "\n".join(x["content"] for x in turn.messages)
            if role == "tool":
                pending = [c for c in turn.tool_calls if c["result"] is None]
                call = next((c for c in pending if c.get("id") and c["id"] == m.get("tool_call_id")),
                            pending[0] if pending else None)
                if call is not None:
                    call["result"], call["success"] = _content(m), True
        else:  # a non-assistant message before the first reply belongs to the prompt
            prompt.append(m)
    for t in turns[:-1]:
        states.append(t.observation)
    ep = Episode(episode_id=index, group_id=group, env_name=env_name, messages=prompt + completion, turns=turns,
                 states=states[:len(turns)] or states)
    return _finish_episode(ep, score, _last_info(score, rewards, advantage, success, extra))


# -- groups -----------------------------------------------------------------------------------------
def prompt_key(prompt: Any) -> str:
    """A prompt as a string that is equal exactly when two prompts are (messages as JSON)."""
    if isinstance(prompt, str):
        return prompt
    return json.dumps(plain_messages(prompt), sort_keys=True, ensure_ascii=False, default=str)


def group_by_prompt(prompts: Iterable[Any]) -> list[str]:
    """Group ids "p0", "p1", ... : rows with identical prompts share one (in order of first
    appearance)."""
    seen: dict[str, str] = {}
    return [seen.setdefault(prompt_key(p), f"p{len(seen)}") for p in prompts]


def group_by_key(keys: Iterable[Any]) -> list[str]:
    """Group ids from the source's own group key, as strings."""
    return [str(k) for k in keys]


# -- files and metrics -------------------------------------------------------------------------------
def read_jsonl(path: Path, skipped: Skipped, label: str | None = None) -> Iterator[dict[str, Any]]:
    """The JSON objects of a JSONL file, one a line; a line that is not one (cut short by a
    writer still at work, damaged) is skipped and counted in `skipped`. Blank lines are ignored."""
    name = label or path.name
    with path.open("rb") as f:
        for number_, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                skipped.add(f"{name} line {number_}", f"{type(exc).__name__}: {exc}")
                continue
            if not isinstance(row, dict):
                skipped.add(f"{name} line {number_}", "not a JSON object")
                continue
            yield row


def map_metrics(rows: list[dict[str, Any]], mapping: Mapping[str, Sequence[str]]) -> tuple[list[dict], dict]:
    """Each row with the workbench names added: `mapping` is workbench name -> the source names
    to take it from, first present wins. Returns (rows, {workbench name: source name used})."""
    used: dict[str, str] = {}
    out = []
    for row in rows:
        row = dict(row)
        for name, candidates in mapping.items():
            if name in row:
                continue
            for c in candidates:
                x = number(row.get(c))
                if x is not None:
                    row[name] = x
                    used.setdefault(name, c)
                    break
        out.append(row)
    return out, used


def metric_frame(rows: list[dict[str, Any]]) -> Any:
    """Rows as a DataFrame sorted by "step" (one row per step: rows of one step merged)."""
    import pandas as pd

    merged: dict[int, dict[str, Any]] = {}
    for row in rows:
        merged.setdefault(int(row["step"]), {}).update(row)
    frame = pd.DataFrame([merged[s] for s in sorted(merged)])
    return frame if len(frame) else pd.DataFrame(columns=["step"])


def batch_metrics(batch: TrajectoryBatch) -> dict[str, float]:
    """The workbench's per-step numbers of an imported batch: reward, group and (only when the
    source reports success) success rate; response length only when tokens were recorded."""
    eps = batch.episodes
    n = max(len(eps), 1)
    rewards = [e.outcome for e in eps]
    mean = sum(rewards) / n
    out = {"episodes": float(len(eps)), "reward/mean": mean,
           "reward/std": (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5,
           "reward/max": max(rewards, default=math.nan), "reward/min": min(rewards, default=math.nan),
           "env/turns_mean": sum(e.num_turns for e in eps) / n, **batch.group_stats()}
    if any("success" in t.info for e in eps for t in e.turns):
        out["env/success_rate"] = sum(bool(e.success) for e in eps) / n
    if any(e.token_ids for e in eps):
        out["rollout/response_length_mean"] = sum(e.response_length for e in eps) / n
    return out


# -- recorded tokens ------------------------------------------------------------------------------
def append_recorded(ep: Episode, ids: Sequence[int], mask: Sequence[Any], logprobs: Sequence[Any] | None,
                    turn: int, per_token: dict[str, list[float]] | None = None,
                    values: Mapping[str, Sequence[Any] | None] | None = None) -> tuple[int, int]:
    """Append tokens a source recorded to `ep`: `mask` True/1 for sampled tokens, `logprobs` for
    every token (or for the sampled ones only, when shorter), `values` more per-token streams by
    field name (same layouts) gathered in `per_token[name]`. Returns the (start, end) of the
    sampled tokens appended (end == start when none)."""
    n = len(ids)
    trained = [1 if bool(m) else 0 for m in list(mask)[:n]] + [0] * max(0, n - len(mask))

    def spread(stream: Sequence[Any] | None) -> list[float]:
        if stream is None:
            return [0.0] * n
        stream = list(stream)
        if len(stream) == n:
            return [number(x) or 0.0 for x in stream]
        it = iter(stream)  # one value per sampled token
        return [(number(next(it, None)) or 0.0) if t else 0.0 for t in trained]

    start = ep.num_tokens
    ep.token_ids.extend(int(x) for x in ids)
    ep.loss_mask.extend(trained)
    ep.rollout_logprobs.extend(spread(logprobs))
    ep.turn_index.extend([turn] * n)
    for name, stream in (values or {}).items():
        if per_token is not None:
            per_token.setdefault(name, [])
            per_token[name].extend(spread(stream))
    sampled = [start + i for i, t in enumerate(trained) if t]
    return (sampled[0], sampled[-1] + 1) if sampled else (ep.num_tokens, ep.num_tokens)


def batch_with_fields(episodes: list[Episode], fields: list[dict[str, list[float]]]) -> TrajectoryBatch:
    """A batch of `episodes` with per-token fields (`fields[i]`: name -> one value per token of
    episode i) set as (B, T) tensors; a name some episode lacks is 0 there."""
    import torch

    batch = TrajectoryBatch(episodes)
    names = sorted({k for f in fields for k in f})
    B, T = batch.tensors["input_ids"].shape
    for name in names:
        t = torch.zeros((B, T), dtype=torch.float32)  # (B, T)
        for b, f in enumerate(fields):
            vals = f.get(name)
            if vals:
                t[b, :len(vals)] = torch.tensor(vals[:T], dtype=torch.float32)
        batch.tensors[name] = t
    return batch
