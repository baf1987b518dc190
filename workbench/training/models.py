"""Everything a run trains, built from its config in one place: the policy (with its
reference view), the critic for PPO with GAE, and their AdamW optimizers.

    models = build_models(config)          # the Trainer
    policy, critic = models.policy, models.critic
    optimizer, critic_optimizer = build_optimizers(config, policy.model, critic)  # FSDP learners, after sharding

The single-process `Trainer` and the Ray learners (`workbench.distributed.learners`) both
call these, so a model or optimizer setting means the same on every path. The Ray rollout
workers build only the sampling policy (`Policy(config.model, with_reference=False)`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from workbench.training.policy import Critic, Policy


@dataclass
class Models:
    """The trained models of a run and their optimizers."""

    policy: Policy
    """The policy (LoRA or full weights) and its reference view."""
    critic: Critic | None
    """The value model (only for `training.adv_estimator == "gae"`)."""
    optimizer: torch.optim.Optimizer | None
    """AdamW over the policy's trained weights (`training.learning_rate`, `weight_decay`);
    None when built with `with_optimizers=False`."""
    critic_optimizer: torch.optim.Optimizer | None
    """AdamW over the critic's trained weights (`training.critic_learning_rate`)."""


def needs_critic(config: Any) -> bool:
    """Whether the run trains a critic (PPO with GAE)."""
    return config.training.adv_estimator == "gae"


def build_optimizers(config: Any, policy_module: torch.nn.Module, critic: torch.nn.Module | None
                     ) -> tuple[torch.optim.Optimizer, torch.optim.Optimizer | None]:
    """AdamW for the policy's trained parameters and, if there is a critic, for its own."""
    t = config.training
    optimizer = AdamW([p for p in policy_module.parameters() if p.requires_grad],
                      lr=t.learning_rate, weight_decay=t.weight_decay)
    critic_optimizer = (AdamW([p for p in critic.parameters() if p.requires_grad], lr=t.critic_learning_rate)
                        if critic is not None else None)
    return optimizer, critic_optimizer


class AdamW(torch.optim.AdamW):
    """torch's AdamW, on its fused kernel when every parameter is on a CPU or CUDA device
    (one kernel for all tensors instead of a loop of small ops: 4.7 vs 16 ms per step for
    SmolLM2's 420 LoRA tensors on this CPU); the update rule is the same.

    The fused kernel writes the parameters without bumping their autograd version
    counters, which is how the engines notice new weights (`engines.merged`, the decode
    step's fused copies), so `step` bumps them itself."""

    def __init__(self, params: list[torch.nn.Parameter], **kwargs: Any):
        params = list(params)
        fused = bool(params) and all(p.device.type in ("cpu", "cuda") for p in params)
        super().__init__(params, fused=fused or None, **kwargs)

    @torch.no_grad()
    def step(self, closure: Any = None) -> Any:
        loss = super().step(closure)
        stepped = [p for g in self.param_groups if g.get("fused") for p in g["params"] if p.grad is not None]
        if stepped:
            torch.autograd.graph.increment_version(stepped)
        return loss


def build_models(config: Any, with_reference: bool = True, with_optimizers: bool = True) -> Models:
    """Policy, critic (for GAE) and optimizers as `config` describes them. Seeds torch
    with `training.seed` first, so fresh LoRA adapters are the same in every process
    that builds them (trainer, learners, rollout workers).

    `with_optimizers=False` leaves the optimizers to the caller (FSDP learners build them
    with `build_optimizers` after sharding, which replaces the parameters)."""
    torch.manual_seed(config.training.seed)
    policy = Policy(config.model, with_reference=with_reference)
    critic = Critic(config.model) if needs_critic(config) else None
    optimizer = critic_optimizer = None
    if with_optimizers:
        optimizer, critic_optimizer = build_optimizers(config, policy.model, critic)
    return Models(policy, critic, optimizer, critic_optimizer)


__all__ = ["AdamW", "Models", "build_models", "build_optimizers", "needs_critic"]
