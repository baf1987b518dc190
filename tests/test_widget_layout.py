"""What the widgets say about why a number is what it is, and how they lay it out, checked
without a browser (tests/test_notebooks_browser.py measures the same in JupyterLab):

* the token view breaks lines between tokens only, and prints the episode's score beside its
  group's mean and std with the advantage they give (checked against a hand computation);
* the conversation view marks the span of each reply the environment read as the action;
* the dashboard hides panels flat for the whole run, names them, and keeps each two-curve
  panel's legend in that panel's corner;
* the comparison view of a real branch with an SFT warm-up names runs by folder, draws the
  branch from its own steps only, breaks lines across steps without a value, gives each
  chart its own legend and lists only the settings changed by hand;
* the batch's HTML and the trajectory table fit: no None/NaN cells, no empty columns;
* in a real Jupyter kernel a finished progress bar leaves text, not a closed widget, the
  dtype notice goes to stdout, not the stderr box, and a report's table is Markdown.
"""
from __future__ import annotations

import math
import re
from pathlib import Path

import pandas as pd
import pytest

from envs import make_env
from workbench.cli import main
from workbench.widgets import ConversationView, RunComparisonView, TokenView, TrainingDashboard, TrajectoryTable
from workbench.widgets.compare import BRANCH_SET_FIELDS, curve_points
from workbench.widgets.dashboard import PANELS, panel_visibility
from workbench.widgets.table import shown_columns

SPAN_RE = re.compile(r'<span class="wb-tok[^"]*"[^>]*>')


@pytest.fixture(scope="module")
def scored(tiny_model_path, tmp_path_factory):
    """A real GRPO batch of the tiny model (groups of 2 on guess_number) with advantages, after
    one update (so the policy is off the reference), and its tokenizer."""
    from tests.test_widgets import tiny_config
    from workbench.training import Trainer

    tmp = tmp_path_factory.mktemp("layout")
    trainer = Trainer(tiny_config(tiny_model_path, tmp, use_kl_loss=True), environment=make_env("guess_number"))
    trainer.fit(steps=1)
    batch = trainer.compute_advantages(trainer.score(trainer.rollout()))
    return batch, trainer.tokenizer


def test_tokens_break_only_between_tokens(scored):
    batch, tok = scored
    html = TokenView(batch, tok).html
    box = html[html.index('<div class="wb-tokbox">'):]
    assert len(SPAN_RE.findall(box)) == batch[0].num_tokens
    assert box.count("<wbr>") == batch[0].num_tokens - 1  # one break opportunity between each two tokens
    assert "break-all" not in html and "word-break: normal" in html


def test_group_line_gives_the_advantage_its_reason(scored):
    batch, tok = scored
    adv, mask = batch.tensors["advantages"].float(), batch.tensors["loss_mask"]
    scores = batch.tensors["token_level_rewards"].float().sum(-1).tolist()
    view = TokenView(batch, tok)
    for i, ep in enumerate(batch):
        group = [scores[j] for j, e in enumerate(batch) if e.group_id == ep.group_id]
        mean = sum(group) / len(group)
        std = math.sqrt(sum((s - mean) ** 2 for s in group) / (len(group) - 1))
        view.index = i
        line = re.search(r'<div class="wb-legend wb-group">([^<]*)</div>', view.html).group(1)
        assert f"{len(group)} episodes" in line and f"seed {ep.env_seed}" in line
        assert f"std {std:.3g}" in line
        shown = float(adv[i][mask[i] > 0].mean())
        expected = (scores[i] - mean) / (std + 1e-6)  # GRPO, computed here by hand
        assert shown == pytest.approx(expected, abs=1e-4)
        if abs(expected) > 1e-9:
            assert "= (score − mean) / std" in line
            assert ("better than" if scores[i] > mean else "worse than") in line
    conv = ConversationView(batch)  # the conversation view prints the same line
    assert re.search(r'<div class="wb-legend wb-group">[^<]*advantage', conv.html)


def test_conversation_marks_the_action_span():
    from workbench.trajectory import Episode, Turn

    reply = "I'm afraid I don't have a 5th number, so 5"
    turn = Turn(index=0, action=reply, info={"action_span": [26, 27]}, reward=1.0)
    ep = Episode(episode_id=0, env_name="GuessNumber", turns=[turn], done=True)
    html = ConversationView(ep).html
    assert "I&#x27;m afraid I don&#x27;t have a <mark class=\"wb-action\"" in html
    assert re.search(r'<mark class="wb-action" title="[^"]*">5</mark>th number', html)
    assert "the part of the reply the environment read as the action" in html  # the legend line
    view = ConversationView(ep)
    view.highlight = {0: [41, 42]}  # a finding's span replaces the action mark in that turn
    assert '<mark class="wb-span">5</mark>' in view.html and 'class="wb-action"' not in view.html.split("wb-conv-body")[1]
    bad = Turn(index=0, action="abc", info={"action_span": [2, 9]})  # out of range: no mark, no error
    assert 'class="wb-action"' not in ConversationView(Episode(turns=[bad], done=True)).html.split("</style>")[-1]


