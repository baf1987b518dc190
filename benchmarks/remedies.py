"""Remedies benchmark: does each doctor finding's remedy (`Finding.remedy`) remove the finding
on a real run, and what does it do to held-out success?

    python benchmarks/remedies.py                          # every pair, training seeds 0 and 1
    python benchmarks/remedies.py --pairs strict_format,sft --seeds 0
    python benchmarks/remedies.py --dtype float32 --device cpu --rl-steps 4   # default: auto, auto, 3
    python benchmarks/remedies.py --resummarise            # recompute the pairs from the stored runs

Every arm is a short LoRA GRPO run of the embedded model (SmolLM2-135M-Instruct) on
guess_number with the demo's settings (`workbench.cli.demo.demo_config`: secret 1..8, 4 guesses,
8 new tokens per turn, batch 16, lr 5e-4; here `--rl-steps` RL steps), built as a user builds
one: a `ConfigStore` with the arm's overrides, `workbench.cli.runner.train_and_report` (held-out
success before and after on seeds 10_000.., greedy; the run doctor over the steps and the
held-out batches), and the doctor's checks (`workbench.doctor.checks.run_checks`) on the
trainer's doctor history for every check's value, fired or not. A pair is a finding and its
remedy, each run without and with the remedy on the same training seeds:

* strict_format vs parse-from-incidental-span: the lenient parser takes the first number
  of "The number is 5."; `environment.strict_format` counts only a bare number.
* sft vs format-errors, and vs zero-variance-groups (the same two arms): with the strict
  format the untrained model's replies are refused, so every group fails alike;
  `sft.steps` warm-up steps on the scripted expert's episodes first.
* dynamic_sampling vs zero-variance-groups: groups of 4 (4 per step) under the strict
  format after a 1-step SFT warm-up, so some groups vary and many do not; the trained
  batch's flat share is the doctor's value, `rollout/dynamic_zero_variance_rate` the share
  of flat groups in everything rolled out (before the filter).
* overlong_penalty vs truncation: a prompt that asks for reasoning before the number and
  `max_tokens` 12, so replies run to the limit; `reward.overlong_penalty` 1.0 over the last
  6 tokens. The statistic is the share of replies cut at max_tokens (the number under
  truncation-surge, which compares it with the first steps').

Per arm: the finding's value at the last RL step (the doctor's statistic on the step's
batch) and on the held-out episodes after training, whether the doctor fired it, held-out
success before / after (and after SFT). Per pair: medians over the seeds. Results:
`benchmarks/results/remedies.json` and a table (printed, and `--markdown` for the README).
Runs that share a config (the same arm in two pairs) are run once. With `WORKBENCH_SMOKE=1`
every count is cut down (the test suite runs it on the tiny model).
"""
from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # before torch: see benchmarks/learning.py

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import load, machine, run_main  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"

#: A prompt that asks for words before the number: with 12 new tokens the replies run to the limit.
VERBOSE_PROMPT = ("Guess my secret number from 1 to 8. First explain your reasoning in a sentence or two, "
                  "then give your guess.")

#: Arm name -> config overrides (section -> {field: value}) on top of `base_config`.
ARMS: dict[str, dict[str, dict[str, Any]]] = {
    "lenient": {},
    "strict": {"environment": {"strict_format": True}},
    "strict+sft": {"environment": {"strict_format": True}, "sft": {"steps": 4, "episodes": 32}},
    "g4": {"environment": {"strict_format": True}, "sft": {"steps": 1, "episodes": 32},
           "training": {"group_size": 4}},
    "g4+dynamic_sampling": {"environment": {"strict_format": True}, "sft": {"steps": 1, "episodes": 32},
                            "training": {"group_size": 4, "dynamic_sampling": True,
                                         "dynamic_sampling_max_batches": 2}},
    "verbose": {"environment": {"system_prompt": VERBOSE_PROMPT}, "inference": {"max_tokens": 12}},
    "verbose+overlong_penalty": {"environment": {"system_prompt": VERBOSE_PROMPT}, "inference": {"max_tokens": 12},
                                 "reward": {"overlong_penalty": 1.0, "overlong_buffer": 6}},
}

