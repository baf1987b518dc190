"""Two runs side by side: did the change work?

    from workbench.debug import compare_runs
    cmp = compare_runs("runs/gn", "runs/gn_strict")   # run folders or `load_run` Runs
    cmp.config_diff        # {"environment.params.strict": (None, True), ...}: what was changed
    cmp.curves             # DataFrame, one row per (run, step): reward, success, held-out success/reward
    cmp.findings           # {"resolved": [...], "persisting": [...], "new": [...]} (`FindingChange`)
    cmp.pairs              # [EpisodePair(seed, a, b)]: the same held-out seed played by both final policies
    print(cmp.to_markdown())

    python -m workbench compare runs/gn runs/gn_strict [--out compare.md]

What is compared, and from which files (nothing is re-run, no model is loaded):
  * config: every field of both `config.yaml`s, flattened to "section.field" (dict values,
    e.g. `environment.params`, one level further). `RUN_LOCAL_FIELDS` (where each run
    writes its own files) always differ and are left out.
  * curves: `metrics.jsonl` (training reward and success per step) and `evals.json`
    (held-out success and reward at the steps evaluated; step S = after S updates, so the
    held-out point at step 0 is the policy that sampled training step 0).
  * doctor findings: `diagnose(run)` of each run (`workbench.debug.doctor`), with each run's
    own thresholds (a notice says so when they differ) or the `doctor=` given for both;
    matched by (check name, train/held-out).
  * episodes: the last saved held-out batch of each run (`Run.eval_batch()`), paired by
    environment seed (the n-th episode of a seed with the n-th of the same seed).

Comparable means the same environment (`environment.name`, and `environment.import_path`
when both runs recorded one): two runs of different environments raise
`RunsNotComparable`, whose message names both. Different environment *settings*
(`environment.params`, e.g. a strict action format) are a config difference, not a reason
to refuse. Held-out seeds that differ (e.g. another `--eval-episodes`) do not raise: the
comparison carries a notice saying plainly that the held-out numbers are over different
episodes, `same_heldout_seeds` is False and only the shared seeds are paired. A run
without held-out evaluations gives a notice and no pairs.
"""
from __future__ import annotations

import argparse
import html
import math
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from workbench._moved import current_path
from workbench.debug.doctor import diagnose
from workbench.debug.runs import Run, RunError, load_run
from workbench.doctor.findings import DoctorConfig, Finding
from workbench.trajectory import Episode

__all__ = ["compare_runs", "RunComparison", "RunsNotComparable", "FindingChange", "EpisodePair",
           "config_differences", "CURVE_COLUMNS", "RUN_LOCAL_FIELDS", "add_compare_parser", "cmd_compare"]

#: Metric columns of `RunComparison.curves` (the trainer's and the evaluation's fixed names).
CURVE_COLUMNS = ("reward/mean", "env/success_rate", "eval/success_rate", "eval/reward_mean")
#: Config fields that name where a run writes its own files: they differ between any two runs.
RUN_LOCAL_FIELDS = ("checkpoint.output_dir", "training.log_dir")
#: `FindingChange.status` values, in report order.
STATUSES = ("resolved", "persisting", "new")


class RunsNotComparable(ValueError):
    """Two runs that cannot be compared (different environments); the message names both."""


@dataclass
class FindingChange:
    """One doctor check (train or held-out) across the two runs."""

    name: str
    """The check's name, e.g. "format-errors"."""
    source: str
    """"train" or "eval" (held-out)."""
    a: Finding | None
    """Run A's finding, None when it did not fire in A."""
    b: Finding | None
    """Run B's finding, None when it did not fire in B."""

    @property
    def status(self) -> str:
        """"resolved" (A only), "persisting" (both) or "new" (B only)."""
        return "persisting" if self.a and self.b else ("resolved" if self.a else "new")

    def where(self) -> str:
        return "held-out" if self.source == "eval" else "train"


@dataclass
class EpisodePair:
    """The same held-out seed played by both runs' final policies."""

    seed: int
    """The environment seed both episodes started from."""
    a: Episode
    """Run A's episode (its last saved held-out batch)."""
    b: Episode
    """Run B's episode."""

    @property
    def change(self) -> str:
        """"fixed" (A failed, B succeeded), "broken" (the reverse), "both succeed" or "both fail"."""
        a, b = bool(self.a.success), bool(self.b.success)
        return {(False, True): "fixed", (True, False): "broken", (True, True): "both succeed"}.get((a, b), "both fail")


def _replies(ep: Episode, width: int = 70) -> str:
    text = " / ".join(t.action.strip().replace("\n", " ") for t in ep.turns if t.source == "model")
    return text if len(text) <= width else text[:width - 1] + "…"


