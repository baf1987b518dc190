"""Seed 000's pipeline names as thin layers over the workbench stages.

    engine = InferenceEngine("smollm2-135m-instruct", device="cpu")   # or InferenceEngine(generation_engine)
    engine.generate(["Hi"], max_new_tokens=16, temperature=0.7)     # -> list[str], one batched call
    engine.compute_log_probs(prompts, responses)                    # -> Tensor (B,), summed over tokens
    harness = MultiTurnChatHarness(engine, CustomGameEnvironment({"max_steps": 5}), max_turns=5)
    trajectories = harness.run_batch(prompts)     # list of the seed's trajectory dicts, batched per turn
    ppo = PPOTrainer(policy_model=engine.model, value_model=engine.model)
    metrics = ppo.update(ppo.make_batch(trajectories, rewards), num_epochs=4)

What is simplified or changed against the seed's code (on purpose):
  * `generate` samples all prompts in one batched engine call and returns only the
    continuation (a `list` of str that also carries `.sequences`, `.tokens`, `.token_ids`,
    `.logprobs` of seed 001's `GenerationOutput`).
  * `MultiTurnChatHarness` runs every episode of a batch in lock-step with `Rollout`
    (one generate call per turn for all episodes, each on its own copy of the
    environment), with the model's chat template and token-exact ids instead of
    "Action: ... Observation: ..." text concatenation. `max_new_tokens` and
    `temperature` (the seed's 128 and 0.7) are arguments.
  * `PPOTrainer` computes with `workbench.algo` (GAE, clipped PPO loss, clipped value
    loss with 0.5 factor as verl); the value model gets a zero-initialised linear value
    head on its last hidden state (shared body when it is the policy model).
    `update` takes verl's layout: `responses` are the last R tokens of `input_ids`.
    `make_batch(trajectories, rewards)` builds that batch from the harness's
    trajectories; the seed's random placeholder batch (`torch.randn(...).long()` as
    token ids, negative) is refused with an error that says so.
"""
from __future__ import annotations

import copy
import os
from typing import Any, Sequence

import torch
from torch import nn

from workbench import algo
from workbench.compat.inference import InferenceEngine as _TextEngine
from workbench.compat.inference import create_inference_engine
from workbench.compat.verl_data import DataProto
from workbench.data import EpisodeSpec, episode_inputs
from workbench.environments.base import BaseEnvironment, StepResult
from workbench.rollout.chat import encode
from workbench.rollout.rollout import Rollout
from workbench.training.policy import forward_logprobs
from workbench.trajectory import Episode, TrajectoryBatch


class Generations(list):
    """`list[str]` of continuations that also carries seed 001's `GenerationOutput` fields."""

    def __init__(self, out: Any):
        super().__init__(out.sequences)
        self.sequences, self.tokens, self.token_ids = out.sequences, out.tokens, out.token_ids
        self.logprobs, self.finish_reasons = out.logprobs, out.finish_reasons


