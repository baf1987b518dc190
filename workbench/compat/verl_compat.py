"""Seed 003's adapter names and verl's `RayPPOTrainer` constructor, in one process.

    trainer = RayPPOTrainer(config, tokenizer, role_worker_mapping, resource_pool_manager,
                            reward_fn=fn, train_dataset=RLHFDataset("train.parquet", tokenizer))
    trainer.init_workers(); trainer.fit()

    trainer = create_trainer(config=config, environment=SimpleGameEnvironment(config.environment),
                             tokenizer=tokenizer)      # CustomEnvironmentDataset + EnvironmentRewardWrapper

`RayPPOTrainer` takes both forms: ours, `(config, environment=None, reward_fn=None,
dataset=None, ...)`, and verl's, `(config, tokenizer, role_worker_mapping,
resource_pool_manager, reward_fn=None, train_dataset=None, val_dataset=None,
collate_fn=None, train_sampler=None, device_name=None)` (positional or by keyword; it
is verl's form when a tokenizer or `role_worker_mapping` is given). In verl's form:

  * `config` may be a verl config (dict or OmegaConf) -> `workbench.compat.verl_config.from_verl`;
  * `reward_fn(data: DataProto) -> Tensor` (B,) or (B, R) is called once per episode on
    a one-row `DataProto` (`workbench.compat.verl_data`), its sum is the episode's score;
  * `tokenizer` must tokenize like the model's own (checked); the rollout uses the model's;
  * `role_worker_mapping` and `resource_pool_manager` set `config.ray`'s group sizes
    (`ray_groups_from_pools`, table below); they take effect with `ray.use_ray=True`,
    else everything runs in this process;
  * `train_dataset` is the trainer's `dataset=` (prompts -> single-turn episodes, or
    with `environment=` per-item seeds/params); `train_sampler` fixes the item order
    (read once); `collate_fn` is accepted and unused (items are read one by one);
    `val_dataset` is kept as `trainer.val_dataset`; `device_name` sets `model.device`.

verl's placement -> `config.ray` (`ray_groups_from_pools`); GPUs(P) is the sum of
`resource_pool_spec[P]` (GPUs per node), and GPU fields are set only when the model
runs on CUDA (on a CPU the counts apply and nothing reserves a GPU):

| verl role (in `mapping`) and its pool P          | workbench                                                          |
|---|---|
| `ActorRollout` / `ActorRolloutRef` (colocated)   | `num_learners = num_actors = GPUs(P)`; learners and rollout workers share each GPU: `num_gpus_per_learner = num_gpus_per_actor = 0.5` |
| `Actor` (apart from rollout)                     | `num_learners = GPUs(P)`, `num_gpus_per_learner = 1`                |
| `Rollout` (apart from the actor)                 | `num_actors = GPUs(P)`, `num_gpus_per_actor = 1`                    |
| `Critic` / `CriticValue`                         | trained by the actor's learners (FSDP2, same ranks): must be in the actor's pool |
| `RefPolicy`                                      | reference logprobs come from the controller's frozen copy; recorded |
| `RewardModel`                                    | the reward model of `reward.reward_model` (verl: `reward_model.model.path`), added to the reward by `reward.reward_model_weight`; with `ray.use_ray`, on a reward-model worker (`workbench.distributed.reward_workers`) |
"""
from __future__ import annotations

import copy
import enum
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Sequence

import torch

from workbench.config import ConfigStore
from workbench.compat.verl_data import DataProto
from workbench.data import item_to_spec
from workbench.reward import call_reward_fn
from workbench.trajectory import Episode, TrajectoryBatch
from workbench.training.trainer import Trainer as _Trainer
from workbench.compat.verl_config import from_verl, is_verl_config, to_plain

VERL_ARGS = ("tokenizer", "role_worker_mapping", "resource_pool_manager", "reward_fn", "train_dataset",
             "val_dataset", "collate_fn", "train_sampler", "device_name")


class Role(enum.Enum):
    """verl's worker roles; `ray_groups_from_pools` maps them onto rollout workers and learners."""

    Actor = 0
    Rollout = 1
    ActorRollout = 2
    Critic = 3
    RefPolicy = 4
    RewardModel = 5
    ActorRolloutRef = 6
    CriticValue = 3  # seed 003's name for the critic (alias of Critic)