def _play(ep: Episode) -> str:
    return f"{'success' if ep.success else 'fail'}, {ep.outcome:+.3g}, {ep.num_turns} turns"


@dataclass
class RunComparison:
    """What `compare_runs` returns (see the module docstring)."""

    a: Run
    """Run A (the baseline)."""
    b: Run
    """Run B (the change)."""
    config_diff: dict[str, tuple[Any, Any]]
    """{"section.field": (value in A, value in B)} for every field that differs (None: absent)."""
    curves: Any
    """pandas DataFrame, one row per (run, step): columns "run" ("A"/"B"), "step" and
    `CURVE_COLUMNS` (NaN where the run has no value at that step)."""
    findings: dict[str, list[FindingChange]]
    """{"resolved": ..., "persisting": ..., "new": ...}."""
    pairs: list[EpisodePair]
    """Held-out episodes of both final policies paired by seed, ascending seed."""
    eval_steps: tuple[int | None, int | None]
    """The step of each run's last held-out batch (the "final policy" of `pairs`), None without one."""
    same_heldout_seeds: bool
    """Whether both final held-out batches played the same seeds (False also when one has none)."""
    notices: list[str] = field(default_factory=list)
    """Plain sentences about what is not comparable or was judged differently."""

    # -- numbers -------------------------------------------------------------------------------
    def final(self, run: str, column: str = "eval/success_rate") -> float:
        """The last non-NaN value of `column` for run "A" or "B" (NaN when it has none)."""
        rows = self.curves[(self.curves["run"] == run)].dropna(subset=[column])
        return float(rows[column].iloc[-1]) if len(rows) else math.nan

    @property
    def episodes(self) -> Any:
        """`pairs` as a DataFrame: seed, each run's success, outcome, turns and replies, the change."""
        import pandas as pd

        return pd.DataFrame([{"seed": p.seed, "a_success": bool(p.a.success), "b_success": bool(p.b.success),
                              "a_outcome": p.a.outcome, "b_outcome": p.b.outcome, "a_turns": p.a.num_turns,
                              "b_turns": p.b.num_turns, "a_replies": _replies(p.a, 10**6),
                              "b_replies": _replies(p.b, 10**6), "change": p.change} for p in self.pairs],
                            columns=["seed", "a_success", "b_success", "a_outcome", "b_outcome", "a_turns",
                                     "b_turns", "a_replies", "b_replies", "change"])

    def headline(self) -> str:
        """One line: held-out success A -> B, findings resolved / still there / new, seeds fixed / broken."""
        n = {s: len(v) for s, v in self.findings.items()}
        changes = [p.change for p in self.pairs]
        return (f"held-out success {_num(self.final('A'))} (A) -> {_num(self.final('B'))} (B); findings: "
                f"{n['resolved']} resolved, {n['persisting']} still there, {n['new']} new; same seeds: "
                f"{changes.count('fixed')} fixed, {changes.count('broken')} broken of {len(changes)}")

    # -- reports -------------------------------------------------------------------------------
    def _sections(self, max_episodes: int) -> list[tuple[str, list[str], list[list[str]], str]]:
        """(title, header, rows, text under the title) of each report section."""
        cfg = [[k, _val(a), _val(b)] for k, (a, b) in self.config_diff.items()]
        summary = [[name, _num(self.final("A", col)), _num(self.final("B", col))]
                   for name, col in (("held-out success (final)", "eval/success_rate"),
                                     ("held-out reward (final)", "eval/reward_mean"),
                                     ("train reward (last step)", "reward/mean"),
                                     ("train success (last step)", "env/success_rate"))]
        steps = []
        for step, rows in self.curves.groupby("step", sort=True):
            by = {r["run"]: r for r in rows.to_dict("records")}
            steps.append([str(int(step))] + [_num(by.get(run, {}).get(col, math.nan))
                                             for col in CURVE_COLUMNS for run in ("A", "B")])
        finds = [[c.name, c.where(), c.status]
                 + [f"{f.value:.3g} vs {f.threshold:.3g}" if f else "-" for f in (c.a, c.b)]
                 for s in STATUSES for c in self.findings[s]]
        eps = [[str(p.seed), p.change, _play(p.a), _play(p.b), _replies(p.a), _replies(p.b)]
               for p in self.pairs[:max_episodes]]
        more = f" (first {max_episodes} of {len(self.pairs)})" if len(self.pairs) > max_episodes else ""
        steps_a, steps_b = (f"step {s}" if s is not None else "none" for s in self.eval_steps)
        return [
            ("Config differences", ["field", "A", "B"], cfg, "" if cfg else "The configs are the same."),
            ("Results", ["", "A", "B"], summary, ""),
            ("Per step", ["step", "A reward", "B reward", "A success", "B success", "A held-out success",
                          "B held-out success", "A held-out reward", "B held-out reward"], steps,
             "Training reward and success per step; held-out numbers at the steps evaluated "
             "(step S = after S updates)."),
            ("Doctor findings", ["check", "where", "status", "A", "B"], finds,
             "" if finds else "No findings in either run."),
            ("Held-out episodes side by side" + more, ["seed", "change", "A", "B", "A replies", "B replies"], eps,
             f"Final policies: A at {steps_a}, B at {steps_b}." + ("" if eps else " No shared held-out seeds.")),
        ]

    def to_markdown(self, max_episodes: int = 32) -> str:
        """The report the CLI prints: notices, config differences, results, per-step curves,
        findings and the side-by-side episodes (at most `max_episodes` rows)."""
        lines = ["# Run comparison", "", f"- A: `{self.a.path}`", f"- B: `{self.b.path}`", "",
                 self.headline() + "."]
        lines += [""] + [f"**Note:** {n}" for n in self.notices] if self.notices else []
        for title, head, rows, text in self._sections(max_episodes):
            lines += ["", f"## {title}", ""] + ([text, ""] if text else [])
            if rows:
                lines += ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
                lines += ["| " + " | ".join(c.replace("|", "\\|") for c in r) + " |" for r in rows]
        return "\n".join(lines) + "\n"

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def _repr_html_(self) -> str:
        esc = html.escape
        parts = [f"<p><b>Run comparison</b><br>A: <code>{esc(str(self.a.path))}</code><br>"
                 f"B: <code>{esc(str(self.b.path))}</code></p><p>{esc(self.headline())}.</p>"]
        parts += [f"<p style='color:#8a1414'><b>Note:</b> {esc(n)}</p>" for n in self.notices]
        for title, head, rows, text in self._sections(32):
            parts.append(f"<h4>{esc(title)}</h4>" + (f"<p>{esc(text)}</p>" if text else ""))
            if rows:
                th = "".join(f"<th style='text-align:left'>{esc(h)}</th>" for h in head)
                body = "".join("<tr>" + "".join(f"<td style='text-align:left'>{esc(c)}</td>" for c in r) + "</tr>"
                               for r in rows)
                parts.append(f"<table><thead><tr>{th}</tr></thead><tbody>{body}</tbody></table>")
        return "".join(parts)

    def __repr__(self) -> str:
        return (f"RunComparison(A={str(self.a.path)!r}, B={str(self.b.path)!r}: {len(self.config_diff)} config "
                f"differences; {self.headline()}" + (f"; {len(self.notices)} notices" if self.notices else "") + ")")


