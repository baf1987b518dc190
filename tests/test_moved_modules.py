"""Modules that moved keep their old import paths (`workbench._moved`): an old path is the
module at its new one, the same object, so user code, notebooks and run folders that name an
old path (a config.yaml's `environment.name` / `import_path`) keep working."""
from __future__ import annotations

import importlib
import random
import subprocess
import sys
from pathlib import Path

import pytest

from workbench._moved import MOVED, current_path, new_name

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.parametrize("old", sorted(MOVED))
def test_an_old_path_is_the_module_at_its_new_one(old):
    module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED[old])
    assert module.__name__ == MOVED[old] and module.__spec__.name == MOVED[old]


def test_submodules_and_from_imports_of_old_paths():
    import workbench.adapters.textarena as old_submodule
    from workbench import config_checks
    from workbench.config import checks
    from workbench.environments.adapters import textarena

    assert old_submodule is textarena and config_checks is checks
    assert sys.modules["workbench.adapters.textarena"] is textarena
    assert new_name("workbench.adapters.verifier") == "workbench.environments.adapters.verifier"
    assert new_name("workbench.config") is None and new_name("workbench.environments.base") is None
    assert new_name("envs.grid") is None
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("workbench.adapters.no_such_module")


def sample(rng: random.Random) -> dict:
    n = rng.randint(2, 9)
    return {"question": f"What is {n} + {n}?", "n": n}


def score(answer: str | None, item: dict) -> float:
    return 1.0 if answer == str(2 * item["n"]) else 0.0


def test_a_run_folder_that_recorded_an_old_path_still_loads(tmp_path):
    from workbench import ConfigStore, VerifierEnvironment, describe_env, make_env

    env = VerifierEnvironment("tests.test_moved_modules:sample", "tests.test_moved_modules:score", attempts=2)
    new = "workbench.environments.adapters.verifier:VerifierEnvironment"
    assert env.config.name == new and describe_env(env).import_path == new
    config = ConfigStore()
    config.environment = describe_env(env)
    old = "workbench.adapters.verifier:VerifierEnvironment"  # what a run saved before the move
    config.environment.name = config.environment.import_path = old
    config.save(tmp_path / "config.yaml")
    assert old in (tmp_path / "config.yaml").read_text()

    recorded = ConfigStore.load(tmp_path / "config.yaml").environment
    rebuilt = make_env(recorded.name, recorded)
    assert type(rebuilt) is VerifierEnvironment and rebuilt.attempts == 2
    question = rebuilt.reset(seed=5)
    assert question == env.reset(seed=5)
    n = rebuilt.sample["n"]
    assert rebuilt.step(f"<answer>{2 * n}</answer>")[1:3] == (1.0, True)
    assert current_path(recorded.import_path) == describe_env(rebuilt).import_path == new
    assert current_path("guess_number") == "guess_number"
    assert current_path("workbench.gym_adapter:GymTextEnvironment,envs.grid:GridEnv") == (
        "workbench.environments.adapters.gym:GymTextEnvironment,envs.grid:GridEnv")


def test_python_m_runs_an_old_module_path():
    """`python -m workbench.OLD` runs the module now at the new path, as __main__."""
    code = ("import runpy, pathlib; g = runpy.run_module('workbench.imports', run_name='__main__'); "
            "print(g['__name__'], '/'.join(pathlib.Path(g['__file__']).parts[-2:]), "
            "g['import_object']('workbench.env_registry:make_env').__module__)")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["__main__", "utils/imports.py", "workbench.environments.registry"]
