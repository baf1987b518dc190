"""Property tests of config loading (hypothesis, 1,000 generated inputs per test).

* `ConfigStore.from_dict` of arbitrary nested data, and `ConfigStore.load` of arbitrary
  YAML text, either return a valid config or raise ConfigError: never another exception.
* A valid config (random values within each field's documented range) survives
  save -> load unchanged.
"""
from __future__ import annotations

import dataclasses
import math

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from workbench.config import SECTIONS, ConfigError, ConfigStore

SETTINGS = settings(max_examples=1000, deadline=None,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture])

FIELD_NAMES = sorted({f.name for cls in SECTIONS.values() for f in dataclasses.fields(cls)})

# Values YAML can produce: scalars of every kind (non-finite floats included), lists, mappings.
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(), st.integers(-10, 5000),
    st.floats(allow_nan=True, allow_infinity=True), st.floats(-2, 2),
    st.text(max_size=12), st.sampled_from(["auto", "cpu", "cuda", "cuda:1", "gpu", "1e-4", "nan", "-inf", "64",
                                           "grpo", "gae", "vanilla", "k3", "token-mean", "hf", "bfloat16", "force"]),
)
values = st.recursive(scalars, lambda inner: st.one_of(
    st.lists(inner, max_size=3), st.dictionaries(st.one_of(st.text(max_size=8), st.integers()), inner, max_size=3)),
    max_leaves=8)
# Mostly each section's own fields with any value (so the field checks run), sometimes
# unknown sections or fields, or sections that are not mappings.
well_formed = st.fixed_dictionaries({}, optional={
    section: st.one_of(st.none(), st.dictionaries(st.sampled_from([f.name for f in dataclasses.fields(cls)]),
                                                  values, max_size=4))
    for section, cls in SECTIONS.items()})
section_bodies = st.one_of(
    st.dictionaries(st.one_of(st.sampled_from(FIELD_NAMES), st.text(max_size=8)), values, max_size=6), values)
config_dicts = st.one_of(
    well_formed, well_formed, well_formed,
    st.dictionaries(st.one_of(st.sampled_from(sorted(SECTIONS)), st.text(max_size=8), st.integers()),
                    section_bodies, max_size=6))


def _outcome(load) -> ConfigStore | None:
    try:
        cfg = load()
    except ConfigError as exc:
        assert str(exc)  # every rejection says something
        return None
    assert isinstance(cfg, ConfigStore)
    assert cfg.validate() is cfg
    return cfg


@SETTINGS
@given(data=st.one_of(config_dicts, config_dicts, config_dicts, values))
def test_from_dict_raises_only_config_error(data):
    cfg = _outcome(lambda: ConfigStore.from_dict(data))
    if cfg is not None:  # what was accepted is a config of well-typed, finite values
        for section in SECTIONS:
            for name, value in dataclasses.asdict(getattr(cfg, section)).items():
                if isinstance(value, float):
                    assert math.isfinite(value), f"{section}.{name} = {value}"


@SETTINGS
@given(text=st.one_of(
    st.text(max_size=200),
    config_dicts.map(lambda d: yaml.safe_dump(d, sort_keys=False)),
    values.map(yaml.safe_dump),
    # hand-written style: `section:\n  field: value` lines with raw (unquoted) scalars
    st.lists(st.tuples(st.sampled_from(sorted(SECTIONS)), st.sampled_from(FIELD_NAMES),
                       st.one_of(st.sampled_from(["1e-4", "3.0e-5", ".inf", ".nan", "-1", "0", "yes", "null", "[1, 2]",
                                                  "{a: 1}", "'1e-4'", "auto", "2024-13-01", "!!binary aGk=", "~"]),
                                 st.text(alphabet="abc019.-:e ", max_size=8))),
             max_size=5).map(lambda rows: "".join(f"{s}:\n  {f}: {v}\n" for s, f, v in rows)),
))
def test_load_of_any_yaml_text_raises_only_config_error(tmp_path_factory, text):
    path = tmp_path_factory.mktemp("yaml") / "run.yaml"
    path.write_text(text, encoding="utf-8")
    _outcome(lambda: ConfigStore.load(path))


