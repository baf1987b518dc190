"""Configuration: one dataclass per concern, gathered in `ConfigStore`.

    __init__.py  `ConfigStore`: the sections gathered; load, save, validate, update
    sections.py  the sections (model, inference, training, checkpoint, environment, ray, reward,
                 sft; doctor's is `workbench.doctor.thresholds.DoctorConfig`)
    checks.py    `ConfigError`, the device/dtype resolvers, the type checks behind `validate`
    flags.py     a `--SECTION.FIELD` command-line flag for every field, from the dataclasses
    reward_checks.py  the checks of the reward section's judges and reward model; `judge_location`

    config = ConfigStore()
    config.model.model_name = "smollm2-135m-instruct"
    config.training.adv_estimator = "grpo"
    config.validate()            # errors name the field and say what to fix
    config.save("run.yaml"); ConfigStore.load("run.yaml")

Every field has a docstring directly below it. Sections and field names follow the
seeds' Configuration Reference (model, inference, training, checkpoint, environment,
ray); fields added here are the ones a verl/TRL user expects (group size, KL loss,
LoRA, micro-batches), a `reward` section with the seeds' `RewardManager` shaping
weights (saved with every checkpoint; `--reward-param K=V` on the command line), and a
`doctor` section with the run doctor's thresholds (`workbench.doctor.thresholds`).
"""
from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping

import yaml

from workbench.config.checks import (  # noqa: F401 - ConfigError, DTYPES, resolve_*: public here too
    DTYPES, ConfigError, _check_types, _choice, _coerce_number, _field_types, _parse_device, _positive_int,
    check_remedies,
    MAX_REWARD_WEIGHT, MAX_STEP_TIMEOUT_S, _short, resolve_device, resolve_dtype, safe_load_bounded,
)
from workbench.doctor.thresholds import DoctorConfig, check_doctor_config
from workbench.utils.settings import StrictFields, UnknownFieldError, unknown_field_message
from workbench.config.reward_checks import check_model_rewards

from workbench.config.sections import (  # noqa: F401 - the sections are public here
    BACKENDS, EMBEDDED_MODEL, FP32_PRODUCTS_CHOICES, HISTORY_MODES, TOOL_FORMATS, CheckpointConfig,
    EnvironmentConfig, InferenceConfig, ModelConfig, RayConfig, RewardConfig, SFTConfig, TrainingConfig,
)

SECTIONS = {
    "model": ModelConfig,
    "inference": InferenceConfig,
    "training": TrainingConfig,
    "checkpoint": CheckpointConfig,
    "environment": EnvironmentConfig,
    "ray": RayConfig,
    "reward": RewardConfig,
    "doctor": DoctorConfig,
    "sft": SFTConfig,
}


#: Readers of configs written in another project's layout: name -> (detect(data) -> bool,
#: read(data) -> ConfigStore). `ConfigStore.from_dict` (and so `load`) tries each.
CONFIG_FORMATS: dict[str, tuple[Any, Any]] = {}


def register_config_format(name: str, detect: Any, read: Any) -> None:
    """Make `ConfigStore.from_dict`/`load` read configs that `detect(data)` recognises with
    `read(data)` (the compatibility layer registers verl's this way)."""
    CONFIG_FORMATS[name] = (detect, read)


