"""The run doctor: names reward hacking, collapse and dead signal in a run, with the
episodes that show it.

    from workbench.debug import diagnose
    findings = diagnose("runs/demo/train")     # a run folder, a reopened run, a batch or a list of batches
    for f in findings:
        print(f.line())                        # name, severity, number vs threshold, evidence episode
    f.evidence[0]                              # episode id, step, turn, the reply and the span that matters

    python -m workbench diagnose runs/demo/train [--json] [--doctor.min_samples 8]

The checks are small named functions in `workbench.doctor.checks` (core layer, so
`Trainer.fit` runs them on every step's batch and records `diagnose/<name>`); each has
a threshold in `DoctorConfig`, the config's `doctor` section: a run is judged with the
thresholds in its config.yaml unless told otherwise. This module adds what needs a whole run: it reads the run
(its steps' batches, metrics.jsonl and the held-out batches), runs the checks over the
training steps (the latest batch is the evidence; the drift checks compare its numbers with
the first steps', so only those batches are read, `_judged_steps`; the metric checks read every
step's metrics), again over the held-out batches (first = before training), takes metric
findings' evidence from the batch of the step they name, and prints or serialises the
findings. A run imported from another trainer (`workbench.importers`) also gets the checks its
files could not feed, with why (`Findings.not_checked`).

Checks: heldout-regression (held-out games the best earlier evaluation won and the latest
lost, paired by seed: training made the policy worse); parse-from-incidental-span,
reward-without-success, tool-result-ignored (reward hacking); template-collapse, repetition-to-limit, length-drift,
truncation-surge, entropy-collapse, kl-spike (collapse); zero-variance-groups,
format-errors, tokenization-mismatch, engine-trainer-gap (dead signal, broken data);
off-policy-clipped (asynchronous training: samples too stale for the correction);
judge-hacking, judge-unreliable, judge-failures (a reward from a model: the policy pleasing the
judge, a judge that cannot tell success from failure, judgments that failed;
`workbench.doctor.judges`, silent on runs without judgments).

Which can fire on an untrained model (one batch, no history): format-errors (a base
model often ignores the reply format; guess_number calls an out-of-range number
invalid), parse-from-incidental-span (a model that answers in sentences, "The number
is 3.", is rewarded for a number read out of a sentence: true, and worth knowing before
training exploits it), repetition-to-limit (base models loop), zero-variance-groups
(a task too hard for it: every group fails alike), tool-result-ignored and
tokenization-mismatch. The drift and metric checks (template-collapse, length-drift,
truncation-surge, reward-without-success, entropy-collapse, kl-spike) need at least two
steps and compare with the first ones, so they cannot fire before training moves the
policy; heldout-regression needs two held-out evaluations of the same seeds, the earlier
one winning at least `min_samples` games (never after an untrained model that won
nothing); engine-trainer-gap and off-policy-clipped need one update's metrics. Scripted experts
(`envs.EXPERTS`) give no finding, with or without the strict format, and neither does a policy
that goes from sentences to the bare action (length-drift and template-collapse compare
bare-action replies only with bare-action first steps, `doctor.whole_action_share`;
tests/test_doctor_experts.py, tests/test_doctor_honest.py).
"""
from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import re
import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from workbench.debug.runs import load_run
from workbench.doctor.checks import CHECKS, run_checks
from workbench.doctor.findings import DoctorConfig, Evidence, Finding, History, RunFacts
from workbench.trajectory import TrajectoryBatch

__all__ = ["diagnose", "diagnose_parts", "Findings", "Finding", "Evidence", "DoctorConfig", "CHECKS", "RunFacts",
           "RunPlace", "run_facts", "remedy_command", "findings_table", "findings_markdown", "add_diagnose_parser",
           "cmd_diagnose"]


