"""workbench: a Jupyter-first workbench for RL of language models in multi-turn,
tool-using text environments. See README.md for the tour.

The seeds' public names are all importable from here (`ConfigStore`,
`BaseEnvironment`, `RayPPOTrainer`, `create_inference_engine`, `algo`, ...).
"""
from workbench import algo
from workbench.config import (
    CheckpointConfig, ConfigError, ConfigStore, EnvironmentConfig, InferenceConfig,
    ModelConfig, RayConfig, TrainingConfig,
)
from workbench.env_checker import EnvCheckError, check_env
from workbench.environment import BaseEnvironment
from workbench.gym_adapter import GymTextEnvironment
from workbench.inference import (
    BatchInferenceManager, GenerationOutput, InferenceEngine, MultiTurnInferenceEngine,
    create_inference_engine,
)
from workbench.reward import RewardError, RewardManager, rescore
from workbench.rollout import Rollout, check_token_alignment
from workbench.tools import (
    ActionParser, CalculatorTool, EnvironmentStepTool, FunctionCallingParser, JSONActionParser,
    MultiTurnManager, ReActActionParser, Tool, ToolDefinition, ToolRegistry,
)
from workbench.training import RayPPOTrainer, Trainer
from workbench.trajectory import Episode, RolloutData, Trajectory, TrajectoryBatch, Turn

__version__ = "0.1.0"
