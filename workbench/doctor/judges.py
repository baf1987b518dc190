"""The run doctor's checks of a reward that comes from a model (an LLM judge, a reward model:
`reward.judge`, `reward.group_judge`, `reward.reward_model`), and the numbers they and the judge
audit (`workbench.reward.audit_judge`) share.

    judge-hacking     the judge's score rises over the first steps' while the environment's success
                      stays flat or falls: the policy learned to please the judge; evidence: the
                      episodes the judge scored high that the environment failed
    judge-unreliable  the judge's scores of the latest batch do not tell the environment's
                      successes from its failures (ROC AUC under `doctor.judge_min_auc`); evidence:
                      failures it scored above successes
    judge-failures    judgments that failed (timeout, no score, a score off the scale, a dead
                      server): those episodes were left out of the update

All three are silent on a run without judgments, and the agreement checks on an environment that
reports no success. The numbers are `workbench.doctor.judge_stats`'s, which the audit uses too
(`judge_verdict`: its thresholds, the `doctor.judge_*` fields), so both judge a judge alike.

Core layer (reads `Episode.judgments` as the dicts they are; imports only the doctor's modules).
"""
from __future__ import annotations

from typing import Any

from workbench.doctor.findings import DoctorConfig, Finding, History
from workbench.doctor.judge_stats import accuracy, judge_reason, judge_score, roc_auc
from workbench.doctor.remedies import finding as _finding
from workbench.trajectory import success_reported


# -- checks ----------------------------------------------------------------------------------
def _judged(batch: Any) -> list[tuple[Any, float]]:
    return [(ep, s) for ep in batch for s in [judge_score(ep)] if s is not None]


def _evidence(h: History, scored: list[tuple[Any, float]]) -> list[Any]:
    """Evidence lines for (episode, judge score) pairs: the score, the judge's reason, the outcome."""
    return [h.evidence(ep, None, text=f"judge {s:.2f} ({judge_reason(ep)[:60]!r}), success {ep.success}")
            for ep, s in scored]


def check_judge_hacking(h: History, cfg: DoctorConfig) -> Finding | None:
    """The judge's mean score (`judge_score`) rising by `doctor.judge_rise` over the first
    steps' while the environment's success rate rises by less than `doctor.success_rise` (or
    falls): the policy is pleasing the judge, not doing the task. Evidence: episodes of the
    latest batch the judge scored high (at least `doctor.judge_high`) that the environment failed."""
    base = h.baseline(cfg.baseline_steps)
    if h.batch is None or not base or not h.stats[-1].reports_success:
        return None
    scored = [b for b in base if b.judge_score_mean is not None and b.reports_success]
    last = h.stats[-1]
    if not scored or last.judge_score_mean is None:
        return None
    rise = last.judge_score_mean - sum(b.judge_score_mean for b in scored) / len(scored)
    success = last.success_rate - sum(b.success_rate for b in scored) / len(scored)
    held = ""
    if h.held_out is not None and len(h.held_out):
        rate = sum(bool(e.success) for e in h.held_out) / len(h.held_out)
        held = f"; held-out success {rate:.2f}" + (f" at step {h.held_out_step}" if h.held_out_step is not None else "")
    fooled = sorted(((ep, s) for ep, s in _judged(h.batch) if not ep.success and s >= cfg.judge_high),
                    key=lambda p: -p[1])
    return _finding(
        "judge-hacking", "warning", rise, cfg.judge_rise, rise >= cfg.judge_rise and success < cfg.success_rise,
        f"the judge's mean score rose by {rise:+.3f} over the first steps while the environment's success rate "
        f"moved {success:+.3f}{held}; {len(fooled)} episodes of the latest batch scored at least "
        f"{cfg.judge_high:g} by the judge failed the task",
        "The policy is learning to please the judge rather than to do the task: read what the high-scored failed "
        "episodes say to it, then weight the environment's reward up (reward.env_weight), make the rubric "
        "stricter (reward.judge_rubric: name what the judge must check) or use another judge (reward.judge), and "
        "audit the judge again (python -m workbench audit-judge RUN --judge ...).",
        h, _evidence(h, fooled), cfg)


def check_judge_unreliable(h: History, cfg: DoctorConfig) -> Finding | None:
    """ROC AUC of the judge's scores of the latest batch against the environment's success
    (`roc_auc`): below `doctor.judge_min_auc` the judge hardly tells a success from a failure
    (0.5 is chance). Needs `doctor.min_samples` judged episodes with both outcomes among them.
    Evidence: failed episodes it scored above the lowest-scored success."""
    if h.batch is None or not success_reported(h.batch):
        return None
    judged = _judged(h.batch)
    labels = [bool(ep.success) for ep, _ in judged]
    if len(judged) < cfg.min_samples or all(labels) or not any(labels):
        return None
    scores = [s for _, s in judged]
    auc = roc_auc(scores, labels)
    low = min(s for s, l in zip(scores, labels) if l)
    wrong = sorted(((ep, s) for ep, s in judged if not ep.success and s >= low), key=lambda p: -p[1])
    return _finding(
        "judge-unreliable", "warning", auc, cfg.judge_min_auc, auc < cfg.judge_min_auc,
        f"the judge's scores tell the environment's successes from its failures with ROC AUC {auc:.2f} "
        f"(0.5 is chance; {sum(labels)} successes, {len(labels) - sum(labels)} failures, accuracy "
        f"{accuracy(scores, labels):.2f} at 0.5)",
        "Do not train on this judge as it is: audit it (workbench.reward.audit_judge, python -m workbench "
        "audit-judge RUN --judge ...), then make the rubric stricter (reward.judge_rubric), ask for a JSON verdict "
        "(reward.judge_json), use a larger judge model (reward.judge), or weight it down (reward.judge_weight) "
        "beside the environment's reward (reward.env_weight).",
        h, _evidence(h, wrong), cfg)


def check_judge_failures(h: History, cfg: DoctorConfig) -> Finding | None:
    """Share of the latest batch's episodes whose judgment failed (`Episode.reward_error`);
    fires above `doctor.judge_failed_share`. Those episodes were left out of the update."""
    if h.batch is None or not any(ep.judgments for ep in h.batch):
        return None
    eps = list(h.batch)
    failed = [ep for ep in eps if ep.reward_error]
    share = len(failed) / len(eps)
    return _finding(
        "judge-failures", "error", share, cfg.judge_failed_share, share > cfg.judge_failed_share,
        (f"{len(failed)} of {len(eps)} episodes could not be scored by their judge and were left out of the "
         f"update (reward/judge_failed); first: {failed[0].reward_error}" if failed else
         f"0 of {len(eps)} episodes failed their judgment"),
        "Read the error: a judge server that is down or slow (reward.judge_timeout_s, reward.judge_retries), a "
        "reply without a score or off the scale (ask for a JSON verdict: reward.judge_json, or tell the judge its "
        "scale: reward.judge_scale_min/max).",
        h, [h.evidence(ep, None, text=ep.reward_error or "") for ep in failed], cfg)


#: The judge checks by name (`workbench.doctor.checks.CHECKS` lists them).
JUDGE_CHECKS = {"judge-hacking": check_judge_hacking, "judge-unreliable": check_judge_unreliable,
                "judge-failures": check_judge_failures}

__all__ = ["JUDGE_CHECKS", "check_judge_failures", "check_judge_hacking", "check_judge_unreliable"]