class Findings(list):
    """What `diagnose` returns: the fired findings (a list of `Finding`), and `not_checked`:
    {check: why} for each check the run's data could not feed (a run imported from a trainer
    that did not record what the check reads; `workbench.doctor.needs`). Empty for a run the
    workbench trained."""

    def __init__(self, findings: Iterable[Finding] = (), not_checked: dict[str, str] | None = None):
        super().__init__(findings)
        self.not_checked: dict[str, str] = dict(not_checked or {})

    def not_checked_lines(self) -> list[str]:
        """"not checked: length-drift: verl records no token ids; ..." one a check."""
        return [f"not checked: {name}: {why}" for name, why in self.not_checked.items()]


def _unchecked(findings: list[Finding], absent: dict[str, str] | None, metrics: Any, source: str) -> Findings:
    """`findings` less those of checks the run could not feed, with those checks' reasons."""
    if absent is None:
        return Findings(findings)
    from workbench.doctor.needs import not_checked

    numbers = []
    if metrics is not None and len(metrics):
        import pandas as pd

        numbers = [c for c in metrics.columns if pd.to_numeric(metrics[c], errors="coerce").notna().any()]
    missing = not_checked(absent, numbers, source)
    return Findings([f for f in findings if f.name not in missing], missing)


#: Checks that read the metric rows; their evidence comes from the batch of the step they name.
_METRIC_CHECKS = ("entropy-collapse", "kl-spike", "engine-trainer-gap", "off-policy-clipped")


def _rows(metrics: Any) -> list[dict[str, Any]]:
    """Metric rows as dicts: a DataFrame (`to_dict("records")`), a list of dicts, or None."""
    if metrics is None:
        return []
    if hasattr(metrics, "to_dict"):
        return [dict(r) for r in metrics.to_dict("records")]
    return [dict(r) for r in metrics]


def _eval_steps(run: Any) -> list[int]:
    steps = getattr(run, "eval_steps", None)
    if steps is None:
        steps = sorted({int(e["step"]) for e in (getattr(run, "evals", None) or []) if "step" in e})
    return list(steps) if hasattr(run, "eval_batch") else []


def _history(batches: Iterable[tuple[int, TrajectoryBatch]], source: str, metrics: list[dict] | None = None) -> History:
    h = History(source=source, metrics=list(metrics or []))
    for step, batch in batches:
        h.add(batch, step)
    return h


def diagnose_parts(train: History | None, evals: Iterable[tuple[int, TrajectoryBatch]] = (),
                   config: DoctorConfig | None = None, batch_at: Any = None,
                   facts: RunFacts | None = None) -> list[Finding]:
    """The fired findings of a training `History` (as `StepDoctor` keeps it) and of the
    held-out batches `evals` ((step, batch), first = before training). `batch_at(step)`
    (optional) gives a step's batch for the metric findings' evidence; `facts` (default: the
    training history's) the run's settings the words and remedies fit (`RunFacts`). The
    training checks see the latest held-out batch (`History.held_out`): a policy that wins its
    training batches is spared by entropy-collapse and zero-variance-groups only if it wins
    the held-out games too."""
    cfg = config or DoctorConfig()
    out: list[Finding] = []
    facts = facts if facts is not None else getattr(train, "run", None)
    if train is not None and facts is not None:
        train.run = facts
    evals = [(s, b) for s, b in evals if b is not None]
    if train is not None and evals:
        # The checks that spare a policy winning its batches ask the latest held-out games too.
        train = dataclasses.replace(train, held_out=evals[-1][1], held_out_step=evals[-1][0])
    if train is not None and (train.stats or train.metrics):
        for f in run_checks(train, cfg):
            if f.fired and f.name in _METRIC_CHECKS and batch_at is not None and f.step not in (None, train.step):
                again = _metric_evidence(train, f, cfg, batch_at)
                f = again or f
            if f.fired:
                out.append(f)
    if evals:
        names = [n for n in CHECKS if n not in _METRIC_CHECKS]
        held_out = _history(evals, "eval")
        held_out.run = facts
        out += [f for f in run_checks(held_out, cfg, names) if f.fired]
    order = {n: i for i, n in enumerate(CHECKS)}
    return sorted(out, key=lambda f: (order[f.name], f.source != "eval"))


