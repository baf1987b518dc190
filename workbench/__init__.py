"""workbench: a Jupyter-first workbench for RL of language models in multi-turn,
tool-using text environments. See README.md for the tour."""
from workbench.config import (
    CheckpointConfig, ConfigError, ConfigStore, EnvironmentConfig, InferenceConfig,
    ModelConfig, RayConfig, TrainingConfig,
)
from workbench.environment import BaseEnvironment
