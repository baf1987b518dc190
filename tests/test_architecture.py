"""The layers of docs/architecture.md hold: no import cycle between modules, and every
import (lazy ones included) points to the same layer or one below it."""
from __future__ import annotations

import ast
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "workbench"

#: Lowest first: (layer, module prefixes). docs/architecture.md has the same table.
LAYERS: list[tuple[str, tuple[str, ...]]] = [
    ("algo", ("workbench.algo",)),
    ("utils", ("workbench.utils", "workbench._moved")),
    ("trajectory", ("workbench.trajectory", "workbench.trajectory_files", "workbench.trajectory_views")),
    ("doctor", ("workbench.doctor",)),
    ("config", ("workbench.config",)),
    ("parts", ("workbench.environments", "workbench.tools", "workbench.engines", "workbench.models", "workbench.data")),
    ("rollout", ("workbench.rollout", "workbench.reward", "workbench.gateway")),
    ("training", ("workbench.training",)),
    ("distributed", ("workbench.distributed",)),
    ("debug", ("workbench.debug", "workbench.importers")),
    ("widgets", ("workbench.widgets",)),
    ("compat", ("workbench.compat", "workbench.integrations")),
    ("app", ("workbench.cli", "workbench.__main__")),
]


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


MODULES = {module_name(p): p for p in PACKAGE.rglob("*.py")}


def layer_of(module: str) -> int:
    for i, (_, prefixes) in enumerate(LAYERS):
        if any(module == p or module.startswith(p + ".") for p in prefixes):
            return i
    raise AssertionError(f"{module} is in no layer: add it to LAYERS here and in docs/architecture.md")


def owner(name: str) -> str | None:
    """The module of the package that `name` (a module or module.attribute) lives in."""
    while name and name not in MODULES:
        name = name.rpartition(".")[0]
    return name or None


def imports_of(module: str) -> set[str]:
    """Modules of the package that `module` imports, anywhere in its body."""
    path = MODULES[module]
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([base] if base else []))
            names = [base] + [f"{base}.{a.name}" for a in node.names]
        for name in names:
            target = owner(name)
            if target and target != module and target != "workbench":
                out.add(target)
            if name == "envs" or name.startswith("envs."):
                out.add("envs")
    return out


GRAPH = {m: imports_of(m) for m in MODULES}


def test_every_module_has_a_layer_and_imports_only_downwards():
    wrong = []
    for module, targets in sorted(GRAPH.items()):
        if module == "workbench":
            continue  # the package root re-exports names from every layer
        for target in sorted(targets):
            if target == "envs":
                wrong.append(f"{module} imports the example package envs")
            elif not module.startswith(target + ".") and layer_of(target) > layer_of(module):
                wrong.append(f"{module} ({LAYERS[layer_of(module)][0]}) imports {target} "
                             f"({LAYERS[layer_of(target)][0]})")
    assert not wrong, "imports against the layer order:\n" + "\n".join(wrong)


def test_no_import_cycles():
    graph = {m: {t for t in ts if t != "envs" and not m.startswith(t + ".")} for m, ts in GRAPH.items()}
    state: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(m: str) -> None:
        state[m] = 1
        stack.append(m)
        for t in sorted(graph[m]):
            if state.get(t) == 1:
                cycles.append(" -> ".join(stack[stack.index(t):] + [t]))
            elif t not in state:
                visit(t)
        stack.pop()
        state[m] = 2

    for m in sorted(graph):
        if m not in state:
            visit(m)
    assert not cycles, "import cycles:\n" + "\n".join(cycles)


def test_the_checker_fails_on_an_upward_import(tmp_path, monkeypatch):
    """The two checks above can fail: an upward arrow planted in a copy is caught."""
    module = "workbench.trajectory"
    planted = {**GRAPH, module: GRAPH[module] | {"workbench.cli"}}
    monkeypatch.setattr(sys.modules[__name__], "GRAPH", planted)
    with pytest.raises(AssertionError, match=r"workbench.trajectory \(trajectory\) imports workbench.cli \(app\)"):
        test_every_module_has_a_layer_and_imports_only_downwards()
    planted = {**GRAPH, "workbench.config": GRAPH["workbench.config"] | {"workbench.environments.base"}}
    monkeypatch.setattr(sys.modules[__name__], "GRAPH", planted)
    with pytest.raises(AssertionError, match="import cycles"):
        test_no_import_cycles()


def test_architecture_doc_lists_the_same_layers():
    text = (ROOT / "docs" / "architecture.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (\w+) \| (.+?) \|", text, flags=re.M)
    documented = [(name, tuple(sorted(m.strip(" `") for m in mods.split(",")))) for _, name, mods in rows]
    assert documented == [(name, tuple(sorted(p.removeprefix("workbench.") for p in prefixes)))
                          for name, prefixes in LAYERS]


def test_import_workbench_is_cheap_and_sets_nothing():
    code = ("import os, sys; before = dict(os.environ); import workbench; "
            "assert dict(os.environ) == before, 'import changed the environment'; "
            "heavy = [m for m in ('torch', 'transformers', 'ray', 'vllm', 'envs') if m in sys.modules]; "
            "assert not heavy, heavy; from workbench import Trainer, DataProto, RayPPOTrainer; "
            "assert 'os' not in workbench.__all__ and 'Trainer' in workbench.__all__; "
            "import workbench.verl_config as old; from workbench.compat import verl_config as new; assert old is new")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
