"""Supervised warm-up from demonstrations: SFT on an expert's turns before RL.

    batch = expert_demonstrations(trainer, episodes=32)    # the environment's scripted expert plays
    metrics = trainer.sft(batch, steps=20)                 # NLL of the expert's turns, LoRA path
    trainer.fit(steps=8)                                   # RL from the warmed-up policy

Why: RL learns only from rewards the policy already earns sometimes. A strict action
format (`environment.strict_format`) that the untrained model never meets gives every
episode the same 0, so GRPO has nothing to learn from; a few steps of supervised learning
on a scripted player's episodes teach the format (and some of the game) first.

Demonstrations are played by the environment's scripted expert (`env.expert_action()`,
which every example environment has) through a real `Rollout` with the run's settings:
the same chat template, system prompt, parser, tools and context budget as the policy's
own episodes. Each expert reply is appended as a model turn (`Rollout.replay`): its ids
are the reply's tokens plus the end-of-turn id, with loss mask 1 and logprob 0.0 (a
scripted player picks them with probability 1), and the turn's `source` is "expert".
Observations, tool results and template glue keep loss mask 0, as in RL.

`sft_step` is one optimizer step on the token-mean negative log-likelihood of the
trained tokens (loss mask 1) of a batch, through the same path as the RL update: the
policy's `forward_logprobs` (packed rows, LoRA linears), micro-batches of whole groups,
gradient accumulation, clipping at `training.max_grad_norm`, the trainer's own AdamW,
and `guarded_step` (a step that makes weights non-finite is undone). Episodes without a
trained token are left out. Shapes: B batch, T tokens.
"""
from __future__ import annotations

import warnings
from typing import Any, Callable, Sequence

import torch

from workbench.config import ConfigError, TrainingConfig
from workbench.rollout.configured import make_rollout
from workbench.training.guards import guarded_step
from workbench.training.policy import forward_logprobs, forward_rows, micro_batches, positions_of
from workbench.trajectory import TrajectoryBatch

Expert = Callable[[Any], str]


class ExpertFailedWarning(UserWarning):
    """A scripted expert failed on one demonstration (raised, or returned no text): that
    demonstration is skipped and the warm-up goes on with the others."""


class ExpertError(RuntimeError):
    """The scripted expert failed on every demonstration: there is nothing to learn from."""

#: Seeds of demonstration episodes start here: apart from training seeds (derived from
#: `training.seed` and the step) and the held-out seeds of the CLI (10_000..).
DEMONSTRATION_SEED_BASE = 50_000_000


def expert_of(env: Any) -> Expert:
    """The scripted expert of an environment: its `expert_action()` method, as
    `expert(env) -> reply text`. A ConfigError says how to give one when it has none."""
    if getattr(type(env), "expert_action", None) is None:
        raise ConfigError(f"{type(env).__name__} has no scripted expert to learn from: give the environment an "
                          "`expert_action(self) -> str` method (the reply an expert makes in the current state), "
                          "or pass demonstrations to Trainer.sft(batch) yourself")

    def expert(e: Any) -> str:
        return e.expert_action()

    expert.__qualname__ = f"{type(env).__name__}.expert_action"  # how failures name it
    return expert


def expert_name(expert: Expert) -> str:
    """How messages name a scripted expert: `GuessNumberEnv.expert_action`, a function's name."""
    return getattr(expert, "__qualname__", None) or repr(expert)


def _expert_reply(expert: Expert, env: Any, episode: int, seed: Any, turn: int) -> tuple[str | None, str]:
    """(the expert's reply, "") or (None, why it failed: the expert, the episode and the turn)."""
    where = f"demonstration episode {episode} (seed {seed}), turn {turn}"
    try:
        reply = expert(env)
    except Exception as exc:  # noqa: BLE001 - the expert's own bug ends its demonstration only
        return None, f"the scripted expert {expert_name(expert)} raised {type(exc).__name__}: {exc} in {where}"
    if not isinstance(reply, str):
        return None, (f"the scripted expert {expert_name(expert)} returned {type(reply).__name__} "
                      f"({str(reply)[:60]!r}) instead of the reply text in {where}")
    return reply, ""


