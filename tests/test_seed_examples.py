"""Seed 001's README examples, with `setup` replaced by `workbench`, on the tiny model."""
from __future__ import annotations

import torch

from workbench import BaseEnvironment, ConfigStore, EnvironmentConfig, RayPPOTrainer


def _shrink(config: ConfigStore, tiny_model_path, tmp_path) -> None:
    """What a CPU user changes: a small local model and a small batch."""
    config.model.model_name = str(tiny_model_path)
    config.model.dtype = "float32"
    config.inference.backend = "hf"
    config.inference.max_tokens = 8
    config.inference.max_turns = 2
    config.training.batch_size = 4
    config.training.group_size = 2
    config.training.num_iters_per_epoch = 1
    config.checkpoint.output_dir = str(tmp_path / "checkpoints")


def test_quick_start(tiny_model_path, tmp_path):
    class MyEnvironment(BaseEnvironment):
        def __init__(self, config: EnvironmentConfig):
            super().__init__(config)

        def reset(self) -> str:
            """Reset and return initial observation."""
            return "Initial state description"

        def step(self, action: str) -> tuple:
            """Execute action and return (observation, reward, done, info)."""
            reward = 1.0
            return "New state", reward, False, {}

        def get_state_description(self) -> str:
            return "Current state description"

    config = ConfigStore()
    config.model.model_name = "meta-llama/Llama-2-7b-hf"
    config.model.dtype = "bfloat16"
    config.inference.backend = "vllm"
    config.inference.max_tokens = 256
    config.inference.temperature = 0.7
    config.training.learning_rate = 1e-5
    config.training.num_epochs = 10
    config.training.batch_size = 32
    config.training.clip_ratio = 0.2
    config.checkpoint.output_dir = "./checkpoints"
    config.checkpoint.save_interval = 5
    _shrink(config, tiny_model_path, tmp_path)

    def compute_reward(trajectory, environment):
        total_reward = sum(trajectory.rewards)
        return total_reward

    env = MyEnvironment(config.environment)
    trainer = RayPPOTrainer(config=config, environment=env, reward_fn=compute_reward, dataset=None)
    trainer.fit(num_epochs=2)
    assert len(trainer.metrics_history) == 2
    for metric_dict in trainer.metrics_history:
        # Every turn earns 1.0 and episodes run max_turns=2 turns.
        assert metric_dict["reward/mean"] == 2.0
        assert "policy_loss" in metric_dict and "epoch" in metric_dict
    assert isinstance(trainer.model, torch.nn.Module)
    # save_interval=5 with 2 steps: nothing saved by fit; a manual save works.
    path = tmp_path / "checkpoints" / "epoch_5"
    trainer.save_checkpoint(path)
    trainer.load_checkpoint(path)
    trainer.cleanup()


def test_simple_text_game(tiny_model_path, tmp_path):
    class TextGameEnv(BaseEnvironment):
        """Simple text-based game."""

        def reset(self) -> str:
            self.score = 0
            self.inventory = []
            return "Welcome to the game! You are in a room."

        def step(self, action: str) -> tuple:
            reward = 0.0

            if "take" in action.lower():
                self.inventory.append("item")
                reward = 1.0
            elif "attack" in action.lower():
                reward = 5.0
                self._done = True
            else:
                reward = -0.1

            self.score += reward
            return self.get_state_description(), reward, self._done, {}

        def get_state_description(self) -> str:
            return f"Score: {self.score}, Inventory: {self.inventory}"

    config = ConfigStore()
    _shrink(config, tiny_model_path, tmp_path)
    env = TextGameEnv(config.environment)
    trainer = RayPPOTrainer(config, env, reward_fn=lambda t: sum(t.rewards))
    trainer.fit(num_epochs=2)
    assert len(trainer.metrics_history) == 2
    batch = trainer.last_batch
    for ep in batch:
        # The reward function's score is exactly the sum of the game's step rewards.
        assert ep.score == sum(ep.rewards)
        assert all(r in (1.0, 5.0, -0.1) for r in ep.rewards)