def test_dashboard_hides_flat_panels_and_keeps_legends_with_their_panels():
    history = [{"step": i, "reward/mean": 0.0, "reward/std": 0.0, "env/success_rate": 0.0, "kl/mean": 0.01 * i,
                "actor/ppo_kl": 0.001 * i, "kl/coef": 0.001, "actor/pg_clipfrac": 0.0, "actor/entropy": 1 - i / 10,
                "actor/pg_loss": 0.1 * i, "rollout/response_length_mean": 5 + i, "perf/tokens_per_s": 100 + i}
               for i in range(4)]
    why = panel_visibility(history)
    titles = [t for t, _ in PANELS]
    hidden = {titles[p]: w for p, w in enumerate(why) if w is not None}
    assert hidden == {"KL coefficient": "0.001 every step", "clip fraction": "0 every step"}  # reward flat but kept
    assert panel_visibility(history[:1])[3] is None  # one step: nothing is flat yet
    assert panel_visibility([{"step": 0, "reward/mean": 1.0}])[2] == "not recorded"
    assert all(w is None for w in panel_visibility([]))

    dash = TrainingDashboard(history)
    layout = dash.figure.layout
    shown = [a.text for a in layout.annotations if a.visible is not False]
    assert shown == [t for t in titles if t not in hidden]
    assert "KL coefficient (0.001 every step)" in dash._status.value
    few = TrainingDashboard([{k: h[k] for k in ("step", "reward/mean", "env/success_rate", "actor/entropy")}
                             for h in history])  # 3 panels: one row, a third of the height of the plots
    assert [a.text for a in few.figure.layout.annotations if a.visible is not False] == \
        ["reward (mean ± std)", "success rate", "entropy"]
    assert layout.height == 640 and few.figure.layout.height < 640 / 2
    for name, legend, panel in (("kl/mean", "legend", 2), ("actor/pg_loss", "legend2", 6)):
        trace = dash.figure.data[dash.trace_index[name]]
        assert trace.legend == legend and trace.showlegend
        axis = trace.xaxis.replace("x", "xaxis")
        box = layout[legend]
        assert box.x == pytest.approx(layout[axis].domain[1])  # its panel's right edge
        assert box.y == pytest.approx(layout[trace.yaxis.replace("y", "yaxis")].domain[1])  # and top
    assert not dash.figure.data[dash.trace_index["critic/vf_loss"]].showlegend  # no entry for an empty curve
    assert dash.figure.data[dash.trace_index["kl/coef"]].visible is False
    assert dash.title == "training"


def test_dashboard_of_a_run_is_titled_by_its_folder(tiny_model_path, tmp_path):
    from workbench.debug import load_run

    out = tmp_path / "gn-short"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "2", "--eval-episodes", "0", "--output", str(out)]) == 0
    dash = TrainingDashboard(load_run(out))
    assert dash.title == "gn-short · grpo on guess_number" and str(tmp_path) not in dash._status.value


def test_curve_points_break_where_a_run_has_no_value():
    rows = pd.DataFrame({"step": [0, 1, 2, 3, 4, 7], "reward/mean": [0.1, 0.2, math.nan, math.nan, 0.5, 0.6],
                         "eval/success_rate": [0.0, math.nan, math.nan, math.nan, 0.5, math.nan]})
    assert curve_points(rows, "reward/mean") == ([0, 1, 2, 3, 4, None, 7], [0.1, 0.2, None, None, 0.5, None, 0.6])
    assert curve_points(rows, "reward/mean", start=2) == ([4, None, 7], [0.5, None, 0.6])
    assert curve_points(rows, "eval/success_rate") == ([0, 4], [0.0, 0.5])  # held-out points joined


def _cli_run(model: Path, out: Path, *extra: str) -> Path:
    assert main(["train", "--model", str(model), "--steps", "2", "--batch-size", "2", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "4", "--eval-episodes", "2", "--save-interval", "1",
                 "--env-param", "low=1", "--env-param", "high=8", "--sft.episodes", "3", *extra,
                 "--output", str(out)]) == 0
    return out