def play_expert(config: Any, engine: Any, environments: Sequence[Any], seeds: Sequence[int],
                expert: Expert, parser: Any = None, tools: Sequence[Any] = ()) -> TrajectoryBatch:
    """Episodes of `environments` (one per seed) played by `expert` through a `Rollout`
    with `config`'s settings; the engine only lends its tokenizer (nothing is sampled).

    An expert that fails on an episode (raises, or returns something other than text) ends
    that demonstration: an `ExpertFailedWarning` names the expert, the episode (and its
    seed) and the turn, and the episode is left out of the batch (`meta["skipped"]` counts
    them); `ExpertError` when it failed on every one."""
    rollout = make_rollout(config, engine, environments, list(seeds), parser=parser, tools=tools, progress=False)
    rollout.reset()
    failed: dict[int, str] = {}
    for turn in range(rollout.max_turns):
        if not rollout.live:
            break
        for i in list(rollout.live):
            slot = rollout.slots[i]
            reply, why = _expert_reply(expert, slot.env, i, slot.episode.env_seed, turn)
            if reply is None:
                failed[i] = why
                rollout._fail(slot, why)
                warnings.warn(f"{why}: that demonstration is skipped, the SFT warm-up goes on without it",
                              ExpertFailedWarning, stacklevel=3)
                continue
            ids = rollout.renderer.human_action_ids(reply)  # the reply + the end-of-turn id
            room = rollout.max_context_tokens - rollout.close_reserve - slot.episode.num_tokens
            if len(ids) > room:
                rollout._truncate(slot, "context")  # as a sampled turn that cannot fit
                continue
            rollout.replay(i, ids, [0.0] * len(ids), "stop")
            slot.episode.turns[-1].source = "expert"
    if failed and len(failed) == len(rollout.slots):
        raise ExpertError(f"the scripted expert {expert_name(expert)} failed on all {len(failed)} demonstration "
                          f"episodes, so there is nothing to learn from; the first: {next(iter(failed.values()))}")
    batch = TrajectoryBatch([s.episode for i, s in enumerate(rollout.slots) if i not in failed])
    for ep in batch:
        if not ep.done:  # turns ran out: as the rollout ends an episode at max_turns
            ep.truncated, ep.truncation_reason = True, "max_turns"
    batch.meta["demonstrations"] = True
    if failed:
        batch.meta["skipped"] = len(failed)
    return batch


def expert_demonstrations(trainer: Any, episodes: int, seed: int = 0, expert: Expert | None = None
                          ) -> TrajectoryBatch:
    """`episodes` episodes of the trainer's environment played by its scripted expert
    (or `expert`), on seeds `DEMONSTRATION_SEED_BASE + seed * episodes + i`, with the
    trainer's config, parser and tools."""
    if episodes < 1:
        raise ValueError(f"expert_demonstrations needs episodes >= 1, got {episodes}")
    expert = expert or expert_of(trainer.make_environment())
    seeds = [DEMONSTRATION_SEED_BASE + seed * episodes + i for i in range(episodes)]
    envs = [trainer.make_environment() for _ in seeds]
    return play_expert(trainer.config, trainer.engine, envs, seeds, expert, trainer.parser, trainer.tools)


def sft_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, batch: TrajectoryBatch,
             t: TrainingConfig) -> dict[str, float]:
    """One optimizer step on the token-mean NLL of `batch`'s trained tokens (see the module
    docstring). Returns `sft/nll` (the mean NLL before the step), `sft/tokens`,
    `sft/grad_norm` and `sft/skipped_updates` (1.0 when the step was not taken)."""
    lengths = [ep.num_tokens for ep in batch]
    tokens = float(batch.loss_mask.sum())  # the token-mean denominator
    if tokens == 0:
        raise ValueError("sft_step: the batch has no trained token (loss mask 1): nothing to learn from")
    device = next(model.parameters()).device
    params = [p for p in model.parameters() if p.requires_grad]
    model.train()
    optimizer.zero_grad(set_to_none=True)
    nll_sum = 0.0
    for idx in micro_batches(lengths, t.micro_batch_size, batch.group_ids, forward_rows(lengths, batch.loss_mask)):
        T = max(lengths[i] for i in idx)
        ids = batch.input_ids[idx, :T].to(device)  # (b, T)
        attn = batch.attention_mask[idx, :T].to(device)
        mask = batch.loss_mask[idx, :T].to(device)
        logp, _ = forward_logprobs(model, ids, attn, autocast=t.autocast_bf16, loss_mask=mask,
                                   position_ids=positions_of(batch, idx, T, device))  # (b, T)
        nll = -(logp.float() * mask).sum()
        (nll / tokens).backward()
        nll_sum += float(nll.detach())
    grad_norm = torch.nn.utils.clip_grad_norm_(params, t.max_grad_norm)
    kept = bool(torch.isfinite(grad_norm)) and guarded_step(optimizer, params)
    optimizer.zero_grad(set_to_none=True)
    model.eval()
    return {"sft/nll": nll_sum / tokens, "sft/tokens": tokens, "sft/grad_norm": float(grad_norm),
            "sft/episodes": float(len(batch) - len(batch.untrained_rows())), "sft/skipped_updates": float(not kept)}


__all__ = ["DEMONSTRATION_SEED_BASE", "ExpertError", "ExpertFailedWarning", "expert_demonstrations", "expert_name",
           "expert_of", "play_expert", "sft_step"]
