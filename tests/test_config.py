"""Config: seed 001's sections and fields, validation naming the field, YAML round trip, docstrings."""
from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest
import yaml

import workbench.config as config_module
from workbench.config import SECTIONS, ConfigError, ConfigStore

# numbers compared under dtype "auto": make test runs this file in both dtypes (WORKBENCH_AUTO_DTYPE)
pytestmark = pytest.mark.numerics

# Seed 001's Configuration Reference (plus the environment and ray sections it uses).
SEED_FIELDS = {
    "model": ["model_name", "dtype", "device", "tensor_parallel_size", "local_path", "trust_remote_code"],
    "inference": ["backend", "max_tokens", "temperature", "top_p", "multi_turn", "max_turns"],
    "training": ["learning_rate", "gamma", "lam", "clip_ratio", "num_epochs", "batch_size", "adv_estimator",
                 "use_kl_in_reward", "kl_coef"],
    "checkpoint": ["output_dir", "save_interval", "keep_last_n"],
    "environment": ["name", "max_steps", "seed", "params"],
    "ray": ["use_ray", "num_actors"],
}


def test_every_seed_section_and_field_exists():
    cfg = ConfigStore()
    assert set(SEED_FIELDS) <= set(SECTIONS)
    for section, names in SEED_FIELDS.items():
        obj = getattr(cfg, section)
        fields = {f.name for f in dataclasses.fields(obj)}
        missing = [n for n in names if n not in fields]
        assert not missing, f"{section} lacks {missing}"
    assert cfg.validate() is cfg  # defaults are valid
    assert cfg.ray.use_ray is False and cfg.ray.num_actors == 1


@pytest.mark.parametrize("section,field,value,needle", [
    ("inference", "backend", "tensorrt", "inference.backend"),
    ("training", "learning_rate", 0.0, "training.learning_rate"),
    ("training", "learning_rate", -1e-3, "training.learning_rate"),
    ("inference", "top_p", 0.0, "inference.top_p"),
    ("inference", "top_p", 1.5, "inference.top_p"),
    ("inference", "max_turns", 0, "inference.max_turns"),
    ("training", "batch_size", 6, "training.batch_size"),  # group_size 4
    ("training", "adv_estimator", "ppo2", "training.adv_estimator"),
    ("model", "dtype", "int3", "model.dtype"),
    ("training", "gamma", 1.5, "training.gamma"),
    ("inference", "max_tokens", 0, "inference.max_tokens"),
    ("doctor", "incidental_share", 1.5, "doctor.incidental_share"),
    ("doctor", "min_samples", 0, "doctor.min_samples"),
    ("doctor", "length_ratio", 0.5, "doctor.length_ratio"),
    ("doctor", "engine_logprob_gap", 0.0, "doctor.engine_logprob_gap"),
    ("doctor", "kl_spike_min", -0.1, "doctor.kl_spike_min"),
])
def test_validation_errors_name_the_field(section, field, value, needle):
    cfg = ConfigStore()
    setattr(getattr(cfg, section), field, value)
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert needle in str(err.value) and repr(value) in str(err.value)  # names the field and the bad value
    # the same error from a dict
    with pytest.raises(ConfigError, match=needle.replace(".", r"\.")):
        ConfigStore.from_dict({section: {field: value}})


def test_batch_size_must_be_a_multiple_of_group_size():
    with pytest.raises(ConfigError, match=r"training\.batch_size \(6\).*training\.group_size \(4\)"):
        ConfigStore.from_dict({"training": {"batch_size": 6, "group_size": 4}})
    ConfigStore.from_dict({"training": {"batch_size": 8, "group_size": 4}})


def test_unknown_field_and_section_in_from_dict():
    with pytest.raises(ConfigError, match=r"unknown field training\.lr\b.*learning_rate"):
        ConfigStore.from_dict({"training": {"lr": 1e-5}})
    with pytest.raises(ConfigError, match=r"unknown config section 'optim'"):
        ConfigStore.from_dict({"optim": {}})


