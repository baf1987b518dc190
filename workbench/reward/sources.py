"""Rewards from models, as settings: `ModelRewards` is the judges and the reward model a
`reward` section turns on, and the one place their settings are read.

    rewards = ModelRewards.from_config(config.reward)      # None when judge, group_judge and reward_model are off
    model_scores = rewards.judge_batch(batch)               # per episode: sum of weight x score, None if it failed
    model_reward_summary(batch)                             # the step's reward/... and perf/judge_seconds metrics

`score_batch` (the trainer's, the CLI's, the reward tuner's) calls `judge_batch` and adds the
model reward to the environment's score by weight:

    score = reward.env_weight * environment score
          + reward.judge_weight * judge score (0..1)
          + reward.group_judge_weight * group judge score (0..1)
          + reward.reward_model_weight * reward model score

Every source's verdict is recorded on the episode (`Episode.judgments`: score, reason, the
exact prompt, the model's name, seconds, tokens), and the environment's score beside it
(`Episode.env_score`, RULER's "independent reward"). An episode a source could not score
(timeout, no score, a score out of range, a dead server) gets `Episode.reward_error`: the
update leaves it out (`TrajectoryBatch.untrained_rows`), `reward/judge_failed` counts it, the
doctor's `judge-unreliable` names it. Episodes that failed before the model took a turn or in
an environment error are not sent to the judges (the update leaves them out anyway).

The models load when they are first needed (a judge by URL loads nothing).
`ModelRewards.reuse(reward, current)` keeps `current` when the section's settings are the ones
it was built from (the trainer calls it each step, so a setting changed in a notebook takes
effect at the next step) and closes it otherwise.
"""
from __future__ import annotations

import dataclasses
import math
import time
from typing import Any

from workbench.reward.shaping import MODEL_REWARD_FIELDS
from workbench.reward.judgments import SOURCES, Judgment, judge_score, judgments_of

#: Fields of the `reward` section that `ModelRewards` reads (a change of one of them rebuilds it).
MODEL_FIELDS = MODEL_REWARD_FIELDS


def model_rewards_on(reward: Any) -> bool:
    """Whether a `reward` section (or mapping) turns a model reward on."""
    get = reward.get if isinstance(reward, dict) else (lambda k, d=None: getattr(reward, k, d))
    return any(get(k) is not None for k in ("judge", "group_judge", "reward_model"))


def _settings(reward: Any) -> tuple:
    return tuple(getattr(reward, k, None) for k in MODEL_FIELDS)


