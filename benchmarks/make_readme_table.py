"""Print the benchmark results in `benchmarks/results/*.json` as markdown tables (for the README).

    python benchmarks/make_readme_table.py [results_dir]

One section per file, in file-name order. A results file may carry:

  * "title" (or "benchmark"): the section heading;
  * "command": shown under the heading;
  * "machine": one line (cpus, threads, load average, versions);
  * "rows": a list of flat dicts -> one table, columns in first-seen key order;
  * "per_turn" tables inside "results"/<backend>/"modes"/<mode> (benchmarks/engines.py)
    -> a per-turn table;
  * "ratios_vllm_over_hf_tokens_per_s" (or any other top-level flat dict of numbers): a
    short list.

A file without "rows" is shown as a two-column table of its scalar values (nested keys
joined with dots), so any benchmark's JSON renders without special casing.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results"


def _fmt(value: Any) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        if value != value:  # nan
            return "-"
        if abs(value) >= 100:
            return f"{value:,.0f}"
        if abs(value) >= 10:
            return f"{value:.1f}"
        return f"{value:.3g}"
    if isinstance(value, int):
        return f"{value:,}"
    if value is None:
        return "-"
    return str(value).replace("|", "\\|")


def table(rows: list[dict[str, Any]]) -> str:
    """Markdown table of flat dicts (columns in first-seen order; missing cells are '-')."""
    columns: list[str] = []
    for row in rows:
        for key in row:
            if key not in columns and not isinstance(row[key], (dict, list)):
                columns.append(key)
    lines = ["| " + " | ".join(columns) + " |", "|" + "|".join("---" for _ in columns) + "|"]
    for row in rows:
        lines.append("| " + " | ".join(_fmt(row.get(c)) for c in columns) + " |")
    return "\n".join(lines)


def _flatten(data: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(data, dict):
        for k, v in data.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    elif isinstance(data, list):
        if all(not isinstance(v, (dict, list)) for v in data):
            out[prefix[:-1]] = ", ".join(_fmt(v) for v in data)
    else:
        out[prefix[:-1]] = data
    return out


def _machine_line(machine: dict[str, Any]) -> str:
    parts = []
    names = {"cpus": "CPUs", "torch_threads": "torch threads", "load_average_before": "load before",
             "load_average_after": "load after"}
    for key, value in machine.items():
        if not isinstance(value, (dict, list)):
            parts.append(f"{names.get(key, key)} {_fmt(value)}")
    return "Machine: " + ", ".join(parts)


def _per_turn_tables(results: dict[str, Any]) -> list[str]:
    out = []
    for backend, entry in results.items():
        if not isinstance(entry, dict):
            continue
        for mode, r in (entry.get("modes") or {}).items():
            rows = r.get("per_turn") if isinstance(r, dict) else None
            if rows:
                out.append(f"Per turn, {backend} / {r.get('rollout', mode)}:\n\n" + table(rows))
    return out


def section(path: Path) -> str:
    data = json.loads(path.read_text())
    if not isinstance(data, dict):
        return f"### {path.stem}\n\n" + table(data) if isinstance(data, list) else f"### {path.stem}\n\n{data}"
    title = data.get("title") or data.get("benchmark") or path.stem
    parts = [f"### {title}"]
    if data.get("command"):
        parts.append(f"`{data['command']}`")
    if isinstance(data.get("machine"), dict):
        parts.append(_machine_line(data["machine"]))
    if isinstance(data.get("rows"), list) and data["rows"]:
        parts.append(table(data["rows"]))
        if isinstance(data.get("results"), dict):
            parts.extend(_per_turn_tables(data["results"]))
        for key, value in data.items():
            if key.startswith("ratio") and isinstance(value, dict) and value:
                parts.append("\n".join(f"- {key.replace('_', ' ')} ({k}): **{_fmt(v)}x**" for k, v in value.items()))
    else:
        flat = {k: v for k, v in _flatten({k: v for k, v in data.items()
                                          if k not in ("title", "command", "machine")}).items()}
        parts.append(table([{"metric": k, "value": v} for k, v in flat.items()]))
    return "\n\n".join(parts)


def main(argv: list[str]) -> None:
    folder = Path(argv[1]) if len(argv) > 1 else RESULTS
    files = sorted(folder.glob("*.json"))
    if not files:
        print(f"no results in {folder}; run the benchmarks first")
        return
    print("\n\n".join(section(p) for p in files))


if __name__ == "__main__":
    main(sys.argv)