class InferenceEngine(_TextEngine):
    """Seed 000's engine: `InferenceEngine(model_path, device=...)`, or wrap a running
    `GenerationEngine` as `workbench.compat.inference.InferenceEngine(engine)` does.

    Args:
        engine_or_path: a model path / hub id / "smollm2-135m-instruct", or a GenerationEngine.
        device, dtype: "auto" (CUDA and bfloat16 when there is a GPU, else CPU and float32)
            or a value; the seed's float16 is `dtype="float16"`.
        backend: "hf" (default), "vllm", "sglang", "server" (`create_inference_engine`).
        model_path: with an engine, the model's path (as `workbench.compat.inference.InferenceEngine`).
        config: more `create_inference_engine` settings (max_model_len, server_url, ...).
    """

    def __init__(self, engine_or_path: Any, model_path: str | None = None, *, device: str = "auto",
                 dtype: str = "auto", backend: str = "hf", config: dict[str, Any] | None = None):
        if isinstance(engine_or_path, (str, os.PathLike)):
            built = create_inference_engine(str(engine_or_path), backend=backend,
                                            config={"device": device, "dtype": dtype, **(config or {})})
            super().__init__(built.engine, str(engine_or_path))
        else:
            super().__init__(engine_or_path, model_path)

    @property
    def model(self) -> nn.Module:
        """The transformers model (the hf engine's own, so training it changes what is sampled)."""
        if self._scoring_model is None:
            from workbench.models.loading import load_model

            if self.model_path is None:
                raise ValueError("this engine has no transformers model and no model path to load one from")
            self._scoring_model = load_model(self.model_path)
        return self._scoring_model

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def generate(self, prompts: Sequence[str], max_new_tokens: int | None = None, temperature: float = 0.7,
                 top_p: float = 0.9, max_tokens: int = 256, top_k: int = -1, seed: int | None = None) -> Generations:
        """Continuations of raw-text prompts, sampled in one batch (prompt not repeated)."""
        if isinstance(prompts, str):
            raise TypeError("generate takes a list of prompts; wrap a single prompt as [prompt]")
        out = super().generate(list(prompts), max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                               top_k=top_k, seed=seed, max_new_tokens=max_new_tokens)
        return Generations(out)

    @torch.no_grad()
    def compute_log_probs(self, prompts: Sequence[str], responses: Sequence[str],
                          per_token: bool = False) -> torch.Tensor | list[list[float]]:
        """Summed log-probability of each response given its prompt: Tensor (B,), from one
        padded forward. `per_token=True` returns each response's token logprobs instead."""
        if len(prompts) != len(responses):
            raise ValueError(f"{len(prompts)} prompts but {len(responses)} responses")
        model = self.model
        pairs = [(encode(self.tokenizer, p), encode(self.tokenizer, r)) for p, r in zip(prompts, responses)]
        if any(not p for p, _ in pairs):
            raise ValueError("every prompt must encode to at least one token")
        B, T = len(pairs), max((len(p) + len(r) for p, r in pairs), default=1)
        ids = torch.full((B, T), self.tokenizer.pad_token_id or 0, dtype=torch.long)  # (B, T) right-padded
        attn = torch.zeros((B, T), dtype=torch.long)
        resp = torch.zeros((B, T), dtype=torch.bool)  # response positions
        for b, (p, r) in enumerate(pairs):
            ids[b, : len(p) + len(r)] = torch.tensor(p + r)
            attn[b, : len(p) + len(r)] = 1
            resp[b, len(p): len(p) + len(r)] = True
        device = self.device
        logp, _ = forward_logprobs(model, ids.to(device), attn.to(device))  # (B, T), token t at t
        logp = logp.float().cpu()
        if per_token:
            return [logp[b][resp[b]].tolist() for b in range(B)]
        return (logp * resp).sum(-1).to(device)  # (B,)


class MultiTurnChatHarness:
    """Seed 000's harness: episodes of `environment` driven by `inference_engine`.

    `run_batch(prompts)` plays one episode per prompt on a deep copy of `environment`, all
    in one `Rollout` (one batched generate call per turn). Each trajectory is the seed's
    dict (`prompts`, `states`, `actions`, `observations`, `rewards`, `dones`, `infos`,
    `total_reward`, `num_turns`) plus `episode`, the token-exact `Episode`.
    """

    def __init__(self, inference_engine: _TextEngine, environment: Any, max_turns: int = 5,
                 max_new_tokens: int = 128, temperature: float = 0.7, top_p: float = 1.0,
                 max_context_tokens: int = 4096, seed: int | None = None):
        self.inference_engine = inference_engine
        self.environment = environment
        self.max_turns = max_turns
        self.max_new_tokens, self.temperature, self.top_p = max_new_tokens, temperature, top_p
        self.max_context_tokens, self.seed = max_context_tokens, seed
        self.last_batch: TrajectoryBatch | None = None

    def run_episode(self, initial_prompt: str) -> dict[str, Any]:
        """One episode (see `run_batch`)."""
        return self.run_batch([initial_prompt])[0]

    def run_batch(self, prompts: Sequence[str]) -> list[dict[str, Any]]:
        """One episode per prompt, batched; returns the seed's trajectory dicts."""
        if isinstance(prompts, str):
            raise TypeError("run_batch takes a list of prompts; use run_episode(prompt) for one")
        specs = [EpisodeSpec(seed=None, index=i, initial_prompt=p) for i, p in enumerate(prompts)]
        envs, seeds, groups = episode_inputs(lambda: copy.deepcopy(self.environment), specs)
        rollout = Rollout(self.inference_engine.engine, envs, seeds=seeds, group_ids=groups,
                          max_turns=self.max_turns, max_tokens=self.max_new_tokens, temperature=self.temperature,
                          top_p=self.top_p, max_context_tokens=self.max_context_tokens, seed=self.seed)
        self.last_batch = rollout.run()
        return [self._as_dict(p, ep) for p, ep in zip(prompts, self.last_batch)]

    @staticmethod
    def _as_dict(prompt: str, ep: Episode) -> dict[str, Any]:
        return {"prompts": [prompt], "states": list(ep.states), "actions": list(ep.actions),
                "observations": [t.observation for t in ep.turns], "rewards": list(ep.rewards),
                "dones": list(ep.dones), "infos": list(ep.infos), "total_reward": float(sum(ep.rewards)),
                "num_turns": len(ep.actions), "episode": ep}


