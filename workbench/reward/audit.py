"""The judge audit: before GPU hours go into training on a judge, does it agree with what the
environment can check, and does it have the biases judges have?

    audit = audit_judge(batch, "http://127.0.0.1:8000/v1")      # or a Judge / GroupJudge / RewardModel
    print(audit.text())                                          # the short report, ending in its verdict
    audit.fit, audit.missed                                      # by the doctor.judge_* thresholds

On the batch's judgeable episodes (a model reply, no environment error), judged afresh (no
cache):

* agreement, on the episodes whose environment reports success: accuracy (the judge's score,
  cut at 0.5, says success or failure), ROC AUC of its scores against success (0.5 is chance),
  and Spearman rank correlation with the environment's reward;
* position bias (a group judge): each group judged again with its episodes in another shuffled
  order; the rank correlation between the two passes' scores (1: the order does not matter).
  A per-episode judge sees one episode at a time, so it has none to measure;
* length bias: rank correlation of the scores with the replies' length (mean tokens per reply),
  within each outcome (successes with successes, failures with failures: `length_bias`);
* self-consistency: the same episodes judged again in the same order; the correlation of the
  two passes (1.0 when they are equal: a greedy judge on a deterministic server);
* cost: judge tokens and seconds per episode; and the share of judgments that failed.

Then the verdict: fit to train on when no measurement misses its threshold (the `doctor`
section's `judge_min_accuracy`, `judge_min_auc`, `judge_min_rank_correlation`,
`judge_min_position_consistency`, `judge_max_length_correlation`, `judge_min_self_consistency`,
`judge_failed_share`; `workbench.doctor.judge_stats.judge_verdict`, the doctor's own reading). A
measurement that cannot be made (no successes and failures both, a constant judge's rank
correlation) is reported as not measured, with the reason, and decides nothing.
"""
from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.doctor.judge_stats import accuracy, judge_verdict, pearson, roc_auc, spearman
from workbench.doctor.thresholds import DoctorConfig
from workbench.reward.judgments import Judgment
from workbench.trajectory import success_reported


@dataclass
class JudgeAudit:
    """What `audit_judge` measured (see the module docstring); NaN where it could not measure."""

    model: str
    """The judge model's name."""
    source: str
    """"judge", "group_judge" or "reward_model"."""
    episodes: int
    """Judgeable episodes audited."""
    with_outcome: int
    """Of them, episodes whose environment reports success or failure (the agreement's sample)."""
    successes: int
    """Of those, successes."""
    accuracy: float = float("nan")
    roc_auc: float = float("nan")
    rank_correlation: float = float("nan")
    position_consistency: float = float("nan")
    length_correlation: float = float("nan")
    self_consistency: float = float("nan")
    failed_share: float = 0.0
    """Share of the first pass's judgments that failed."""
    tokens_per_episode: float = 0.0
    """Judge prompt + reply tokens per judgment, first pass."""
    seconds_per_episode: float = 0.0
    """Wall time of the first pass per episode."""
    fit: bool = False
    """No measurement missed its threshold."""
    missed: list[str] = field(default_factory=list)
    """The thresholds missed ("roc_auc 0.52 < doctor.judge_min_auc 0.7")."""
    notes: list[str] = field(default_factory=list)
    """Why a measurement is missing."""
    judgments: list[dict[str, Any]] = field(default_factory=list)
    """The first pass's judgments, one per audited episode (`Judgment.to_dict()`)."""
    rows: list[dict[str, Any]] = field(default_factory=list)
    """Per audited episode: episode_id, group_id, success (None: not reported), env_reward,
    length (mean tokens per reply), score, score_again, score_shuffled, reason, error."""

    def measures(self) -> dict[str, float]:
        return {k: getattr(self, k) for k in ("accuracy", "roc_auc", "rank_correlation", "position_consistency",
                                              "length_correlation", "self_consistency", "failed_share")}

    def text(self) -> str:
        """The short report, ending in the verdict."""
        def num(x: float) -> str:
            return "not measured" if not math.isfinite(x) else f"{x:.2f}"
        lines = [f"judge audit: {self.model} ({self.source}), {self.episodes} episodes, {self.with_outcome} with an "
                 f"outcome from the environment ({self.successes} successes)",
                 f"  agreement      accuracy {num(self.accuracy)}, ROC AUC {num(self.roc_auc)} (0.5 is chance), "
                 f"rank correlation with the env reward {num(self.rank_correlation)}",
                 f"  position bias  rank correlation of two shuffled orders {num(self.position_consistency)}",
                 f"  length bias    rank correlation of score and reply length {num(self.length_correlation)}",
                 f"  consistency    the same episodes judged twice: {num(self.self_consistency)}",
                 f"  cost           {self.tokens_per_episode:.0f} judge tokens and {self.seconds_per_episode:.2f} s "
                 f"per episode; {self.failed_share:.0%} of judgments failed"]
        lines += [f"  note: {n}" for n in self.notes]
        if self.fit:
            lines.append("verdict: fit to train on (every measured number meets its doctor.judge_* threshold)")
        else:
            lines.append("verdict: NOT fit to train on: " + "; ".join(self.missed))
        return "\n".join(lines)

    def to_dict(self) -> dict[str, Any]:
        return json.loads(json.dumps(asdict(self), default=str))

    def __str__(self) -> str:
        return self.text()