@dataclass
class ResourcePoolManager:
    """verl's placement: pool name -> GPUs per node, role -> pool (mapped onto `config.ray`
    by `ray_groups_from_pools`)."""

    resource_pool_spec: dict[str, list[int]] = field(default_factory=dict)
    mapping: dict[Any, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        unknown = sorted({str(p) for p in self.mapping.values()} - set(self.resource_pool_spec))
        if unknown:
            raise ValueError(f"ResourcePoolManager.mapping names pools {unknown} that resource_pool_spec "
                             f"does not define ({sorted(self.resource_pool_spec)})")


def _role_name(role: Any) -> str:
    name = role.name if isinstance(role, enum.Enum) else str(role)
    return "Critic" if name == "CriticValue" else name


def ray_groups_from_pools(role_worker_mapping: Mapping[Any, Any] | None,
                          resource_pool_manager: ResourcePoolManager | None, on_cuda: bool) -> dict[str, Any]:
    """`config.ray` fields implied by verl's placement (the table in the module docstring);
    {} when no resource pool manager is given."""
    if resource_pool_manager is None:
        return {}
    gpus = {pool: int(sum(per_node)) for pool, per_node in resource_pool_manager.resource_pool_spec.items()}
    pools = {_role_name(role): str(pool) for role, pool in resource_pool_manager.mapping.items()}
    roles = {_role_name(role) for role in (role_worker_mapping or {})} | set(pools)
    out: dict[str, Any] = {}
    colocated = next((pools[r] for r in ("ActorRollout", "ActorRolloutRef") if r in pools), None)
    actor_pool = colocated or pools.get("Actor")
    if colocated is not None:
        out.update(num_learners=gpus[colocated], num_actors=gpus[colocated])
        if on_cuda:
            out.update(num_gpus_per_learner=0.5, num_gpus_per_actor=0.5)
    else:
        if "Actor" in pools:
            out["num_learners"] = gpus[pools["Actor"]]
            if on_cuda:
                out["num_gpus_per_learner"] = 1.0
        if "Rollout" in pools:
            out["num_actors"] = gpus[pools["Rollout"]]
            if on_cuda:
                out["num_gpus_per_actor"] = 1.0
    if "Critic" in pools and actor_pool is not None and pools["Critic"] != actor_pool:
        raise ValueError(f"the critic is in pool {pools['Critic']!r} and the actor in {actor_pool!r}: here the "
                         "actor's learners train the critic too, so map Role.Critic to the actor's pool")
    bad = sorted(k for k in ("num_learners", "num_actors") if k in out and out[k] < 1)
    if bad:
        raise ValueError(f"resource pools give {bad} no GPUs: {resource_pool_manager.resource_pool_spec}")
    return out


def _reward_value(out: Any, where: str) -> float:
    if isinstance(out, Mapping) and "reward_tensor" in out:  # verl reward managers with return_dict=True
        out = out["reward_tensor"]
    if isinstance(out, torch.Tensor):
        if out.shape[:1] != (1,):
            raise ValueError(f"{where} returned a tensor of shape {tuple(out.shape)}; expected (B,) or (B, R)")
        return float(out.float().sum())
    if isinstance(out, (int, float)):
        return float(out)
    raise TypeError(f"{where} returned {type(out).__name__}; return a torch.Tensor of shape (B,) or (B, R)")


class DataProtoReward:
    """A verl-style `reward_fn(data: DataProto)` as a per-trajectory reward function."""

    def __init__(self, fn: Callable[[DataProto], Any]):
        self.fn = fn

    def __call__(self, trajectory: Episode) -> float:
        data = DataProto.from_batch(TrajectoryBatch([trajectory]))
        return _reward_value(self.fn(data), f"reward_fn {getattr(self.fn, '__name__', type(self.fn).__name__)}")


class EnvironmentRewardWrapper:
    """Seed 003's wrapper: a trajectory reward function (or the environment's own rewards)
    behind verl's `reward_fn(data: DataProto) -> Tensor (B,)`.

    Rows with an `episode` (batches from workbench) are scored as
    `reward_fn(trajectory[, environment])`, or their summed environment rewards without a
    reward_fn. Rows without one (a single-turn verl batch) step a fresh copy of the
    environment, reset with the row's `env_seed` (else `seed`, `index`), with the decoded
    response (needs `tokenizer`) and use that step's reward. Called with a trajectory it
    returns that trajectory's float, so `Trainer(reward_fn=wrapper)` works too.
    """

    def __init__(self, environment: Any, reward_fn: Callable[..., float] | None = None, tokenizer: Any = None):
        self.environment, self.reward_fn, self.tokenizer = environment, reward_fn, tokenizer

    def score_trajectory(self, trajectory: Episode) -> float:
        """`reward_fn(trajectory[, environment])` as the trainer calls it
        (`workbench.reward.call_reward_fn`: the episode's own environment copy when it has
        one, errors that name the episode), or the summed environment rewards."""
        if self.reward_fn is None:
            return float(sum(trajectory.rewards))
        return call_reward_fn(self.reward_fn, trajectory, self.environment)

    def _step_row(self, data: DataProto, i: int) -> float:
        if self.tokenizer is None:
            raise ValueError("EnvironmentRewardWrapper: this batch has no 'episode' rows, so responses are decoded "
                             "and stepped in the environment; pass tokenizer=")
        mask = data.batch["response_mask"][i] if "response_mask" in data.batch else None
        ids = data.batch["responses"][i]
        ids = ids[mask.bool()] if mask is not None else ids
        text = self.tokenizer.decode(ids.tolist(), skip_special_tokens=True)
        nt = data.non_tensor_batch
        seed = next((nt[k][i] for k in ("env_seed", "seed", "index") if k in nt and nt[k][i] is not None), None)
        env = copy.deepcopy(self.environment)
        env.reset(seed=int(seed)) if seed is not None else env.reset()
        return float(env.step(text)[1])

    def __call__(self, data: DataProto | Episode) -> torch.Tensor | float:
        if isinstance(data, Episode):
            return self.score_trajectory(data)
        episodes = data.non_tensor_batch.get("episode")
        rewards = [self.score_trajectory(episodes[i]) if episodes is not None else self._step_row(data, i)
                   for i in range(len(data))]
        return torch.tensor(rewards, dtype=torch.float32)


class CustomEnvironmentDataset(torch.utils.data.Dataset):
    """Seed 003's dataset: item i resets a copy of `environment` with seed `seed_offset + i`
    and renders `prompt_template.format(obs=observation)`.

    Items: `seed`, `index`, `prompt` (the opening text the model sees in that episode) and,
    with a tokenizer, 1-D `input_ids` / `attention_mask` (at most `max_length` tokens).
    """

    def __init__(self, environment: Any, tokenizer: Any = None, num_samples: int = 128,
                 prompt_template: str = "Perform: {obs}", max_length: int = 512, seed_offset: int = 0):
        if "{obs}" not in prompt_template:
            raise ValueError(f"prompt_template must contain '{{obs}}', got {prompt_template!r}")
        if num_samples < 1:
            raise ValueError(f"num_samples must be >= 1, got {num_samples}")
        self.environment, self.tokenizer = environment, tokenizer
        self.num_samples, self.prompt_template = num_samples, prompt_template
        self.max_length, self.seed_offset = max_length, seed_offset

    def __len__(self) -> int:
        return self.num_samples

    def __getitem__(self, index: int) -> dict[str, Any]:
        if not 0 <= index < self.num_samples:
            raise IndexError(f"CustomEnvironmentDataset index {index} out of range (len {self.num_samples})")
        env = copy.deepcopy(self.environment)
        seed = self.seed_offset + index
        obs = env.reset(seed=seed)
        item: dict[str, Any] = {"seed": seed, "index": index, "prompt": self.prompt_template.format(obs=obs)}
        if self.tokenizer is not None:
            ids = self.tokenizer(item["prompt"])["input_ids"][: self.max_length]
            item["input_ids"] = torch.tensor(ids, dtype=torch.long)
            item["attention_mask"] = torch.ones(len(ids), dtype=torch.long)
        return item


class _Ordered:
    """`dataset` read in the order a sampler gives (read once)."""

    def __init__(self, dataset: Any, order: Sequence[int]):
        self.dataset, self.order = dataset, list(order)
        if not self.order:
            raise ValueError("train_sampler yielded no indices")

    def __len__(self) -> int:
        return len(self.order)

    def __getitem__(self, i: int) -> Any:
        return self.dataset[self.order[i]]


def _looks_like_tokenizer(obj: Any) -> bool:
    return callable(getattr(obj, "encode", None)) and callable(getattr(obj, "decode", None)) \
        and not callable(getattr(obj, "step", None))


def _as_store(config: Any) -> ConfigStore:
    if isinstance(config, ConfigStore):
        return config
    plain = to_plain(config)
    if is_verl_config(plain):
        return from_verl(plain)
    if isinstance(plain, Mapping):
        return ConfigStore.from_dict(plain)
    raise TypeError(f"config must be a ConfigStore, a verl config (dict or OmegaConf) or a dict of our sections, "
                    f"got {type(config).__name__}")


class RayPPOTrainer(_Trainer):
    """The trainer under verl's and the seeds' name; takes both constructor forms (module docstring)."""

    def __init__(self, config: Any, *args: Any, **kwargs: Any):
        verl = bool(set(kwargs) & {"tokenizer", "role_worker_mapping", "resource_pool_manager", "train_dataset"}) \
            or (bool(args) and _looks_like_tokenizer(args[0]))
        if not verl:
            super().__init__(_as_store(config), *args, **kwargs)
            return
        if len(args) > len(VERL_ARGS):
            raise TypeError(f"RayPPOTrainer takes at most {len(VERL_ARGS)} arguments after config in verl's form "
                            f"({', '.join(VERL_ARGS)})")
        given = dict(zip(VERL_ARGS, args))
        twice = sorted(set(given) & set(kwargs))
        if twice:
            raise TypeError(f"RayPPOTrainer got {twice} both by position and by keyword")
        given.update(kwargs)
        environment = given.pop("environment", None)
        extra = sorted(set(given) - set(VERL_ARGS) - {"processor", "ray_worker_group_cls"})
        if extra:
            raise TypeError(f"RayPPOTrainer (verl's form) got unexpected arguments {extra}; it takes "
                            f"{', '.join(VERL_ARGS)} (and environment=)")
        if given.get("processor") is not None:
            raise ValueError("processor= (multimodal inputs) is not supported; pass processor=None")
        store = _as_store(config)
        if given.get("device_name"):
            store.model.device = str(given["device_name"])
        placement = ray_groups_from_pools(given.get("role_worker_mapping"), given.get("resource_pool_manager"),
                                          on_cuda=store.model.resolved_device().type == "cuda")
        store.update("ray", placement)
        roles = {_role_name(r) for r in (given.get("role_worker_mapping") or {})}
        pools = getattr(given.get("resource_pool_manager"), "mapping", {}) or {}
        if "RewardModel" in roles | {_role_name(r) for r in pools} and store.reward.reward_model is None:
            raise ValueError("Role.RewardModel needs the reward model: set reward.reward_model to its folder or hub "
                             "id (verl: reward_model.model.path)")
        dataset = given.get("train_dataset")
        sampler = given.get("train_sampler")
        if dataset is not None and sampler is not None:
            dataset = _Ordered(dataset, list(iter(sampler)))
        reward_fn = given.get("reward_fn")
        if reward_fn is not None and not isinstance(reward_fn, EnvironmentRewardWrapper):
            reward_fn = DataProtoReward(reward_fn)
        super().__init__(store, environment=environment, reward_fn=reward_fn, dataset=dataset)
        self.role_worker_mapping = dict(given.get("role_worker_mapping") or {})
        self.resource_pool_manager = given.get("resource_pool_manager")
        self.val_dataset = given.get("val_dataset")
        self.collate_fn = given.get("collate_fn")
        tokenizer = given.get("tokenizer")
        if tokenizer is not None:
            probe = "The quick brown fox: 12 + 30 = 42."
            if list(tokenizer.encode(probe)) != list(self.tokenizer.encode(probe)):
                raise ValueError(f"the tokenizer passed in ({type(tokenizer).__name__}) tokenizes differently from "
                                 f"the model's ({self.config.model.path}); pass the model's own tokenizer")
            self.verl_tokenizer = tokenizer

    def init_workers(self) -> None:
        """verl's worker start-up; the model, critic and engine are already built here."""


def create_trainer(config: ConfigStore, environment: Any, tokenizer: Any = None,
                   reward_fn: Callable[..., float] | None = None, num_samples: int | None = None,
                   prompt_template: str = "Perform: {obs}", **kwargs: Any) -> RayPPOTrainer:
    """Seed 003's factory: `CustomEnvironmentDataset(environment, tokenizer)` as the
    dataset and `EnvironmentRewardWrapper(environment, reward_fn)` as the reward.

    `num_samples` defaults to one epoch of episode groups
    (`batch_size // group_size * num_iters_per_epoch`); other keywords go to the trainer.
    """
    t = config.training
    n = num_samples or max(1, t.batch_size // t.group_size) * t.num_iters_per_epoch
    dataset = CustomEnvironmentDataset(environment, tokenizer, num_samples=n, prompt_template=prompt_template)
    wrapper = EnvironmentRewardWrapper(environment, reward_fn, tokenizer)
    return RayPPOTrainer(config, environment=environment, reward_fn=wrapper, dataset=dataset, **kwargs)


__all__ = ["CustomEnvironmentDataset", "DataProtoReward", "EnvironmentRewardWrapper", "RayPPOTrainer",
           "ResourcePoolManager", "Role", "create_trainer", "item_to_spec", "ray_groups_from_pools"]