@dataclass
class ConfigStore(StrictFields, section=""):
    """All settings of a run, one section per concern. Assigning a section or field that
    does not exist (`c.trainig = ...`, `c.training.lr = ...`) raises `UnknownFieldError` (a
    `ConfigError`) naming the nearest one, as an unknown key in YAML does."""

    model: ModelConfig = field(default_factory=ModelConfig)
    """The policy model."""
    inference: InferenceConfig = field(default_factory=InferenceConfig)
    """Generation during rollouts."""
    training: TrainingConfig = field(default_factory=TrainingConfig)
    """RL algorithm and optimisation."""
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    """Where and how often to save."""
    environment: EnvironmentConfig = field(default_factory=EnvironmentConfig)
    """The environment episodes run in."""
    ray: RayConfig = field(default_factory=RayConfig)
    """Distributed rollout workers."""
    reward: RewardConfig = field(default_factory=RewardConfig)
    """Shaping of environment rewards (`RewardManager` weights)."""
    doctor: DoctorConfig = field(default_factory=DoctorConfig)
    """Thresholds of the run doctor's checks (`workbench.doctor.thresholds`)."""
    sft: SFTConfig = field(default_factory=SFTConfig)
    """Supervised warm-up from an expert's demonstrations before RL."""

    # -- (de)serialisation ---------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        """Plain nested dict of every field."""
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "ConfigStore":
        """Build from a nested dict; unknown sections or fields raise ConfigError.

        A config in another project's layout goes through the reader registered for it
        (`register_config_format`): `import workbench` registers verl's (sections trainer,
        data, actor_rollout_ref, critic, algorithm; `workbench.compat.verl_config.from_verl`,
        one mapping table; keys it does not map are named in a warning).

        Numbers written as strings (YAML 1.1 reads `1e-4` as a string) are converted for
        float fields; a string that is not a number is an error naming the field.
        """
        if data is None:
            data = {}
        if not isinstance(data, Mapping):
            raise ConfigError(f"a config must be a mapping of sections ({', '.join(SECTIONS)}), "
                              f"got {type(data).__name__}: {_short(data)}")
        for name, (detect, read) in CONFIG_FORMATS.items():
            if detect(data):  # e.g. verl's trainer/data/actor_rollout_ref/critic/algorithm sections
                return read(data)
        out = cls()
        for section, values in data.items():
            if section not in SECTIONS:
                raise ConfigError(f"unknown config section {section!r}; valid: {sorted(SECTIONS)}")
            if values is None:
                continue
            if not isinstance(values, Mapping):
                raise ConfigError(f"config section {section!r} must be a mapping of field: value, "
                                  f"got {type(values).__name__}: {_short(values)}")
            out.update(section, values)
        out.validate()
        return out

    def update(self, section: str, values: Mapping[str, Any]) -> "ConfigStore":
        """Set several fields of one section, e.g. update("training", {"lr": ...})."""
        target = getattr(self, section)
        hints = _field_types(type(target))
        for key, value in values.items():
            if key not in hints:
                raise UnknownFieldError(unknown_field_message(section, str(key), hints))
            setattr(target, key, _coerce_number(value, hints[key]))
        return self

    def apply_overrides(self, overrides: Mapping[str, Any]) -> "ConfigStore":
        """Set fields named `"section.field"`, e.g. {"training.group_size": 4, "sft.steps": 1}
        (a doctor's `Finding.remedy`, a benchmark variant); `"environment.params.NAME"` sets one
        environment parameter. ConfigError for a key that names no section or field. Not
        validated: call `validate()` after the last change."""
        for key, value in overrides.items():
            section, _, name = str(key).partition(".")
            if section not in SECTIONS or not name:
                raise ConfigError(f"override {key!r}: give 'section.field' (e.g. 'training.learning_rate'); "
                                  f"sections: {', '.join(SECTIONS)}")
            if section == "environment" and name.startswith("params."):
                self.environment.params[name.removeprefix("params.")] = value
            else:
                self.update(section, {name: value})
        return self

    def save(self, path: str | Path) -> Path:
        """Write the config as YAML."""
        from workbench.utils.files import write_text

        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        # libyaml's emitter where PyYAML has it (same text as safe_dump's, several times faster)
        dumper = getattr(yaml, "CSafeDumper", yaml.SafeDumper)
        text = yaml.dump(self.to_dict(), Dumper=dumper, sort_keys=False)
        return write_text(path, text)  # an OSError names the file

    @classmethod
    def load(cls, path: str | Path) -> "ConfigStore":
        """Read a YAML file written by `save` (or by hand); an empty file is the defaults.
        A file whose aliases expand past `MAX_YAML_NODES` values (an anchor bomb) or that
        is larger than `MAX_YAML_BYTES` is refused (`workbench.config.checks.safe_load_bounded`)."""
        try:
            data = safe_load_bounded(Path(path).read_text(), str(path))
        except ConfigError:
            raise
        except (yaml.YAMLError, ValueError) as exc:  # ValueError: e.g. a date like 2024-13-01
            raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
        if data is not None and not isinstance(data, Mapping):
            raise ConfigError(f"{path} must hold a YAML mapping of sections ({', '.join(SECTIONS)}), "
                              f"got a {type(data).__name__}: {_short(data)}")
        return cls.from_dict(data)

    # -- validation ------------------------------------------------------------
    def validate(self) -> "ConfigStore":
        """Check every field; raise ConfigError naming the first bad one."""
        m, i, t, c, e, r = self.model, self.inference, self.training, self.checkpoint, self.environment, self.ray
        for section in SECTIONS:  # types first: the range checks below compare numbers
            _check_types(section, getattr(self, section))
        _choice("model.dtype", m.dtype, ("auto",) + DTYPES)
        _choice("model.fp32_base_products", m.fp32_base_products, FP32_PRODUCTS_CHOICES)
        if m.device != "auto":
            _parse_device(m.device, "model.device")
        _positive_int("model.tensor_parallel_size", m.tensor_parallel_size)
        _positive_int("model.lora_rank", m.lora_rank)
        if not 0 <= m.lora_dropout < 1:
            raise ConfigError(f"model.lora_dropout must be in [0, 1), got {m.lora_dropout!r}")
        _choice("inference.backend", i.backend, BACKENDS)
        _positive_int("inference.max_tokens", i.max_tokens)
        if i.top_k != -1 and i.top_k < 1:
            raise ConfigError(f"inference.top_k must be -1 (disabled) or >= 1, got {i.top_k!r}")
        if not i.temperature >= 0:
            raise ConfigError(f"inference.temperature must be >= 0, got {i.temperature}")
        if not 0 < i.top_p <= 1:
            raise ConfigError(f"inference.top_p must be in (0, 1], got {i.top_p}")
        _positive_int("inference.max_turns", i.max_turns)
        _positive_int("inference.max_context_tokens", i.max_context_tokens)
        if i.max_tokens > i.max_context_tokens:
            raise ConfigError(f"inference.max_tokens ({i.max_tokens}) must be <= inference.max_context_tokens "
                              f"({i.max_context_tokens}): one turn cannot be longer than the episode budget")
        if not i.request_timeout > 0:
            raise ConfigError(f"inference.request_timeout must be > 0 seconds, got {i.request_timeout!r}")
        if i.max_retries < 0:
            raise ConfigError(f"inference.max_retries must be >= 0, got {i.max_retries!r}")
        _choice("inference.server_kind", i.server_kind, ("vllm", "sglang"))
        _choice("inference.history", i.history, HISTORY_MODES)
        _choice("inference.tool_format", i.tool_format, TOOL_FORMATS)
        _choice("inference.vllm_dtype", i.vllm_dtype, ("auto",) + DTYPES)
        if i.max_batch_size is not None:
            _positive_int("inference.max_batch_size", i.max_batch_size)
        if not i.prefix_cache_mb > 0:
            raise ConfigError(f"inference.prefix_cache_mb must be > 0 (enable_prefix_caching=false turns the "
                              f"cache off), got {i.prefix_cache_mb!r}")
        if not 0 < i.gpu_memory_utilization <= 1:
            raise ConfigError(
                f"inference.gpu_memory_utilization must be in (0, 1], got {i.gpu_memory_utilization}"
            )
        if not t.learning_rate > 0:
            raise ConfigError(f"training.learning_rate must be > 0, got {t.learning_rate}")
        if not 0 <= t.gamma <= 1:
            raise ConfigError(f"training.gamma must be in [0, 1], got {t.gamma}")
        if not 0 <= t.lam <= 1:
            raise ConfigError(f"training.lam must be in [0, 1], got {t.lam}")
        if not t.clip_ratio > 0:
            raise ConfigError(f"training.clip_ratio must be > 0, got {t.clip_ratio}")
        if not t.clip_ratio_c > 1:
            raise ConfigError(f"training.clip_ratio_c must be > 1, got {t.clip_ratio_c}")
        for name in ("num_epochs", "num_iters_per_epoch", "batch_size", "group_size", "ppo_epochs", "micro_batch_size"):
            _positive_int(f"training.{name}", getattr(t, name))
        if t.batch_size % t.group_size:
            raise ConfigError(
                f"training.batch_size ({t.batch_size}) must be a multiple of training.group_size ({t.group_size})"
            )
        if t.mini_batch_size is not None:
            _positive_int("training.mini_batch_size", t.mini_batch_size)
        from workbench.algo import advantages, kl, losses, utils  # live registries

        _choice("training.adv_estimator", t.adv_estimator, tuple(advantages._ADVANTAGE_ESTIMATORS))
        _choice("training.loss_agg_mode", t.loss_agg_mode, utils.LOSS_AGG_MODES)
        _choice("training.kl_penalty", t.kl_penalty, kl.KL_ESTIMATORS)
        _choice("training.kl_loss_type", t.kl_loss_type, kl.KL_ESTIMATORS)
        _choice("training.policy_loss", t.policy_loss, tuple(losses._POLICY_LOSSES))
        if t.weight_decay < 0:
            raise ConfigError(f"training.weight_decay must be >= 0, got {t.weight_decay!r}")
        if t.kl_coef < 0 or t.kl_loss_coef < 0:
            raise ConfigError("training.kl_coef and training.kl_loss_coef must be >= 0")
        if not t.max_grad_norm > 0:
            raise ConfigError(f"training.max_grad_norm must be > 0, got {t.max_grad_norm}")
        if t.save_rollouts_every < 0:
            raise ConfigError(f"training.save_rollouts_every must be >= 0 (0 = never), got {t.save_rollouts_every!r}")
        if c.save_interval < 0 or c.keep_last_n < 0:
            raise ConfigError("checkpoint.save_interval and checkpoint.keep_last_n must be >= 0")
        _positive_int("environment.max_steps", e.max_steps)
        if e.step_timeout is not None and not 0 <= e.step_timeout <= MAX_STEP_TIMEOUT_S:
            raise ConfigError(f"environment.step_timeout must be between 0 and {MAX_STEP_TIMEOUT_S:g} seconds "
                              f"(0 or null: no limit), got {e.step_timeout!r}")
        if not isinstance(e.params, dict):
            raise ConfigError(f"environment.params must be a dict, got {type(e.params).__name__}")
        _positive_int("ray.num_actors", r.num_actors)
        _positive_int("ray.num_learners", r.num_learners)
        for name in ("num_gpus_per_actor", "num_gpus_per_learner"):
            value = getattr(r, name)
            if value is not None and not (math.isfinite(value) and value >= 0):
                raise ConfigError(f"ray.{name} must be a number >= 0 (a fraction shares a GPU), got {value!r}")
        for name in ("num_cpus_per_actor", "num_cpus_per_learner"):
            value = getattr(r, name)
            if value is not None and not (math.isfinite(value) and value > 0):
                raise ConfigError(f"ray.{name} must be a number > 0 (a fraction shares a CPU), got {value!r}")
        if not (math.isfinite(r.placement_timeout_s) and r.placement_timeout_s > 0):
            raise ConfigError(f"ray.placement_timeout_s must be a number of seconds > 0, got {r.placement_timeout_s!r}")
        for name in ("step_reward_weight", "success_bonus", "invalid_action_penalty", "efficiency_bonus"):
            value = getattr(self.reward, name)
            if not (math.isfinite(value) and abs(value) <= MAX_REWARD_WEIGHT):
                raise ConfigError(f"reward.{name} must be a number between {-MAX_REWARD_WEIGHT:g} and "
                                  f"{MAX_REWARD_WEIGHT:g} (scores are float32, about 7 significant digits: a larger "
                                  f"weight drowns every other term of the reward), got {value!r}")
        if self.reward.max_steps is not None:
            _positive_int("reward.max_steps", self.reward.max_steps)
        check_model_rewards(self.reward)  # judges and reward models (workbench.config.reward_checks)
        check_remedies(self)
        check_doctor_config(self.doctor, ConfigError)
        if self.sft.steps < 0:
            raise ConfigError(f"sft.steps must be >= 0 (0: no SFT warm-up), got {self.sft.steps!r}")
        if not isinstance(self.sft.start_step, int) or self.sft.start_step < 0:
            raise ConfigError(f"sft.start_step must be an integer >= 0 (the step the warm-up begins at), "
                              f"got {self.sft.start_step!r}")
        _positive_int("sft.episodes", self.sft.episodes)
        lr = self.sft.learning_rate
        if lr is not None and not (math.isfinite(lr) and lr > 0):
            raise ConfigError(f"sft.learning_rate must be a finite number > 0 or null (training.learning_rate), "
                              f"got {lr!r}")
        return self

    def __repr__(self) -> str:
        lines = ["ConfigStore("]
        for section in SECTIONS:
            values = dataclasses.asdict(getattr(self, section))
            lines.append(f"  {section}: " + ", ".join(f"{k}={v!r}" for k, v in values.items()))
        return "\n".join(lines) + "\n)"