def test_dotted_overrides_set_fields_and_environment_params():
    cfg = ConfigStore().apply_overrides({"training.group_size": 2, "sft.steps": 1,
                                         "environment.params.high": 16, "environment.strict_format": True})
    assert (cfg.training.group_size, cfg.sft.steps, cfg.environment.strict_format) == (2, 1, True)
    assert cfg.environment.params == {"high": 16}
    assert (ConfigStore().training.group_size, ConfigStore().environment.params) == (4, {})  # defaults unchanged
    with pytest.raises(ConfigError, match="unknown field training.group"):
        ConfigStore().apply_overrides({"training.group": 4})
    with pytest.raises(ConfigError, match="'trainer.lr': give 'section.field'"):
        ConfigStore().apply_overrides({"trainer.lr": 1e-4})
    with pytest.raises(ConfigError, match="give 'section.field'"):
        ConfigStore().apply_overrides({"training": 4})


def test_yaml_round_trip(tmp_path):
    cfg = ConfigStore()
    cfg.model.model_name = "Qwen/Qwen2.5-0.5B-Instruct"
    cfg.model.lora_target_modules = ["q_proj", "v_proj"]
    cfg.inference.temperature = 0.7
    cfg.inference.stop = ["\n\n"]
    cfg.training.adv_estimator = "rloo"
    cfg.training.clip_ratio_high = 0.28
    cfg.checkpoint.output_dir = str(tmp_path / "ckpt")
    cfg.environment.params = {"low": 1, "high": 20}
    cfg.environment.seed = 3
    cfg.ray.num_actors = 2
    cfg.doctor.truncation_rise = 0.4
    path = cfg.save(tmp_path / "nested" / "run.yaml")
    loaded = ConfigStore.load(path)
    assert loaded == cfg
    assert loaded.to_dict() == cfg.to_dict()
    assert "adv_estimator: rloo" in Path(path).read_text()
    assert loaded.doctor.truncation_rise == 0.4 and "doctor:\n  baseline_steps: 2" in Path(path).read_text()
    # a hand-written partial file: the rest stays default
    (tmp_path / "partial.yaml").write_text("training:\n  learning_rate: 3.0e-5\n")
    part = ConfigStore.load(tmp_path / "partial.yaml")
    assert part.training.learning_rate == 3e-5 and part.model == ConfigStore().model


def _config_classes() -> list[ast.ClassDef]:
    """The class definitions of every section and of ConfigStore, each read from the module
    that defines it (the doctor's thresholds live in workbench.doctor.thresholds)."""
    found = []
    for cls in [*SECTIONS.values(), ConfigStore]:
        tree = ast.parse(Path(inspect.getsourcefile(cls)).read_text())
        found += [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == cls.__name__]
    assert [c.name for c in found] == [cls.__name__ for cls in [*SECTIONS.values(), ConfigStore]]
    return found


def test_every_field_has_a_docstring():
    assert inspect.getsourcefile(ConfigStore) == inspect.getsourcefile(config_module)
    undocumented = []
    checked = 0
    for cls in _config_classes():
        body = cls.body
        for i, node in enumerate(body):
            if not isinstance(node, ast.AnnAssign):
                continue
            checked += 1
            nxt = body[i + 1] if i + 1 < len(body) else None
            ok = (isinstance(nxt, ast.Expr) and isinstance(nxt.value, ast.Constant)
                  and isinstance(nxt.value.value, str) and nxt.value.value.strip())
            if not ok:
                undocumented.append(f"{cls.name}.{node.target.id}")
    assert not undocumented, f"fields without a docstring: {undocumented}"
    # every dataclass field was seen by the AST walk
    assert checked == sum(len(dataclasses.fields(c)) for c in SECTIONS.values()) + len(dataclasses.fields(ConfigStore))


