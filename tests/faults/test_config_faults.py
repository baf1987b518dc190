"""Configuration and command-line input that used to pass and fail later (or silently).

1. a YAML anchor bomb in `environment.params` (nine levels of ten aliases: ~10^9 values
   once expanded) is refused by `ConfigStore.load`, quickly and with little memory;
2. `environment.step_timeout: 1e10` is refused by validation naming the field (it
   passed, then overflowed the timers and failed every reset);
3. an `--env module:Class` whose module calls `sys.exit(0)` on import ends the CLI with
   an error naming the module (it ended with rc 0 and no output).
"""
from __future__ import annotations

import os
import subprocess
import sys
import time
import tracemalloc
from pathlib import Path

import pytest

from workbench.config import ConfigError, ConfigStore

ROOT = Path(__file__).resolve().parents[2]


def _bomb(levels: int = 9) -> str:
    lines = ["environment:", "  name: guess_number", "  params:", '    l0: &l0 ["lol", "lol", "lol", "lol", "lol", '
             '"lol", "lol", "lol", "lol", "lol"]']
    for i in range(1, levels):
        lines.append(f"    l{i}: &l{i} [" + ", ".join([f"*l{i - 1}"] * 10) + "]")
    return "\n".join(lines) + "\n"


def test_yaml_anchor_bomb_is_refused_at_load(tmp_path):
    path = tmp_path / "bomb.yaml"
    path.write_text(_bomb())
    tracemalloc.start()
    start = time.perf_counter()
    with pytest.raises(ConfigError, match=r"bomb.yaml expands to [\d,]+ values through its anchors and aliases"):
        ConfigStore.load(path)
    seconds = time.perf_counter() - start
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert seconds < 1 and peak < 20 * 2**20, (seconds, peak)


def test_ordinary_anchors_still_load(tmp_path):
    path = tmp_path / "ok.yaml"
    path.write_text("environment:\n  params:\n    a: &a {low: 1, high: 20}\n    b: *a\n")
    assert ConfigStore.load(path).environment.params["b"] == {"low": 1, "high": 20}


@pytest.mark.parametrize("value", [1e10, 1e300])
def test_huge_step_timeout_is_refused_naming_the_field(value):
    c = ConfigStore()
    c.environment.step_timeout = value
    with pytest.raises(ConfigError, match=r"environment.step_timeout must be between 0 and 604800 seconds"):
        c.validate()
    c.environment.step_timeout = 604800.0  # a week is still allowed
    c.validate()


def test_env_module_that_exits_on_import_is_an_error_naming_it(tmp_path):
    (tmp_path / "exits_on_import.py").write_text(
        "import sys\nfrom envs.guess_number import GuessNumberEnv as Env\nsys.exit(0)\n")
    env = {**os.environ, "PYTHONPATH": f"{ROOT}{os.pathsep}{tmp_path}"}
    proc = subprocess.run([sys.executable, "-m", "workbench", "rollout", "--env", "exits_on_import:Env",
                           "--episodes", "1", "--output", str(tmp_path / "out")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2, (proc.returncode, proc.stdout[-2000:], proc.stderr[-2000:])
    assert "exits_on_import" in proc.stderr and "sys.exit(0)" in proc.stderr
    assert "Traceback" not in proc.stderr