def _num(value: Any) -> str:
    try:
        v = float(value)
    except (TypeError, ValueError):
        return "-"
    return "-" if math.isnan(v) else f"{v:.3g}"


def _val(value: Any) -> str:
    return "(absent)" if value is None else repr(value) if isinstance(value, str) else str(value)


# -- the parts ---------------------------------------------------------------------------------
def _flatten(data: dict[str, Any], prefix: str = "", depth: int = 2) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and depth > 0:
            out.update(_flatten(value, name + ".", depth - 1))
        else:
            out[name] = value
    return out


def config_differences(a: Any, b: Any) -> dict[str, tuple[Any, Any]]:
    """{"section.field": (a's value, b's value)} for each field of two `ConfigStore`s that
    differs (dict fields compared key by key, an absent key is None), `RUN_LOCAL_FIELDS` left out."""
    fa, fb = _flatten(a.to_dict()), _flatten(b.to_dict())
    keys = [k for k in fa] + [k for k in fb if k not in fa]
    return {k: (fa.get(k), fb.get(k)) for k in keys if k not in RUN_LOCAL_FIELDS and fa.get(k) != fb.get(k)}


def _curves(a: Run, b: Run) -> Any:
    import pandas as pd

    frames = []
    for label, run in (("A", a), ("B", b)):
        cols = [c for c in ("step", *CURVE_COLUMNS[:2]) if c in run.metrics.columns]
        train = run.metrics[cols] if len(run.metrics) else pd.DataFrame(columns=["step"])
        held = pd.DataFrame([{"step": e["step"], **{c: e.get(c, math.nan) for c in CURVE_COLUMNS[2:]}}
                             for e in run.evals if "step" in e], columns=["step", *CURVE_COLUMNS[2:]])
        both = train.merge(held, on="step", how="outer") if len(held) else train
        both = both.reindex(columns=["step", *CURVE_COLUMNS]).astype({c: float for c in CURVE_COLUMNS})
        frames.append(both.assign(run=label))
    out = pd.concat(frames, ignore_index=True)[["run", "step", *CURVE_COLUMNS]]
    out["step"] = out["step"].astype(int)
    return out.sort_values(["run", "step"], ignore_index=True)


