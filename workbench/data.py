"""Datasets for `Trainer(dataset=...)`: what each item asks of its episodes.

    Trainer(config, environment=env, dataset=[{"seed": 3}, {"seed": 4, "params": {"max_number": 50}}])
    Trainer(config, dataset=[{"prompt": "What is 2+3?", "answer": "5"}], reward_fn=fn)  # no env: prompts
    Trainer(config, environment=env, dataset=torch_map_style_dataset)  # indexed, never list()-ed

Dataset items (`EpisodeDataset` normalises them; an item is read when its episode starts):

  * an int: the environment seed of one episode group (the older `dataset=` form);
  * a dict with any of
      - `seed` (or `env_seed`, `index`): the environment seed; default: the item's position;
      - `prompt` (or `raw_prompt`): the opening text of the episode; with an environment
        the environment is still reset (with the item's seed and params) but the model
        sees this text instead of the first observation (datasets built from
        observations, seeds 002/003); a list of chat messages counts too (the last user
        message is the text, a system message becomes the system prompt);
      - `initial_prompt`: text put before the first observation (Rollout's `initial_prompt`);
      - `params` (or `env_params`): environment parameters for this item; the episode's
        environment is built as `type(env)(config)` with these merged into `config.params`;
      - anything else (a ground truth, a state, ...): kept with the episode's first turn
        (`info["dataset_item"]`) and shown in `DataProto.non_tensor_batch`; tensors such as
        `input_ids` are dropped (the rollout tokenizes with the chat template itself);
  * anything with `__len__` and `__getitem__` (a torch map-style `Dataset`, a list, a
    `datasets.Dataset`) holding those items; it is indexed, never iterated to the end.

Without an environment, a dataset whose items carry prompts trains single-turn on the
prompts (`PromptEnvironment`: the reply ends the episode with reward 0; give a
`reward_fn`), as verl's RLHF datasets do.

verl's `RLHFDataset` and `DataProto` view live in `workbench.compat.verl_data`.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import torch

from workbench.environments.base import BaseEnvironment, StepResult

SEED_KEYS = ("seed", "env_seed", "index")
PROMPT_KEYS = ("prompt", "raw_prompt")
PARAM_KEYS = ("params", "env_params")
#: Tokenized fields a prompt dataset may carry; the rollout tokenizes itself, so they are dropped.
TOKEN_KEYS = ("input_ids", "attention_mask", "position_ids")


@dataclass(frozen=True)
class EpisodeSpec:
    """What one dataset item asks of its episodes."""

    seed: int | None
    """Environment seed (the episodes of one GRPO group share it)."""
    index: int = 0
    """Position of the item in the dataset."""
    prompt: str | None = None
    """Opening text shown instead of the first observation."""
    initial_prompt: str | None = None
    """Text put before the first observation."""
    system_prompt: str | None = None
    """System prompt for this item (from a chat-message prompt)."""
    params: dict[str, Any] = field(default_factory=dict)
    """Environment parameters merged into `config.params`."""
    extra: dict[str, Any] = field(default_factory=dict)
    """The item's other fields, kept with the episode."""

    @property
    def group_id(self) -> str:
        return f"item{self.index}:seed{self.seed}"


def _prompt_text(value: Any, where: str) -> tuple[str, str | None]:
    """(user text, system prompt or None) from a str or a list of chat messages."""
    if isinstance(value, str):
        return value, None
    if isinstance(value, np.ndarray):
        value = value.tolist()
    if isinstance(value, (list, tuple)) and value and all(isinstance(m, Mapping) for m in value):
        users = [m.get("content", "") for m in value if m.get("role") == "user"]
        systems = [m.get("content", "") for m in value if m.get("role") == "system"]
        if not users:
            raise ValueError(f"{where}: a chat-message prompt needs a message with role 'user'")
        return str(users[-1]), (str(systems[0]) if systems else None)
    raise TypeError(f"{where}: the prompt must be a str or a list of {{'role', 'content'}} messages, "
                    f"got {type(value).__name__}")


def item_to_spec(item: Any, index: int) -> EpisodeSpec:
    """Normalise one dataset item (see the module docstring); errors name the item."""
    where = f"dataset item {index}"
    if isinstance(item, (bool, np.bool_)):
        raise TypeError(f"{where} is a bool; give an int seed or a dict")
    if isinstance(item, (int, np.integer)):
        return EpisodeSpec(seed=int(item), index=index)
    if not isinstance(item, Mapping):
        raise TypeError(f"{where} is a {type(item).__name__}; items must be int seeds or dicts with "
                        f"'prompt' and/or 'seed' / 'params' (see workbench.data)")
    item = dict(item)
    seed = next((item[k] for k in SEED_KEYS if item.get(k) is not None), index)
    if isinstance(seed, torch.Tensor):
        seed = seed.item()
    try:
        seed = int(seed)
    except (TypeError, ValueError):
        raise TypeError(f"{where}: the seed must be an int, got {seed!r}") from None
    prompt = system = None
    key = next((k for k in PROMPT_KEYS if item.get(k) is not None), None)
    if key is not None:
        prompt, system = _prompt_text(item[key], f"{where}[{key!r}]")
    initial = item.get("initial_prompt")
    if initial is not None and not isinstance(initial, str):
        raise TypeError(f"{where}['initial_prompt'] must be a str, got {type(initial).__name__}")
    params = next((item[k] for k in PARAM_KEYS if item.get(k) is not None), {})
    if not isinstance(params, Mapping):
        raise TypeError(f"{where}['params'] must be a dict of environment parameters, got {type(params).__name__}")
    used = set(SEED_KEYS) | set(PROMPT_KEYS) | set(PARAM_KEYS) | set(TOKEN_KEYS) | {"initial_prompt"}
    extra = {k: v for k, v in item.items() if k not in used and not isinstance(v, torch.Tensor)}
    return EpisodeSpec(seed=seed, index=index, prompt=prompt, initial_prompt=initial, system_prompt=system,
                       params=dict(params), extra=extra)


