"""Dynamic sampling (DAPO's group filtering; verl's `algorithm.filter_groups`): keep only
groups whose rewards vary, and roll out fresh groups in place of the others.

    config.training.dynamic_sampling = True          # --training.dynamic_sampling true
    config.training.dynamic_sampling_max_batches = 3  # extra rollout rounds per step, at most
    trainer.train_step()                              # rollout, score, filter_groups, advantages, update

    batch = trainer.score(trainer.rollout())          # stepwise, in a notebook:
    batch = trainer.filter_groups(batch)              # the same filtering; the batch to train on

A group-relative estimator (GRPO, RLOO, REINFORCE++ with baseline) gives every episode of
a group whose rewards are all equal an advantage of 0, so such a group only dilutes the
update. `filter_groups` drops them and rolls out replacement groups with the same weights,
round by round, until the batch holds `batch_size / group_size` groups that vary or
`training.dynamic_sampling_max_batches` extra rounds have run:

* A group *varies* when at least two of its trained episodes (failed episodes, with no
  trained token, are no members: `TrajectoryBatch.untrained_rows`) have different scores.
  A group with one trained episode, or none, is dropped with the flat ones.
* Each extra round samples the groups still missing, scaled up by the share of groups that
  varied so far (at most a full step's worth), on fresh environment seeds and a fresh
  sampling seed derived from `training.seed`, the step and the round (`extra_seeds`,
  `round_sampling_seed`): never the step's own seeds (with a dataset: other items while it
  has any), the same on a rerun.
* Enough varied groups: the step trains on the first `batch_size / group_size` of them
  (the step's own first, then the extra rounds' in order), so `batch_size` episodes.
* Bound reached: the step trains on the varied groups it has (fewer episodes) and warns
  (`DynamicSamplingBoundWarning`, `rollout/dynamic_bound_reached` = 1). With none (or too few
  for the Ray learners to split by group), it trains on the step's own batch as without
  dynamic sampling (with none varied, its group-relative advantages are all 0 and
  `ZeroVarianceWarning` says so).

Rollouts go through `trainer.stages.rollout`, so extra rounds run where the step's own
rollout ran (this process or Ray rollout workers), and are scored with `trainer.score`.
In asynchronous training (`training.max_staleness`) they first wait for the batch being
sampled ahead and pause the queue (`RolloutAhead.settle`), so they sample alone, with the
step's own weights (their episodes carry its weight version).
The returned batch is the one the step trains on and `fit` saves (`trainer.last_batch`).
Its episodes are renumbered 0..B-1 and a group id reused by an extra round gets
"/r<round>" appended. Metrics (in `batch.meta`, copied into the step's metrics):
`rollout/dynamic_dropped_groups`, `rollout/dynamic_resample_rounds`,
`rollout/dynamic_resampled_groups`, `rollout/dynamic_kept_groups` (groups trained on),
`rollout/dynamic_zero_variance_rate` (dropped / groups seen: the flat share before the
filter, which the trained batch's `reward/zero_std_group_rate` no longer shows) and
`rollout/dynamic_bound_reached`; `perf/rollout_seconds` and the generated tokens include
the extra rounds. `training.dynamic_sampling` and its bound are read here only.
"""
from __future__ import annotations

import math
import random
import time
import warnings
from typing import Any

import torch

from workbench.trajectory import TrajectoryBatch

#: Added to the environment seeds of extra rounds, so they never meet a step's own seeds
#: (`Trainer._step_seeds`: `training.seed * 1_000_003 + step * groups + g`).
EXTRA_SEED_OFFSET = 1_000_000_000
#: Stride between the sampling seeds of a step's rounds (round 0 is the step's own).
ROUND_SEED_STRIDE = 1_000_003


class DynamicSamplingBoundWarning(UserWarning):
    """`training.dynamic_sampling_max_batches` extra rounds ran without finding enough
    groups whose rewards vary: the step trains on fewer episodes (or on its own batch)."""


