"""verl-style configs (`trainer`, `data`, `actor_rollout_ref`, `critic`, `algorithm`) into `ConfigStore`.

    config = ConfigStore.load("ppo_trainer.yaml")   # a verl YAML works where ours does
    config = from_verl(yaml.safe_load(text))       # the same from a dict (or an OmegaConf config)
    print(mapping_markdown())                      # the table below

One table (`MAPPING`) says where each verl key goes; every key not in it (including
whole sections such as `reward_model`, `custom_reward_function`, `ray_init`) is named in
one `UnmappedConfigWarning` (or a `ConfigError` with `strict=True`). Sections of our own
(`model`, `inference`, `training`, `checkpoint`, `environment`, `ray`, and `reward`
once it exists) may sit beside the verl ones and are applied after them.

verl's defaults where ours differ: a verl config starts from `adv_estimator="gae"` and
`rollout.n = 1` (so `training.group_size = 1`), as verl does. verl counts
`data.train_batch_size` and `actor.ppo_mini_batch_size` in prompts; we count episodes,
so both are multiplied by `rollout.n`.

| verl key | workbench field | note |
|---|---|---|
| trainer.total_epochs | training.num_epochs | |
| trainer.device | model.device | |
| trainer.experiment_name | training.run_name | |
| trainer.default_local_dir | checkpoint.output_dir | |
| trainer.save_freq | checkpoint.save_interval | -1 (never) becomes 0 |
| trainer.max_actor_ckpt_to_keep | checkpoint.keep_last_n | null (all) becomes 0 |
| trainer.resume_mode | checkpoint.resume | "auto" -> True, "disable" -> False |
| trainer.seed | training.seed | |
| data.seed | training.seed | |
| data.train_batch_size | training.batch_size | times rollout.n (prompts -> episodes) |
| data.max_response_length | inference.max_tokens | per model turn |
| data.max_prompt_length | inference.max_context_tokens | plus max_response_length |
| algorithm.adv_estimator | training.adv_estimator | |
| algorithm.gamma | training.gamma | |
| algorithm.lam | training.lam | |
| algorithm.clip_ratio | training.clip_ratio | seed 003 puts it here |
| algorithm.norm_adv_by_std_in_grpo | training.norm_adv_by_std_in_grpo | |
| algorithm.use_kl_in_reward | training.use_kl_in_reward | |
| algorithm.kl_penalty | training.kl_penalty | |
| algorithm.kl_ctrl.type | training.adaptive_kl | "adaptive" -> True, "fixed" -> False |
| algorithm.kl_ctrl.kl_coef | training.kl_coef | |
| algorithm.kl_ctrl.target_kl | training.target_kl | |
| algorithm.kl_ctrl.horizon | training.kl_horizon | |
| actor_rollout_ref.hybrid_engine | (none) | must be true: actor and rollout share one process here |
| actor_rollout_ref.model.path | model.model_name | |
| actor_rollout_ref.model.trust_remote_code | model.trust_remote_code | |
| actor_rollout_ref.model.lora_rank | model.lora_rank | 0 -> model.use_lora = False |
| actor_rollout_ref.model.lora_alpha | model.lora_alpha | |
| actor_rollout_ref.model.target_modules | model.lora_target_modules | |
| actor_rollout_ref.model.enable_gradient_checkpointing | model.gradient_checkpointing | |
| actor_rollout_ref.actor.optim.lr | training.learning_rate | |
| actor_rollout_ref.actor.optim.weight_decay | training.weight_decay | |
| actor_rollout_ref.actor.ppo_epochs | training.ppo_epochs | |
| actor_rollout_ref.actor.ppo_mini_batch_size | training.mini_batch_size | times rollout.n |
| actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu | training.micro_batch_size | |
| actor_rollout_ref.actor.clip_ratio | training.clip_ratio | |
| actor_rollout_ref.actor.clip_ratio_low | training.clip_ratio_low | |
| actor_rollout_ref.actor.clip_ratio_high | training.clip_ratio_high | |
| actor_rollout_ref.actor.clip_ratio_c | training.clip_ratio_c | |
| actor_rollout_ref.actor.entropy_coeff | training.entropy_coeff | |
| actor_rollout_ref.actor.use_kl_loss | training.use_kl_loss | |
| actor_rollout_ref.actor.kl_loss_coef | training.kl_loss_coef | |
| actor_rollout_ref.actor.kl_loss_type | training.kl_loss_type | |
| actor_rollout_ref.actor.loss_agg_mode | training.loss_agg_mode | |
| actor_rollout_ref.actor.grad_clip | training.max_grad_norm | |
| actor_rollout_ref.actor.policy_loss.loss_mode | training.policy_loss | |
| actor_rollout_ref.rollout.name | inference.backend | |
| actor_rollout_ref.rollout.n | training.group_size | |
| actor_rollout_ref.rollout.temperature | inference.temperature | |
| actor_rollout_ref.rollout.top_p | inference.top_p | |
| actor_rollout_ref.rollout.top_k | inference.top_k | |
| actor_rollout_ref.rollout.response_length | inference.max_tokens | |
| actor_rollout_ref.rollout.dtype | inference.vllm_dtype | |
| actor_rollout_ref.rollout.gpu_memory_utilization | inference.gpu_memory_utilization | |
| actor_rollout_ref.rollout.tensor_model_parallel_size | model.tensor_parallel_size | |
| actor_rollout_ref.rollout.enable_prefix_caching | inference.enable_prefix_caching | |
| actor_rollout_ref.rollout.multi_turn.enable | inference.multi_turn | |
| actor_rollout_ref.rollout.multi_turn.max_assistant_turns | inference.max_turns | |
| critic.optim.lr | training.critic_learning_rate | |
| critic.cliprange_value | training.cliprange_value | |
| reward_model.model.path | reward.reward_model | verl's reward-model worker: `workbench.reward.RewardModel` (Ray: `workbench.distributed.reward_workers`) |

The critic is the policy model with a value head (`workbench.training.policy.Critic`),
so `critic.model.*` has no field of its own; like every key not in the table it is
named in the warning.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Mapping

from workbench.config import SECTIONS, ConfigError, ConfigStore, register_config_format

VERL_SECTIONS = ("trainer", "data", "actor_rollout_ref", "critic", "algorithm")


class UnmappedConfigWarning(UserWarning):
    """A verl config had keys with no workbench field; the message lists them."""


def _resume(value: Any) -> Any:
    if value in ("auto", "resume_path"):
        return True
    if value == "disable":
        return False
    raise ConfigError(f"trainer.resume_mode must be 'auto' or 'disable', got {value!r}")


def _kl_type(value: Any) -> bool:
    if value not in ("fixed", "adaptive"):
        raise ConfigError(f"algorithm.kl_ctrl.type must be 'fixed' or 'adaptive', got {value!r}")
    return value == "adaptive"


def _hybrid(value: Any) -> None:
    if value is not True:
        raise ConfigError("actor_rollout_ref.hybrid_engine must be true: in workbench the actor and the rollout "
                          "engine share one process (weights are synced after each update)")


def _same(value: Any) -> Any:
    return value


#: verl key -> (workbench "section.field" or None, converter). The docstring's table lists these.
MAPPING: dict[str, tuple[str | None, Callable[[Any], Any]]] = {
    "trainer.total_epochs": ("training.num_epochs", _same),
    "trainer.device": ("model.device", _same),
    "trainer.experiment_name": ("training.run_name", _same),
    "trainer.default_local_dir": ("checkpoint.output_dir", _same),
    "trainer.save_freq": ("checkpoint.save_interval", lambda v: max(int(v), 0)),
    "trainer.max_actor_ckpt_to_keep": ("checkpoint.keep_last_n", lambda v: 0 if v is None else int(v)),
    "trainer.resume_mode": ("checkpoint.resume", _resume),
    "trainer.seed": ("training.seed", _same),
    "data.seed": ("training.seed", _same),
    "data.train_batch_size": ("training.batch_size", _same),
    "data.max_response_length": ("inference.max_tokens", _same),
    "data.max_prompt_length": ("inference.max_context_tokens", _same),
    "algorithm.adv_estimator": ("training.adv_estimator", _same),
    "algorithm.gamma": ("training.gamma", _same),
    "algorithm.lam": ("training.lam", _same),
    "algorithm.clip_ratio": ("training.clip_ratio", _same),
    "algorithm.norm_adv_by_std_in_grpo": ("training.norm_adv_by_std_in_grpo", _same),
    "algorithm.use_kl_in_reward": ("training.use_kl_in_reward", _same),
    "algorithm.kl_penalty": ("training.kl_penalty", _same),
    "algorithm.kl_ctrl.type": ("training.adaptive_kl", _kl_type),
    "algorithm.kl_ctrl.kl_coef": ("training.kl_coef", _same),
    "algorithm.kl_ctrl.target_kl": ("training.target_kl", _same),
    "algorithm.kl_ctrl.horizon": ("training.kl_horizon", _same),
    "actor_rollout_ref.hybrid_engine": (None, _hybrid),
    "actor_rollout_ref.model.path": ("model.model_name", _same),
    "actor_rollout_ref.model.trust_remote_code": ("model.trust_remote_code", _same),
    "actor_rollout_ref.model.lora_rank": ("model.lora_rank", _same),
    "actor_rollout_ref.model.lora_alpha": ("model.lora_alpha", _same),
    "actor_rollout_ref.model.target_modules": ("model.lora_target_modules", _same),
    "actor_rollout_ref.model.enable_gradient_checkpointing": ("model.gradient_checkpointing", _same),
    "actor_rollout_ref.actor.optim.lr": ("training.learning_rate", _same),
    "actor_rollout_ref.actor.optim.weight_decay": ("training.weight_decay", _same),
    "actor_rollout_ref.actor.ppo_epochs": ("training.ppo_epochs", _same),
    "actor_rollout_ref.actor.ppo_mini_batch_size": ("training.mini_batch_size", _same),
    "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu": ("training.micro_batch_size", _same),
    "actor_rollout_ref.actor.clip_ratio": ("training.clip_ratio", _same),
    "actor_rollout_ref.actor.clip_ratio_low": ("training.clip_ratio_low", _same),
    "actor_rollout_ref.actor.clip_ratio_high": ("training.clip_ratio_high", _same),
    "actor_rollout_ref.actor.clip_ratio_c": ("training.clip_ratio_c", _same),
    "actor_rollout_ref.actor.entropy_coeff": ("training.entropy_coeff", _same),
    "actor_rollout_ref.actor.use_kl_loss": ("training.use_kl_loss", _same),
    "actor_rollout_ref.actor.kl_loss_coef": ("training.kl_loss_coef", _same),
    "actor_rollout_ref.actor.kl_loss_type": ("training.kl_loss_type", _same),
    "actor_rollout_ref.actor.loss_agg_mode": ("training.loss_agg_mode", _same),
    "actor_rollout_ref.actor.grad_clip": ("training.max_grad_norm", _same),
    "actor_rollout_ref.actor.policy_loss.loss_mode": ("training.policy_loss", _same),
    "actor_rollout_ref.rollout.name": ("inference.backend", _same),
    "actor_rollout_ref.rollout.n": ("training.group_size", _same),
    "actor_rollout_ref.rollout.temperature": ("inference.temperature", _same),
    "actor_rollout_ref.rollout.top_p": ("inference.top_p", _same),
    "actor_rollout_ref.rollout.top_k": ("inference.top_k", _same),
    "actor_rollout_ref.rollout.response_length": ("inference.max_tokens", _same),
    "actor_rollout_ref.rollout.dtype": ("inference.vllm_dtype", _same),
    "actor_rollout_ref.rollout.gpu_memory_utilization": ("inference.gpu_memory_utilization", _same),
    "actor_rollout_ref.rollout.tensor_model_parallel_size": ("model.tensor_parallel_size", _same),
    "actor_rollout_ref.rollout.enable_prefix_caching": ("inference.enable_prefix_caching", _same),
    "actor_rollout_ref.rollout.multi_turn.enable": ("inference.multi_turn", _same),
    "actor_rollout_ref.rollout.multi_turn.max_assistant_turns": ("inference.max_turns", _same),
    "critic.optim.lr": ("training.critic_learning_rate", _same),
    "critic.cliprange_value": ("training.cliprange_value", _same),
    "reward_model.model.path": ("reward.reward_model", _same),
}


def is_verl_config(data: Any) -> bool:
    """Whether a mapping has any of verl's top-level sections."""
    return isinstance(data, Mapping) and any(k in data for k in VERL_SECTIONS)


