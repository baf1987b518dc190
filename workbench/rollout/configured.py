"""A rollout built from a run's config: the one place rollout settings are read from it.

    rollout = make_rollout(config, engine, envs, seeds=[0, 0, 1, 1])
    batch = rollout.run()

The trainer, the Ray rollout workers, the CLI and the fork of an episode all call
`make_rollout`, so a setting reaches every path or none. Where each field of
`InferenceConfig` and `EnvironmentConfig` takes effect is written down in
`INFERENCE_FIELDS` / `ENVIRONMENT_FIELDS` (a test checks that every field is listed and
that each "rollout" field arrives on every path):

    "rollout"      read here, by `make_rollout`
    "engine"       read by `workbench.engines.make_engine` when the engine is built
    "environment"  carried by the environment objects (`env.config`); the trainer records
                   them (`workbench.environments.registry.record_environment`)
"""
from __future__ import annotations

from typing import Any, Sequence

from workbench.engines.base import GenerationEngine
from workbench.rollout.async_rollout import AsyncRollout
from workbench.rollout.rollout import Rollout

#: InferenceConfig field -> where it takes effect (see the module docstring).
INFERENCE_FIELDS: dict[str, str] = {
    "backend": "engine", "max_tokens": "rollout", "temperature": "rollout", "top_p": "rollout",
    "top_k": "rollout", "multi_turn": "rollout", "max_turns": "rollout", "max_context_tokens": "rollout",
    "stop": "engine", "seed": "rollout", "server_url": "engine", "server_kind": "engine",
    "request_timeout": "engine", "max_retries": "engine", "gpu_memory_utilization": "engine",
    "enable_prefix_caching": "engine", "prefix_cache_mb": "engine", "max_batch_size": "engine", "cuda_graphs": "engine",
    "enable_sleep_mode": "engine",
    "vllm_dtype": "engine",
    "async_rollout": "rollout",
}
#: EnvironmentConfig field -> where it takes effect.
ENVIRONMENT_FIELDS: dict[str, str] = {
    "name": "environment", "max_steps": "environment", "seed": "environment", "system_prompt": "environment",
    "params": "environment", "import_path": "environment", "step_timeout": "rollout",
    "strict_format": "environment",  # env.strict_format; MultiTurnManager builds the parser strict from it
    "constrained_decoding": "environment",  # env.constrained_decoding; Rollout asks env.action_constraint()
}

_FROM_CONFIG = object()  # sampling_seed default: inference.seed as written


def rollout_settings(config: Any, temperature: float | None = None) -> dict[str, Any]:
    """The `Rollout` keyword arguments that come from `config` (every "rollout" field but
    `seed` and `async_rollout`, which choose the sampling seed and the class)."""
    inf = config.inference
    return dict(
        max_turns=inf.max_turns if inf.multi_turn else 1, max_tokens=inf.max_tokens,
        temperature=inf.temperature if temperature is None else temperature, top_p=inf.top_p, top_k=inf.top_k,
        max_context_tokens=inf.max_context_tokens, step_timeout=config.environment.step_timeout,
    )


def make_rollout(config: Any, engine: GenerationEngine, environments: Sequence[Any],
                 seeds: Sequence[int | None] | None = None, group_ids: Sequence[str] | None = None, *,
                 parser: Any = None, tools: Sequence[Any] = (), temperature: float | None = None,
                 sampling_seed: Any = _FROM_CONFIG, rollout_class: type | None = None,
                 progress: bool | None | Any = _FROM_CONFIG, **kwargs: Any) -> Rollout:
    """A `Rollout` (an `AsyncRollout` when `inference.async_rollout`) over `environments`
    with the run's settings.

    Args:
        config: the run's ConfigStore.
        engine, environments, seeds, group_ids, parser, tools: as for `Rollout`.
        temperature: overrides `inference.temperature` (evaluation runs greedy with 0).
        sampling_seed: the base sampling seed; default `inference.seed` (the trainer
            passes one derived from it and the step, so every step samples afresh).
        rollout_class: a subclass of the class chosen by `inference.async_rollout`
            (e.g. the Ray workers' streaming one), built instead of it.
        progress: progress bar setting; default `training.progress`.
        **kwargs: further `Rollout` arguments (`initial_prompt`, `check_alignment`).
    """
    base = AsyncRollout if config.inference.async_rollout else Rollout
    cls = rollout_class or base
    if not issubclass(cls, base):
        raise TypeError(f"rollout_class {cls.__name__} must subclass {base.__name__} "
                        f"(inference.async_rollout={config.inference.async_rollout})")
    seed = config.inference.seed if sampling_seed is _FROM_CONFIG else sampling_seed
    return cls(engine, list(environments), seeds=seeds, group_ids=group_ids, seed=seed, parser=parser,
               tools=list(tools), progress=config.training.progress if progress is _FROM_CONFIG else progress,
               **rollout_settings(config, temperature), **kwargs)


__all__ = ["ENVIRONMENT_FIELDS", "INFERENCE_FIELDS", "make_rollout", "rollout_settings"]
