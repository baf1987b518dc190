"""Adapters that make environments from other libraries workbench environments.

    TextArenaEnvironment("GuessTheNumber-v0")            # single-player TextArena games
    VerifierEnvironment(sample_fn, score_fn, attempts=1) # question/answer datasets
    VerifierEnvironment.from_reasoning_gym("chain_sum")  # reasoning-gym tasks
    OpenEnvEnvironment("http://127.0.0.1:8000")          # an OpenEnv server (or "module:Class")

The libraries are optional (`pip install textarena reasoning-gym`, `openenv-core`); importing this
package does not import them, building an environment does. Gymnasium envs with text
spaces go through `workbench.gym_adapter.GymTextEnvironment`.
"""
from workbench.adapters.openenv_env import OpenEnvEnvironment
from workbench.adapters.textarena import TextArenaEnvironment
from workbench.adapters.verifier import VerifierEnvironment, extract_answer

__all__ = ["OpenEnvEnvironment", "TextArenaEnvironment", "VerifierEnvironment", "extract_answer"]
