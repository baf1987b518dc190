"""workbench: a Jupyter-first workbench for RL of language models in multi-turn,
tool-using text environments. See README.md for the tour.

The seeds' public names are all importable from here (`ConfigStore`,
`BaseEnvironment`, `RayPPOTrainer`, `create_inference_engine`, `algo`, ...).
"""
import os

# OpenMP threads that spin while waiting make torch 10x slower on a busy CPU (measured
# here: 2 spinning threads under load ran ~15x slower than 1). Passive waiting costs
# nothing on an idle machine. Users who set the variable keep their value.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from workbench import algo  # noqa: E402
from workbench.config import (  # noqa: E402
    CheckpointConfig, ConfigError, ConfigStore, EnvironmentConfig, InferenceConfig,
    ModelConfig, RayConfig, TrainingConfig,
)
from workbench.adapters import TextArenaEnvironment, VerifierEnvironment  # noqa: E402
from workbench.env_checker import EnvCheckError, check_env
from workbench.env_registry import (  # noqa: E402
    EnvRegistry, describe_env, list_envs, make_env, register_env,
)
from workbench.environment import BaseEnvironment
from workbench.gym_adapter import GymTextEnvironment
from workbench.inference import (
    BatchInferenceManager, GenerationOutput, MultiTurnInferenceEngine, create_inference_engine,
)
from workbench.reward import RewardError, RewardManager, rescore
from workbench.rollout import Rollout, check_token_alignment
from workbench.tools import (
    ActionParser, CalculatorTool, EnvironmentStepTool, FunctionCallingParser, JSONActionParser,
    MultiTurnManager, ReActActionParser, Tool, ToolDefinition, ToolRegistry,
)
from workbench.training import Trainer
from workbench.trajectory import Episode, RolloutData, Trajectory, TrajectoryBatch, Turn
# The seeds' remaining names: seed 000's pipeline, verl's data shapes and trainer form (seeds 002/003).
from workbench.data import DataProto, PromptEnvironment, RLHFDataset, collate_fn
from workbench.seed_api import (
    CustomGameEnvironment, InferenceEngine, MultiTurnChatHarness, PPOTrainer, SimpleGameEnvironment,
)
from workbench.verl_compat import (
    CustomEnvironmentDataset, EnvironmentRewardWrapper, RayPPOTrainer, ResourcePoolManager, Role,
    create_trainer,
)
from workbench.verl_config import from_verl

__version__ = "0.1.0"