finite = st.floats(allow_nan=False, allow_infinity=False)
safe_text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=20)
param_values = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(-10**6, 10**6), finite, safe_text),
    lambda inner: st.one_of(st.lists(inner, max_size=3), st.dictionaries(safe_text, inner, max_size=3)),
    max_leaves=6)


@st.composite
def valid_configs(draw) -> dict:
    """Nested dicts of in-range values for a selection of fields of every type."""
    max_context = draw(st.integers(1, 100_000))
    group = draw(st.integers(1, 16))
    return {
        "model": {"model_name": draw(safe_text.filter(bool)), "dtype": draw(st.sampled_from(["auto", "float32",
                                                                                               "bfloat16", "float16"])),
                  "device": draw(st.sampled_from(["auto", "cpu", "cuda", "cuda:3", "mps"])),
                  "lora_rank": draw(st.integers(1, 512)), "lora_dropout": draw(st.floats(0, 1, exclude_max=True)),
                  "lora_target_modules": draw(st.one_of(st.just("all-linear"), st.lists(safe_text, max_size=4))),
                  "local_path": draw(st.one_of(st.none(), safe_text)), "use_lora": draw(st.booleans())},
        "inference": {"max_context_tokens": max_context, "max_tokens": draw(st.integers(1, max_context)),
                      "temperature": draw(st.floats(0, 1e6)), "top_p": draw(st.floats(0, 1, exclude_min=True)),
                      "top_k": draw(st.one_of(st.just(-1), st.integers(1, 10**6))),
                      "stop": draw(st.lists(safe_text, max_size=3)), "seed": draw(st.one_of(st.none(), st.integers(-(2**32 - 1), 2**32 - 1))),
                      "request_timeout": draw(st.floats(0, 1e6, exclude_min=True)),
                      "max_retries": draw(st.integers(0, 100)), "vllm_dtype": draw(st.sampled_from(["auto", "float32"]))},
        "training": {"learning_rate": draw(st.floats(0, 10, exclude_min=True)), "gamma": draw(st.floats(0, 1)),
                     "clip_ratio_high": draw(st.one_of(st.none(), st.floats(0.01, 1))),
                     "group_size": group, "batch_size": group * draw(st.integers(1, 8)),
                     "weight_decay": draw(st.floats(0, 1)), "entropy_coeff": draw(finite),
                     "adv_estimator": draw(st.sampled_from(["gae", "grpo", "rloo", "reinforce_plus_plus"])),
                     "kl_loss_type": draw(st.sampled_from(["k1", "k3", "low_var_kl", "abs", "mse"])),
                     "norm_adv_by_std_in_grpo": draw(st.booleans())},
        "checkpoint": {"output_dir": draw(safe_text), "save_interval": draw(st.integers(0, 100)),
                       "keep_last_n": draw(st.integers(0, 100))},
        "environment": {"name": draw(safe_text), "max_steps": draw(st.integers(1, 1000)),
                        "seed": draw(st.one_of(st.none(), st.integers(-(2**32 - 1), 2**32 - 1))),
                        "params": draw(st.dictionaries(safe_text, param_values, max_size=4))},
        "ray": {"num_actors": draw(st.integers(1, 64)), "num_gpus_per_actor": draw(st.floats(0, 8)),
                "address": draw(st.one_of(st.none(), safe_text))},
    }


@SETTINGS
@given(data=valid_configs())
def test_valid_config_round_trips_through_save_and_load(tmp_path_factory, data):
    try:
        cfg = ConfigStore.from_dict(data)
    except ConfigError as exc:  # the generator stays in range, so this is a validation bug
        raise AssertionError(f"valid config rejected: {exc}") from exc
    for section, fields in data.items():  # every given value was kept
        for name, value in fields.items():
            assert getattr(getattr(cfg, section), name) == value, f"{section}.{name}"
    path = cfg.save(tmp_path_factory.mktemp("rt") / "run.yaml")
    loaded = ConfigStore.load(path)
    assert loaded == cfg
    assert loaded.to_dict() == cfg.to_dict()