# -- devices and dtypes ---------------------------------------------------------------------
def test_resolver_maps_auto_by_cuda_availability():
    import torch

    from workbench.config import resolve_device, resolve_dtype

    gpu = resolve_device("auto", cuda_available=True)
    assert gpu == torch.device("cuda") and resolve_dtype("auto", gpu) == torch.bfloat16
    cpu = resolve_device("auto", cuda_available=False)
    from workbench.config.checks import cpu_auto_bf16

    cpu_auto = torch.bfloat16 if cpu_auto_bf16()[0] else torch.float32  # bf16 where the CPU has it (or told to)
    assert cpu == torch.device("cpu") and resolve_dtype("auto", cpu) == cpu_auto
    assert resolve_device("cuda:1", cuda_available=True) == torch.device("cuda", 1)
    assert resolve_dtype("float16", gpu) == torch.float16 and resolve_dtype("float32", gpu) == torch.float32
    with pytest.raises(ConfigError, match=r"model\.device is 'cuda' but CUDA is not available"):
        resolve_device("cuda", cuda_available=False)
    with pytest.raises(ConfigError, match=r"model\.device must be \"auto\" or a torch device.*'gpu'"):
        resolve_device("gpu", cuda_available=True)
    with pytest.raises(ConfigError, match=r"model\.dtype must be one of .*'fp8'"):
        resolve_dtype("fp8", cpu)
    # the config's own fields resolve the same way
    cfg = ConfigStore()
    assert (cfg.model.device, cfg.model.dtype) == ("auto", "auto")
    assert cfg.model.resolved_device(cuda_available=True) == gpu
    assert cfg.model.resolved_dtype(cuda_available=True) == torch.bfloat16
    assert cfg.model.resolved_dtype(cuda_available=False) == cpu_auto
    cfg.model.use_lora = False  # full fine-tuning: no fp32 master copy, so fp32 on a CPU
    assert cfg.model.resolved_dtype(cuda_available=False) == torch.float32


def test_auto_policy_and_critic_on_this_cpu(tiny_model_path):
    """"auto" on this CPU: base weights in bf16 where the CPU has bf16 instructions (else
    fp32); LoRA adapters and the critic's head fp32 either way."""
    import torch

    from workbench.config.checks import cpu_auto_bf16
    from workbench.training.policy import Critic, Policy

    assert not torch.cuda.is_available()  # this machine; on a GPU "auto" would mean cuda/bf16
    base = torch.bfloat16 if cpu_auto_bf16()[0] else torch.float32
    cfg = ConfigStore().model
    assert (cfg.device, cfg.dtype) == ("auto", "auto")
    cfg.model_name, cfg.lora_rank = str(tiny_model_path), 2
    policy = Policy(cfg)
    params = dict(policy.model.named_parameters())
    assert {p.device.type for p in params.values()} == {"cpu"}
    assert {p.dtype for n, p in params.items() if "lora_" not in n} == {base}
    assert {p.dtype for n, p in params.items() if "lora_" in n} == {torch.float32}
    critic = Critic(cfg)
    assert {p.device.type for p in critic.parameters()} == {"cpu"}
    assert {p.dtype for n, p in critic.named_parameters() if "lora_" in n or "value_head" in n} == {torch.float32}
    assert {p.dtype for n, p in critic.named_parameters() if "lora_" not in n and "value_head" not in n} == {base}


def test_explicit_bogus_device_errors_naming_the_field(tiny_model_path):
    from workbench.training.policy import Policy

    for bogus in ("gpu", "cuda:x", "CPU "):
        with pytest.raises(ConfigError, match=r"model\.device") as err:
            ConfigStore.from_dict({"model": {"device": bogus}})
        assert repr(bogus) in str(err.value)
    cfg = ConfigStore().model
    cfg.model_name, cfg.device = str(tiny_model_path), "tpu0"
    with pytest.raises(ConfigError, match=r"model\.device .*'tpu0'"):
        Policy(cfg)


