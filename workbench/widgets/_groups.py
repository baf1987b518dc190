"""An episode's score beside its group's, and the advantage that follows from them.

A GRPO advantage is the episode's score standardised within its group (the episodes that
started from the same seed), so a lost game can carry a positive advantage: it lost by
less than its siblings. `group_summary` gathers the numbers that say so and
`group_line_html` prints them as one line for the conversation and token views:

    score -0.40 · its group (seed 3, 4 episodes): mean -0.65, std 0.12 · advantage +1.49
    = (score - mean) / std: better than its group

The score is what the estimator saw: the summed `token_level_rewards` (scores plus any KL
penalty) when the batch has them, else `Episode.outcome`. The rule is named only when the
shown advantage matches it (GRPO, Dr.GRPO's `score - mean`, RLOO's leave-one-out), since
the batch does not record which estimator produced it.
"""
from __future__ import annotations

import math
from typing import Any, Sequence

from workbench.trajectory import Episode, TrajectoryBatch
from workbench.widgets._html import esc

__all__ = ["group_summary", "group_line_html"]


def _scores(data: TrajectoryBatch | Sequence[Episode]) -> list[float]:
    if isinstance(data, TrajectoryBatch) and data.has("token_level_rewards"):
        return data.tensors["token_level_rewards"].float().sum(-1).tolist()
    return [e.outcome for e in (data.episodes if isinstance(data, TrajectoryBatch) else data)]


def group_summary(data: TrajectoryBatch | Sequence[Episode], index: int) -> dict[str, Any] | None:
    """{"score", "mean", "std", "n", "group", "seed", "advantage", "rule", "raw"} of episode
    `index` and its group (episodes with its `group_id` that have a trained token, or were
    recorded as text by another trainer); None when the episode has no group of two or more.
    "advantage" (mean over the episode's trained tokens, else the trainer's own in the last
    turn's `info["advantage"]`) is None without advantages; "rule" names the formula the advantage matches, or
    is "" when it matches none of them; "raw" is the score before a KL penalty in the reward
    (None when there is none)."""
    episodes = list(data.episodes if isinstance(data, TrajectoryBatch) else data)
    if not 0 <= index < len(episodes):
        return None
    ep = episodes[index]
    rows = [i for i, e in enumerate(episodes)
            if e.group_id == ep.group_id and (e.response_length or e.recorded_as_text)]
    if not ep.group_id or len(rows) < 2 or index not in rows:
        return None
    scores = _scores(data)
    group = [scores[i] for i in rows]
    n = len(group)
    mean = sum(group) / n
    std = math.sqrt(sum((s - mean) ** 2 for s in group) / (n - 1))  # unbiased, as the estimators
    score = scores[index]
    advantage, rule = None, ""
    if isinstance(data, TrajectoryBatch) and data.has("advantages"):
        adv = data.tensors["advantages"][index].float()
        mask = data.tensors["loss_mask"][index] > 0
        if mask.any():
            advantage = float(adv[mask].mean())
            rules = [("(score − mean) / std", (score - mean) / (std + 1e-6)),
                     ("score − mean", score - mean),
                     ("score − mean of the others", (score - mean) * n / (n - 1))]
            rule = next((text for text, value in rules
                         if abs(advantage - value) <= 1e-3 * max(1.0, abs(value))), "")
    recorded = ep.turns[-1].info.get("advantage") if ep.turns else None
    if advantage is None and isinstance(recorded, (int, float)):  # the trainer's own, of a run imported as text
        advantage = float(recorded)
        rules = [("(score − mean) / std", (score - mean) / (std + 1e-6)), ("score − mean", score - mean),
                 ("score − mean of the others", (score - mean) * n / (n - 1))]
        rule = next((text for text, value in rules if abs(advantage - value) <= 1e-3 * max(1.0, abs(value))), "")
    raw = None  # the score before the KL penalty, when the estimator saw a penalised one
    if isinstance(data, TrajectoryBatch) and data.has("token_level_rewards") and data.has("token_level_scores"):
        before = float(data.tensors["token_level_scores"][index].float().sum())
        raw = before if abs(before - score) > 1e-9 else None
    return {"score": score, "mean": mean, "std": std, "n": n, "group": ep.group_id, "seed": ep.env_seed,
            "advantage": advantage, "rule": rule, "raw": raw}


def _signed(value: float) -> str:
    return "0" if abs(value) < 5e-13 else f"{value:+.3g}"


def group_line_html(data: TrajectoryBatch | Sequence[Episode], index: int) -> str:
    """One `wb-legend wb-group` line with `group_summary`'s numbers ("" when there is no group)."""
    g = group_summary(data, index)
    if g is None:
        return ""
    which = f"seed {g['seed']}" if g["seed"] is not None else f"group {g['group']}"
    penalty = "" if g["raw"] is None else f" ({_signed(g['raw'])} less the KL penalty)"
    text = (f"score {_signed(g['score'])}{penalty} · its group ({which}, {g['n']} episodes): mean {_signed(g['mean'])}, "
            f"std {g['std']:.3g}")
    if g["advantage"] is not None:
        text += f" · advantage {_signed(g['advantage'])}"
        if g["rule"]:
            side = ("better than" if g["score"] > g["mean"] else "worse than" if g["score"] < g["mean"]
                    else "the same as")
            text += f" = {g['rule']}: {side} its group's mean"
        if g["std"] == 0:
            text += " (every score in its group is the same: nothing to learn from it)"
    return f'<div class="wb-legend wb-group">{esc(text)}</div>'
