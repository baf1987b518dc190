"""The run doctor's thresholds: `DoctorConfig`, the `doctor` section of `ConfigStore`.

    config.doctor.engine_logprob_gap = 0.2        # in a notebook
    python -m workbench train --doctor.truncation_rise 0.5
    python -m workbench diagnose runs/demo/train --doctor.min_samples 8

`Trainer.fit` runs the per-step checks with `config.doctor`, the run summary and
`diagnose(run)` use the reopened run's `config.yaml` section, so a threshold written in
the config is the one every path compares with. `check_doctor_config` is the range check
`ConfigStore.validate` runs on it.

Core layer, no imports from the package: `workbench.config` and `workbench.doctor.findings`
both read it.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Callable

from workbench.utils.settings import StrictFields


@dataclass
class DoctorConfig(StrictFields, section="doctor"):
    """Thresholds of the doctor's checks (`workbench.doctor.checks`)."""

    baseline_steps: int = 2
    """How many first batches (or metric rows) the drift checks take as "the first steps"."""
    min_samples: int = 4
    """Fewest units a check judges from (rewarded turns, model turns, groups, episodes);
    with fewer it stays silent."""
    incidental_coverage: float = 0.5
    """parse-from-incidental-span: a rewarded turn's action is incidental when its span
    covers less than this share of the (stripped) reply."""
    incidental_share: float = 0.5
    """parse-from-incidental-span fires when at least this share of rewarded turns is incidental."""
    min_distinct_ratio: float = 0.25
    """template-collapse: distinct replies / model turns of the latest batch must be below this..."""
    collapse_fraction: float = 0.5
    """...and below this fraction of the first steps' ratio; or the replies' word-bigram
    entropy fell below this fraction of the first steps'."""
    bare_collapse_share: float = 0.8
    """template-collapse on replies that are bare actions (at least `whole_action_share` of
    them, as were the first steps'): fires when the most common reply is at least this
    share of the latest batch's replies (and the share of distinct replies fell as above),
    one action whatever the observation. The share of distinct replies alone is no sign
    there: a converged policy in a small action space has few by design (binary search over
    1..8 opens every game with the same guess)."""
    repeat_count: int = 3
    """repetition-to-limit: a reply cut at max_tokens ends inside a unit (of at most
    `repeat_max_period` characters) repeated at least this many times."""
    repeat_max_period: int = 64
    """repetition-to-limit: longest repeated unit looked for, in characters."""
    repetition_share: float = 0.25
    """repetition-to-limit fires when at least this share of model turns ends that way."""
    whole_action_share: float = 0.5
    """template-collapse and length-drift compare the latest batch only with first steps
    whose replies have the same form: at least this share of them the whole action
    (`doctor.findings.is_whole_action`: a bare "5" under a strict format), or fewer in both.
    A policy that went from sentences to the bare action (a strict format learned, an SFT
    warm-up) changed form: its fewer distinct, shorter replies are not a collapse."""
    length_ratio: float = 2.0
    """length-drift fires when the mean reply length is this many times the first steps'
    (or less than 1 / this)."""
    truncation_rise: float = 0.25
    """truncation-surge fires when the share of replies cut at max_tokens rose by this much
    (absolute) over the first steps'."""
    zero_variance_share: float = 0.75
    """zero-variance-groups fires when at least this share of GRPO groups has all rewards equal..."""
    solved_success_rate: float = 0.9
    """...and the batch's success rate is below this (a solved batch has nothing left to learn;
    that is not a dead signal). entropy-collapse uses it too: a low entropy at a step whose
    success rate reaches it is a policy converged on what wins."""
    reward_rise: float = 0.25
    """reward-without-success: mean reward rose by at least this much over the first steps'..."""
    success_rise: float = 0.05
    """...while the success rate rose by less than this."""
    tool_ignored_share: float = 0.5
    """tool-result-ignored fires when at least this share of final answers after a tool
    result contains none of the results."""
    entropy_fraction: float = 0.2
    """entropy-collapse fires when `actor/entropy` fell below this fraction of the first steps'."""
    kl_spike_factor: float = 10.0
    """kl-spike: `kl/mean` of a step is this many times the median of the steps before it..."""
    kl_spike_min: float = 0.05
    """...and at least this large."""
    format_error_share: float = 0.3
    """format-errors fires when at least this share of model turns could not be parsed or was invalid."""
    environment_error_share: float = 0.0
    """environment-errors fires when more than this share of a batch's episodes ended in an
    environment error (those episodes are left out of the update)."""
    mismatch_share: float = 0.0
    """tokenization-mismatch fires when more than this share of episodes has an alignment warning."""
    engine_logprob_gap: float = 0.1
    """engine-trainer-gap fires when a step's `actor/rollout_logprob_diff` (mean |trainer
    logprob - engine logprob| of the trained tokens, nats) reaches this. fp32 gives ~1e-6,
    bf16 a few hundredths (SmolLM2: 0.04)."""
    off_policy_clipped_share: float = 0.2
    """off-policy-clipped fires when a step's `rollout_corr/clipped_fraction` (share of trained
    tokens whose importance weight pi_old / pi_rollout passed `training.rollout_is_threshold`)
    reaches this."""
    heldout_regression_share: float = 0.1
    """heldout-regression fires when the latest held-out evaluation lost at least this share
    of the seeds that the best earlier evaluation (the most games won) won, and its success
    rate on the seeds both played fell. The CLI's evaluations are greedy (temperature 0) on
    the same seeds, so a game lost comes from the new weights, not from another draw; 0.1
    is 4 of the demo's 32 held-out games once all 32 were won."""
    max_evidence: int = 3
    """Evidence episodes kept per finding."""
    judge_rise: float = 0.15
    """judge-hacking: the judge's mean score (0..1) rose by at least this much over the first
    steps' while the success rate rose by less than `success_rise`."""
    judge_high: float = 0.5
    """judge-hacking's evidence: a failed episode the judge scored at least this high."""
    judge_min_accuracy: float = 0.7
    """The judge audit (and `workbench.doctor.judges.judge_verdict`): least share of episodes
    whose judge score (cut at 0.5) says what the environment said."""
    judge_min_auc: float = 0.7
    """The audit and judge-unreliable: least ROC AUC of the judge's scores against the
    environment's success (0.5 is chance)."""
    judge_min_rank_correlation: float = 0.3
    """The audit: least Spearman correlation of the judge's scores with the environment's reward."""
    judge_min_position_consistency: float = 0.7
    """The audit: least Spearman correlation between a group judge's scores of the same groups
    shown in two shuffled orders (position bias)."""
    judge_max_length_correlation: float = 0.5
    """The audit: largest |Spearman correlation| of the judge's scores with the replies' length."""
    judge_min_self_consistency: float = 0.8
    """The audit: least Pearson correlation between two judgments of the same episodes."""
    judge_failed_share: float = 0.0
    """judge-failures fires (and the audit calls a judge unfit) when more than this share of the
    judgments failed."""


