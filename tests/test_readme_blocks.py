"""Every ```python, ```bash and ```sh block of README.md and docs/*.md runs, or is marked as an excerpt.

A block is an excerpt when the line right before its opening fence is
`<!-- excerpt: why it does not run here -->`; the rest run here, each in a fresh process in
its own temporary folder:

* Python blocks run as written, with `ConfigStore()` made small for a CPU test (`small(...)`:
  the tiny test model instead of the embedded SmolLM2, fp32, short replies, small batches,
  checkpoints in the temporary folder) and the step counts below cut to one step
  (`CUTS`); each cut must still match the block, so a changed block fails here until the cut
  is updated.
* Shell blocks run with bash (`set -euo pipefail`), with this venv's `python` first on PATH and
  the repository on PYTHONPATH, after the setup `SETUP` names for them (files an earlier step
  of the page would have made).

A block that raises or exits non-zero fails its test with its output.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
LANGS = {"python", "bash", "sh"}
EXCERPT = re.compile(r"^<!--\s*excerpt:\s*(.+?)\s*-->\s*$")


@dataclass
class Block:
    page: Path
    line: int          # 1-based line of the opening fence
    lang: str
    code: str
    excerpt: str | None  # the reason, when marked

    @property
    def id(self) -> str:
        return f"{self.page.relative_to(ROOT)}:{self.line}"


def blocks(page: Path) -> list[Block]:
    out, lines = [], page.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = re.match(r"^```(\w*)\s*$", lines[i])
        if not m:
            i += 1
            continue
        j = i + 1
        while j < len(lines) and not lines[j].startswith("```"):
            j += 1
        if m.group(1) in LANGS:
            marker = EXCERPT.match(lines[i - 1]) if i > 0 else None
            out.append(Block(page, i + 1, m.group(1), "\n".join(lines[i + 1:j]) + "\n",
                             marker.group(1) if marker else None))
        i = j + 1
    return out


ALL = [b for page in PAGES for b in blocks(page)]
RUN = [b for b in ALL if b.excerpt is None]

#: Python blocks: (text in the block, what it becomes here). Steps and loops cut to one.
CUTS = {
    "trainer.fit(steps=20)": "trainer.fit(steps=1)",
    "for step in range(8):": "for step in range(1):",
}

PRELUDE = '''
import os, tempfile
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
from workbench import ConfigStore as _ConfigStore
from workbench.models import build_tiny_model as _build_tiny_model

def small(config):
    """The block's config, made small for a CPU test: the tiny model, short replies, small batches."""
    config.model.model_name = str(_build_tiny_model())
    config.model.dtype = "float32"
    config.model.lora_rank = 4
    config.inference.max_tokens = 8
    config.inference.max_turns = 2
    config.training.batch_size, config.training.group_size = 4, 2
    config.checkpoint.output_dir = tempfile.mkdtemp(dir=".")
    config.checkpoint.save_interval = 0
    return config
'''

#: Shell blocks: commands run first, keyed by text in the block.
SETUP = {
    "--config runs/train/config.yaml":
        'mkdir -p runs/train && python -c "from workbench import ConfigStore; '
        "ConfigStore().save('runs/train/config.yaml')\"",
}


def env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "PATH": os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")]),
            "WORKBENCH_SMOKE": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false",
            "OMP_WAIT_POLICY": os.environ.get("OMP_WAIT_POLICY", "PASSIVE"), "MPLBACKEND": "Agg"}


def python_source(block: Block) -> str:
    code = block.code
    for old, new in CUTS.items():
        code = code.replace(old, new)
    code = re.sub(r"\bConfigStore\(\)", "small(ConfigStore())", code)
    return PRELUDE + "\n" + code


def test_every_block_is_found_and_the_excerpts_say_why():
    assert len(ALL) >= 5, [b.id for b in ALL]
    for b in ALL:
        if b.excerpt is not None:
            assert len(b.excerpt) >= 10, f"{b.id}: say why the excerpt does not run"


def test_every_cut_and_setup_matches_a_block():
    """A cut or setup step whose text no block contains any more is stale: the block changed."""
    py = "".join(b.code for b in RUN if b.lang == "python")
    sh = "".join(b.code for b in RUN if b.lang != "python")
    for old in CUTS:
        assert old in py, f"no runnable python block contains {old!r}: update CUTS"
    for key in SETUP:
        assert key in sh, f"no runnable shell block contains {key!r}: update SETUP"


@pytest.mark.parametrize("block", RUN, ids=lambda b: b.id)
def test_block_runs(block: Block, tmp_path):
    if block.lang == "python":
        script = tmp_path / "block.py"
        script.write_text(python_source(block))
        cmd = [sys.executable, str(script)]
    else:
        setup = [cmd for key, cmd in SETUP.items() if key in block.code]
        script = tmp_path / "block.sh"
        script.write_text("set -euo pipefail\n" + "\n".join(setup) + "\n" + block.code)
        cmd = ["bash", str(script)]
    proc = subprocess.run(cmd, cwd=tmp_path, env=env(), capture_output=True, text=True, timeout=1500)
    assert proc.returncode == 0, (f"{block.id} ({block.lang}) exited {proc.returncode}:\n"
                                  + textwrap.indent(script.read_text(), "    | ")
                                  + "\n--- output ---\n" + (proc.stdout + proc.stderr)[-6000:])