def _metric_evidence(train: History, f: Finding, cfg: DoctorConfig, batch_at: Any) -> Finding | None:
    """Run a metric check again with the batch of the step it names as the evidence batch."""
    try:
        batch = batch_at(f.step)
    except (OSError, ValueError, KeyError):
        return None
    h = dataclasses.replace(train, batch=batch, step=f.step)
    return CHECKS[f.name](h, cfg)


def diagnose(run_or_batches: Any, config: DoctorConfig | None = None) -> Findings:
    """Run the doctor; returns the findings that crossed their thresholds (a list, `Findings`,
    whose `not_checked` names the checks an imported run's data could not feed, and why).

    Args:
        run_or_batches: one `TrajectoryBatch`; a list of batches (first = earliest, steps
            0, 1, ...); a run folder path (read with `load_run`: `RUN/rollouts/step_*.jsonl.gz`,
            `RUN/evals/...`, `RUN/metrics.jsonl`, `RUN/config.yaml`); a `History`; or a reopened run (`.steps`, `.batch(step)`,
            `.metrics`, optionally `.eval_batch(step)` with `.eval_steps` or `.evals`).
        config: thresholds. Default: a run's own (`run.config.doctor`, the `doctor` section
            of its config.yaml), else `DoctorConfig()`.
    """
    cfg = config or DoctorConfig()
    run = run_or_batches
    if isinstance(run, History):
        return Findings(diagnose_parts(run, (), cfg))
    if isinstance(run, TrajectoryBatch):
        run = [run]
    if isinstance(run, (list, tuple)):
        if not all(isinstance(b, TrajectoryBatch) for b in run):
            raise TypeError("diagnose: a list must hold TrajectoryBatch objects")
        meta = run[-1].meta if run else {}
        return _unchecked(diagnose_parts(_history(enumerate(run), "train"), (), cfg), meta.get("absent"), None,
                          str(meta.get("source_trainer", meta.get("source_format", "the source"))))
    if isinstance(run, (str, os.PathLike)):
        run = load_run(run)  # a RunError says what is missing from the folder
    if not (hasattr(run, "steps") and callable(getattr(run, "batch", None))):
        raise TypeError(f"diagnose: expected a batch, a list of batches, a run folder or a run, "
                        f"got {type(run).__name__}")
    if config is None and isinstance(getattr(getattr(run, "config", None), "doctor", None), DoctorConfig):
        cfg = run.config.doctor  # the thresholds the run trained with (its config.yaml)
    train = _history(((s, run.batch(s)) for s in _judged_steps(run.steps, cfg)), "train",
                     _rows(getattr(run, "metrics", None)))
    evals = [(s, run.eval_batch(s)) for s in _eval_steps(run)]
    saved = getattr(run, "config", None)
    provenance = getattr(run, "provenance", None)
    facts = run_facts(saved) if hasattr(saved, "training") else None
    if provenance is not None:  # imported: only what its trainer recorded is known
        from workbench.algo.advantages import GROUP_RELATIVE_ESTIMATORS

        known = provenance.estimator
        facts = RunFacts(adv_estimator=known, group_relative=None if known is None else
                         known in GROUP_RELATIVE_ESTIMATORS)
    found = diagnose_parts(train, evals, cfg, batch_at=run.batch, facts=facts)
    if provenance is None:
        return Findings(found)
    return _unchecked(found, provenance.absent, getattr(run, "metrics", None),
                      getattr(provenance, "trainer", provenance.format))


def _judged_steps(steps: list[int], cfg: DoctorConfig) -> list[int]:
    """The saved steps the training checks read: the first `baseline_steps` (what the drift
    checks compare with) and the last (what every check judges; `History.baseline`). The steps
    between change no finding, so a long run is judged without reading all its batches."""
    return sorted(set(steps[:cfg.baseline_steps]) | set(steps[-1:]))


