"""Re-run notebooks and store the outputs that `pytest --nbval-lax` checks.

    python notebooks/refresh_outputs.py 04_reward_tuning      # one notebook (name or path)
    python notebooks/refresh_outputs.py                       # all but browser_demo

Each notebook is a Jupytext pair (see jupytext.toml): the .py is read as the source (so
edit it, or the notebook in Jupyter, first), run with nbclient under WORKBENCH_SMOKE=1,
and written back as the pair. Only cells whose first line is `# NBVAL_CHECK_OUTPUT` keep
their outputs (with their code-cell number as execution count, as nbval wants);
widgets and other outputs are dropped, so the .ipynb stays small and reviewable.

The notebooks in FULL_OUTPUTS have prose about the numbers of a real run: they run in full
mode (no WORKBENCH_SMOKE: the embedded model, several minutes) and keep every cell's text
output (stdout, text/plain, text/markdown, text/html; no stderr, widgets or images). nbval
then checks only their `# NBVAL_CHECK_OUTPUT` cells, whose output is the same in both modes.
"""
from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import jupytext
from nbclient import NotebookClient

HERE = Path(__file__).resolve().parent
CHECK = "# NBVAL_CHECK_OUTPUT"
NOT_EXECUTED = {"browser_demo"}  # run by tests/test_browser.py instead
FULL_OUTPUTS = {"09_finding_to_fix", "10_judges"}  # stored outputs from full mode (see the module docstring)
TEXT = ("text/plain", "text/markdown", "text/html")
#: The kernel every notebook names (ipykernel's own spec, the one `make install` puts in the venv).
KERNELSPEC = {"display_name": "Python 3 (ipykernel)", "language": "python", "name": "python3"}


def text_outputs(outputs: list) -> list:
    """The outputs a reader of the stored notebook needs: stdout, and the text forms of results
    that are not widgets (and not empty: a progress bar's updates leave empty displays)."""
    kept = []
    for out in outputs:
        if out.get("output_type") == "stream":
            if out.get("name") == "stdout":
                kept.append(out)
        elif out.get("output_type") in ("execute_result", "display_data"):
            data = out.get("data", {})
            if "application/vnd.jupyter.widget-view+json" not in data and any("".join(data.get(k, "")).strip()
                                                                                  for k in TEXT):
                out["data"] = {k: v for k, v in data.items() if k in TEXT}
                out["metadata"] = {}
                kept.append(out)
        elif out.get("output_type") == "error":
            kept.append(out)
    return kept


def keep_checked_outputs(nb, full: bool = False) -> None:
    number = 0
    for cell in nb.cells:
        if cell.cell_type != "code":
            continue
        number += 1
        if full:
            cell.outputs = text_outputs(cell.outputs)
        elif not cell.source.startswith(CHECK):
            cell.outputs = []
        count = number if cell.get("outputs") else None
        cell.execution_count = count
        for out in cell.get("outputs", []):
            if "execution_count" in out:
                out["execution_count"] = count
        cell.metadata = {}
    nb.metadata.pop("widgets", None)


def refresh(name: str) -> None:
    py = HERE / f"{Path(name).stem}.py"
    nb = jupytext.read(py)
    full = py.stem in FULL_OUTPUTS
    if full:
        os.environ.pop("WORKBENCH_SMOKE", None)
    else:
        os.environ["WORKBENCH_SMOKE"] = "1"
    start = time.time()
    NotebookClient(nb, timeout=1200, kernel_name="python3", resources={"metadata": {"path": str(HERE)}}).execute()
    keep_checked_outputs(nb, full)
    nb.metadata["jupytext"] = {"formats": "ipynb,py:percent"}
    nb.metadata["kernelspec"] = dict(KERNELSPEC)  # JupyterLab opens it with this kernel, no dialog
    jupytext.write(nb, py.with_suffix(".ipynb"))
    print(f"{py.stem}: ran in {time.time() - start:.0f}s ({'full' if full else 'smoke'} mode), wrote {py.stem}.ipynb")


if __name__ == "__main__":
    names = sys.argv[1:] or sorted(p.stem for p in HERE.glob("*.ipynb") if p.stem not in NOT_EXECUTED)
    for n in names:
        refresh(n)