def _source(judge: Any) -> Any:
    """A judge object from what `audit_judge` takes."""
    from workbench.reward.group_judge import GroupJudge
    from workbench.reward.judges import Judge

    if hasattr(judge, "judge") and hasattr(judge, "source"):
        return judge
    if hasattr(judge, "judge_rubric"):  # a `reward` section: its first judge that is on
        for name, cls in (("judge", Judge), ("group_judge", GroupJudge)):
            if getattr(judge, name) is not None:
                return cls.from_config(judge)
        if judge.reward_model is not None:
            from workbench.reward.reward_model import RewardModel

            return RewardModel.from_config(judge)
        raise ValueError("the reward section turns no judge on (reward.judge, reward.group_judge, reward.reward_model)")
    return Judge(judge)


def _pass(src: Any, episodes: list[Any], order_seed: int | None) -> tuple[list[Judgment], float]:
    start = time.perf_counter()
    if src.source == "group_judge":
        groups: dict[str, list[int]] = {}
        for i, ep in enumerate(episodes):
            groups.setdefault(ep.group_id, []).append(i)
        out: list[Judgment | None] = [None] * len(episodes)
        verdicts = src.judge_groups([[episodes[i] for i in g] for g in groups.values()], order_seed=order_seed,
                                    use_cache=False)
        for rows, js in zip(groups.values(), verdicts):
            for i, j in zip(rows, js):
                out[i] = j
        judged: list[Judgment] = out  # type: ignore[assignment]
    elif src.source == "reward_model":
        judged = src.judge(episodes)
    else:
        judged = src.judge(episodes, use_cache=False)
    return judged, time.perf_counter() - start


def _outcomes(episodes: list[Any]) -> list[bool | None]:
    """Each episode's success, when the environment reports success at all
    (`workbench.trajectory.success_reported`: it says so, or an `info["success"]` in some turn of
    the batch; a turn refused for its format may carry none); else None each."""
    reported = success_reported(episodes)
    return [bool(ep.success) if reported else None for ep in episodes]


def reply_length(ep: Any) -> float:
    """Mean sampled tokens per model reply of an episode."""
    replies = [t for t in ep.turns if t.source == "model"]
    return ep.response_length / max(len(replies), 1)


def length_bias(episodes: list[Any], scores: list[float]) -> float:
    """Rank correlation of the scores with the replies' length (`reply_length`), within each
    outcome the environment reports (successes among themselves, failures among themselves,
    averaged by their sizes), so a judge that rightly pays for success is not taken for one that
    pays for length when winners happen to write less; over all episodes when no outcome is reported."""
    classes: dict[Any, list[int]] = {}
    for i, outcome in enumerate(_outcomes(episodes)):
        classes.setdefault(outcome, []).append(i)
    parts = []
    for rows in classes.values():
        if len(rows) >= 3:
            rho = spearman([scores[i] for i in rows], [reply_length(episodes[i]) for i in rows])
            if math.isfinite(rho):
                parts.append((rho, len(rows)))
    if not parts:
        return float("nan")
    return sum(r * n for r, n in parts) / sum(n for _, n in parts)


def _same_or(a: list[float], b: list[float], fn: Any) -> float:
    return 1.0 if a == b and a else fn(a, b)


