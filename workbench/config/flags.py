"""Command-line flags generated from the config dataclasses: one `--SECTION.FIELD` flag per
field of every `ConfigStore` section, with the field's type and docstring as its help, so a
new config field gets a flag with no extra code.

    python -m workbench train --training.entropy_coeff 0.01 --inference.stop '["\\n"]'

A value is read as YAML (`0.01` -> float, `true` -> bool, `null` -> None, `[a, b]` -> a
list) and then checked like any config value (`ConfigStore.update` + `validate`: an error
names the field). A flag not given leaves the field as `--config` (or the defaults) set it.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import inspect
from functools import lru_cache
from typing import Any

import yaml

from workbench.config import SECTIONS, ConfigError, ConfigStore
from workbench.config.checks import _describe, _field_types

#: argparse dest prefix of the generated flags.
PREFIX = "cfg:"


@lru_cache(maxsize=None)
def field_docs(cls: type) -> dict[str, str]:
    """Field name -> the docstring written under the field in the dataclass's source."""
    tree = ast.parse(inspect.getsource(cls))
    body = tree.body[0].body  # type: ignore[attr-defined]
    docs: dict[str, str] = {}
    for node, after in zip(body, body[1:]):
        if (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) and isinstance(after, ast.Expr)
                and isinstance(after.value, ast.Constant) and isinstance(after.value.value, str)):
            docs[node.target.id] = " ".join(after.value.value.split())
    return docs


def add_config_flags(parser: argparse.ArgumentParser, sections: tuple[str, ...] | None = None) -> None:
    """One `--SECTION.FIELD` flag per config field, grouped by section (every section, or
    the ones named in `sections`)."""
    for section, cls in SECTIONS.items():
        if sections is not None and section not in sections:
            continue
        group = parser.add_argument_group(f"{section} settings (--{section}.FIELD VALUE, read as YAML)")
        docs = field_docs(cls)
        for f in dataclasses.fields(cls):
            hint = _describe(_field_types(cls)[f.name])
            group.add_argument(f"--{section}.{f.name}", dest=f"{PREFIX}{section}.{f.name}", metavar="VALUE",
                               default=argparse.SUPPRESS,
                               help=f"{docs.get(f.name, '')} [{hint}]".replace("%", "%%"))


def given_config_flags(args: argparse.Namespace) -> dict[str, dict[str, Any]]:
    """The generated flags given on the command line: {section: {field: value read as YAML}}."""
    out: dict[str, dict[str, Any]] = {}
    for dest, raw in vars(args).items():
        if not dest.startswith(PREFIX):
            continue
        section, _, name = dest[len(PREFIX):].partition(".")
        try:
            value = yaml.safe_load(raw) if raw.strip() else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"--{section}.{name} {raw!r} is not valid YAML: {exc}") from exc
        out.setdefault(section, {})[name] = value
    return out


def apply_config_flags(config: ConfigStore, args: argparse.Namespace) -> ConfigStore:
    """Set every generated flag given in `args` on `config` (validated by the caller)."""
    for section, values in given_config_flags(args).items():
        config.update(section, values)
    return config


__all__ = ["add_config_flags", "apply_config_flags", "field_docs", "given_config_flags"]