def run_facts(config: Any) -> RunFacts:
    """`RunFacts` of a run from its config alone: the settings, and the environment's class
    (`environment.import_path`, else the registered name) for its expert and strict format;
    those two are unknown (None) when the class cannot be imported here."""
    from workbench.environments.registry import REGISTRY
    from workbench.utils.imports import import_object

    env_type = None
    try:
        spec = config.environment.import_path
        target = import_object(spec) if spec else REGISTRY.resolve(config.environment.name)
        env_type = target if isinstance(target, type) else None
    except Exception:  # noqa: BLE001 - an environment this process cannot import: its abilities are unknown
        env_type = None
    return RunFacts.of(config, env_type)


# -- remedies as commands -------------------------------------------------------------------------
@dataclass(frozen=True)
class RunPlace:
    """Where a run's remedies start from: its folder, its config and its checkpoint folders
    (a `load_run` Run has all three; `RunPlace.of(run)`)."""

    path: Path
    """The run folder."""
    config: Any
    """Its `ConfigStore` (config.yaml)."""
    checkpoints: list[Path] = field(default_factory=list)
    """Its checkpoint folders, oldest first."""

    @classmethod
    def of(cls, run: Any) -> "RunPlace":
        return cls(Path(run.path), run.config, list(run.checkpoints))


_STEP = re.compile(r"step_(\d+)$")


def remedy_command(finding: Finding, place: RunPlace) -> str:
    """The complete command that tries `finding.remedy` on the run at `place`, runnable as
    printed: a branch (`train --from`) from the newest checkpoint at or before the step the
    finding was measured at, training to the run's own target (or, from its last step, as
    many steps again), into `RUN-<remedy>` next to the run; a fresh run of the run's
    config.yaml with the remedy when no such checkpoint was kept. A finding whose cause began
    earlier (`Finding.branch_step`, e.g. a policy that stopped exploring before it met the
    games it loses) branches from at or before that step instead. "" without a remedy."""
    if not finding.remedy:
        return ""
    q = shlex.quote
    run_dir = place.path.resolve()
    section, _, name = next(iter(finding.remedy)).partition(".")
    slug = (f"{section}-{name}" if name == "steps" else name).replace("_", "-")  # runs/gn-dynamic-sampling, -sft-steps
    out = run_dir.with_name(f"{run_dir.name}-{slug}")
    t = place.config.training
    rl_steps = t.num_epochs * t.num_iters_per_epoch
    target = place.config.sft.steps + rl_steps
    kept = [(int(m.group(1)), p) for p in place.checkpoints if (m := _STEP.search(Path(p).name))]
    last = finding.branch_step if finding.branch_step is not None else finding.step
    usable = [(s, p) for s, p in kept if last is None or s <= last]
    if usable:
        step, ckpt = max(usable)
        steps = target - step if target > step else rl_steps
        head = f"python -m workbench train --from {q(str(Path(ckpt).resolve()))} --steps {steps}"
    else:
        head = f"python -m workbench train --config {q(str(run_dir / 'config.yaml'))}"
    return f"{head} --output {q(str(out))} {finding.remedy_flags()}"


def _try_line(f: Finding, place: RunPlace | None) -> str:
    if place is not None:
        return remedy_command(f, place)
    return f"python -m workbench train --from RUN/checkpoints/step_N --steps N --output NEW {f.remedy_flags()}"


# -- reports ----------------------------------------------------------------------------------
def _imported(run: Any) -> bool:
    """A run another trainer trained: a remedy is a setting of that trainer, so no workbench
    command is printed for it (the advice says what to change)."""
    return getattr(run, "provenance", None) is not None
def _where(f: Finding) -> str:
    return ("held-out" if f.source == "eval" else "train") + (f", step {f.step}" if f.step is not None else "")


