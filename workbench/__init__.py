"""workbench: a Jupyter-first workbench for RL of language models in multi-turn,
tool-using text environments. See README.md for the tour and docs/architecture.md for
the layers.

    from workbench import ConfigStore, Trainer, make_env

Every name in `__all__` is imported on first use (so `import workbench` stays cheap and
pulls in neither torch models nor Ray), and `import workbench` changes no process-wide
setting. The seeds' and verl's names (`RayPPOTrainer`'s verl form, `InferenceEngine`,
`DataProto`, ...) come from `workbench.compat`, re-exported here; the modules' old paths
(`workbench.verl_config`, `workbench.seed_api`, ...) still import.
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

# Configs in verl's layout load through ConfigStore.load: registering the reader is cheap
# (the mapping table imports only workbench.config).
import workbench.compat.verl_config  # noqa: F401,E402

#: Public name -> module that defines it.
_CORE = {
    "algo": None,
    "CheckpointConfig": "config", "ConfigError": "config", "ConfigStore": "config", "EnvironmentConfig": "config",
    "InferenceConfig": "config", "ModelConfig": "config", "RayConfig": "config", "RewardConfig": "config",
    "TrainingConfig": "config",
    "TextArenaEnvironment": "adapters", "VerifierEnvironment": "adapters", "OpenEnvEnvironment": "adapters",
    "Gateway": "gateway", "GatewayRollout": "gateway",
    "EnvCheckError": "env_checker", "check_env": "env_checker",
    "EnvRegistry": "env_registry", "describe_env": "env_registry", "list_envs": "env_registry",
    "make_env": "env_registry", "register_env": "env_registry",
    "BaseEnvironment": "environment", "GymTextEnvironment": "gym_adapter",
    "RewardError": "reward", "RewardManager": "reward", "rescore": "reward",
    "Rollout": "rollout", "check_token_alignment": "rollout", "make_rollout": "rollout",
    "ActionParser": "tools", "CalculatorTool": "tools", "EnvironmentStepTool": "tools",
    "FunctionCallingParser": "tools", "JSONActionParser": "tools", "MultiTurnManager": "tools",
    "ReActActionParser": "tools", "Tool": "tools", "ToolDefinition": "tools", "ToolRegistry": "tools",
    "Trainer": "training",
    "Episode": "trajectory", "RolloutData": "trajectory", "Trajectory": "trajectory",
    "TrajectoryBatch": "trajectory", "Turn": "trajectory",
    "load_run": "debug", "fork": "debug", "compare_policies": "debug", "diagnose": "debug",
    "compare_runs": "debug",
}
#: The seeds' and verl's names (seed 000's pipeline, verl's data shapes and trainer form).
_COMPAT = {
    "BatchInferenceManager": "compat.inference", "GenerationOutput": "compat.inference",
    "MultiTurnInferenceEngine": "compat.inference", "create_inference_engine": "compat.inference",
    "DataProto": "compat.verl_data", "RLHFDataset": "compat.verl_data", "collate_fn": "compat.verl_data",
    "PromptEnvironment": "data",
    "CustomGameEnvironment": "compat.seed_api", "InferenceEngine": "compat.seed_api",
    "MultiTurnChatHarness": "compat.seed_api", "PPOTrainer": "compat.seed_api",
    "SimpleGameEnvironment": "compat.seed_api",
    "CustomEnvironmentDataset": "compat.verl_compat", "EnvironmentRewardWrapper": "compat.verl_compat",
    "RayPPOTrainer": "compat.verl_compat", "ResourcePoolManager": "compat.verl_compat",
    "Role": "compat.verl_compat", "create_trainer": "compat.verl_compat",
    "from_verl": "compat.verl_config",
}
_NAMES = {**_CORE, **_COMPAT}

__all__ = sorted(_NAMES)
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name not in _NAMES:
        raise AttributeError(f"module 'workbench' has no attribute {name!r}")
    where = _NAMES[name]
    if where is None:  # a subpackage, e.g. `from workbench import algo`
        value = importlib.import_module(f"workbench.{name}")
    else:
        value = getattr(importlib.import_module(f"workbench.{where}"), name)
    globals()[name] = value  # looked up once
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


#: Modules that moved into `workbench.compat`: old path -> new path.
MOVED_MODULES = {f"workbench.{m}": f"workbench.compat.{m}"
                 for m in ("seed_api", "inference", "verl_compat", "verl_config", "verl_export", "verl_runtime")}


class _MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports a module's old path as the module at its new path (the same object)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        if fullname in MOVED_MODULES:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module(MOVED_MODULES[spec.name])
        self._spec = module.__spec__  # importlib overwrites __spec__ with the alias's; put it back
        return module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = self._spec


if not any(isinstance(f, _MovedModuleFinder) for f in sys.meta_path):
    sys.meta_path.append(_MovedModuleFinder())
