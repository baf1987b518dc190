"""Every command, flag and path README.md (and docs/*.md) names exists.

* `python -m workbench SUB --flag ...`: SUB is a subcommand of the CLI's argparse parser
  (`workbench.cli.parse_args`) and each `--flag` one of SUB's options (the generated
  `--SECTION.FIELD` flags included);
* `python benchmarks/NAME.py --flag ...`: the script exists and its `--help` lists each flag;
* `make TARGET`: a target of the Makefile;
* a path under workbench/, envs/, tests/, benchmarks/, notebooks/, docs/ or .ci/ exists (a glob
  matches something), and `FILE.py::test_name` names a function of that file;
* a dotted `workbench.x.y` name is a module, or a name defined in one;
* every entry of the Files tree (docs/architecture.md) exists, and the tree lists every module under workbench/ and
  every benchmark script.

Placeholders in capitals (`--SECTION.FIELD`, `RUN`, `step_XXXXXX`) are not checked.
"""
from __future__ import annotations

import argparse
import functools
import glob
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
TOP = ("workbench/", "envs/", "tests/", "benchmarks/", "notebooks/", "docs/", ".ci/")


def fragments(text: str) -> list[str]:
    """Code the page shows: the lines of fenced blocks and the `inline spans` (joined across lines)."""
    out, inside = [], False
    prose = []
    for line in text.splitlines():
        if line.startswith("```"):
            inside = not inside
            continue
        (out if inside else prose).append(line)
    code_lines = [line.split("  #")[0] for line in out]  # a comment after code is prose
    spans = [m.group(1).replace("\n", " ") for m in re.finditer(r"`([^`]+)`", "\n".join(prose))]
    return code_lines + spans


FRAGS = [(page, f) for page in PAGES for f in fragments(page.read_text())]


class _Parsed(Exception):
    def __init__(self, parser):
        self.parser = parser


@functools.lru_cache(maxsize=1)
def cli_commands() -> dict[str, set[str]]:
    """{subcommand: its option strings}, read from the parser `workbench.cli.parse_args` builds."""
    from workbench import cli

    def capture(self, *args, **kwargs):
        raise _Parsed(self)

    original = argparse.ArgumentParser.parse_args
    argparse.ArgumentParser.parse_args = capture
    try:
        cli.parse_args(["train"])
    except _Parsed as got:
        parser = got.parser
    finally:
        argparse.ArgumentParser.parse_args = original
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return {name: set(p._option_string_actions) for name, p in sub.choices.items()}


@functools.lru_cache(maxsize=None)
def script_flags(script: str) -> str:
    proc = subprocess.run([sys.executable, script, "--help"], cwd=ROOT, capture_output=True, text=True,
                          timeout=300, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin",
                                            "HF_HUB_OFFLINE": "1", "OMP_WAIT_POLICY": "PASSIVE"})
    assert proc.returncode == 0, f"{script} --help failed:\n{proc.stderr[-3000:]}"
    return proc.stdout


def flags_in(command: str) -> list[str]:
    return [f.split("=")[0] for f in re.findall(r"(?<![\w-])(--[a-z][\w.-]*)", command)
            if not re.search(r"[A-Z]", f)]


def test_cli_commands_and_flags_exist():
    commands = cli_commands()
    seen = 0
    for page, frag in FRAGS:
        for m in re.finditer(r"python -m workbench ([a-z][\w-]*)((?:(?!python -m|&&|;|\|).)*)", frag):
            sub, rest = m.group(1), m.group(2)
            assert sub in commands, f"{page.name}: `{m.group(0)}`: no subcommand {sub!r} (have {sorted(commands)})"
            for flag in flags_in(rest):
                assert flag in commands[sub], f"{page.name}: `{m.group(0).strip()}`: {sub} has no {flag}"
            seen += 1
    assert seen >= 10


