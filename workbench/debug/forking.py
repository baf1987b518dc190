"""Fork an episode at any turn (the debugger's front door to `workbench.rollout.fork`).

    from workbench.debug import fork, ReplayMismatch
    branches = fork(episode, turn=1, action="5", n=4, engine=engine, config=config)
    branches = fork(episode, turn=1, n=4, policy="runs/gn/checkpoints/step_000002")  # a checkpoint's policy
    branches = fork(episode, turn=1, n=4, engine=trainer)                            # a Trainer's everything
    branches = fork(episode, turn=1, action="Answer: 6", engine=gateway_rollout)     # an external agent's episode

The replay-and-continue core is `workbench.rollout.fork.fork_episode` (below training, so
`Trainer.fork` uses it too); this adds the ways to name the policy: an engine plus the
run's config, a Trainer, or a checkpoint folder / "base" (the run's model and the
checkpoint's weights are loaded and an hf engine built over them). Branches are scored
with the run's reward shaping (`config.reward`, as `Trainer.score` does without a
reward_fn) when the original episode was scored, so their `outcome` compares with its.
"""
from __future__ import annotations

from typing import Any, Sequence

from workbench.gateway.rollout import GatewayRollout
from workbench.rollout.fork import ReplayMismatch, fork_episode, replay
from workbench.trajectory import Episode, TrajectoryBatch

__all__ = ["fork", "ReplayMismatch", "replay"]


def fork(episode: Episode, turn: int, action: str | None = None, observation: str | None = None, n: int = 4,
         engine: Any = None, *, policy: Any = None, config: Any = None, environment: Any = None,
         parser: Any = None, tools: Sequence[Any] = (), temperature: float | None = None, seed: int | None = 0,
         score: bool | None = None, **overrides: Any) -> TrajectoryBatch:
    """`n` branches of `episode` parting at turn `turn` (see `workbench.rollout.fork`).

    Args:
        episode: a recorded episode (in memory or from `TrajectoryBatch.load`).
        turn: where the branches part (0-based).
        action / observation: the edit at that turn (at most one; neither = resample).
        n: branches.
        engine: a `GenerationEngine` (with `config`), or a `Trainer` (its engine, config,
            environment, parser, tools and reward function; see `Trainer.fork`), or the
            `GatewayRollout` that played an external agent's episode (`GatewayRollout.fork`:
            the agent runs again, its first turns answered as recorded).
        policy: instead of `engine`: a checkpoint folder or "base" (with `config`, or the
            checkpoint's own `config.yaml`); an hf engine is built over it.
        config: the run's ConfigStore: environment, limits, temperature, reward shaping.
        environment, parser, tools, temperature, seed, **overrides: see `fork_episode`.
        score: score the branches with `config.reward` (default: when the original
            episode has a score and a config is known).
    """
    if isinstance(engine, GatewayRollout):  # an external agent's episode: the agent runs again
        given = [name for name, v in (("observation", observation), ("policy", policy), ("config", config),
                                      ("environment", environment), ("parser", parser), ("tools", tools),
                                      ("temperature", temperature), ("score", score)) if v is not None and v != ()]
        if given or overrides:
            raise ValueError(f"fork of a gateway episode takes turn, action and n (the agent sets everything else "
                             f"in its own requests); got {', '.join(given + sorted(overrides))}")
        return engine.fork(episode, turn, action=action, n=n)
    if engine is not None and hasattr(engine, "fork") and hasattr(engine, "policy"):  # a Trainer
        given = [name for name, v in (("policy", policy), ("config", config), ("environment", environment),
                                      ("parser", parser), ("tools", tools)) if v]
        if given:
            raise ValueError(f"fork with a Trainer uses the trainer's own {', '.join(given)}; pass an engine "
                             "(trainer.engine) to use others")
        return engine.fork(episode, turn, action=action, observation=observation, n=n, temperature=temperature,
                           seed=seed, **overrides)
    if engine is None:
        if policy is None:
            raise ValueError("fork needs engine= (an engine or a Trainer) or policy= (a checkpoint folder or \"base\")")
        from workbench.debug.policies import load_policy
        from workbench.engines import hf_engine

        model, tokenizer, config = load_policy(policy, config)
        engine = hf_engine(config, model, tokenizer)
    batch = fork_episode(episode, turn, engine, action=action, observation=observation, n=n, config=config,
                         environment=environment, parser=parser, tools=tools, temperature=temperature, seed=seed,
                         **overrides)
    if score is None:
        score = episode.score is not None and config is not None
    if score:
        from workbench.reward import score_batch

        score_batch(batch, None, None, config.reward,
                    max_tokens=overrides.get("max_tokens", config.inference.max_tokens))  # the branches' limit
    return batch