def _finding_changes(fa: list[Finding], fb: list[Finding]) -> dict[str, list[FindingChange]]:
    by_a = {(f.name, f.source): f for f in fa}
    by_b = {(f.name, f.source): f for f in fb}
    keys = list(by_a) + [k for k in by_b if k not in by_a]
    out: dict[str, list[FindingChange]] = {s: [] for s in STATUSES}
    for name, source in keys:
        change = FindingChange(name, source, by_a.get((name, source)), by_b.get((name, source)))
        out[change.status].append(change)
    return out


def _final_eval(run: Run) -> tuple[int | None, list[Episode]]:
    steps = run.eval_steps
    return (steps[-1], list(run.eval_batch(steps[-1]))) if steps else (None, [])


def _seeds(episodes: list[Episode]) -> str:
    seeds = sorted({e.env_seed for e in episodes if e.env_seed is not None})
    if not seeds:
        return "none"
    run_of = seeds == list(range(seeds[0], seeds[-1] + 1))
    span = f"{seeds[0]}-{seeds[-1]}" if run_of else ", ".join(map(str, seeds[:8]))
    return span + ("" if len(seeds) <= 8 or "-" in span else ", ...") + f" ({len(seeds)})"


def _pair(eps_a: list[Episode], eps_b: list[Episode]) -> list[EpisodePair]:
    """Pair episodes by seed: the n-th episode of a seed in A with the n-th of it in B."""
    pool: dict[int, list[Episode]] = {}
    for ep in eps_b:
        pool.setdefault(ep.env_seed, []).append(ep)
    pairs = []
    for ep in eps_a:
        if ep.env_seed is not None and pool.get(ep.env_seed):
            pairs.append(EpisodePair(ep.env_seed, ep, pool[ep.env_seed].pop(0)))
    return sorted(pairs, key=lambda p: p.seed)


def _environment(run: Run) -> str:
    env = run.config.environment
    return repr(env.name) + (f" ({env.import_path})" if env.import_path else "")


def _as_run(run: Any) -> Run:
    if isinstance(run, Run):
        return run
    if isinstance(run, (str, os.PathLike)):
        return load_run(run)  # a RunError names what is missing
    raise TypeError("compare_runs: expected a run folder or a Run (workbench.debug.load_run), "
                    f"got {type(run).__name__}")