def group_rows(batch: TrajectoryBatch) -> dict[str, list[int]]:
    """Rows of each group, in order of first appearance (`TrajectoryBatch.group_rows`)."""
    return batch.group_rows()


def varies(batch: TrajectoryBatch, rows: list[int]) -> bool:
    """Whether at least two trained episodes among `rows` have different outcomes."""
    scores = batch.trained_outcomes(rows)
    return len(scores) >= 2 and max(scores) != min(scores)


def extra_seeds(trainer: Any, step: int, round_: int, n: int) -> list[Any]:
    """`n` fresh group seeds for extra round `round_` (1-based) of step `step`.

    Without a dataset: integers in a range of their own (`EXTRA_SEED_OFFSET`), distinct per
    (step, round, group). With one: items drawn by a generator seeded with `training.seed`,
    the step and the round, other than the step's own items while the dataset has others."""
    t = trainer.config.training
    n_groups = t.batch_size // t.group_size
    bound = max(t.dynamic_sampling_max_batches, 1)
    if trainer.dataset is None:
        first = t.seed * 1_000_003 + EXTRA_SEED_OFFSET + (step * bound + round_ - 1) * n_groups
        return [first + g for g in range(n)]
    size = len(trainer.dataset)
    own = {(step * n_groups + g) % size for g in range(n_groups)}
    pool = [i for i in range(size) if i not in own] or list(range(size))
    rng = random.Random(f"dynamic-sampling/{t.seed}/{step}/{round_}")
    picks = rng.sample(pool, n) if n <= len(pool) else [rng.choice(pool) for _ in range(n)]
    return [trainer.dataset[i] for i in picks]


def round_sampling_seed(trainer: Any, step: int, round_: int) -> int | None:
    """The base sampling seed of extra round `round_` of step `step` (None: unseeded)."""
    base = trainer.sampling_seed(step)
    return None if base is None else base + round_ * ROUND_SEED_STRIDE


def concat(parts: list[tuple[TrajectoryBatch, list[int]]]) -> TrajectoryBatch:
    """One batch of the given rows of each batch, in order: episodes renumbered 0..B-1,
    every tensor field all the parts hold right-padded to the longest episode."""
    episodes = [b[i] for b, rows in parts for i in rows]
    out = TrajectoryBatch(episodes, {})
    T = max((ep.num_tokens for ep in episodes), default=0)
    names = set.intersection(*(set(b.tensors) for b, _ in parts)) if parts else set()
    for name in sorted(names):
        pieces = []
        for b, rows in parts:
            if rows:
                t = b.tensors[name][torch.tensor(rows, dtype=torch.long)]  # (n, T_b)
                pieces.append(torch.nn.functional.pad(t, (0, T - t.shape[1])) if t.shape[1] < T else t[:, :T])
        out.tensors[name] = torch.cat(pieces) if pieces else parts[0][0].tensors[name][:0, :T]
    for k, ep in enumerate(episodes):
        ep.episode_id = k
    out.meta = dict(parts[0][0].meta) if parts else {}
    return out