# -- values rejected by validation (each passed validation before) --------------------------
@pytest.mark.parametrize("section,field,value,needle", [
    ("training", "learning_rate", float("inf"), "training.learning_rate"),
    ("training", "kl_coef", float("nan"), "training.kl_coef"),
    ("inference", "temperature", float("inf"), "inference.temperature"),
    ("training", "entropy_coeff", float("nan"), "training.entropy_coeff"),
    ("training", "clip_ratio_high", float("inf"), "training.clip_ratio_high"),
    ("inference", "max_tokens", 4096, "inference.max_tokens"),  # max_context_tokens 2048
    ("inference", "top_k", 0, "inference.top_k"),
    ("inference", "top_k", -2, "inference.top_k"),
    ("inference", "request_timeout", -1.0, "inference.request_timeout"),
    ("inference", "max_retries", -1, "inference.max_retries"),
    ("environment", "step_timeout", -5.0, "environment.step_timeout"),
    ("model", "lora_dropout", 1.0, "model.lora_dropout"),
    ("model", "lora_dropout", -0.1, "model.lora_dropout"),
    ("training", "weight_decay", -0.01, "training.weight_decay"),
    ("model", "device", "gpu", "model.device"),
    ("inference", "top_k", "5", "inference.top_k"),           # a string for an int
    ("training", "seed", "0", "training.seed"),
    ("inference", "temperature", True, "inference.temperature"),  # a bool for a float
    ("model", "use_lora", "yes", "model.use_lora"),           # a string for a bool
    ("inference", "stop", "\n", "inference.stop"),            # a string for a list of strings
    ("training", "learning_rate", "fast", "training.learning_rate"),  # a string that is no number
])
def test_rejected_values_name_the_field(section, field, value, needle):
    cfg = ConfigStore()
    setattr(getattr(cfg, section), field, value)
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    message = str(err.value)
    assert message.startswith(needle) and repr(value) in message
    with pytest.raises(ConfigError) as err:
        ConfigStore.from_dict({section: {field: value}})
    assert str(err.value).startswith(needle)


@pytest.mark.parametrize("text,kind", [("- model\n- training\n", "list"), ("42\n", "int"), ("just words\n", "str")])
def test_yaml_that_is_not_a_mapping_is_rejected(tmp_path, text, kind):
    path = tmp_path / "run.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=rf"must hold a YAML mapping of sections .*got a {kind}"):
        ConfigStore.load(path)
    with pytest.raises(ConfigError, match=r"a config must be a mapping of sections"):
        ConfigStore.from_dict(yaml.safe_load(text))


def test_numbers_written_as_strings_load_as_floats(tmp_path):
    path = tmp_path / "run.yaml"
    # YAML 1.1 reads 1e-4 (no dot) as a string, and a quoted number is one anyway
    path.write_text("training:\n  learning_rate: 1e-4\n  kl_coef: '0.05'\ninference:\n  temperature: 1\n")
    assert yaml.safe_load(path.read_text())["training"]["learning_rate"] == "1e-4"
    cfg = ConfigStore.load(path)
    assert cfg.training.learning_rate == 1e-4 and type(cfg.training.learning_rate) is float
    assert cfg.training.kl_coef == 0.05 and type(cfg.inference.temperature) is float
    path.write_text("training:\n  learning_rate: 1e-4x\n")
    with pytest.raises(ConfigError, match=r"training\.learning_rate must be a number, got '1e-4x'"):
        ConfigStore.load(path)
    path.write_text("training:\n  learning_rate: .inf\n")
    with pytest.raises(ConfigError, match=r"training\.learning_rate must be a finite number, got inf"):
        ConfigStore.load(path)


def test_option_lists_come_from_the_live_registries():
    from workbench import algo
    from workbench.algo import advantages, losses

    for field in ("adv_estimator", "policy_loss"):
        with pytest.raises(ConfigError, match=rf"training\.{field} must be one of"):
            ConfigStore.from_dict({"training": {field: "my_new_one"}})

    @algo.register_advantage_estimator("my_new_one")
    def my_estimator(**kwargs):
        raise NotImplementedError

    @algo.register_policy_loss("my_new_one")
    def my_loss(**kwargs):
        raise NotImplementedError

    try:
        cfg = ConfigStore.from_dict({"training": {"adv_estimator": "my_new_one", "policy_loss": "my_new_one"}})
        assert (cfg.training.adv_estimator, cfg.training.policy_loss) == ("my_new_one", "my_new_one")
    finally:
        del advantages._ADVANTAGE_ESTIMATORS["my_new_one"], losses._POLICY_LOSSES["my_new_one"]
    with pytest.raises(ConfigError, match=r"training\.adv_estimator must be one of \['gae', 'grpo'"):
        ConfigStore.from_dict({"training": {"adv_estimator": "my_new_one"}})


