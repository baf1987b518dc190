"""Settings objects that refuse a misspelled field: `ConfigError` and `StrictFields`.

A config section is a dataclass; Python lets `c.training.lr = 1e-3` add an attribute that
nothing reads, so the run trains at the default learning rate while the notebook says
otherwise (the same key in YAML was already refused). A dataclass that also derives from
`StrictFields` raises `UnknownFieldError` at the assignment instead, naming the nearest
field, as `ConfigStore.update` does for YAML keys and flags:

    c.training.lr = 1e-3
    UnknownFieldError: training.lr is not a setting; did you mean training.learning_rate? ...

Names starting with "_" (private state) and class-level properties with a setter stay
assignable. `ConfigError` lives here, below every layer that checks settings (the doctor's
thresholds sit below the config), and is re-exported by `workbench.config` as the same class.
"""
from __future__ import annotations

import dataclasses
import difflib
import functools
from typing import Any, ClassVar, Iterable

__all__ = ["ConfigError", "StrictFields", "UnknownFieldError", "unknown_field_message"]


class ConfigError(ValueError):
    """A configuration value is invalid; the message names the field."""


class UnknownFieldError(ConfigError, AttributeError):
    """A setting that does not exist was assigned or given (a misspelled field)."""


def unknown_field_message(section: str, name: str, valid: Iterable[str]) -> str:
    """"unknown field training.lr; did you mean training.learning_rate? valid fields of training: [...]"."""
    valid = sorted(valid)
    where = f"{section}." if section else ""
    near = difflib.get_close_matches(name, valid, n=1, cutoff=0.5)
    if not near:  # "lr" for "learning_rate": an abbreviation of a field's words
        initials = {"".join(w[0] for w in v.split("_") if w): v for v in valid}
        near = [initials[name]] if name in initials else [v for v in valid if v.startswith(name)][:1]
    hint = f"; did you mean {where}{near[0]}?" if near else ""
    what = f"valid fields of {section}" if section else "config sections"
    return f"unknown field {where}{name}{hint} ({what}: {', '.join(valid)})"


class StrictFields:
    """Mixin for a settings dataclass: assigning an attribute that is not one of its fields
    raises `UnknownFieldError` (see the module docstring). The class keyword `section` names
    the section in the message: `class TrainingConfig(StrictFields, section="training")` ->
    "training.lr"."""

    SECTION: ClassVar[str] = ""

    def __init_subclass__(cls, section: str = "", **kwargs: Any) -> None:
        super().__init_subclass__(**kwargs)
        cls.SECTION = section

    def __setattr__(self, name: str, value: Any) -> None:
        cls = type(self)
        fields = _field_names(cls)
        if name in fields or name.startswith("_") or hasattr(getattr(cls, name, None), "__set__"):
            object.__setattr__(self, name, value)
            return
        raise UnknownFieldError(unknown_field_message(cls.SECTION, name, fields))


@functools.lru_cache(maxsize=None)
def _field_names(cls: type) -> frozenset[str]:
    """The dataclass fields of `cls` (its ClassVars, such as SECTION, are not fields)."""
    return frozenset(f.name for f in dataclasses.fields(cls)) if dataclasses.is_dataclass(cls) else frozenset()