class EpisodeDataset:
    """An indexable view of a `dataset=` argument whose items are `EpisodeSpec`s.

    Accepts a sequence or map-style dataset (`__len__` + `__getitem__`, indexed lazily)
    or a finite iterable of int seeds (read once). The first item is checked at once so
    a malformed dataset fails when the trainer is built, not at every episode.
    """

    def __init__(self, data: Any):
        if isinstance(data, EpisodeDataset):
            data = data.data
        if isinstance(data, (str, bytes, Mapping)):
            raise TypeError(f"dataset= must be a list or a Dataset of items, got a {type(data).__name__}; "
                            f"for a parquet/JSONL file use RLHFDataset(path)")
        if not (hasattr(data, "__len__") and hasattr(data, "__getitem__")):
            if not isinstance(data, Iterable):
                raise TypeError(f"dataset= must be a sequence, a map-style Dataset or an iterable of seeds, "
                                f"got {type(data).__name__}")
            data = list(data)  # a generator of seeds: finite by contract
        self.data = data
        if len(self) == 0:
            raise ValueError("dataset= is empty; give at least one item (or dataset=None for fresh seeds)")
        self.first = self[0]

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, index: int) -> EpisodeSpec:
        return item_to_spec(self.data[index], index)

    @property
    def has_prompts(self) -> bool:
        """Whether the items carry prompts (checked on the first item)."""
        return self.first.prompt is not None

    def __repr__(self) -> str:
        return f"EpisodeDataset({len(self)} items of {type(self.data).__name__})"


class PromptEnvironment(BaseEnvironment):
    """Single-turn episodes on a prompt: `reset` returns `params["prompt"]`, the reply
    ends the episode with reward 0 (score it with a `reward_fn`)."""

    def reset(self) -> str:
        return str(self.params.get("prompt", ""))

    def step(self, action: str) -> StepResult:
        return "", 0.0, True, {}


def _with_opening(env: Any, spec: EpisodeSpec) -> Any:
    """Make `env.reset` (this instance only) return the item's opening text."""
    inner_reset, inner_step = env.reset, env.step

    def reset(*args: Any, **kwargs: Any) -> str:
        obs = inner_reset(*args, **kwargs)
        text = spec.prompt if spec.prompt is not None else obs
        if spec.initial_prompt:
            text = f"{spec.initial_prompt}\n\n{text}" if text else spec.initial_prompt
        env._dataset_item_pending = bool(spec.extra)
        return text

    def step(action: str, *args: Any, **kwargs: Any) -> StepResult:
        obs, reward, done, info = inner_step(action, *args, **kwargs)
        if getattr(env, "_dataset_item_pending", False):
            info = dict(info or {})
            info["dataset_item"] = dict(spec.extra)
            env._dataset_item_pending = False
        return obs, reward, done, info

    if spec.prompt is not None or spec.initial_prompt or spec.extra:
        env.reset, env.step = reset, step
    return env


def make_episode_env(make_env: Callable[[], Any], spec: EpisodeSpec) -> Any:
    """A fresh environment for one episode of `spec` (params applied, opening text set)."""
    env = make_env()
    if isinstance(env, PromptEnvironment) and spec.prompt is not None:
        env.params["prompt"] = spec.prompt
        spec = EpisodeSpec(seed=spec.seed, index=spec.index, initial_prompt=spec.initial_prompt,
                           system_prompt=spec.system_prompt, extra=spec.extra)
    if spec.params:
        config = getattr(env, "config", None)
        if config is None or not hasattr(config, "params"):
            raise TypeError(f"dataset item {spec.index} has params {sorted(spec.params)}, but "
                            f"{type(env).__name__} has no config.params; use a BaseEnvironment")
        config = copy.deepcopy(config)
        config.params = {**config.params, **spec.params}
        try:
            env = type(env)(config)
        except TypeError as exc:
            raise TypeError(f"dataset item {spec.index} has params, so its environment is rebuilt as "
                            f"{type(env).__name__}(config); that failed: {exc}") from exc
    if spec.system_prompt is not None and hasattr(getattr(env, "config", None), "system_prompt"):
        env.config.system_prompt = spec.system_prompt
    return _with_opening(env, spec)


def episode_inputs(make_env: Callable[[], Any], seeds: Sequence[Any]
                   ) -> tuple[list[Any], list[int | None], list[str] | None]:
    """(environments, seeds, group ids) for a rollout over int seeds or `EpisodeSpec`s."""
    if not any(isinstance(s, EpisodeSpec) for s in seeds):
        return [make_env() for _ in seeds], list(seeds), None
    specs = [s if isinstance(s, EpisodeSpec) else EpisodeSpec(seed=s, index=-1) for s in seeds]
    return ([make_episode_env(make_env, s) for s in specs], [s.seed for s in specs],
            [s.group_id if s.index >= 0 else f"seed{s.seed}" for s in specs])
