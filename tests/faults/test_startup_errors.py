"""Every start-up error a user's input causes is one line on stderr and exit 2 (issue 50,
item 5). Each case below used to end in a traceback of 12-48 lines with exit 1:

- `--inference.enable_thinking true` on a template without a thinking switch (TemplateError);
- a chat template that calls `raise_exception` (TemplateError);
- a model folder with no chat template (ValueError);
- `--inference.tool_format hermes` on guess_number, whose message also said "the None parser";
- `--env-param high=abc` and `--env-param low=9 --env-param high=2` (the environment's ValueError);
- resuming a folder that holds another model's checkpoints, with `--checkpoint.resume true`
  and with `force` (CheckpointMismatchError).

`main` runs in-process (as `python -m workbench` does, without a new interpreter per case).
"""
from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import pytest

from workbench.cli import main
from workbench.models import build_tiny_model


def _train(model: Path | str, out: Path, *extra: str) -> list[str]:
    return ["train", "--model", str(model), "--dtype", "float32", "--steps", "1", "--batch-size", "2",
            "--group-size", "2", "--max-tokens", "4", "--max-turns", "2", "--eval-episodes", "2",
            "--output", str(out), *extra]


def _error_line(err: str) -> str:
    """The error line of stderr; nothing else may be there but progress bars (lines with \\r)."""
    assert "Traceback" not in err, err[-3000:]
    lines = [line for line in err.splitlines() if line.strip() and "\r" not in line and "Loading weights" not in line]
    assert len(lines) == 1, lines
    return lines[0]


def _template_folder(tiny_model_path: Path, tmp_path: Path, template: str | None) -> Path:
    """A copy of the tiny model whose chat template is `template` (None: no template at all)."""
    folder = Path(shutil.copytree(tiny_model_path, tmp_path / "model"))
    (folder / "chat_template.jinja").unlink(missing_ok=True)
    config = json.loads((folder / "tokenizer_config.json").read_text())
    config.pop("chat_template", None)
    if template is not None:
        (folder / "chat_template.jinja").write_text(template)
    (folder / "tokenizer_config.json").write_text(json.dumps(config))
    return folder


CASES = {
    "thinking-on-a-template-without-it": (["--inference.enable_thinking", "true"],
                                          "error: model .*: its chat template has no enable_thinking switch; leave "
                                          "inference.enable_thinking unset"),
    "tool-format-on-an-environment-without-tool-calls": (
        ["--inference.tool_format", "hermes"],
        "config error: inference.tool_format='hermes' sets how tool calls are written, but GuessNumberEnv reads "
        r"the reply itself \(it has no action parser\), not tool calls"),
    "an-env-param-that-is-not-a-number": (
        ["--env-param", "high=abc"],
        r"config error: environment 'guess_number' refused its settings: ValueError: invalid literal for int\(\) "
        r"with base 10: 'abc' \(at guess_number.py:\d+\); its params were high='abc'"),
    "env-params-that-contradict-each-other": (
        ["--env-param", "low=9", "--env-param", "high=2"],
        r"config error: environment 'guess_number' refused its settings: ValueError: .*low \(9\) must be <= high \(2\)"),
}


@pytest.mark.parametrize("case", list(CASES))
def test_a_bad_setting_at_start_is_one_line_and_rc_2(case, tiny_model_path, tmp_path, capsys):
    flags, expected = CASES[case]
    rc = main(_train(tiny_model_path, tmp_path / "run", *flags))
    line = _error_line(capsys.readouterr().err)
    assert rc == 2
    assert re.match(expected, line), line
    assert not (tmp_path / "run" / "checkpoints").exists()  # refused before training


@pytest.mark.parametrize("template, expected", [
    ("{{ raise_exception('This model only supports user/assistant turns') }}",
     r"error: model .*: its chat template fails on a single user message \(TemplateError: This model only supports "
     r"user/assistant turns\)"),
    (None, r"config error: model '.*' has no chat template \(no chat_template.jinja, no chat_template in its "
           r"tokenizer_config.json\)"),
], ids=["a-template-that-raises", "no-chat-template"])
def test_a_model_whose_template_cannot_run_is_one_line(template, expected, tiny_model_path, tmp_path, capsys):
    import re

    folder = _template_folder(tiny_model_path, tmp_path, template)
    rc = main(_train(folder, tmp_path / "run"))
    line = _error_line(capsys.readouterr().err)
    assert rc == 2 and re.match(expected, line), line


@pytest.mark.parametrize("resume", ["true", "force"])
def test_resuming_another_models_checkpoints_is_one_line(resume, tiny_model_path, tmp_path, capsys):
    out = tmp_path / "run"
    assert main(_train(tiny_model_path, out)) == 0
    other = build_tiny_model(hidden_size=128, num_heads=4)  # on a fresh machine its save prints progress bars
    capsys.readouterr()
    rc = main(_train(other, out, "--steps", "2", "--checkpoint.resume", resume))
    line = _error_line(capsys.readouterr().err)
    assert rc == 2, line
    if resume == "true":
        assert "was written by a run with another config (model.path" in line and "checkpoint.resume='force'" in line
    else:
        assert "the checkpoint's policy weights do not fit this trainer" in line and "of another shape" in line
