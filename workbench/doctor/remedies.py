"""The settings that address the doctor's findings (`Finding.remedy`), made to fit the run.

    remedy_for("truncation-surge", RunFacts.of(config))
    # {"reward.overlong_penalty": 1.0, "reward.overlong_buffer": 2} for max_tokens 8

`REMEDIES` is the plain table (check name -> config overrides); `remedy_for` fits it to a
run (`RunFacts`), so that a branch with the remedy starts: it drops a remedy the run would
refuse, sizes the overlong window to `inference.max_tokens`, and fits the judge remedies to
the run's `reward.env_weight` and model rewards (`_judge_remedy`). `workbench.debug.doctor.
remedy_command` prints a remedy as a complete `python -m workbench train --from ...` command.
Core layer, like the checks.
"""
from __future__ import annotations

from typing import Any

from workbench.doctor.findings import DoctorConfig, Finding, History, RunFacts

#: Check name -> the config overrides that address it (`Finding.remedy`); a check not here has
#: no setting for a fix (a bug to find in the environment, template or weight sync), and its
#: advice says what to look at. A test applies every remedy to a config and validates it.
REMEDIES: dict[str, dict[str, Any]] = {
    "parse-from-incidental-span": {"environment.strict_format": True},
    "repetition-to-limit": {"reward.overlong_penalty": 1.0},
    "truncation-surge": {"reward.overlong_penalty": 1.0},
    "zero-variance-groups": {"training.dynamic_sampling": True},
    "format-errors": {"sft.steps": 4},
    "entropy-collapse": {"training.entropy_coeff": 0.01},
    "judge-hacking": {"reward.env_weight": 2.0},
    "judge-unreliable": {"reward.judge_weight": 0.0},
    "judge-failures": {"reward.judge_json": True},
}


#: The overlong penalty's window in its remedy: `reward.overlong_buffer`'s default, 16 tokens,
#: when `inference.max_tokens` is 64 or more; else a quarter of `max_tokens` (at least 1), so
#: the window always fits inside the limit (a window as long as the limit is refused).
OVERLONG_WINDOW = 16


def remedy_for(name: str, run: RunFacts | None = None) -> dict[str, Any]:
    """The remedy of check `name` (`REMEDIES`) made to fit the run (`RunFacts`), so that a
    branch with it starts: the overlong penalty with a window inside `inference.max_tokens`
    (`OVERLONG_WINDOW`; none when the limit is 1 token); no dynamic sampling for an estimator that is not
    group-relative; no SFT warm-up for an environment without a scripted expert; no strict
    format for an environment without one. {} when no setting fits."""
    remedy = dict(REMEDIES.get(name, {}))
    if not remedy or run is None:
        return remedy
    if "reward.overlong_penalty" in remedy and run.max_tokens is not None:
        if run.max_tokens < 2:
            return {}
        remedy["reward.overlong_buffer"] = min(OVERLONG_WINDOW, max(1, run.max_tokens // 4))
    if "training.dynamic_sampling" in remedy and run.group_relative is False:
        return {}
    if "sft.steps" in remedy and run.has_expert is False:
        return {}
    if "environment.strict_format" in remedy and run.supports_strict_format is False:
        return {}
    if name in ("judge-hacking", "judge-unreliable"):
        return _judge_remedy(name, run)
    return remedy


def _judge_remedy(name: str, run: RunFacts) -> dict[str, Any]:
    """judge-hacking: the environment's reward weighted up (twice `reward.env_weight`, 1 from 0);
    judge-unreliable: the model rewards that are on weighted to 0 and the environment's reward
    to at least 1 (train on what can be checked, audit another judge)."""
    env = run.env_weight
    if name == "judge-hacking":
        return {"reward.env_weight": 1.0 if env is None or env <= 0 else 2.0 * env}
    sources = run.model_sources if run.model_sources else ("judge",)
    remedy: dict[str, Any] = {f"reward.{s}_weight": 0.0 for s in sources}
    if env is not None and env < 1:
        remedy["reward.env_weight"] = 1.0
    return remedy


def finding(name: str, severity: str, value: float, threshold: float, fired: bool, message: str, advice: str,
            h: History, evidence: list, cfg: DoctorConfig, step: int | None = None) -> Finding:
    """A check's `Finding` on history `h` (its step unless `step`), with at most
    `cfg.max_evidence` pieces of evidence and the remedy that fits the run (`remedy_for`)."""
    return Finding(name=name, severity=severity, value=float(value), threshold=float(threshold), message=message,
                   advice=advice, evidence=evidence[:cfg.max_evidence], step=h.step if step is None else step,
                   source=h.source, fired=bool(fired), remedy=remedy_for(name, h.run))