@pytest.mark.gpu
def test_auto_policy_on_a_gpu_is_cuda_bfloat16(tiny_model_path):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    from workbench.training.policy import Critic, Policy

    cfg = ConfigStore().model
    cfg.model_name, cfg.lora_rank = str(tiny_model_path), 2
    policy = Policy(cfg)
    frozen = [p for p in policy.model.parameters() if not p.requires_grad]
    assert {(p.device.type, p.dtype) for p in frozen} == {("cuda", torch.bfloat16)}
    assert {p.device.type for p in policy.model.parameters()} == {"cuda"}  # LoRA adapters too
    critic = Critic(cfg)
    assert {p.device.type for p in critic.parameters()} == {"cuda"}
    assert critic.value_head.weight.dtype == torch.float32  # the value head stays fp32


# -- a misspelled setting in Python is refused at once (issue 50, item 6) --------------------------
@pytest.mark.parametrize("section, name, nearest", [
    ("training", "lr", "training.learning_rate"),
    ("inference", "temprature", "inference.temperature"),
    ("doctor", "min_sample", "doctor.min_samples"),
    ("checkpoint", "save_intervall", "checkpoint.save_interval"),
])
def test_assigning_an_unknown_field_raises_naming_the_nearest_one(section, name, nearest):
    from workbench.config import UnknownFieldError

    c = ConfigStore()
    with pytest.raises(UnknownFieldError, match=rf"unknown field {section}\.{name}; did you mean {nearest}\?"):
        setattr(getattr(c, section), name, 1)
    assert not hasattr(getattr(c, section), name)
    c.validate()


def test_an_unknown_section_and_a_trainers_config_refuse_misspellings_too(tiny_model_path):
    from envs import make_env
    from workbench import Trainer
    from workbench.config import ConfigError

    c = ConfigStore()
    with pytest.raises(ConfigError, match="unknown field trainig; did you mean training"):
        c.trainig = c.training
    c.model.model_name = str(tiny_model_path)
    c.model.dtype = "float32"
    trainer = Trainer(c, environment=make_env("guess_number"))
    with pytest.raises(AttributeError, match="did you mean training.learning_rate"):
        trainer.config.training.lr = 1e-3
    trainer.config.training.learning_rate = 1e-3  # a real field still takes
    assert trainer.config.training.learning_rate == 1e-3


def test_the_yaml_refusal_names_the_nearest_field_as_well():
    with pytest.raises(ConfigError, match=r"unknown field inference\.temprature; did you mean inference\.temperature"):
        ConfigStore.from_dict({"inference": {"temprature": 0.0}})


def test_the_environment_variable_decides_what_auto_is_on_a_cpu(monkeypatch):
    """WORKBENCH_AUTO_DTYPE lets any machine check both dtypes (make test's second pass)."""
    import torch

    from workbench.config.checks import cpu_bf16_support, resolve_dtype

    for value, want in (("bfloat16", torch.bfloat16), ("float32", torch.float32)):
        monkeypatch.setenv("WORKBENCH_AUTO_DTYPE", value)
        assert resolve_dtype("auto", "cpu") == want
        assert resolve_dtype("auto", "cpu", trains_all_weights=True) == torch.float32  # no bf16 master copy
        assert resolve_dtype("float32", "cpu") == torch.float32  # an explicit dtype is the one that runs
    monkeypatch.setenv("WORKBENCH_AUTO_DTYPE", "")
    assert resolve_dtype("auto", "cpu") == (torch.bfloat16 if cpu_bf16_support()[0] else torch.float32)
    monkeypatch.setenv("WORKBENCH_AUTO_DTYPE", "fp16")
    with pytest.raises(ConfigError, match="WORKBENCH_AUTO_DTYPE='fp16': give bfloat16 or float32"):
        resolve_dtype("auto", "cpu")