class ModelRewards:
    """The model reward sources of a run (see the module docstring).

    Args:
        judge: a `Judge` (or None).
        group_judge: a `GroupJudge` (or None).
        reward_model: a `RewardModel` (or None).
        env_weight: the weight of the environment's score.
    Sources may also be given as zero-argument factories, called on first use.
    """

    def __init__(self, judge: Any = None, group_judge: Any = None, reward_model: Any = None,
                 env_weight: float = 1.0):
        self._sources: dict[str, Any] = {"judge": judge, "group_judge": group_judge, "reward_model": reward_model}
        self.env_weight = float(env_weight)
        self.settings: tuple | None = None
        """The `reward` settings it was built from (`from_config`), else None."""

    @classmethod
    def from_config(cls, reward: Any, reward_model: Any = None) -> "ModelRewards | None":
        """The sources a `reward` section turns on (None when none is), built on first use;
        `reward_model`: a factory of the reward model source instead of `RewardModel.from_config`
        (the Ray reward-model worker's, `workbench.distributed.reward_workers`)."""
        if reward is None or isinstance(reward, dict) or not model_rewards_on(reward):
            return None
        from workbench.reward.group_judge import GroupJudge
        from workbench.reward.judges import Judge
        from workbench.reward.reward_model import RewardModel

        section = dataclasses.replace(reward) if dataclasses.is_dataclass(reward) else reward
        made = cls(judge=(lambda: Judge.from_config(section)) if reward.judge is not None else None,
                   group_judge=(lambda: GroupJudge.from_config(section)) if reward.group_judge is not None else None,
                   reward_model=(reward_model or (lambda: RewardModel.from_config(section)))
                   if reward.reward_model is not None else None,
                   env_weight=reward.env_weight)
        made.settings = _settings(reward)
        return made

    @classmethod
    def reuse(cls, reward: Any, current: "ModelRewards | None") -> "ModelRewards | None":
        """`current` when it was built from these settings (or was built by hand), else the
        sources of `reward` (and `current` is closed)."""
        if current is not None and (current.settings is None or current.settings == _settings(reward)):
            return current
        if current is not None:
            current.close()
        return cls.from_config(reward)

    def source(self, name: str) -> Any:
        """The source `name` ("judge", "group_judge", "reward_model"), built now if it was a factory; None when off."""
        value = self._sources[name]
        if value is not None and not hasattr(value, "judge") and callable(value):
            value = self._sources[name] = value()
        return value

    @property
    def names(self) -> list[str]:
        """The sources that are on, in `SOURCES` order."""
        return [n for n in SOURCES if self._sources[n] is not None]

    def judge_batch(self, batch: Any) -> list[float | None]:
        """Judge every episode with every source; record `judgments`, set `reward_error` on the
        ones that failed; returns each episode's model reward (sum of weight x score; None
        for a failed one, 0.0 for one not sent to the judges). `perf/judge_seconds` goes in
        `batch.meta`."""
        start = time.perf_counter()
        episodes = list(batch)
        judged = [i for i, ep in enumerate(episodes) if ep.response_length and not ep.environment_error]
        verdicts: dict[int, list[Judgment]] = {i: [] for i in range(len(episodes))}
        for name in self.names:
            src = self.source(name)
            if not judged:
                break
            for i, j in zip(judged, src.judge([episodes[i] for i in judged])):
                verdicts[i].append(j)
        out: list[float | None] = []
        for i, ep in enumerate(episodes):
            js = verdicts[i]
            ep.judgments = [j.to_dict() for j in js]
            failed = [j for j in js if j.failed]
            ep.reward_error = "; ".join(f"{j.source}: {j.error}" for j in failed) or None
            out.append(None if failed else math.fsum(j.weight * j.score for j in js))
        batch.meta["perf/judge_seconds"] = time.perf_counter() - start
        return out

    def close(self) -> None:
        """Close every source that was built."""
        for name, value in self._sources.items():
            if value is not None and hasattr(value, "close") and hasattr(value, "judge"):
                value.close()

    def __repr__(self) -> str:
        return f"ModelRewards({', '.join(self.names)}, env_weight={self.env_weight:g})"


def model_reward_summary(batch: Any) -> dict[str, float]:
    """The model rewards' metrics of a scored batch ({} when none was on):

        reward/judge_failed          episodes a source could not score (left out of the update)
        reward/env_score_mean        the environment's score, over the scored episodes
        reward/model_score_mean      the model reward (sum of weight x score), over the scored episodes
        reward/judge_score_mean      `judge_score` (the LLM judges' mean, else the reward model's)
        reward/<source>/score_mean   each source's score, over its successful judgments
        reward/judge_tokens          judge prompt + reply tokens of the step's requests
        reward/judge_cache_hits      judgments taken from a cache
        perf/judge_seconds           wall time of the step's judging
    """
    episodes = list(batch)
    if not any(ep.judgments or ep.env_score is not None for ep in episodes):
        return {}
    scored = [ep for ep in episodes if ep.env_score is not None and not ep.reward_error]
    out: dict[str, float] = {"reward/judge_failed": float(sum(1 for ep in episodes if ep.reward_error))}
    if scored:
        out["reward/env_score_mean"] = math.fsum(ep.env_score for ep in scored) / len(scored)
        out["reward/model_score_mean"] = _model_mean(scored)
    js_all = [j for ep in episodes for j in judgments_of(ep)]
    judged = [s for s in (judge_score(ep) for ep in episodes) if s is not None]
    if judged:
        out["reward/judge_score_mean"] = math.fsum(judged) / len(judged)
    for name in SOURCES:
        ok = [j.score for j in js_all if j.source == name and not j.failed]
        if any(j.source == name for j in js_all):
            out[f"reward/{name}/score_mean"] = math.fsum(ok) / len(ok) if ok else float("nan")
    out["reward/judge_tokens"] = float(sum(j.prompt_tokens + j.completion_tokens for j in js_all))
    out["reward/judge_cache_hits"] = float(sum(j.cached for j in js_all))
    if "perf/judge_seconds" in getattr(batch, "meta", {}):
        out["perf/judge_seconds"] = float(batch.meta["perf/judge_seconds"])
    return out


def _model_mean(episodes: list[Any]) -> float:
    vals = [math.fsum(j.weight * j.score for j in judgments_of(ep)) for ep in episodes]
    return math.fsum(vals) / len(vals)


__all__ = ["MODEL_FIELDS", "ModelRewards", "model_reward_summary", "model_rewards_on"]