#: Pair name -> the remedy, its finding, the statistic, arm without, arm with. Pairs may share
#: arms (each arm and seed runs once).
PAIRS: dict[str, dict[str, str]] = {
    "strict_format": {"remedy": "environment.strict_format", "finding": "parse-from-incidental-span",
                      "statistic": "parse-from-incidental-span", "without": "lenient", "with": "strict"},
    "sft": {"remedy": "sft.steps 4", "finding": "format-errors", "statistic": "format-errors",
            "without": "strict", "with": "strict+sft"},
    "sft_zero_variance": {"remedy": "sft.steps 4", "finding": "zero-variance-groups",
                          "statistic": "zero-variance-groups", "without": "strict", "with": "strict+sft"},
    "dynamic_sampling": {"remedy": "training.dynamic_sampling", "finding": "zero-variance-groups",
                         "statistic": "zero-variance-groups", "without": "g4", "with": "g4+dynamic_sampling"},
    "overlong_penalty": {"remedy": "reward.overlong_penalty 1.0", "finding": "truncation-surge",
                         "statistic": "truncation_rate", "without": "verbose", "with": "verbose+overlong_penalty"},
}

FULL = {"rl_steps": 3, "eval_episodes": 16, "batch_size": 16, "group_size": 8}
SMOKE = {"rl_steps": 2, "eval_episodes": 4, "batch_size": 4, "group_size": 2}


def counts() -> dict[str, int]:
    return SMOKE if os.environ.get("WORKBENCH_SMOKE") == "1" else FULL


def base_config(args: argparse.Namespace, seed: int, out: Path):
    """The demo's training config (`workbench.cli.demo.demo_config`) with this benchmark's counts,
    and without the demo's own remedies (the strict format and the SFT warm-up at its learning
    rate): the lenient arm is the run the doctor diagnoses, and each arm adds its remedy."""
    from workbench.cli.demo import demo_config

    n = counts()
    demo_args = argparse.Namespace(model=args.model, device=args.device, dtype=args.dtype)
    cfg = demo_config(demo_args, out, remedies=False)  # an arm's SFT steps run at training.learning_rate
    cfg.update("training", {"batch_size": n["batch_size"], "group_size": n["group_size"],
                            "micro_batch_size": n["batch_size"], "num_iters_per_epoch": args.rl_steps,
                            "seed": seed})
    cfg.checkpoint.save_interval = 0  # no checkpoints: nothing here branches
    return cfg


def arm_config(args: argparse.Namespace, arm: str, seed: int, out: Path):
    cfg = base_config(args, seed, out)
    for section, values in ARMS[arm].items():
        values = dict(values)
        if section == "training" and "group_size" in values and os.environ.get("WORKBENCH_SMOKE") == "1":
            values["group_size"] = min(values["group_size"], cfg.training.group_size)
        if section == "environment":
            for k, v in values.items():
                setattr(cfg.environment, k, v)
        else:
            cfg.update(section, values)
    return cfg.validate()


def _value(findings: list, name: str) -> tuple[float | None, bool | None]:
    f = next((f for f in findings if f.name == name), None)
    return (None, None) if f is None else (f.value, f.fired)