def test_comparison_of_a_branch_with_a_warm_up(tiny_model_path, tmp_path):
    parent = _cli_run(tiny_model_path, tmp_path / "lenient")
    branch = tmp_path / "strict"
    assert main(["train", "--from", str(parent / "checkpoints" / "step_000002"), "--sft.steps", "2",
                 "--environment.strict_format", "true", "--steps", "1", "--output", str(branch)]) == 0
    view = RunComparisonView(parent, branch)
    cmp = view.comparison
    assert view.names == {"A": "lenient", "B": "strict"}
    head = view._head.value
    assert "a branch of A, from its checkpoint at step 2" in head and str(tmp_path) not in head
    traces = {(t.name, t.xaxis): t for t in view.figure.data}
    b_train = traces[("B strict · train", "x")]
    assert list(b_train.x) == [4]  # its own RL step: not the parent's copied rows 0-1, not the SFT steps 2-3
    a_train = traces[("A lenient · train", "x")]
    assert list(a_train.x) == [0, 1] and a_train.line.width > b_train.line.width
    assert list(traces[("B strict · held-out", "x2")].x) == [2, 4, 5]
    assert {t.legend for t in view.figure.data if t.xaxis == "x"} == {"legend"}
    assert {t.legend for t in view.figure.data if t.xaxis == "x2"} == {"legend2"}
    layout = view.figure.layout
    assert layout.legend.x == pytest.approx(layout.xaxis.domain[0])
    assert layout.legend2.x == pytest.approx(layout.xaxis2.domain[0])
    shapes = [(s.type, s.x0, s.x1) for s in layout.shapes]
    assert ("line", 1.5, 1.5) in shapes and ("rect", 1.5, 3.5) in shapes  # branch start, the SFT steps shaded
    assert "sft.start_step" in cmp.config_diff and "training.num_iters_per_epoch" in cmp.config_diff
    table = view._config.value
    rows = re.findall(r"<tr[^>]*><td>([^<]*)</td>", table)
    assert set(rows) == {"environment.strict_format", "sft.steps"}
    assert not set(rows) & set(BRANCH_SET_FIELDS)
    assert "set by the branch itself" in table and "sft.start_step 0 → 2" in table
    # the same two runs that are not parent and branch: every difference is a row
    other = RunComparisonView(_cli_run(tiny_model_path, tmp_path / "x" / "lenient", "--training.seed", "1"), parent)
    assert other.names == {"A": "x/lenient", "B": f"{tmp_path.name}/lenient"}
    assert "set by the branch itself" not in other._config.value


def test_batch_html_and_table_fit(scored):
    batch, _ = scored
    html = batch._repr_html_()
    cells = re.findall(r"<td[^>]*>([^<]*)</td>", html)
    assert cells and not {"None", "NaN", "nan"} & set(cells)
    assert all(len(c) <= 40 for c in cells)
    assert html.count("<tr>") == len(batch) + 1
    table = TrajectoryTable(batch)
    drawn, left = shown_columns(table.df)
    assert {"tool_calls", "human_turns", "error"} <= set(left)  # nothing in them for this batch
    assert {"index", "seed", "reward", "success"} <= set(drawn)
    # advantages are drawn when some episode has one: the sampled groups may all be flat (equal
    # rewards, all 0), which depends on the CPU's rounding and the decode kernels
    assert ("adv_mean" in drawn) == any(abs(v) > 0 for v in table.df["adv_mean"])
    heads = re.findall(r"<th>([^<]*)</th>", table.html)
    assert heads == [c.replace("_", " ") for c in drawn]
    assert "not drawn, empty in every row: " in table._msg.value


def test_in_a_kernel_bars_leave_text_and_the_dtype_notice_is_not_stderr(tiny_model_path, tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    cells = [
        "import os; os.environ['CI'] = '0'\n"
        "from workbench.utils.progress import progress_bar\n"
        "bar = progress_bar(None, total=3, desc='fit')\n"
        "bar.update(3); bar.set_postfix(step=7); bar.close()\n"
        "gone = progress_bar(None, total=2, desc='rollout', leave=False)\n"
        "gone.update(2); gone.close()",
        "from workbench.config import checks\n"
        "checks._announced.clear()\n"
        "checks.resolve_dtype('auto', 'cpu')",
        "from workbench.utils.progress import print_markdown\n"
        "print_markdown('| step | reward |\\n|---|---|\\n| 0 | 0.5 |')",
    ]
    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in cells])
    nbclient.NotebookClient(nb, timeout=300, kernel_name="python3",
                            resources={"metadata": {"path": str(tmp_path)}}).execute()
    outputs = nb.cells[0].outputs
    assert not [o for o in outputs if "application/vnd.jupyter.widget-view+json" in o.get("data", {})]
    texts = [o["data"]["text/plain"] for o in outputs if "text/plain" in o.get("data", {})]
    assert len(texts) == 2 and re.match(r"fit: 100%\|.*\| 3/3 \[.*step=7", texts[0]) and texts[1] == ""
    streams = nb.cells[1].outputs
    said = [o for o in streams if o.get("output_type") == "stream" and '"auto" ->' in o["text"]]
    assert said and all(o["name"] == "stdout" for o in said)
    table = nb.cells[2].outputs  # train_and_report's metrics table: Markdown, not printed pipes
    assert [o["output_type"] for o in table] == ["display_data"]
    assert table[0]["data"]["text/markdown"].startswith("| step | reward |")
