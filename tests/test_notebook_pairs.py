"""Each tutorial notebook is a Jupytext pair: `notebooks/NAME.py` (percent format, the reviewed
source) and `notebooks/NAME.ipynb` (the same cells plus the outputs nbval checks).

The pair must agree cell by cell (type and source), so a change made on one side only (an edit
in a text editor without `jupytext --sync`, or in Jupyter without jupytext) fails here.
"""
from __future__ import annotations

from pathlib import Path

import pytest

jupytext = pytest.importorskip("jupytext")
nbformat = pytest.importorskip("nbformat")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
PAIRS = sorted(p.stem for p in NOTEBOOKS.glob("*.ipynb"))


def cells(nb) -> list[tuple[str, str]]:
    return [(c.cell_type, c.source.strip()) for c in nb.cells]


def first_difference(a: list, b: list) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"cell {i}: ipynb {x[0]} {x[1][:200]!r}\n        py    {y[0]} {y[1][:200]!r}"
    return f"cell count: ipynb {len(a)}, py {len(b)}"


def test_every_notebook_has_its_pair():
    ipynb = {p.stem for p in NOTEBOOKS.glob("*.ipynb")}
    py = {p.stem for p in NOTEBOOKS.glob("*.py") if "\n# %%" in "\n" + p.read_text()}  # not helper scripts
    assert ipynb, "no notebooks found"
    assert ipynb == py, f"unpaired: only .ipynb {sorted(ipynb - py)}, only .py {sorted(py - ipynb)}"


@pytest.mark.parametrize("name", PAIRS)
def test_pair_has_same_cells(name):
    ipynb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    py = jupytext.read(NOTEBOOKS / f"{name}.py")
    a, b = cells(ipynb), cells(py)
    assert a == b, f"{name}.ipynb and {name}.py differ; run `jupytext --sync notebooks/{name}.py`\n  " + \
        first_difference(a, b)


@pytest.mark.parametrize("name", PAIRS)
def test_pair_is_declared(name):
    """Jupyter (with jupytext) saves both files only when the notebook says it is paired."""
    ipynb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert ipynb.metadata.get("jupytext", {}).get("formats") == "ipynb,py:percent"


def test_pairing_config_applies_to_the_folder():
    from jupytext.config import find_jupytext_configuration_file, load_jupytext_configuration_file

    path = find_jupytext_configuration_file(str(NOTEBOOKS))
    assert path is not None and Path(path).parent == NOTEBOOKS
    formats = load_jupytext_configuration_file(path).formats
    assert formats in ("ipynb,py:percent", ["ipynb,py:percent"])


def test_a_one_sided_edit_is_caught(tmp_path):
    """The comparison above can fail: edit one cell of the .py only and it reports that cell."""
    name = PAIRS[0]
    py = jupytext.read(NOTEBOOKS / f"{name}.py")
    code = next(i for i, c in enumerate(py.cells) if c.cell_type == "code")
    py.cells[code].source += "\nprint('edited in the .py only')"
    ipynb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    assert cells(ipynb) != cells(py)
    assert first_difference(cells(ipynb), cells(py)).startswith(f"cell {code}:")


@pytest.mark.parametrize("name", PAIRS)
def test_notebook_names_its_kernel(name):
    """Without a kernelspec JupyterLab asks which kernel to start; with ipykernel's "python3"
    it starts the one `make install` put in the venv."""
    ipynb = nbformat.read(NOTEBOOKS / f"{name}.ipynb", as_version=4)
    spec = ipynb.metadata.get("kernelspec", {})
    assert spec.get("name") == "python3" and spec.get("language") == "python", spec