class PPOTrainer:
    """Seed 000's `PPOTrainer` over `workbench.algo` (see the module docstring)."""

    def __init__(self, policy_model: nn.Module, value_model: nn.Module, learning_rate: float = 1e-5,
                 clip_ratio: float = 0.2, entropy_coef: float = 0.01, value_loss_coef: float = 0.5,
                 gamma: float = 0.99, lam: float = 0.95, cliprange_value: float = 0.5):
        self.policy_model, self.value_model = policy_model, value_model
        self.clip_ratio, self.entropy_coef, self.value_loss_coef = clip_ratio, entropy_coef, value_loss_coef
        self.gamma, self.lam, self.cliprange_value = gamma, lam, cliprange_value
        hidden = value_model.config.hidden_size
        device = next(value_model.parameters()).device
        self.value_head = nn.Linear(hidden, 1, device=device)  # fp32 head, zero-initialised
        nn.init.zeros_(self.value_head.weight)
        nn.init.zeros_(self.value_head.bias)
        self.shared_body = value_model is policy_model
        value_params = list(self.value_head.parameters())
        if not self.shared_body:
            value_params += [p for p in value_model.parameters() if p.requires_grad]
        self.policy_optimizer = torch.optim.AdamW([p for p in policy_model.parameters() if p.requires_grad],
                                                  lr=learning_rate)
        self.value_optimizer = torch.optim.AdamW(value_params, lr=learning_rate)

    # -- the seed's numerics, on workbench.algo ------------------------------------------
    @staticmethod
    def mask_from_dones(dones: torch.Tensor) -> torch.Tensor:
        """(B, T) 1 up to and including each row's first done (all 1 without one)."""
        d = dones.float()
        after = (d.cumsum(1) - d) > 0  # strictly after the first done
        return (~after).float()

    def compute_gae_advantages(self, rewards: torch.Tensor, values: torch.Tensor, dones: torch.Tensor,
                               response_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """(advantages, returns), both (B, T): GAE over each row up to its first done (and,
        given `response_mask`, over sampled tokens only), whitened over those tokens."""
        mask = self.mask_from_dones(dones)
        if response_mask is not None:
            mask = mask * response_mask.float()
        return algo.compute_gae_advantage_return(rewards, values.detach(), mask, gamma=self.gamma, lam=self.lam)

    def compute_ppo_loss(self, old_log_probs: torch.Tensor, new_log_probs: torch.Tensor,
                         advantages: torch.Tensor, response_mask: torch.Tensor
                         ) -> tuple[torch.Tensor, dict[str, float]]:
        """Clipped PPO loss (token-mean over the mask) and its metrics."""
        loss, metrics = algo.compute_policy_loss(old_log_probs, new_log_probs, advantages, response_mask,
                                                 clip_ratio=self.clip_ratio)
        with torch.no_grad():
            ratio = torch.exp(new_log_probs - old_log_probs)[response_mask.bool()]
        metrics.update(policy_loss=loss.item(), ratio_mean=ratio.mean().item(),
                       ratio_std=ratio.std().item() if ratio.numel() > 1 else 0.0)
        return loss, metrics

    def compute_value_loss(self, values: torch.Tensor, returns: torch.Tensor,
                           response_mask: torch.Tensor) -> tuple[torch.Tensor, dict[str, float]]:
        """Value loss 0.5 * masked mean (v - R)^2 (clipped against the detached values: no-op here)."""
        loss, metrics = algo.compute_value_loss(values, returns, values.detach(), response_mask,
                                                cliprange_value=self.cliprange_value)
        m = response_mask.bool()
        metrics.update(value_loss=loss.item(), value_mean=values.detach()[m].mean().item(),
                       return_mean=returns[m].mean().item())
        return loss, metrics

    # -- forward passes -----------------------------------------------------------------
    def _forward(self, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(new log-probs, entropies, values) of the response tokens, each (B, R)."""
        device = next(self.policy_model.parameters()).device
        ids, attn = batch["input_ids"].to(device), batch["attention_mask"].to(device)
        pos = batch.get("position_ids")
        pos = ((attn.cumsum(1) - 1).clamp(min=0) if pos is None else pos).to(device)
        R = batch["responses"].shape[1]
        T = ids.shape[1]
        out = self.policy_model(input_ids=ids, attention_mask=attn, position_ids=pos,
                                output_hidden_states=self.shared_body)
        logits = out.logits[:, T - R - 1:T - 1].float()  # (B, R, V) predict the response tokens
        logp_all = torch.log_softmax(logits, -1)
        logp = logp_all.gather(-1, ids[:, T - R:, None]).squeeze(-1)  # (B, R)
        entropy = -(logp_all.exp() * logp_all).sum(-1)  # (B, R)
        if self.shared_body:
            hidden = out.hidden_states[-1]
        else:
            hidden = self.value_model(input_ids=ids, attention_mask=attn, position_ids=pos,
                                      output_hidden_states=True).hidden_states[-1]
        h = hidden[:, T - R - 1:T - 1]  # (B, R, H)
        values = self.value_head(h.to(self.value_head.weight.dtype)).squeeze(-1)  # (B, R)
        return logp, entropy, values

    def _check(self, batch: dict[str, torch.Tensor]) -> None:
        need = ("input_ids", "attention_mask", "responses", "rewards", "dones", "old_log_probs", "response_mask")
        missing = [k for k in need if k not in batch]
        if missing:
            raise KeyError(f"PPOTrainer.update: batch is missing {missing}; "
                           "build it with make_batch(trajectories, rewards)")
        ids, resp = batch["input_ids"], batch["responses"]
        vocab = self.policy_model.get_input_embeddings().num_embeddings
        for name, t in (("input_ids", ids), ("responses", resp)):
            if t.dtype != torch.long or t.numel() and (t.min() < 0 or t.max() >= vocab):
                raise ValueError(f"batch[{name!r}] must hold token ids in [0, {vocab}), got values in "
                                 f"[{t.min().item()}, {t.max().item()}] ({t.dtype}); placeholders such as "
                                 f"torch.randn(...).long() are not token ids: use make_batch(trajectories, rewards)")
        R = resp.shape[1]
        if R >= ids.shape[1] or not torch.equal(ids[:, ids.shape[1] - R:].cpu(), resp.cpu()):
            raise ValueError("batch['responses'] must be the last R tokens of batch['input_ids'] (verl's layout: "
                             "input_ids = prompt + response) after at least one prompt token; use make_batch()")
        for name in ("rewards", "dones", "old_log_probs", "response_mask"):
            if tuple(batch[name].shape) != tuple(resp.shape):
                raise ValueError(f"batch[{name!r}] must have the shape of responses {tuple(resp.shape)}, "
                                 f"got {tuple(batch[name].shape)}")

    def make_batch(self, trajectories: Sequence[dict[str, Any] | Episode], rewards: Sequence[float] | torch.Tensor
                   ) -> dict[str, torch.Tensor]:
        """The `update` batch from harness trajectories: verl layout (DataProto view), each
        row's reward on its last sampled token, done there, old log-probs from the policy."""
        episodes = [t["episode"] if isinstance(t, dict) else t for t in trajectories]
        if len(episodes) != len(rewards):
            raise ValueError(f"{len(episodes)} trajectories but {len(rewards)} rewards")
        data = DataProto.from_batch(TrajectoryBatch(episodes))
        mask = data.batch["response_mask"].float()  # (B, R)
        R = mask.shape[1]
        last = (mask * torch.arange(1, R + 1)).argmax(1)  # (B,) last sampled token
        reward_t = torch.zeros_like(mask)
        dones = torch.zeros_like(mask)
        rows = torch.arange(len(episodes))
        reward_t[rows, last] = torch.as_tensor(rewards, dtype=torch.float32).flatten()
        dones[rows, last] = 1.0
        batch = {k: data.batch[k] for k in ("input_ids", "attention_mask", "position_ids", "responses")}
        batch.update(rewards=reward_t, dones=dones, response_mask=mask)
        with torch.no_grad():
            batch["old_log_probs"] = self._forward({**batch, "old_log_probs": mask})[0].detach().cpu()
        return batch

    def update(self, batch: dict[str, torch.Tensor], num_epochs: int = 4) -> dict[str, float]:
        """`num_epochs` PPO passes over `batch` (see `make_batch` for its layout)."""
        self._check(batch)
        device = next(self.policy_model.parameters()).device
        mask = batch["response_mask"].to(device).float()
        all_metrics: dict[str, float] = {}
        self.policy_model.train()
        for epoch in range(num_epochs):
            new_log_probs, entropy, values = self._forward(batch)
            advantages, returns = self.compute_gae_advantages(batch["rewards"].to(device).float(), values,
                                                              batch["dones"].to(device), mask)
            policy_loss, policy_metrics = self.compute_ppo_loss(batch["old_log_probs"].to(device).float(),
                                                                new_log_probs, advantages, mask)
            value_loss, value_metrics = self.compute_value_loss(values, returns, mask)
            ent = algo.masked_mean(entropy, mask)
            total_loss = policy_loss + self.value_loss_coef * value_loss - self.entropy_coef * ent
            self.policy_optimizer.zero_grad()
            self.value_optimizer.zero_grad()
            total_loss.backward()
            self.policy_optimizer.step()
            self.value_optimizer.step()
            all_metrics.update({f"epoch_{epoch}_policy_loss": policy_loss.item(),
                                f"epoch_{epoch}_value_loss": value_loss.item(),
                                f"epoch_{epoch}_total_loss": total_loss.item(), "entropy": ent.item(),
                                **policy_metrics, **value_metrics})
        self.policy_model.eval()
        return all_metrics


# -- the seeds' example games ----------------------------------------------------------------

class CustomGameEnvironment(BaseEnvironment):
    """Seed 000's example game: move north/south/east/west (+0.1), "pick up X" (+0.5,
    X goes to the inventory), "complete quest" (+10, score +10, success, ends); anything
    else -0.1 with `info["invalid_action"]`. Ends after `max_steps` (default 10)."""

    def __init__(self, config: Any = None):
        super().__init__(config)
        self.score, self.inventory, self.position = 0, [], (0, 0)

    def reset(self) -> str:
        self.score, self.inventory, self.position = 0, [], (0, 0)
        return self.get_state_description()

    def step(self, action: str) -> StepResult:
        self.step_count += 1  # counted here (as the seed does) so the description is current
        text = action.lower().strip()
        moves = {"move north": (0, 1), "move south": (0, -1), "move east": (1, 0), "move west": (-1, 0)}
        info: dict[str, Any] = {}
        move = next((d for k, d in moves.items() if k in text), None)
        if move is not None:
            self.position = (self.position[0] + move[0], self.position[1] + move[1])
            reward = 0.1
        elif "pick up" in text:
            self.inventory.append(text.replace("pick up", "").strip())
            reward = 0.5
        elif "complete quest" in text:
            self.score += 10
            reward = 10.0
            self.done = True
            info["success"] = True
        else:
            reward = -0.1
            info["invalid_action"] = True
        return self.get_state_description(), reward, self.done, info

    def get_state_description(self) -> str:
        inventory = ", ".join(self.inventory) if self.inventory else "empty"
        remaining = self.max_steps - self.step_count
        return (f"Game State:\n- Position: {self.position}\n- Score: {self.score}\n"
                f"- Inventory: {inventory}\n- Steps remaining: {remaining}")


class SimpleGameEnvironment(BaseEnvironment):
    """Seed 001's Simple Text Game (the seeds' `SimpleGameEnvironment`): "take" +1 (an
    item to the inventory), "attack" +5 and the episode ends, anything else -0.1."""

    def reset(self) -> str:
        self.score, self.inventory = 0.0, []
        return "Welcome to the game! You are in a room."

    def step(self, action: str) -> StepResult:
        text = action.lower()
        if "take" in text:
            self.inventory.append("item")
            reward = 1.0
        elif "attack" in text:
            reward = 5.0
            self.done = True
        else:
            reward = -0.1
        self.score += reward
        return self.get_state_description(), reward, self.done, {}

    def get_state_description(self) -> str:
        return f"Score: {round(self.score, 6)}, Inventory: {self.inventory}"


__all__ = ["CustomGameEnvironment", "Generations", "InferenceEngine", "MultiTurnChatHarness", "PPOTrainer",
           "SimpleGameEnvironment"]