#: Fields that are shares or fractions of something: each must lie in [0, 1].
_SHARES = ("incidental_coverage", "incidental_share", "min_distinct_ratio", "collapse_fraction", "bare_collapse_share",
           "repetition_share", "truncation_rise", "zero_variance_share", "solved_success_rate",
           "success_rise", "tool_ignored_share", "entropy_fraction", "format_error_share", "mismatch_share",
           "environment_error_share",
           "whole_action_share", "off_policy_clipped_share", "heldout_regression_share",
           "judge_rise", "judge_high", "judge_min_accuracy", "judge_min_auc", "judge_min_position_consistency",
           "judge_max_length_correlation", "judge_min_self_consistency", "judge_failed_share")
#: Fields that count something: integers, with their least sensible value.
_COUNTS = {"baseline_steps": 1, "min_samples": 1, "repeat_count": 2, "repeat_max_period": 1, "max_evidence": 0}


def check_doctor_config(cfg: DoctorConfig, error: Callable[[str], Exception] = ValueError) -> None:
    """Raise `error(message)` naming the first threshold out of its range (`doctor.FIELD`
    and what to write instead). Types are `ConfigStore.validate`'s job; this checks ranges."""
    for name in _SHARES:
        value = getattr(cfg, name)
        if not 0 <= value <= 1:
            raise error(f"doctor.{name} is a share and must be in [0, 1], got {value!r}")
    for name, least in _COUNTS.items():
        value = getattr(cfg, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise error(f"doctor.{name} must be an integer >= {least}, got {value!r}")
    for name in ("length_ratio", "kl_spike_factor"):
        value = getattr(cfg, name)
        if not value > 1:
            raise error(f"doctor.{name} is a factor over the earlier steps and must be > 1, got {value!r}")
    for name in ("reward_rise", "kl_spike_min"):
        value = getattr(cfg, name)
        if not value >= 0:
            raise error(f"doctor.{name} must be >= 0, got {value!r}")
    if not -1 <= cfg.judge_min_rank_correlation <= 1:
        raise error(f"doctor.judge_min_rank_correlation is a correlation and must be in [-1, 1], "
                    f"got {cfg.judge_min_rank_correlation!r}")
    if not cfg.engine_logprob_gap > 0:
        raise error(f"doctor.engine_logprob_gap must be > 0 nats, got {cfg.engine_logprob_gap!r}")


def doctor_fields() -> list[str]:
    """Names of every threshold, in declaration order."""
    return [f.name for f in fields(DoctorConfig)]


__all__ = ["DoctorConfig", "check_doctor_config", "doctor_fields"]
