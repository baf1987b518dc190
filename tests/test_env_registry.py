"""The environment registry: names, module:Class, schemes, entry points, the `envs`
fallback, what the Trainer records, and the CLI's --env / --env-param."""
from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from workbench import ConfigStore, Trainer, describe_env, list_envs, make_env
from workbench.cli import build_config, main, parse_args, parse_env_params
from workbench.config import ConfigError, EnvironmentConfig
from workbench.environments.base import BaseEnvironment, StepResult
from workbench.environments.registry import REGISTRY, EnvNotFoundError, EnvRegistry

REPO = Path(__file__).resolve().parents[1]
BUNDLED = {"arithmetic", "grid", "guess_number", "text_game", "wordle"}


class CoinEnv(BaseEnvironment):
    """Call a coin with `sides` faces (params: sides). One step; reward 1 when right."""

    def __init__(self, config=None):
        super().__init__(config)
        self.sides = int(self.params.get("sides", 2))
        self.face = 0

    def reset(self) -> str:
        self.face = self.rng.randrange(self.sides)
        return f"Call the face, 0 to {self.sides - 1}."

    def step(self, action: str) -> StepResult:
        right = action.strip() == str(self.face)
        return ("Right." if right else "Wrong."), float(right), True, {"success": right}


def tiny_config(tiny_model_path: Path, tmp_path: Path) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.inference.max_tokens = 4
    c.inference.max_turns = 1
    c.training.batch_size = 2
    c.training.group_size = 2
    c.checkpoint.output_dir = str(tmp_path / "ckpt")
    c.checkpoint.save_interval = 0
    return c.validate()


def test_bundled_envs_are_registered_and_built_with_params():
    assert BUNDLED <= set(list_envs())
    env = make_env("guess_number", high=32, max_steps=7, seed=3)
    assert type(env).__name__ == "GuessNumberEnv" and env.params["high"] == 32
    assert (env.max_steps, env.config.seed, env.config.name) == (7, 3, "guess_number")
    with pytest.raises(EnvNotFoundError, match=r"unknown environment 'no_such_env'.*guess_number.*module:Class"):
        make_env("no_such_env")


def test_module_class_spec_needs_no_registration():
    env = make_env("tests.test_env_registry:CoinEnv", sides=6, seed=1)
    assert type(env) is CoinEnv and env.sides == 6 and env.config.name == "tests.test_env_registry:CoinEnv"
    assert env.reset() == "Call the face, 0 to 5."
    with pytest.raises(EnvNotFoundError, match=r"cannot import module 'no_such_mod'.*PYTHONPATH"):
        make_env("no_such_mod:Env")
    with pytest.raises(EnvNotFoundError, match=r"no attribute 'CoinEnvv'; environment classes in it: .*'CoinEnv'"):
        make_env("tests.test_env_registry:CoinEnvv")


def test_register_names_schemes_and_factories():
    registry = EnvRegistry(entry_point_group=None, fallback_modules=())
    registry.register("coin", CoinEnv)
    registry.register("d20", lambda config: CoinEnv({**config, "params": {"sides": 20}}))
    registry.register("lazy_coin", "tests.test_env_registry:CoinEnv")
    registry.register_scheme("dice", lambda rest, config: CoinEnv({**config, "params": {"sides": int(rest)}}))
    assert registry.list() == ["coin", "d20", "lazy_coin"]
    assert registry.make("d20").sides == 20 and registry.make("dice:12").sides == 12
    assert registry.make("lazy_coin", sides=3).sides == 3 and "dice" in registry.schemes
    assert registry.spec_of(registry.make("coin")) == "coin"
    with pytest.raises(ValueError, match="without ':'"):
        registry.register("a:b", CoinEnv)
    with pytest.raises(EnvNotFoundError, match="unknown environment 'guess_number'"):
        registry.make("guess_number")  # this registry has no fallback


def test_entry_point_of_an_installed_distribution_is_found(tmp_path, monkeypatch):
    """A real distribution on sys.path (dist-info with entry_points.txt), read by importlib.metadata."""
    (tmp_path / "maze_pkg.py").write_text(textwrap.dedent("""
        from workbench.environments.base import BaseEnvironment

        class MazeEnv(BaseEnvironment):
            def reset(self):
                return "maze of size %d" % self.params.get("size", 3)

            def step(self, action):
                return "wall", 0.0, True, {}
    """))
    dist = tmp_path / "maze_pkg-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: maze-pkg\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[workbench.envs]\nmaze = maze_pkg:MazeEnv\nbroken = maze_pkg:Nope\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    registry = EnvRegistry(fallback_modules=())
    assert {"maze", "broken"} <= set(registry.list())
    env = registry.make("maze", size=9)
    assert type(env).__name__ == "MazeEnv" and env.reset(seed=0) == "maze of size 9"
    assert registry.spec_of(env) == "maze"
    with pytest.raises(EnvNotFoundError, match=r"entry point 'broken' = 'maze_pkg:Nope' of the installed package "
                                               r"'maze-pkg' failed to load"):
        registry.make("broken")


