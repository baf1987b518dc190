"""The seeds' multi-turn harness, re-implemented faithfully as a benchmark baseline.

Seed 000 ("MULTI-TURN CHAT HARNESS") runs one episode at a time:

    context = f"{initial_prompt}\\n\\nInitial state:\\n{initial_state}"
    for turn in range(max_turns):
        action = engine.generate([context], max_new_tokens=128, temperature=0.7)[0]
        observation, reward, done, info = env.step(action)
        context += f"\\n\\nAction: {action}\\n\\nObservation:\\n{observation}"

and its `InferenceEngine.generate` tokenises the string prompt (padding, truncation to
512 tokens), calls `model.generate(do_sample=True, temperature, top_p)`, decodes the
whole output with `skip_special_tokens=True` and strips the prompt by characters.
So every turn re-encodes the whole context string and generates for one prompt.

Kept as in the seed: one episode at a time, string context rebuilt and re-encoded
every turn, no chat template, HF `generate` on a single string prompt, decode-then-
strip. Changed only so the comparison is fair and measurable: the engine wraps an
already loaded model/tokenizer (the same weights our `Rollout` uses, instead of
loading fp16 onto "cuda"), `max_new_tokens`/`temperature`/`top_p` are constructor
arguments (seed defaults 128 / 0.7 / 0.9), and the engine counts generated tokens.
"""
from __future__ import annotations

from typing import Any, Dict, List

import torch


class SeedInferenceEngine:
    """Seed 000's `InferenceEngine`, over a model and tokenizer already in memory."""

    def __init__(self, model: Any, tokenizer: Any, device: Any = None):
        self.device = device if device is not None else next(model.parameters()).device  # the model's own
        self.tokenizer = tokenizer
        self.model = model
        self.model.eval()
        self.generated_tokens = 0
        self.prompt_tokens = 0
        self.calls = 0

    def generate(self, prompts: List[str], max_new_tokens: int = 256, temperature: float = 0.7,
                 top_p: float = 0.9) -> List[str]:
        inputs = self.tokenizer(prompts, return_tensors="pt", padding=True, truncation=True,
                                max_length=512).to(self.device)
        with torch.no_grad():
            outputs = self.model.generate(
                **inputs,
                max_new_tokens=max_new_tokens,
                temperature=temperature,
                top_p=top_p,
                do_sample=True,
                pad_token_id=self.tokenizer.eos_token_id,
            )
        # Counting (not in the seed): new tokens per row up to and including its stop.
        new = outputs[:, inputs["input_ids"].shape[1]:]
        eos = self.model.generation_config.eos_token_id
        eos = set(eos if isinstance(eos, list) else [eos])
        for row in new.tolist():
            n = len(row)
            for i, t in enumerate(row):
                if t in eos:
                    n = i + 1
                    break
            self.generated_tokens += n
        self.prompt_tokens += int(inputs["attention_mask"].sum())
        self.calls += 1
        responses = self.tokenizer.batch_decode(outputs, skip_special_tokens=True)
        return [response[len(prompt):].strip() for response, prompt in zip(responses, prompts)]


class MultiTurnChatHarness:
    """Seed 000's `MultiTurnChatHarness`: inference -> environment -> repeat, one episode at a time."""

    def __init__(self, inference_engine: SeedInferenceEngine, environment: Any, max_turns: int = 5,
                 max_new_tokens: int = 128, temperature: float = 0.7, top_p: float = 0.9):
        self.inference_engine = inference_engine
        self.environment = environment
        self.max_turns = max_turns
        self.max_new_tokens = max_new_tokens
        self.temperature = temperature
        self.top_p = top_p

    def run_episode(self, initial_prompt: str) -> Dict[str, Any]:
        initial_state = self.environment.reset()
        context = f"{initial_prompt}\n\nInitial state:\n{initial_state}"
        trajectory: Dict[str, Any] = {
            "prompts": [initial_prompt], "states": [initial_state], "actions": [], "observations": [],
            "rewards": [], "dones": [], "infos": [],
        }
        total_reward = 0.0
        for _turn in range(self.max_turns):
            if self.environment.is_done():
                break
            action = self.inference_engine.generate([context], max_new_tokens=self.max_new_tokens,
                                                    temperature=self.temperature, top_p=self.top_p)[0]
            trajectory["actions"].append(action)
            observation, reward, done, info = self.environment.step(action)
            trajectory["observations"].append(observation)
            trajectory["rewards"].append(reward)
            trajectory["dones"].append(done)
            trajectory["infos"].append(info)
            total_reward += reward
            context += f"\n\nAction: {action}\n\nObservation:\n{observation}"
            if done:
                break
        trajectory["total_reward"] = total_reward
        trajectory["num_turns"] = len(trajectory["actions"])
        return trajectory

    def run_batch(self, prompts: List[str]) -> List[Dict[str, Any]]:
        return [self.run_episode(prompt) for prompt in prompts]