def compare_runs(a: Any, b: Any, doctor: DoctorConfig | None = None) -> RunComparison:
    """Compare run `a` (the baseline) with run `b` (the change); see the module docstring.

    Args:
        a, b: run folders (read with `load_run`) or `Run`s.
        doctor: thresholds to judge both runs with; default: each run's own (the `doctor`
            section of its config.yaml, as `diagnose` does).

    Raises:
        RunsNotComparable: the runs trained on different environments.
        RunError: a run folder is missing or a file in it is damaged (the message names it).
    """
    a, b = _as_run(a), _as_run(b)
    ea, eb = a.config.environment, b.config.environment
    # a run recorded before a module moved names its old path: the same environment (workbench._moved)
    same_name = current_path(ea.name) == current_path(eb.name)
    notices = []
    unnamed = [(label, run) for label, run in (("A", a), ("B", b))
               if getattr(run, "provenance", None) is not None and not run.config.environment.name]
    for label, run in unnamed:  # another trainer's run names no task: compared as the other's
        notices.append(f"run {label} ({run.path}) is imported from {run.provenance.trainer}, which records no "
                       "environment: it is compared as a run of the same task as the other (name the task with "
                       "`workbench import --task NAME` to have it checked)")
    if unnamed:
        same_name = True
    if not same_name or (ea.import_path and eb.import_path
                         and current_path(ea.import_path) != current_path(eb.import_path)):
        raise RunsNotComparable(
            f"{a.path} and {b.path} are not comparable: A trained on environment {_environment(a)}, B on "
            f"{_environment(b)} (environment.name / environment.import_path in their config.yaml). "
            "compare_runs compares two runs of the same environment; compare each with a run of its own environment")
    if doctor is None and a.config.doctor != b.config.doctor:
        fields = [k for k in config_differences(a.config, b.config) if k.startswith("doctor.")]
        notices.append(f"the runs' doctor thresholds differ ({', '.join(fields)}): each run's findings are judged "
                       "with its own, so a finding can come or go with its threshold alone; pass doctor=... "
                       "(or compare with one set) to judge both alike")
    step_a, eps_a = _final_eval(a)
    step_b, eps_b = _final_eval(b)
    seeds_a = sorted(e.env_seed for e in eps_a if e.env_seed is not None)
    seeds_b = sorted(e.env_seed for e in eps_b if e.env_seed is not None)
    same = bool(eps_a) and seeds_a == seeds_b
    for label, run, eps in (("A", a, eps_a), ("B", b, eps_b)):
        if not eps:
            how = ("; train it with --eval-episodes N" if getattr(run, "provenance", None) is None else
                   f" (its {run.provenance.trainer} files hold none, or none by environment seed)")
            notices.append(f"run {label} ({run.path}) has no held-out evaluation batch (evals/): there are no "
                           f"held-out numbers or episodes of it to compare{how}")
    if eps_a and eps_b and not same:
        shared = len(set(seeds_a) & set(seeds_b))
        notices.append(f"NOT COMPARABLE on held-out episodes: A's final evaluation played seeds {_seeds(eps_a)}, "
                       f"B's {_seeds(eps_b)}; {shared} are shared. Their held-out success and reward are over "
                       "different episodes, and the side by side shows the shared seeds only. Evaluate both on "
                       "the same seeds (the CLI's --eval-episodes N plays seeds 10000..10000+N-1)")
    found_a, found_b = diagnose(a, doctor), diagnose(b, doctor)
    for label, found in (("A", found_a), ("B", found_b)):
        if found.not_checked:  # a check one run's trainer gave no data for: its absence there says nothing
            notices.append(f"the doctor could not check {len(found.not_checked)} things in run {label}, so a finding "
                           "missing there is not a fix: " + "; ".join(f"{name} ({why})" for name, why in
                                                                  found.not_checked.items()))
    return RunComparison(
        a=a, b=b, config_diff=config_differences(a.config, b.config), curves=_curves(a, b),
        findings=_finding_changes(found_a, found_b), pairs=_pair(eps_a, eps_b),
        eval_steps=(step_a, step_b), same_heldout_seeds=same, notices=notices)


# -- command line ------------------------------------------------------------------------------
def add_compare_parser(subparsers: Any) -> argparse.ArgumentParser:
    """`python -m workbench compare RUN_A RUN_B [--out FILE] [--episodes N]`."""
    p = subparsers.add_parser("compare", help="two runs side by side: config differences, held-out success "
                                              "per step, doctor findings resolved / still there / new, and "
                                              "the same held-out seeds played by both final policies")
    p.add_argument("run_a", metavar="RUN_A",
                   help="the baseline run folder (config.yaml, metrics.jsonl, rollouts/, evals/)")
    p.add_argument("run_b", metavar="RUN_B", help="the run with the change (e.g. a remedy), same environment")
    p.add_argument("--out", dest="report", default=None, help="also write the report (markdown) to this file")
    p.add_argument("--episodes", type=int, default=32, help="side-by-side episode rows to print (default 32)")
    p.set_defaults(output=None, run=cmd_compare)  # reads two runs, writes nothing unless --out
    return p


def cmd_compare(args: argparse.Namespace) -> int:
    """Print the comparison (markdown; with --out also written to that file, first); 0 when it
    was made, 2 when a run folder cannot be read, the runs are not comparable, --episodes is
    negative or --out cannot be written (one line on stderr says which and why)."""
    import sys

    if args.episodes < 0:
        print(f"compare: --episodes must be an integer >= 0 (side-by-side rows to print), got {args.episodes}",
              file=sys.stderr)
        return 2
    if args.report and Path(args.report).is_dir():
        print(f"compare: --out {args.report} is a folder; give a file to write the report to, e.g. --out "
              f"{Path(args.report) / 'compare.md'}", file=sys.stderr)
        return 2
    try:
        report = compare_runs(args.run_a, args.run_b).to_markdown(args.episodes)
    except (RunError, RunsNotComparable) as exc:
        print(f"compare: {exc}", file=sys.stderr)
        return 2
    if args.report:  # written before the report is printed: a file that cannot be written is the only output
        try:
            Path(args.report).parent.mkdir(parents=True, exist_ok=True)
            Path(args.report).write_text(report, encoding="utf-8")
        except OSError as exc:
            print(f"compare: cannot write --out {args.report}: {exc.strerror or exc}", file=sys.stderr)
            return 2
    print(report)
    return 0