def test_benchmark_commands_and_flags_exist():
    seen = 0
    for page, frag in FRAGS:
        for m in re.finditer(r"python (benchmarks/\w+\.py)((?:(?!python |&&|;|\|).)*)", frag):
            script, rest = m.group(1), m.group(2)
            assert (ROOT / script).is_file(), f"{page.name}: `{m.group(0)}`: no {script}"
            flags = flags_in(rest)
            if flags:
                helptext = script_flags(script)
                for flag in flags:
                    assert re.search(rf"(?<![\w-]){re.escape(flag)}(?![\w-])", helptext), \
                        f"{page.name}: `{m.group(0).strip()}`: {script} has no {flag}"
            seen += 1
    assert seen >= 10


def test_make_targets_exist():
    targets = set(re.findall(r"^([\w-]+):", (ROOT / "Makefile").read_text(), re.M))
    for page, frag in FRAGS:
        for target in re.findall(r"(?<![\w-])make ([a-z][\w-]*)", frag):
            assert target in targets, f"{page.name}: `make {target}`: no such target (have {sorted(targets)})"


def test_paths_exist():
    seen = 0
    for page, frag in FRAGS:
        for raw in re.findall(r"(?<![\w./-])((?:\.ci|workbench|envs|tests|benchmarks|notebooks|docs)/[\w./*{}-]*(?:::\w+)?)", frag):
            path, _, test = raw.partition("::")
            path = path.rstrip(".,;:)")
            if re.search(r"[A-Z]{2}|\{", path):
                continue  # a placeholder (step_XXXXXX) or a brace list
            assert glob.glob(str(ROOT / path)), f"{page.name}: `{raw}`: no such path"
            if test:
                assert re.search(rf"^def {test}\b", (ROOT / path).read_text(), re.M), \
                    f"{page.name}: `{raw}`: {path} has no {test}"
            seen += 1
    assert seen >= 30


def test_fault_table_tests_exist():
    """The Reliability table's `test_x.py::name` cells (under tests/faults/ unless they say tests/)."""
    text = (ROOT / "docs" / "reliability.md").read_text()
    for file, name in re.findall(r"`(test_\w+\.py)::(\w+)`", text):
        found = [p for p in (ROOT / "tests").rglob(file)]
        assert found, f"no tests/**/{file}"
        assert any(re.search(rf"^def {name}\b", p.read_text(), re.M) for p in found), f"{file} has no {name}"


def test_dotted_names_exist():
    entry_point_groups = set(re.findall(r'^\[project\.entry-points\."([\w.]+)"\]', (ROOT / "pyproject.toml").read_text(), re.M))
    assert "workbench.envs" in entry_point_groups
    for page, frag in FRAGS:
        for name in re.findall(r"(?<![\w.])(workbench(?:\.\w+)+)", frag):
            if name in entry_point_groups:
                continue
            parts = name.split(".")
            for k in range(len(parts), 0, -1):
                base = ROOT.joinpath(*parts[:k])
                module = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
                if module.is_file():
                    break
            else:
                pytest.fail(f"{page.name}: `{name}`: no such module")
            rest = parts[k:]
            if rest:
                assert re.search(rf"\b{rest[0]}\b", module.read_text()), \
                    f"{page.name}: `{name}`: {module.relative_to(ROOT)} defines no {rest[0]}"


def files_tree() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    section = text[text.index("## Files"):]
    block = section[section.index("```") + 3:]
    block = block[block.index("\n") + 1:block.index("```")]
    stack: list[str] = []
    out = []
    for line in block.splitlines():
        m = re.match(r"^( *)(\S+)", line)
        if not m:
            continue
        depth = len(m.group(1)) // 2
        stack = stack[:depth] + [m.group(2)]
        out.append("/".join(s.rstrip("/") for s in stack) + ("/" if m.group(2).endswith("/") else ""))
    return out


def test_files_tree_entries_exist_and_cover_the_modules():
    entries = files_tree()
    for entry in entries:
        assert (ROOT / entry).exists(), f"Files tree: {entry} does not exist"
    listed = {e for e in entries if e.endswith(".py")}
    modules = {str(p.relative_to(ROOT)) for p in (ROOT / "workbench").rglob("*.py")
               if p.name not in ("__init__.py", "__main__.py") and "share" not in p.parts}
    modules |= {str(p.relative_to(ROOT)) for p in (ROOT / "benchmarks").glob("*.py")}
    missing = sorted(modules - listed)
    assert not missing, f"the Files tree does not list {missing}"