def run_arm(args: argparse.Namespace, arm: str, seed: int, work: Path) -> dict[str, Any]:
    """One short run of `arm` on training seed `seed`: held-out success, every check's value."""
    from workbench.doctor.checks import run_checks
    from workbench.doctor.findings import History
    from workbench.cli.runner import train_and_report

    out = work / f"{arm.replace('+', '_')}_seed{seed}"
    cfg = arm_config(args, arm, seed, out)
    load0, start = load(), time.perf_counter()
    report = train_and_report(cfg, out, counts()["eval_episodes"])
    seconds = time.perf_counter() - start
    trainer = report["trainer"]
    history = trainer.doctor.history
    train = run_checks(history, cfg.doctor)  # every check's value at the last RL step, fired or not
    held = History(source="eval")
    held.add(report["after"], trainer.global_step)
    held_out = run_checks(held, cfg.doctor, ["parse-from-incidental-span", "format-errors", "repetition-to-limit"])
    rl = [m for m in trainer.metrics_history if "reward/mean" in m]
    sft = [m for m in trainer.metrics_history if "sft/nll" in m]
    evals = report["evals"]
    rec: dict[str, Any] = {
        "arm": arm, "seed": seed, "overrides": ARMS[arm], "seconds": round(seconds, 1),
        "load": round((load0 + load()) / 2, 2), "steps": trainer.global_step, "rl_steps": len(rl),
        "success_before": evals[0]["eval/success_rate"], "success_after": evals[-1]["eval/success_rate"],
        "success_after_sft": (next(e["eval/success_rate"] for e in evals if e["step"] == cfg.sft.steps)
                              if report["after_sft"] is not None else None),
        "fired": sorted({f.name for f in report["findings"]}),
        "fired_held_out": sorted({f.name for f in report["findings"] if f.source == "eval"}),
        "train": {f.name: {"value": f.value, "fired": f.fired} for f in train},
        "held_out": {f.name: {"value": f.value, "fired": f.fired} for f in held_out},
        "truncation_rate": history.stats[-1].truncation_rate if history.stats else None,
        "held_out_truncation_rate": held.stats[-1].truncation_rate,
        "train_success": [m["env/success_rate"] for m in rl],
        "train_reward": [m["reward/mean"] for m in rl],
        "sft_nll": [m["sft/nll"] for m in sft],
        "dynamic_zero_variance_rate": [m["rollout/dynamic_zero_variance_rate"] for m in rl
                                       if "rollout/dynamic_zero_variance_rate" in m],
        "dynamic_bound_reached": [m["rollout/dynamic_bound_reached"] for m in rl
                                  if "rollout/dynamic_bound_reached" in m],
        "diagnose_per_step": per_step(rl),
        "first_replies_after": [ep.turns[0].action for ep in list(report["after"])[:4] if ep.turns],
        "run_dir": str(out),
        "model": {"name": cfg.model.model_name, "device": str(cfg.model.resolved_device()),
                  "dtype": str(cfg.model.resolved_dtype()).removeprefix("torch.")},
    }
    trainer.cleanup()
    del trainer, report, history
    gc.collect()
    return rec


def per_step(rows: list[dict[str, Any]]) -> dict[str, list[float | None]]:
    """Each check's `diagnose/<name>` value per RL step (None where it measured nothing)."""
    from workbench.doctor.checks import CHECKS

    def value(row: dict[str, Any], name: str) -> float | None:
        v = row.get(f"diagnose/{name}")
        return None if v is None or v != v else float(v)  # NaN: not measured that step

    return {name: [value(r, name) for r in rows] for name in CHECKS}


def statistic(rec: dict[str, Any], name: str, where: str = "train") -> float | None:
    """The pair's statistic in one arm's record: a check's value, or the truncation rate."""
    if name == "truncation_rate":
        return rec["truncation_rate"] if where == "train" else rec["held_out_truncation_rate"]
    entry = rec[where].get(name)
    return None if entry is None else entry["value"]


def _median(xs: list[float | None]) -> float | None:
    xs = [x for x in xs if x is not None]
    return median(xs) if xs else None


