"""Adapters that make environments from other libraries workbench environments.

    textarena.py         TextArenaEnvironment for single-player TextArena games
    verifier.py          VerifierEnvironment for question/answer datasets (reasoning-gym)
    openenv_env.py       OpenEnvEnvironment: an OpenEnv server by URL, or a module's Environment served on 127.0.0.1
    openenv_capacity.py  how many sessions an OpenEnv server takes (its refusal or `max_concurrent`), shared per URL
    gym.py               GymTextEnvironment for Gymnasium envs with text spaces

    TextArenaEnvironment("GuessTheNumber-v0")            # single-player TextArena games
    VerifierEnvironment(sample_fn, score_fn, attempts=1) # question/answer datasets
    VerifierEnvironment.from_reasoning_gym("chain_sum")  # reasoning-gym tasks
    OpenEnvEnvironment("http://127.0.0.1:8000")          # an OpenEnv server (or "module:Class")

The libraries are optional (`pip install textarena reasoning-gym`, `openenv-core`); importing this
package does not import them, building an environment does. Gymnasium envs with text
spaces go through `workbench.environments.adapters.gym.GymTextEnvironment`.
"""
from workbench.environments.adapters.openenv_env import OpenEnvEnvironment
from workbench.environments.adapters.textarena import TextArenaEnvironment
from workbench.environments.adapters.verifier import VerifierEnvironment, extract_answer

__all__ = ["OpenEnvEnvironment", "TextArenaEnvironment", "VerifierEnvironment", "extract_answer"]
