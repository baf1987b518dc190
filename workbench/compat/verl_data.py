"""verl's data shapes: `RLHFDataset` (prompt rows from parquet/JSONL), `collate_fn`, and
`DataProto`, a view of a `TrajectoryBatch` in verl's layout (not a second batch type).

    ds = RLHFDataset("train.parquet", tokenizer)     # verl's prompt dataset, from parquet or JSONL
    data = DataProto.from_batch(trajectory_batch)    # data.batch / data.non_tensor_batch / data.meta_info

`DataProto`: `batch["prompts"]` (B, P) left-padded, `batch["responses"]` (B, R)
right-padded (everything after the prompt: model turns, observations and tool results of
a multi-turn episode), `response_mask` (B, R) 1 on sampled tokens,
`input_ids`/`attention_mask`/`position_ids` (B, P+R), and every per-token field the batch
has computed, cut to the response part under verl's name (`old_log_probs`, `ref_log_prob`,
`token_level_scores`, `advantages`, ...). `non_tensor_batch` holds numpy object arrays:
`uid` (GRPO group), `env_seed`, `episode`, `prompt`, `response`, `actions`, `rewards`,
`infos`, `score`, `total_reward`, `success` and the dataset items' extra fields.
`meta_info` is the batch's `meta`. `len(data)` and `len(data.batch)` are the batch size.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import torch


def read_records(path: str | Path) -> list[dict[str, Any]]:
    """Rows of a parquet, JSONL (one object per line) or JSON (a list) file as dicts."""
    path = Path(path)
    if not path.exists():
        raise FileNotFoundError(f"dataset file {path} does not exist")
    suffix = path.suffix.lower()
    if suffix == ".parquet":
        import pandas as pd

        return pd.read_parquet(path).to_dict("records")
    if suffix in (".jsonl", ".ndjson"):
        rows = []
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ValueError(f"{path}:{n} is not a JSON object: {exc}") from exc
        return rows
    if suffix == ".json":
        rows = json.loads(path.read_text())
        if not isinstance(rows, list):
            raise ValueError(f"{path} must hold a JSON list of objects")
        return rows
    raise ValueError(f"{path}: unsupported file type {suffix!r}; use .parquet, .jsonl or .json")


class RLHFDataset(torch.utils.data.Dataset):
    """verl's prompt dataset: rows of parquet/JSONL files, one episode group per row.

    Args:
        data_files: a path or a list of paths (.parquet, .jsonl, .json).
        tokenizer: optional; with it each item also has `input_ids` / `attention_mask`
            (1-D, the chat-templated prompt with the generation prompt), as verl returns.
        config: verl's `data` section or a dict: `prompt_key` (default "prompt"),
            `max_prompt_length` (default 1024), `truncation` ("error", "left", "right").
        processor: accepted for verl's signature; multimodal inputs are not supported.
        tokenizer_kwargs: keyword arguments subclasses pass to `tokenizer(...)` calls
            (seed 002's `CustomEnvDataset` does); stored as `self.tokenizer_kwargs`.

    An item is the row (verl's `reward_model`, `extra_info`, `data_source` stay as they
    are) with its prompt under "prompt" (a str or chat messages), plus `index`.
    """

    def __init__(self, data_files: str | Path | Sequence[str | Path], tokenizer: Any = None,
                 config: Mapping[str, Any] | None = None, processor: Any = None,
                 tokenizer_kwargs: Mapping[str, Any] | None = None):
        if processor is not None:
            raise ValueError("RLHFDataset: multimodal processors are not supported; pass processor=None")
        files = [data_files] if isinstance(data_files, (str, Path)) else list(data_files)
        config = dict(config or {})
        self.prompt_key = config.get("prompt_key", "prompt")
        self.max_prompt_length = int(config.get("max_prompt_length", 1024))
        self.truncation = config.get("truncation", "error")
        self.tokenizer = tokenizer
        self.tokenizer_kwargs = dict(tokenizer_kwargs or {})
        self.rows: list[dict[str, Any]] = [row for f in files for row in read_records(f)]
        for n, row in enumerate(self.rows):
            if row.get(self.prompt_key) is None:
                raise ValueError(f"RLHFDataset row {n} has no {self.prompt_key!r} field (columns: {sorted(row)}); "
                                 f"set config prompt_key to the prompt column")

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < len(self.rows):
            raise IndexError(f"RLHFDataset index {index} out of range (len {len(self.rows)})")
        row = dict(self.rows[index])
        prompt = row.pop(self.prompt_key)
        if isinstance(prompt, np.ndarray):
            prompt = prompt.tolist()
        item = {**row, "prompt": prompt, "index": row.get("index", index)}
        if self.tokenizer is not None:
            ids = self._encode(prompt, index)
            item["input_ids"] = torch.tensor(ids, dtype=torch.long)
            item["attention_mask"] = torch.ones(len(ids), dtype=torch.long)
        return item

    def _encode(self, prompt: Any, index: int) -> list[int]:
        messages = [{"role": "user", "content": prompt}] if isinstance(prompt, str) else list(prompt)
        if getattr(self.tokenizer, "chat_template", None):
            ids = self.tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=True)
            ids = list(ids["input_ids"] if isinstance(ids, Mapping) else ids)
        else:
            ids = self.tokenizer("\n".join(m["content"] for m in messages))["input_ids"]
        if len(ids) > self.max_prompt_length:
            if self.truncation == "left":
                ids = ids[-self.max_prompt_length:]
            elif self.truncation == "right":
                ids = ids[: self.max_prompt_length]
            else:
                raise ValueError(f"RLHFDataset row {index}: prompt has {len(ids)} tokens > max_prompt_length "
                                 f"{self.max_prompt_length}; raise it or set truncation='left'/'right'")
        return ids


def collate_fn(data_list: Sequence[Mapping[str, Any]]) -> dict[str, Any]:
    """verl's collate: tensors stacked (1-D ones of unequal length left-padded with 0),
    everything else gathered into numpy object arrays."""
    if not data_list:
        raise ValueError("collate_fn needs at least one item")
    out: dict[str, Any] = {}
    for key in data_list[0]:
        values = [d[key] for d in data_list]
        if all(isinstance(v, torch.Tensor) for v in values):
            n = max(v.shape[-1] for v in values) if values[0].dim() else 0
            if values[0].dim() == 1 and any(v.shape[0] != n for v in values):
                values = [torch.nn.functional.pad(v, (n - v.shape[0], 0)) for v in values]
            out[key] = torch.stack(values)
        else:
            arr = np.empty(len(values), dtype=object)
            arr[:] = values
            out[key] = arr
    return out


# -- DataProto view ------------------------------------------------------------------------

#: workbench token field -> verl's name in `DataProto.batch`.
VERL_FIELD_NAMES = {
    "loss_mask": "response_mask", "old_logprobs": "old_log_probs", "ref_logprobs": "ref_log_prob",
    "rollout_logprobs": "rollout_log_probs", "new_logprobs": "log_probs",
}


class TensorBatch:
    """`DataProto.batch`: named (B, ...) tensors; `len()` is the batch size, as for a
    TensorDict. Non-tensor fields can be read here too (`data.batch["state"]`), as seed
    code does; they live in `non_tensor_batch`."""

    def __init__(self, tensors: Mapping[str, torch.Tensor], batch_size: int,
                 non_tensor: Mapping[str, Any] | None = None):
        self.tensors = dict(tensors)
        self.batch_size = batch_size
        self._non_tensor = non_tensor if non_tensor is not None else {}

    def __len__(self) -> int:
        return self.batch_size

    def __getitem__(self, key: str) -> Any:
        if key in self.tensors:
            return self.tensors[key]
        if key in self._non_tensor:
            return self._non_tensor[key]
        raise KeyError(f"{key!r} is not in this batch; tensors: {sorted(self.tensors)}; "
                       f"non-tensor fields: {sorted(self._non_tensor)}")

    def __setitem__(self, key: str, value: torch.Tensor) -> None:
        if value.shape[0] != self.batch_size:
            raise ValueError(f"batch[{key!r}] must have {self.batch_size} rows, got shape {tuple(value.shape)}")
        self.tensors[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self.tensors

    def keys(self):
        return self.tensors.keys()

    def items(self):
        return self.tensors.items()

    def to(self, device: str | torch.device) -> "TensorBatch":
        return TensorBatch({k: v.to(device) for k, v in self.tensors.items()}, self.batch_size, self._non_tensor)

    def __repr__(self) -> str:
        shapes = ", ".join(f"{k}: {tuple(v.shape)}" for k, v in self.tensors.items())
        return f"TensorBatch(batch_size={self.batch_size}, {shapes})"


def _objects(values: Sequence[Any]) -> np.ndarray:
    arr = np.empty(len(values), dtype=object)
    arr[:] = list(values)
    return arr


class DataProto:
    """verl's `DataProto` shape over workbench data (see the module docstring)."""

    def __init__(self, batch: Mapping[str, torch.Tensor] | TensorBatch | None = None,
                 non_tensor_batch: Mapping[str, Any] | None = None, meta_info: Mapping[str, Any] | None = None):
        self.non_tensor_batch = {k: (v if isinstance(v, np.ndarray) else _objects(v))
                                 for k, v in (non_tensor_batch or {}).items()}
        if isinstance(batch, TensorBatch):
            batch = batch.tensors
        batch = dict(batch or {})
        sizes = {v.shape[0] for v in batch.values()} | {len(v) for v in self.non_tensor_batch.values()}
        if len(sizes) > 1:
            raise ValueError(f"DataProto fields disagree on the batch size: {sorted(sizes)}")
        self.batch = TensorBatch(batch, sizes.pop() if sizes else 0, self.non_tensor_batch)
        self.meta_info = dict(meta_info or {})

    @classmethod
    def from_single_dict(cls, data: Mapping[str, Any], meta_info: Mapping[str, Any] | None = None) -> "DataProto":
        """verl's constructor from one dict (e.g. a `collate_fn` output): tensors to
        `batch`, everything else to `non_tensor_batch`."""
        tensors = {k: v for k, v in data.items() if isinstance(v, torch.Tensor)}
        return cls(tensors, {k: v for k, v in data.items() if k not in tensors}, meta_info)

    @classmethod
    def from_batch(cls, batch: Any, pad_token_id: int = 0) -> "DataProto":
        """The verl layout of a `TrajectoryBatch` (tensors share nothing with it). Episodes
        that hold several token sequences ("rendered" history, `Episode.segments`) have no
        one-sequence layout and are refused."""
        if not batch.has("input_ids"):
            batch.collate()
        episodes = list(batch)
        several = [ep.episode_id for ep in episodes if ep.segments]
        if several:
            raise ValueError(f"episodes {several[:5]} hold several token sequences (inference.history \"rendered\": "
                             "each turn's prompt rendered afresh), which verl's one row per episode cannot hold; "
                             "export a batch rolled out with inference.history=sampled")
        B = len(episodes)
        P = max((ep.prompt_length for ep in episodes), default=0)
        R = max((ep.num_tokens - ep.prompt_length for ep in episodes), default=0)
        prompts = torch.full((B, P), pad_token_id, dtype=torch.long)  # (B, P) left-padded
        prompt_mask = torch.zeros((B, P), dtype=torch.long)
        fields = {name: torch.zeros((B, R), dtype=t.dtype) for name, t in batch.tensors.items()
                  if name not in ("input_ids", "attention_mask", "position_ids")}  # (B, R) response part
        responses = torch.full((B, R), pad_token_id, dtype=torch.long)  # (B, R) right-padded
        response_attn = torch.zeros((B, R), dtype=torch.long)
        for b, ep in enumerate(episodes):
            p, n = ep.prompt_length, ep.num_tokens
            ids = batch.tensors["input_ids"][b].cpu()
            prompts[b, P - p:] = ids[:p]
            prompt_mask[b, P - p:] = 1
            responses[b, : n - p] = ids[p:n]
            response_attn[b, : n - p] = 1
            for name in fields:
                fields[name][b, : n - p] = batch.tensors[name][b, p:n].detach().cpu()
        attention_mask = torch.cat([prompt_mask, response_attn], dim=1)  # (B, P+R)
        tensors = {"prompts": prompts, "responses": responses, "input_ids": torch.cat([prompts, responses], 1),
                   "attention_mask": attention_mask,
                   "position_ids": (attention_mask.cumsum(1) - 1).clamp(min=0) * attention_mask}
        tensors.update({VERL_FIELD_NAMES.get(k, k): v for k, v in fields.items()})
        first_infos = [(ep.infos[0] if ep.infos else {}) for ep in episodes]
        items = [info.get("dataset_item", {}) for info in first_infos]
        non_tensor: dict[str, Any] = {
            "uid": [ep.group_id for ep in episodes], "env_seed": [ep.env_seed for ep in episodes],
            "episode": episodes,
            "prompt": [next((m["content"] for m in ep.messages if m.get("role") == "user"), "") for ep in episodes],
            "response": ["\n".join(ep.actions) for ep in episodes],
            "actions": [list(ep.actions) for ep in episodes], "rewards": [list(ep.rewards) for ep in episodes],
            "infos": [list(ep.infos) for ep in episodes], "score": [ep.score for ep in episodes],
            "total_reward": [ep.total_reward for ep in episodes], "success": [ep.success for ep in episodes],
        }
        for key in sorted({k for item in items for k in item}):
            non_tensor.setdefault(key, [item.get(key) for item in items])
        return cls(tensors, non_tensor, dict(batch.meta))

    def __len__(self) -> int:
        return len(self.batch)

    def __getitem__(self, index: int) -> "DataProto":
        """Row `index` as a one-row DataProto (tensors keep a batch dim of 1)."""
        if not -len(self) <= index < len(self):
            raise IndexError(f"DataProto index {index} out of range (len {len(self)})")
        return DataProto({k: v[index:index + 1] for k, v in self.batch.items()},
                         {k: v[index:index + 1] for k, v in self.non_tensor_batch.items()}, self.meta_info)

    def to(self, device: str | torch.device) -> "DataProto":
        return DataProto(self.batch.to(device).tensors, self.non_tensor_batch, self.meta_info)

    def __repr__(self) -> str:
        return (f"DataProto(batch_size={len(self)}, batch={sorted(self.batch.keys())}, "
                f"non_tensor_batch={sorted(self.non_tensor_batch)}, meta_info={sorted(self.meta_info)})")