def audit_judge(batch: Any, judge: Any, thresholds: DoctorConfig | None = None, order_seeds: tuple[int, int] = (1, 2),
                repeat: bool = True) -> JudgeAudit:
    """Audit `judge` on `batch` (a `TrajectoryBatch` or a list of episodes); see the module
    docstring. `judge`: a `Judge`, `GroupJudge` or `RewardModel`, a judge location (a URL,
    `hf:MODEL`, ...: a per-episode `Judge`), or a `reward` section (its first judge that is on).
    `thresholds`: the verdict's (default `DoctorConfig()`). `order_seeds`: the group judge's two
    shuffled orders. `repeat=False` skips the self-consistency pass (one pass fewer)."""
    cfg = thresholds or DoctorConfig()
    src = _source(judge)
    episodes = [ep for ep in batch if ep.response_length and not ep.environment_error]
    if not episodes:
        raise ValueError("the batch has no episode to judge (every one failed before the model replied, or in an "
                         "environment error)")
    first, seconds = _pass(src, episodes, order_seeds[0] if src.source == "group_judge" else None)
    notes: list[str] = []
    again = _pass(src, episodes, order_seeds[0] if src.source == "group_judge" else None)[0] if repeat else None
    shuffled = _pass(src, episodes, order_seeds[1])[0] if src.source == "group_judge" else None
    if src.source != "group_judge":
        notes.append("position bias not measured: a per-episode judge sees one episode at a time")
    if not repeat:
        notes.append("self-consistency not measured (repeat=False)")
    ok = [i for i, j in enumerate(first) if not j.failed]
    scores = [first[i].score for i in ok]
    outcomes = _outcomes(episodes)
    outcome = [(i, outcomes[i]) for i in ok if outcomes[i] is not None]
    audit = JudgeAudit(model=getattr(src, "model", None) or getattr(src, "name", "?"), source=src.source,
                       episodes=len(episodes), with_outcome=len(outcome), successes=sum(s for _, s in outcome),
                       failed_share=1 - len(ok) / len(episodes),
                       tokens_per_episode=sum(j.prompt_tokens + j.completion_tokens for j in first) / len(episodes),
                       seconds_per_episode=seconds / len(episodes))
    if outcome:
        labels = [s for _, s in outcome]
        sc = [first[i].score for i, _ in outcome]
        audit.accuracy = accuracy(sc, labels)
        if all(labels) or not any(labels):
            notes.append("ROC AUC not measured: the audited episodes are all successes or all failures; audit a "
                         "batch with both (e.g. held-out games of a half-trained policy)")
        else:
            audit.roc_auc = roc_auc(sc, labels)
    elif not ok:
        first_error = next((j.error for j in first if j.error), "")
        notes.append(f"nothing measured: every judgment failed; first: {first_error}")
    else:
        notes.append("agreement not measured: the environment reports no success (info['success'])")
    if len(set(scores)) <= 1 and scores:
        notes.append(f"the judge gave every episode the same score ({scores[0]:g}): it ranks nothing, so the rank "
                     "correlations are not measured")
    else:
        audit.rank_correlation = spearman(scores, [episodes[i].total_reward for i in ok])
        audit.length_correlation = length_bias([episodes[i] for i in ok], scores)
        if not math.isfinite(audit.length_correlation):
            notes.append("length bias not measured: the replies (within each outcome) are all of one length")
    if shuffled is not None:
        both = [i for i in ok if not shuffled[i].failed]
        audit.position_consistency = _same_or([first[i].score for i in both], [shuffled[i].score for i in both],
                                              spearman)
    if again is not None:
        both = [i for i in ok if not again[i].failed]
        audit.self_consistency = _same_or([first[i].score for i in both], [again[i].score for i in both], pearson)
    audit.missed = judge_verdict(audit.measures(), cfg)
    if not math.isfinite(audit.roc_auc) and not math.isfinite(audit.accuracy):
        audit.missed.append("no agreement measured: the audit needs episodes whose environment says success or failure")
    audit.fit = not audit.missed
    audit.notes = notes
    audit.judgments = [j.to_dict() for j in first]
    for k, ep in enumerate(episodes):
        audit.rows.append({"episode_id": ep.episode_id, "group_id": ep.group_id, "success": outcomes[k],
                           "env_reward": ep.total_reward, "length": reply_length(ep), "score": first[k].score,
                           "score_again": again[k].score if again is not None else None,
                           "score_shuffled": shuffled[k].score if shuffled is not None else None,
                           "reason": first[k].reason, "error": first[k].error})
    return audit


__all__ = ["JudgeAudit", "audit_judge", "length_bias", "reply_length"]