def test_envs_found_through_their_entry_points_in_a_fresh_process():
    code = ("from workbench.environments.registry import REGISTRY\n"
            "import sys; assert 'envs' not in sys.modules\n"  # the library never imports the examples itself
            "env = REGISTRY.make('wordle')\n"
            "print(type(env).__module__, type(env).__name__, sorted(REGISTRY.list()))\n")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.startswith("envs.wordle WordleEnv ")
    assert all(name in out.stdout for name in BUNDLED)


def test_describe_env_names_what_rebuilds_it():
    recorded = describe_env(CoinEnv({"params": {"sides": 4}, "max_steps": 1}))
    assert recorded.name == "tests.test_env_registry:CoinEnv"  # its config said "guess_number": not true
    assert recorded.import_path == "tests.test_env_registry:CoinEnv" and recorded.params == {"sides": 4}
    rebuilt = make_env(recorded.name, recorded)
    assert type(rebuilt) is CoinEnv and rebuilt.sides == 4
    assert describe_env(make_env("grid", size=5)).name == "grid"
    assert describe_env(make_env("grid")).import_path == "envs.grid:GridEnv"


def test_trainer_records_the_environment_in_config_and_checkpoint(tiny_model_path, tmp_path):
    trainer = Trainer(tiny_config(tiny_model_path, tmp_path), environment=CoinEnv({"params": {"sides": 3}}))
    env_config = trainer.config.environment
    assert (env_config.name, env_config.import_path, env_config.params) == (
        "tests.test_env_registry:CoinEnv", "tests.test_env_registry:CoinEnv", {"sides": 3})
    path = trainer.save_checkpoint(tmp_path / "ck")
    loaded = ConfigStore.load(Path(path) / "config.yaml")
    assert loaded.environment.name == "tests.test_env_registry:CoinEnv" and loaded.environment.params == {"sides": 3}
    rebuilt = make_env(loaded.environment.name, loaded.environment)
    assert type(rebuilt) is CoinEnv and rebuilt.sides == 3
    # A factory is recorded by what it builds.
    trainer2 = Trainer(tiny_config(tiny_model_path, tmp_path), environment=lambda: make_env("grid", size=4))
    assert (trainer2.config.environment.name, trainer2.config.environment.params) == ("grid", {"size": 4})


def test_cli_env_module_class_and_env_params():
    args = parse_args(["train", "--env", "tests.test_env_registry:CoinEnv", "--env-param", "sides=12",
                       "--env-param", "label=big coin", "--env-param", "fair=true"])
    config = build_config(args)
    assert config.environment.name == "tests.test_env_registry:CoinEnv"
    assert config.environment.params == {"sides": 12, "label": "big coin", "fair": True}
    assert make_env(config.environment.name, config.environment).sides == 12
    assert parse_env_params(["x=1.5", "y=", "z=[1, 2]"]) == {"x": 1.5, "y": "", "z": [1, 2]}
    with pytest.raises(ConfigError, match="write it as KEY=VALUE"):
        parse_env_params(["sides12"])


def test_cli_rejects_an_unknown_env_with_what_to_fix(capsys):
    assert main(["train", "--env", "tests.test_env_registry:Nope", "--steps", "1"]) == 2
    err = capsys.readouterr().err
    assert "--env tests.test_env_registry:Nope" in err and "'CoinEnv'" in err
    assert main(["rollout", "--env", "guess_number,no_such_env"]) == 2
    assert "unknown environment 'no_such_env'" in capsys.readouterr().err


def test_cli_trains_on_a_textarena_game(tiny_model_path, tmp_path):
    pytest.importorskip("textarena")
    out = tmp_path / "run"
    code = main(["train", "--env", "textarena:GuessTheNumber-v0", "--env-param", "max_number=8",
                 "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "4", "--group-size", "2",
                 "--max-tokens", "6", "--max-turns", "2", "--eval-episodes", "0", "--save-interval", "2",
                 "--output", str(out)])
    assert code == 0
    lines = (out / "metrics.jsonl").read_text().splitlines()
    assert len(lines) == 2
    checkpoints = sorted((out / "checkpoints").glob("*/config.yaml"))
    assert checkpoints, list((out / "checkpoints").iterdir())
    recorded = ConfigStore.load(checkpoints[-1]).environment
    assert recorded.name == "textarena:GuessTheNumber-v0"
    assert recorded.import_path == "workbench.environments.adapters.textarena:TextArenaEnvironment"
    assert recorded.params == {"env_id": "GuessTheNumber-v0", "max_number": 8}
    env = make_env(recorded.name, recorded)
    assert env.game.max_number == 8 and "between 1 and 8" in env.reset(seed=0)