def filter_groups(trainer: Any, batch: TrajectoryBatch) -> TrajectoryBatch:
    """The batch step `trainer.global_step` trains on: `batch` (scored) when
    `training.dynamic_sampling` is off, else its varied groups topped up from extra rounds
    (see the module docstring). Sets `trainer.last_batch` to the result."""
    t = trainer.config.training
    if not t.dynamic_sampling:
        return batch
    bound, n_groups, step = t.dynamic_sampling_max_batches, t.batch_size // t.group_size, trainer.global_step
    if not batch.has("token_level_scores"):
        trainer.score(batch)
    start = time.perf_counter()
    kept: list[tuple[TrajectoryBatch, list[int]]] = []  # (batch, rows of one varied group)
    seen_ids: set[str] = set()
    seen = dropped = rounds = resampled = 0
    sampled_tokens = 0
    current, round_ = batch, 0
    while True:
        for gid, rows in group_rows(current).items():
            if round_ and gid in seen_ids:  # an item drawn again: its group keeps its own id
                for i in rows:
                    current[i].group_id = f"{gid}/r{round_}"
                gid = f"{gid}/r{round_}"
            seen_ids.add(gid)
            seen += 1
            if varies(current, rows):
                kept.append((current, rows))
            else:
                dropped += 1
        if len(kept) >= n_groups or round_ >= bound:
            break
        round_ += 1
        missing = n_groups - len(kept)
        rate = len(kept) / seen
        n = n_groups if rate == 0 else min(n_groups, math.ceil(missing / rate))
        if getattr(trainer, "ahead", None) is not None:  # async_fit: the engine is free, with this step's weights
            trainer.ahead.settle()
        current = trainer.stages.rollout(trainer, extra_seeds(trainer, step, round_, n), t.group_size, None,
                                         round_sampling_seed(trainer, step, round_))
        trainer.score(current)
        rounds, resampled = rounds + 1, resampled + n
        sampled_tokens += sum(ep.response_length for ep in current)
    kept = kept[:n_groups]
    min_groups = trainer.config.ray.num_learners if trainer.config.ray.use_ray else 1  # learners split by group
    bound_reached = len(kept) < n_groups
    if bound_reached:
        fallback = len(kept) < min_groups
        if not kept:
            what = "it trains on its own batch, whose group-relative advantages are all 0"
        elif fallback:
            what = (f"it trains on its own batch, as {len(kept)} group(s) cannot be split over the "
                    f"{min_groups} Ray learners")
        else:
            what = f"it trains on their {len(kept) * t.group_size} episodes instead of {t.batch_size}"
        warnings.warn(f"dynamic sampling, step {step}: after {rounds} extra rollout round(s) "
                      f"(training.dynamic_sampling_max_batches={bound}), {len(kept)} of the {seen} groups sampled "
                      f"have rewards that vary ({n_groups} needed): {what}; make the task easier or harder, raise "
                      "inference.temperature or the bound", DynamicSamplingBoundWarning, stacklevel=3)
        if fallback:
            kept = [(batch, rows) for rows in group_rows(batch).values()]
    out = concat(kept)
    out.meta["rollout_seconds"] = batch.meta.get("rollout_seconds", 0.0) + time.perf_counter() - start
    out.meta["generated_tokens"] = batch.meta.get("generated_tokens", 0) + sampled_tokens
    out.meta.update({
        "rollout/dynamic_dropped_groups": float(dropped),
        "rollout/dynamic_resample_rounds": float(rounds),
        "rollout/dynamic_resampled_groups": float(resampled),
        "rollout/dynamic_kept_groups": float(len(group_rows(out))),
        "rollout/dynamic_zero_variance_rate": dropped / max(seen, 1),
        "rollout/dynamic_bound_reached": float(bound_reached),
    })
    trainer.last_batch = out
    return out


def check_filtered(trainer: Any, batch: TrajectoryBatch) -> None:
    """Warn when `training.dynamic_sampling` is on but `batch` did not go through
    `filter_groups` (the stepwise cells skipped it): its flat groups are trained on as they are."""
    if trainer.config.training.dynamic_sampling and "rollout/dynamic_kept_groups" not in batch.meta:
        warnings.warn("training.dynamic_sampling is on, but this batch was not filtered: call "
                      "batch = trainer.filter_groups(batch) after trainer.score(batch) (train_step and fit do), "
                      "or its groups with identical rewards are trained on as they are", UserWarning, stacklevel=3)


__all__ = ["DynamicSamplingBoundWarning", "check_filtered", "concat", "extra_seeds", "filter_groups", "group_rows",
           "round_sampling_seed", "varies"]