def findings_table(findings: list[Finding], run: Any = None) -> str:
    """Plain text: one row per finding, then what was measured, what to do, the remedy as a
    command (`remedy_command`, complete when `run`, a `RunPlace` or a `load_run` Run, is given)
    and the evidence."""
    place = run if isinstance(run, RunPlace) or run is None else RunPlace.of(run)
    unchecked = findings.not_checked_lines() if isinstance(findings, Findings) else []
    if not findings:
        return "\n".join(["doctor: no findings", *unchecked])
    head = ("check", "severity", "value", "threshold", "where")
    rows = [(f.name, f.severity, f"{f.value:.3g}", f"{f.threshold:.3g}", _where(f)) for f in findings]
    widths = [max(len(r[i]) for r in [head, *rows]) for i in range(len(head))]
    lines = ["  ".join(c.ljust(w) for c, w in zip(head, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths)) for r in rows]
    for f in findings:
        lines += ["", f"{f.name} ({_where(f)}): {f.message}.", f"  do: {f.advice}"]
        if f.remedy and not _imported(run):
            lines.append(f"  try: {_try_line(f, place)}")
        lines += [f"  - {e.where()}: {e.quote()!r}" for e in f.evidence]
    if unchecked:
        lines += ["", *unchecked]
    return "\n".join(lines)


def findings_markdown(findings: list[Finding], run: Any = None) -> str:
    """Markdown for summary.md: a table, then each finding's message, advice, remedy command
    (as in `findings_table`) and evidence."""
    place = run if isinstance(run, RunPlace) or run is None else RunPlace.of(run)
    unchecked = [f"- {line}" for line in findings.not_checked_lines()] if isinstance(findings, Findings) else []
    if not findings:
        return "\n".join(["## Run doctor", "", "No findings.", *([""] + unchecked if unchecked else [])])
    lines = ["## Run doctor", "", "| check | severity | value | threshold | where | evidence |", "|---|---|---|---|---|---|"]
    for f in findings:
        ev = f.evidence[0].where() if f.evidence else ""
        lines.append(f"| {f.name} | {f.severity} | {f.value:.3g} | {f.threshold:.3g} | {_where(f)} | {ev} |")
    for f in findings:
        lines += ["", f"**{f.name}** ({_where(f)}): {f.message}. *Do:* {f.advice}"
                  + (f" *Try:* `{_try_line(f, place)}`" if f.remedy and not _imported(run) else "")]
        lines += [f"- {e.where()}: `{e.quote()}`" for e in f.evidence]
    if unchecked:
        lines += ["", *unchecked]
    return "\n".join(lines)


# -- command line -------------------------------------------------------------------------------
def add_diagnose_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`python -m workbench diagnose RUN_DIR [--json]`."""
    p = subparsers.add_parser("diagnose", help="the run doctor: name reward hacking, collapse and dead signal "
                                                "in a run folder, with the episodes that show it")
    p.add_argument("run_dir", help="a run folder (rollouts/, evals/, metrics.jsonl), e.g. runs/demo/train, or a "
                                "folder another trainer wrote (verl, TRL, ART, verifiers, prime-rl), read in place")
    p.add_argument("--json", action="store_true", help="print the findings as a JSON list instead of a table")
    # The CLI adds a --doctor.FIELD VALUE flag per threshold (workbench.config.flags) and hands the
    # ones given to cmd_diagnose as args.doctor_overrides.
    p.set_defaults(output=None, run=cmd_diagnose, doctor_overrides={})  # reads a run, writes nothing
    return p


def cmd_diagnose(args: argparse.Namespace) -> int:
    """Print the findings of `args.run_dir` (a table, or JSON with --json); 0 even with findings.
    The thresholds are the run's (`doctor` in its config.yaml) with `args.doctor_overrides`
    ({field: value}, from `--doctor.FIELD VALUE`) over them; a bad one is a ConfigError."""
    run = load_run(args.run_dir)
    config = copy.deepcopy(run.config)  # the flags change this call's thresholds, not the reopened run
    config.update("doctor", args.doctor_overrides).validate()
    findings = diagnose(run, config.doctor)
    if args.json:
        print(json.dumps([f.to_dict() for f in findings], indent=1))
        for line in findings.not_checked_lines():  # stdout stays the findings' JSON list
            print(line, file=sys.stderr)
    else:
        print(findings_table(findings, run))
    return 0
