"""Adapters that make environments from other libraries workbench environments.

    TextArenaEnvironment("GuessTheNumber-v0")            # single-player TextArena games
    VerifierEnvironment(sample_fn, score_fn, attempts=1) # question/answer datasets
    VerifierEnvironment.from_reasoning_gym("chain_sum")  # reasoning-gym tasks

The libraries are optional (`pip install textarena reasoning-gym`); importing this
package does not import them, building an environment does. Gymnasium envs with text
spaces go through `workbench.gym_adapter.GymTextEnvironment`.
"""
from workbench.adapters.textarena import TextArenaEnvironment
from workbench.adapters.verifier import VerifierEnvironment, extract_answer

__all__ = ["TextArenaEnvironment", "VerifierEnvironment", "extract_answer"]
