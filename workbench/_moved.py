"""Old module paths that still import: each moved module's old dotted name is the module
at its new one, the same object (`import workbench.config_checks` is `workbench.config.checks`).

User code, saved notebooks and run folders name modules by path: a run's config.yaml records
its environment as `module:Class` (`environment.name`, `environment.import_path`), and a
`--env` spec or a `VerifierEnvironment`'s functions are "module:function" strings. Those keep
working after a module moves: `install()` (called by `workbench/__init__.py`) puts a finder
first on `sys.meta_path` that answers an old name (or a submodule of an old package) with the
new module, and `python -m` of an old path runs the new module. `current_path` rewrites such a
string to the current path, for comparing what two runs recorded.

Imports nothing else of workbench (the utils layer, below everything but algo).
"""
from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
from typing import Any

#: Old dotted module -> new one. A package covers its submodules (`workbench.adapters.textarena`).
MOVED: dict[str, str] = {
    "workbench.seed_api": "workbench.compat.seed_api",
    "workbench.inference": "workbench.compat.inference",
    "workbench.verl_compat": "workbench.compat.verl_compat",
    "workbench.verl_config": "workbench.compat.verl_config",
    "workbench.verl_export": "workbench.compat.verl_export",
    "workbench.verl_runtime": "workbench.compat.verl_runtime",
    "workbench.config_checks": "workbench.config.checks",
    "workbench.cli_flags": "workbench.config.flags",
    "workbench.doctor_config": "workbench.doctor.thresholds",
    "workbench.doctor_findings": "workbench.doctor.findings",
    "workbench.doctor_checks": "workbench.doctor.checks",
    "workbench.environment": "workbench.environments.base",
    "workbench.env_registry": "workbench.environments.registry",
    "workbench.env_checker": "workbench.environments.checker",
    "workbench.overrides": "workbench.environments.params",
    "workbench.adapters": "workbench.environments.adapters",
    "workbench.gym_adapter": "workbench.environments.adapters.gym",
    "workbench.imports": "workbench.utils.imports",
    "workbench.timeouts": "workbench.utils.timeouts",
    "workbench.progress": "workbench.utils.progress",
    "workbench.demo": "workbench.cli.demo",
    "workbench.runner": "workbench.cli.runner",
    "workbench.reports": "workbench.cli.reports",
}


def new_name(name: str) -> str | None:
    """The current dotted name of an old module path, or None when `name` did not move."""
    head, rest = name, ""
    while head.startswith("workbench."):
        if head in MOVED:
            return MOVED[head] + rest
        head, _, tail = head.rpartition(".")
        rest = "." + tail + rest
    return None


def current_path(spec: str) -> str:
    """`spec` ("module:attr", a dotted module, or several of them joined by commas) with each
    moved module replaced by its current path; anything else unchanged."""
    if not isinstance(spec, str):
        return spec
    parts = []
    for part in spec.split(","):
        module, sep, attr = part.partition(":")
        moved = new_name(module.strip())
        parts.append(part if moved is None else part.replace(module.strip(), moved, 1))
    return ",".join(parts)


class MovedModuleFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Imports an old module path as the module at its new path (the same object)."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        name = new_name(fullname) if fullname.startswith("workbench.") else None
        if name is None:
            return None
        found = importlib.util.find_spec(name)
        if found is None:  # a submodule the new package does not have either
            return None
        return importlib.util.spec_from_loader(fullname, self, origin=found.origin)

    def create_module(self, spec: Any) -> Any:
        module = importlib.import_module(new_name(spec.name))
        spec.loader_state = module.__spec__  # importlib overwrites __spec__ with the alias's; put it back
        return module

    def exec_module(self, module: Any) -> None:
        module.__spec__ = module.__spec__.loader_state

    def get_code(self, fullname: str) -> Any:
        """The new module's code (what `python -m OLD.PATH` runs)."""
        name = new_name(fullname)
        return importlib.util.find_spec(name).loader.get_code(name)


def install() -> None:
    """Put the finder first on `sys.meta_path` (once), ahead of the path finder, which would
    otherwise load a submodule of an old package a second time under the old name."""
    if not any(isinstance(f, MovedModuleFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, MovedModuleFinder())