def to_plain(config: Any) -> Any:
    """An OmegaConf config (or anything with `to_container`/`_content`) as plain dicts."""
    if type(config).__module__.startswith("omegaconf"):
        from omegaconf import OmegaConf  # only present when the user passes one

        return OmegaConf.to_container(config, resolve=True)
    return config


def _flatten(data: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and path not in MAPPING:
            out.update(_flatten(value, path + "."))
        else:
            out[path] = value
    return out


def from_verl(data: Mapping[str, Any], strict: bool = False) -> ConfigStore:
    """A `ConfigStore` from a verl-style nested config (see the table in the module docstring).

    Keys with no workbench field are listed in one `UnmappedConfigWarning`, or raise
    `ConfigError` with `strict=True`. Sections of our own are applied after the verl ones.
    """
    data = to_plain(data)
    if not isinstance(data, Mapping):
        raise ConfigError(f"a verl config must be a mapping of sections, got {type(data).__name__}")
    # verl's other sections (reward_model, custom_reward_function, ray_init, ...) and any
    # other non-workbench section are flattened too: their keys are named as unmapped.
    flat = _flatten({k: v for k, v in data.items() if k not in SECTIONS and v is not None})
    values: dict[str, dict[str, Any]] = {}
    unmapped = []
    for key, value in flat.items():
        if key not in MAPPING:
            unmapped.append(key)
            continue
        target, convert = MAPPING[key]
        try:
            converted = convert(value)
        except (TypeError, ValueError) as exc:
            raise ConfigError(f"{key}: {exc}") from exc
        if target is not None and value is not None:
            section, name = target.split(".")
            values.setdefault(section, {})[name] = converted
    if unmapped:
        message = (f"{len(unmapped)} verl config key(s) have no workbench field and are ignored: "
                   f"{', '.join(sorted(unmapped))} (the mapping: workbench.compat.verl_config.MAPPING)")
        if strict:
            raise ConfigError(message)
        warnings.warn(message, UnmappedConfigWarning, stacklevel=3)
    config = ConfigStore()
    config.training.adv_estimator = "gae"  # verl's defaults (module docstring)
    config.training.group_size = 1
    for section, fields in values.items():
        config.update(section, fields)
    n = config.training.group_size
    if "batch_size" in values.get("training", {}):
        config.training.batch_size = values["training"]["batch_size"] * n
    if values.get("training", {}).get("mini_batch_size") is not None:
        config.training.mini_batch_size = values["training"]["mini_batch_size"] * n
    if "max_context_tokens" in values.get("inference", {}):
        config.inference.max_context_tokens += config.inference.max_tokens
    if values.get("model", {}).get("lora_rank") == 0:
        config.model.use_lora = False
        config.model.lora_rank = ConfigStore().model.lora_rank
    for section in SECTIONS:
        if data.get(section):
            config.update(section, data[section])
    return config.validate()


def mapping_markdown() -> str:
    """The mapping as a markdown table (for the README)."""
    lines = ["| verl key | workbench field |", "|---|---|"]
    lines += [f"| {k} | {t or '(none)'} |" for k, (t, _) in MAPPING.items()]
    return "\n".join(lines)


register_config_format("verl", is_verl_config, from_verl)
