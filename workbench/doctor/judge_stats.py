"""The numbers of a judge that the run doctor's judge checks (`workbench.doctor.judges`) and the
judge audit (`workbench.reward.audit_judge`) share: an episode's judge score as its recorded
judgments give it, rank and linear correlations, ROC AUC, accuracy, and `judge_verdict`, the
audit's thresholds (the `doctor.judge_*` fields) applied to its measurements.

Core layer: imports only the doctor's thresholds.
"""
from __future__ import annotations

import math
from typing import Any

from workbench.doctor.thresholds import DoctorConfig


def judge_score(episode: Any) -> float | None:
    """The mean score of the episode's LLM-judge verdicts (judge, group_judge: on 0..1), else of
    its reward model's; None when it has none that succeeded."""
    ok = [j for j in (episode.judgments or []) if j.get("score") is not None]
    chat = [j["score"] for j in ok if j.get("source") != "reward_model"]
    picked = chat or [j["score"] for j in ok]
    return sum(picked) / len(picked) if picked else None


def judge_reason(episode: Any) -> str:
    """The first reason among the episode's judgments ("" when none gave one)."""
    return next((j.get("reason") or "" for j in (episode.judgments or []) if j.get("reason")), "")


def _ranks(xs: list[float]) -> list[float]:
    """Ranks 1..n of `xs`, ties given their mean rank."""
    order = sorted(range(len(xs)), key=lambda i: xs[i])
    ranks = [0.0] * len(xs)
    i = 0
    while i < len(order):
        j = i
        while j + 1 < len(order) and xs[order[j + 1]] == xs[order[i]]:
            j += 1
        for k in range(i, j + 1):
            ranks[order[k]] = (i + j) / 2 + 1
        i = j + 1
    return ranks


def pearson(x: list[float], y: list[float]) -> float:
    """Pearson's correlation; NaN when either side is constant or has fewer than 2 values."""
    n = len(x)
    if n < 2 or n != len(y):
        return float("nan")
    mx, my = sum(x) / n, sum(y) / n
    sxy = sum((a - mx) * (b - my) for a, b in zip(x, y))
    sxx, syy = sum((a - mx) ** 2 for a in x), sum((b - my) ** 2 for b in y)
    return sxy / math.sqrt(sxx * syy) if sxx > 0 and syy > 0 else float("nan")


def spearman(x: list[float], y: list[float]) -> float:
    """Spearman's rank correlation (Pearson's on ranks, ties at their mean rank)."""
    return pearson(_ranks(x), _ranks(y))


def roc_auc(scores: list[float], labels: list[bool]) -> float:
    """The probability that a random positive scores above a random negative (ties count a
    half): ROC AUC. NaN without both classes. 0.5 is chance."""
    pos = [s for s, l in zip(scores, labels) if l]
    neg = [s for s, l in zip(scores, labels) if not l]
    if not pos or not neg:
        return float("nan")
    wins = sum((p > q) + 0.5 * (p == q) for p in pos for q in neg)
    return wins / (len(pos) * len(neg))


def accuracy(scores: list[float], labels: list[bool], cut: float = 0.5) -> float:
    """Share of episodes where `score >= cut` says what the environment said (success or not)."""
    if not scores:
        return float("nan")
    return sum((s >= cut) == bool(l) for s, l in zip(scores, labels)) / len(scores)


#: The audit's measurements the thresholds apply to: name -> (DoctorConfig field, "min" or "max").
VERDICT_RULES: dict[str, tuple[str, str]] = {
    "accuracy": ("judge_min_accuracy", "min"),
    "roc_auc": ("judge_min_auc", "min"),
    "rank_correlation": ("judge_min_rank_correlation", "min"),
    "position_consistency": ("judge_min_position_consistency", "min"),
    "length_correlation": ("judge_max_length_correlation", "max"),
    "self_consistency": ("judge_min_self_consistency", "min"),
    "failed_share": ("judge_failed_share", "max"),
}


def judge_verdict(measures: dict[str, float], cfg: DoctorConfig) -> list[str]:
    """The thresholds a judge's measurements miss ("roc_auc 0.52 < doctor.judge_min_auc 0.7"),
    [] when it is fit to train on. A measurement that is NaN (not measured) is not judged;
    `length_correlation` is judged by its size (a judge that pays for length either way)."""
    missed = []
    for name, (field, kind) in VERDICT_RULES.items():
        value = measures.get(name)
        if value is None or not math.isfinite(value):
            continue
        limit = getattr(cfg, field)
        size = abs(value) if name == "length_correlation" else value
        if (kind == "min" and size < limit) or (kind == "max" and size > limit):
            op = "<" if kind == "min" else ">"
            missed.append(f"{name} {value:.2f} {op} doctor.{field} {limit:g}")
    return missed



__all__ = ["VERDICT_RULES", "accuracy", "judge_reason", "judge_score", "judge_verdict", "pearson", "roc_auc",
           "spearman"]