def summarise(pair: str, runs: dict[tuple[str, int], dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    """Medians over `seeds` of the pair's statistic, fired counts and held-out success, per side."""
    spec = PAIRS[pair]
    out: dict[str, Any] = {"pair": pair, **spec}
    for side in ("without", "with"):
        recs = [runs[(spec[side], s)] for s in seeds]
        out[side] = {
            "arm": spec[side],
            "statistic_train": _median([statistic(r, spec["statistic"]) for r in recs]),
            "statistic_train_per_seed": [statistic(r, spec["statistic"]) for r in recs],
            "statistic_held_out": _median([statistic(r, spec["statistic"], "held_out") for r in recs]),
            "statistic_per_step": [r.get("diagnose_per_step", {}).get(spec["statistic"]) for r in recs],
            "fired": sum(spec["finding"] in r["fired"] for r in recs),
            "success_before": _median([r["success_before"] for r in recs]),
            "success_after": _median([r["success_after"] for r in recs]),
            "success_after_per_seed": [r["success_after"] for r in recs],
            "seeds": len(recs),
        }
        if pair == "dynamic_sampling":
            out[side]["flat_share_rolled_out"] = _median([_median(r["dynamic_zero_variance_rate"]) for r in recs])
        if pair == "overlong_penalty":
            out[side]["truncation_surge"] = _median([statistic(r, "truncation-surge") for r in recs])
    return out


#: What "n/m" in the table means.
NOT_MEASURED = ("n/m: not measured, the check had fewer than doctor.min_samples units to judge (e.g. no "
                "rewarded turn for parse-from-incidental-span)")


def _fmt(x: float | None) -> str:
    return "n/m" if x is None else f"{x:.2f}"


def table(summaries: list[dict[str, Any]]) -> str:
    """Markdown: one row per pair."""
    lines = ["| remedy | finding (statistic) | without | with | runs it fired in, without -> with | "
             "held-out success without | with |", "|---|---|---|---|---|---|---|"]
    for s in summaries:
        stat = s["statistic"] if s["statistic"] != s["finding"] else "its value"
        if s["statistic"] == "truncation_rate":
            stat = "share of replies cut at max_tokens"
        n = s["without"]["seeds"]
        lines.append(f"| `{s['remedy']}` | {s['finding']} ({stat}) | {_fmt(s['without']['statistic_train'])} | "
                     f"{_fmt(s['with']['statistic_train'])} | {s['without']['fired']}/{n} -> {s['with']['fired']}/{n} | "
                     f"{_fmt(s['without']['success_after'])} | {_fmt(s['with']['success_after'])} |")
    return "\n".join(lines)


def verdicts(summaries: list[dict[str, Any]]) -> list[str]:
    """One sentence per pair: removed or not, with the numbers."""
    out = []
    for s in summaries:
        w, r = s["without"], s["with"]
        gone = r["fired"] == 0 and w["fired"] > 0
        a, b = _fmt(w["statistic_train"]), _fmt(r["statistic_train"])
        if s["statistic"] != s["finding"]:
            a = f"{s['statistic']} {a}"
        if gone:
            what = f"removed it: {a} -> {b}, fired in {w['fired']} of {w['seeds']} runs without, none with"
        elif w["fired"] == 0:
            what = f"nothing to remove: the finding did not fire without the remedy ({a}; with: {b})"
        else:
            what = (f"did NOT remove it: {a} -> {b}, fired in {w['fired']} of {w['seeds']} runs without "
                    f"and {r['fired']} of {r['seeds']} with")
        out.append(f"{s['remedy']} vs {s['finding']}: {what}; held-out success {_fmt(w['success_after'])} -> "
                   f"{_fmt(r['success_after'])}")
    return out


def results(args: argparse.Namespace, argv: list[str] | None, pairs: list[str], seeds: list[int],
            runs: dict[tuple[str, int], dict[str, Any]], started: datetime.datetime, load_start: float,
            wall: float) -> dict[str, Any]:
    """The results file's content for the runs of `seeds`."""
    n = counts()
    summaries = [summarise(pair, runs, seeds) for pair in pairs]
    first = next(iter(runs.values()))
    recs = [dict(r) for (arm, seed), r in runs.items() if seed in seeds]
    if not args.keep_runs:
        for r in recs:
            r.pop("run_dir", None)
    return {
        "date": started.strftime("%Y-%m-%d %H:%M UTC"),
        "command": " ".join(["python", "benchmarks/remedies.py", *(argv if argv is not None else sys.argv[1:])]),
        "machine": machine(), "dtype": first["model"]["dtype"], "device": first["model"]["device"],
        "model": args.model, "load_start": load_start, "load_now": load(),
        "mean_run_load": round(sum(r["load"] for r in recs) / len(recs), 2),
        "wall_minutes": round((time.perf_counter() - wall) / 60, 1),
        "setting": {"env": "guess_number 1..8, 4 guesses (workbench.cli.demo.demo_config)", "rl_steps": args.rl_steps,
                    "batch_size": n["batch_size"], "group_size": n["group_size"], "learning_rate": 5e-4,
                    "eval": f"{n['eval_episodes']} held-out seeds 10000.., greedy", "seeds": seeds,
                    "smoke": os.environ.get("WORKBENCH_SMOKE") == "1"},
        "pairs": summaries, "verdicts": verdicts(summaries), "runs": recs,
    }


def record_from_folder(arm: str, seed: int, folder: Path) -> dict[str, Any]:
    """`run_arm`'s record rebuilt from a kept run folder (a run whose round did not finish):
    the doctor's checks on the reopened steps and held-out batches, the metrics and
    evals.json. No timing or load (None): those were not written down."""
    from workbench.debug.doctor import diagnose
    from workbench.debug.runs import load_run
    from workbench.doctor.checks import run_checks
    from workbench.doctor.findings import History

    run = load_run(folder)
    cfg = run.config
    rows = [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines() if line.strip()]
    rl = [m for m in rows if "reward/mean" in m]
    history = History(source="train", metrics=rows)
    for step in run.steps:
        history.add(run.batch(step), step)
    evals = json.loads((folder / "evals.json").read_text())
    after = run.eval_batch(evals[-1]["step"])
    held = History(source="eval")
    held.add(after, evals[-1]["step"])
    found = diagnose(run)
    return {
        "arm": arm, "seed": seed, "overrides": ARMS[arm], "seconds": None, "load": None,
        "steps": evals[-1]["step"], "rl_steps": len(rl),
        "success_before": evals[0]["eval/success_rate"], "success_after": evals[-1]["eval/success_rate"],
        "success_after_sft": next((e["eval/success_rate"] for e in evals if cfg.sft.steps and e["step"] == cfg.sft.steps),
                                  None),
        "fired": sorted({f.name for f in found}), "fired_held_out": sorted({f.name for f in found if f.source == "eval"}),
        "train": {f.name: {"value": f.value, "fired": f.fired} for f in run_checks(history, cfg.doctor)},
        "held_out": {f.name: {"value": f.value, "fired": f.fired} for f in run_checks(
            held, cfg.doctor, ["parse-from-incidental-span", "format-errors", "repetition-to-limit"])},
        "truncation_rate": history.stats[-1].truncation_rate if history.stats else None,
        "held_out_truncation_rate": held.stats[-1].truncation_rate,
        "train_success": [m["env/success_rate"] for m in rl], "train_reward": [m["reward/mean"] for m in rl],
        "sft_nll": [m["sft/nll"] for m in rows if "sft/nll" in m],
        "dynamic_zero_variance_rate": [m["rollout/dynamic_zero_variance_rate"] for m in rl
                                       if "rollout/dynamic_zero_variance_rate" in m],
        "dynamic_bound_reached": [m["rollout/dynamic_bound_reached"] for m in rl
                                  if "rollout/dynamic_bound_reached" in m],
        "diagnose_per_step": per_step(rl),
        "first_replies_after": [ep.turns[0].action for ep in list(after)[:4] if ep.turns],
        "run_dir": str(folder), "from_folder": True,
        "model": {"name": cfg.model.model_name, "device": str(cfg.model.resolved_device()),
                  "dtype": str(cfg.model.resolved_dtype()).removeprefix("torch.")},
    }


def resummarise(path: Path, runs_dir: Path | None = None) -> int:
    """Recompute `pairs` and `verdicts` of a results file from its `runs` (every check's
    value is stored per run, so a pair added to `PAIRS` over arms already run needs no run);
    where a run's folder was kept, its fired findings are re-read with `diagnose(folder)`."""
    from workbench.debug.doctor import diagnose

    result = json.loads(path.read_text())
    for r in result["runs"]:  # kept run folders (--keep-runs): the doctor's findings with the current checks
        if r.get("run_dir") and Path(r["run_dir"]).is_dir():
            found = diagnose(r["run_dir"])
            r["fired"] = sorted({f.name for f in found})
            r["fired_held_out"] = sorted({f.name for f in found if f.source == "eval"})
            r["rediagnosed"] = True
            rows = [json.loads(line) for line in (Path(r["run_dir"]) / "metrics.jsonl").read_text().splitlines()
                    if line.strip()]
            r["diagnose_per_step"] = per_step([m for m in rows if "reward/mean" in m])
    runs = {(r["arm"], r["seed"]): r for r in result["runs"]}
    for folder in sorted(runs_dir.iterdir()) if runs_dir and runs_dir.is_dir() else []:
        # Finished runs of an unfinished round (evals.json is written at a run's end).
        arm = next((a for a in ARMS if folder.name.rsplit("_seed", 1)[0] == a.replace("+", "_")), None)
        if arm and (folder / "evals.json").exists() and folder.name.rsplit("_seed", 1)[1].isdigit():
            seed = int(folder.name.rsplit("_seed", 1)[1])
            if (arm, seed) not in runs:
                runs[(arm, seed)] = record_from_folder(arm, seed, folder)
                result["runs"].append(runs[(arm, seed)])
    seeds = sorted({seed for _, seed in runs})
    result["pairs"] = []
    for p in PAIRS:  # each pair over the seeds both its arms finished
        both = [s for s in seeds if all((PAIRS[p][side], s) in runs for side in ("without", "with"))]
        if both:
            result["pairs"].append({**summarise(p, runs, both), "seeds": both})
    result["verdicts"] = verdicts(result["pairs"])
    result["resummarised"] = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    path.write_text(json.dumps(result, indent=1))
    print(table(result["pairs"]))
    print(NOT_MEASURED)
    print("\n".join(result["verdicts"]))
    return 0


def main(argv: list[str] | None = None) -> int:
    from workbench.config import EMBEDDED_MODEL

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--pairs", default=",".join(PAIRS), help=f"comma-separated, of {', '.join(PAIRS)}")
    p.add_argument("--seeds", default="0,1", help="training seeds (training.seed), comma-separated")
    p.add_argument("--rl-steps", type=int, default=None, help=f"RL steps per run (default {FULL['rl_steps']})")
    p.add_argument("--model", default=EMBEDDED_MODEL)
    p.add_argument("--device", default="auto", help='model.device: "auto" (CUDA when available, else CPU), "cpu", ...')
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"],
                   help='model.dtype: "auto" is bfloat16 on CUDA and on CPUs with bf16 instructions, else float32')
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=str(RESULTS / "remedies.json"))
    p.add_argument("--keep-runs", default=None, help="keep the run folders here (default: a temporary folder)")
    p.add_argument("--resummarise", action="store_true",
                   help="run nothing: recompute the pairs and verdicts of --out from its stored runs, adding "
                        "the finished runs in --keep-runs that it lacks")
    args = p.parse_args(argv)
    if args.resummarise:
        return resummarise(Path(args.out), Path(args.keep_runs) if args.keep_runs else None)
    import torch

    torch.set_num_threads(args.threads)
    args.rl_steps = args.rl_steps or counts()["rl_steps"]
    pairs = [x.strip() for x in args.pairs.split(",") if x.strip()]
    unknown = [x for x in pairs if x not in PAIRS]
    if unknown:
        p.error(f"unknown pair(s) {unknown}; choose from {list(PAIRS)}")
    seeds = [int(s) for s in args.seeds.split(",")]
    work = Path(args.keep_runs) if args.keep_runs else Path(tempfile.mkdtemp(prefix="remedies_"))
    started = datetime.datetime.now(datetime.timezone.utc)
    load_start, wall = load(), time.perf_counter()
    runs: dict[tuple[str, int], dict[str, Any]] = {}
    out = Path(args.out)
    try:
        # Seeds outer: after each seed the results so far are written, so a cut-short
        # benchmark still leaves every pair measured on the seeds it finished.
        for i, seed in enumerate(seeds):
            for pair in pairs:
                for side in ("without", "with"):
                    arm = PAIRS[pair][side]
                    if (arm, seed) not in runs:
                        print(f"== {pair}: {arm}, seed {seed} (load {load()}) ==", flush=True)
                        runs[(arm, seed)] = run_arm(args, arm, seed, work)
            result = results(args, argv, pairs, seeds[:i + 1], runs, started, load_start, wall)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(json.dumps(result, indent=1))
    finally:
        if not args.keep_runs:
            shutil.rmtree(work, ignore_errors=True)
    summaries = result["pairs"]
    print(f"\nremedies on {args.model} ({result['dtype']}, {result['machine']['cpu']}), "
          f"{args.rl_steps} RL steps, medians over training seeds {seeds}; load {load_start} -> {load()}:")
    print(table(summaries))
    print(NOT_MEASURED)
    print("\n".join(verdicts(summaries)))
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    run_main(main)  # with glibc's MALLOC_ENV (benchmarks/_common.py): 7 runs in one process
