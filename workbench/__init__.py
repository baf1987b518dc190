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
    "TextArenaEnvironment": "environments.adapters", "VerifierEnvironment": "environments.adapters",
    "OpenEnvEnvironment": "environments.adapters",
    "Gateway": "gateway", "GatewayRollout": "gateway",
    "EnvCheckError": "environments.checker", "check_env": "environments.checker",
    "EnvRegistry": "environments.registry", "describe_env": "environments.registry",
    "list_envs": "environments.registry",
    "make_env": "environments.registry", "register_env": "environments.registry",
    "BaseEnvironment": "environments.base", "GymTextEnvironment": "environments.adapters.gym",
    "RewardError": "reward", "RewardManager": "reward", "rescore": "reward",
    "Judge": "reward", "GroupJudge": "reward", "RewardModel": "reward", "audit_judge": "reward",
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


#: Modules that moved: old path -> new path (the seeds' `workbench.seed_api` ->
#: `workbench.compat.seed_api`, the loose modules now in packages, ...). Importing an old path
#: gives the module at its new one, the same object (`workbench._moved`).
from workbench._moved import MOVED as MOVED_MODULES  # noqa: E402
from workbench._moved import install as _install_moved  # noqa: E402

_install_moved()
