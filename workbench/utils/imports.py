"""Import by path: `module:attr` strings to objects and back.

    import_object("envs.grid:GridEnv")     # the class
    import_path(GridEnv)                   # "envs.grid:GridEnv"

The environment registry, the adapters (reward functions given as "module:function")
and checkpoints (the environment class a run used) all name objects this way.
"""
from __future__ import annotations

import importlib
from typing import Any


class EnvNotFoundError(ValueError):
    """A spec names no environment (or no importable object); the message says what to fix."""


def import_path(obj: Any) -> str:
    """`module:qualname` of a class or function (what `import_object` reads back)."""
    return f"{obj.__module__}:{obj.__qualname__}"


def import_object(path: str) -> Any:
    """Import `module:attr` (attr may be dotted, `module:Outer.Inner`).

    Raises:
        EnvNotFoundError: the module cannot be imported (or calls `sys.exit` while it is
            imported) or has no such attribute; the message says which part is wrong.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise EnvNotFoundError(f"{path!r} is not an import path; write it as module:Class")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise EnvNotFoundError(
            f"cannot import module {module_name!r} (from {path!r}): {exc}. Run from the folder that "
            f"holds it, add that folder to PYTHONPATH, or pip install the package that provides it."
        ) from exc
    except SystemExit as exc:  # a script's sys.exit() at import would end the caller silently
        raise EnvNotFoundError(
            f"importing module {module_name!r} (from {path!r}) called sys.exit({exc.code!r}); a module that "
            "provides an environment must not exit when imported: put its script part under "
            "`if __name__ == \"__main__\":`") from None
    obj: Any = module
    for part in attr.split("."):
        if not hasattr(obj, part):
            classes = sorted(n for n, v in vars(module).items() if isinstance(v, type) and not n.startswith("_")
                             and hasattr(v, "reset") and hasattr(v, "step"))
            raise EnvNotFoundError(f"module {module_name!r} has no attribute {attr!r}; environment classes "
                                   f"in it: {classes or 'none'}")
        obj = getattr(obj, part)
    return obj
