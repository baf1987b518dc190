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
from workbench.rollout.chat import ChatRenderer
from workbench.rollout.rollout import Rollout
from workbench.rollout.template import say_once

#: InferenceConfig field -> where it takes effect (see the module docstring).
INFERENCE_FIELDS: dict[str, str] = {
    "backend": "engine", "max_tokens": "rollout", "temperature": "rollout", "top_p": "rollout",
    "top_k": "rollout", "multi_turn": "rollout", "max_turns": "rollout", "max_context_tokens": "rollout",
    "stop": "engine", "seed": "rollout", "server_url": "engine", "server_kind": "engine",
    "request_timeout": "engine", "max_retries": "engine", "gpu_memory_utilization": "engine",
    "enable_prefix_caching": "engine", "prefix_cache_mb": "engine", "max_batch_size": "engine", "cuda_graphs": "engine",
    "packed_decode": "engine", "cpu_kernels": "engine",
    "enable_sleep_mode": "engine",
    "vllm_dtype": "engine",
    "async_rollout": "rollout",
    "history": "rollout", "enable_thinking": "rollout", "tool_format": "rollout",
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
    `seed` and `async_rollout`, which choose the sampling seed and the class; the chat
    template's settings through `chat_settings`)."""
    inf = config.inference
    return dict(
        max_turns=inf.max_turns if inf.multi_turn else 1, max_tokens=inf.max_tokens,
        temperature=inf.temperature if temperature is None else temperature, top_p=inf.top_p, top_k=inf.top_k,
        max_context_tokens=inf.max_context_tokens, step_timeout=config.environment.step_timeout,
        **chat_settings(config),
    )


def chat_settings(config: Any) -> dict[str, Any]:
    """How the chat template is used (`inference.history`, `enable_thinking`, `tool_format`): the
    keyword arguments of `Rollout` and of the gateway (`workbench.gateway.Gateway`,
    `GatewayRollout`) that come from `config`."""
    inf = config.inference
    return dict(history=inf.history, enable_thinking=inf.enable_thinking, tool_format=inf.tool_format)


def check_chat_template(config: Any, tokenizer: Any) -> ChatRenderer:
    """The model's chat template checked against the run's `chat_settings` when the run starts
    (the trainer calls it once the tokenizer is loaded): a template that cannot express the
    conversation, or an `enable_thinking` it has no switch for, raises `TemplateError` naming
    the model, the rule and the fix; what `inference.history` "auto" chose is said once."""
    settings = chat_settings(config)
    kwargs = {} if settings["enable_thinking"] is None else {"enable_thinking": bool(settings["enable_thinking"])}
    renderer = ChatRenderer(tokenizer, kwargs, settings["history"])
    say_once(renderer.history_note)
    return renderer


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


__all__ = ["ENVIRONMENT_FIELDS", "INFERENCE_FIELDS", "chat_settings", "check_chat_template", "make_rollout",
           "rollout_settings"]
