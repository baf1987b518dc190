"""Config: seed 001's sections and fields, validation naming the field, YAML round trip, docstrings."""
from __future__ import annotations

import ast
import dataclasses
import inspect
from pathlib import Path

import pytest

import workbench.config as config_module
from workbench.config import SECTIONS, ConfigError, ConfigStore

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
    path = cfg.save(tmp_path / "nested" / "run.yaml")
    loaded = ConfigStore.load(path)
    assert loaded == cfg
    assert loaded.to_dict() == cfg.to_dict()
    assert "adv_estimator: rloo" in Path(path).read_text()
    # a hand-written partial file: the rest stays default
    (tmp_path / "partial.yaml").write_text("training:\n  learning_rate: 3.0e-5\n")
    part = ConfigStore.load(tmp_path / "partial.yaml")
    assert part.training.learning_rate == 3e-5 and part.model == ConfigStore().model


def _config_classes(tree: ast.Module) -> list[ast.ClassDef]:
    names = {cls.__name__ for cls in SECTIONS.values()} | {"ConfigStore"}
    found = [n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in names]
    assert {c.name for c in found} == names
    return found


def test_every_field_has_a_docstring():
    tree = ast.parse(Path(inspect.getsourcefile(config_module)).read_text())
    undocumented = []
    checked = 0
    for cls in _config_classes(tree):
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
