"""Notebook widgets (ipywidgets 8 + plotly FigureWidget) for looking at and steering RL runs.

    conversation.py  one episode as a chat, with rewards, tool calls and errors; fork from a turn
    tokens.py        every token coloured by advantage, KL, logprob, ... (per-episode scale)
    table.py         the batch as a clickable table linked to the views
    dashboard.py     live training curves
    play.py          play an environment by hand, ask the model for a suggestion
    reward_tuner.py  reward weights as sliders, scores and advantages recomputed; re-judge with an edited rubric
    judgments.py     what the judges said of an episode (score, reason, the exact prompt), as HTML
    rejudge.py       a batch judged again with an edited rubric, and which episodes changed rank
    judge_audit.py   JudgeAuditView: the judge audit's report and verdict, episode by episode
    findings.py      the run doctor's findings; each opens its evidence episode with the span marked
    compare.py       RunComparisonView: two runs' curves overlaid, the same held-out seeds side by side
    _html.py         shared HTML helpers
    _groups.py       an episode's score beside its group's mean and std, and the advantage they give
    _runs.py         a reopened run (load_run) accepted wherever a widget takes a batch or a history

| widget              | shows                                                               |
|---------------------|---------------------------------------------------------------------|
| `ConversationView`  | an episode as chat bubbles (tool calls, errors, reward per turn)    |
| `TokenView`         | an episode's tokens coloured by advantage / KL / logprob / ...      |
| `TrainingDashboard` | live training curves (`trainer.fit(callbacks=[dash.callback])`)     |
| `PlayWidget`        | play an environment by hand; the game is kept as a trajectory      |
| `RewardTuner`       | reward-shaping sliders re-scoring a stored batch                    |
| `TrajectoryTable`   | sortable, filterable episode list linked to the two viewers         |
| `FindingsPanel`     | the run doctor's findings; evidence opens with its span marked      |
| `RunComparisonView` | two runs side by side: config diff, curves, findings, same seeds    |
| `JudgeAuditView`    | the judge audit: agreement, position and length bias, verdict      |

The viewers (`ConversationView`, `TokenView`, `TrajectoryTable`, `RewardTuner`) take a
reopened run (`workbench.debug.load_run`) where they take a batch, showing its last saved
step or `step=`; `TrainingDashboard(run)` draws its metrics.

Every widget keeps its state in traitlets and its logic in plain functions
(`render_episode_html`, `render_tokens_html`, `history_series`, `rescore_table`,
`filter_sort`, ...) that work without a kernel. All JavaScript comes from the
installed packages (ipywidgets, plotly's anywidget bundle): nothing from a CDN.
For Voilà, whose stock "lab" template links Font Awesome from a CDN, use the
bundled template: `JUPYTER_PATH=$(python -c "import workbench.widgets as w;
print(w.VOILA_JUPYTER_PATH)") voila --template=workbench-offline notebook.ipynb`.
"""
from pathlib import Path

from workbench.widgets.compare import RunComparisonView
from workbench.widgets.conversation import ConversationView, render_episode_html
from workbench.widgets.dashboard import PANELS, TrainingDashboard, history_series
from workbench.widgets.findings import FindingsPanel
from workbench.widgets.judge_audit import JudgeAuditView, audit_html
from workbench.widgets.play import PlayWidget, TokenizerOnlyEngine
from workbench.widgets.reward_tuner import RewardTuner, grpo_advantages, rescore_table
from workbench.widgets.table import TrajectoryTable, episode_frame, filter_sort
from workbench.widgets.tokens import TokenView, available_fields, render_tokens_html

#: Add to JUPYTER_PATH to get the "workbench-offline" Voilà template (no CDN links).
VOILA_JUPYTER_PATH = Path(__file__).resolve().parent / "share"

__all__ = [
    "VOILA_JUPYTER_PATH",
    "ConversationView", "TokenView", "TrainingDashboard", "FindingsPanel", "RunComparisonView", "PlayWidget", "RewardTuner", "TrajectoryTable",
    "TokenizerOnlyEngine", "render_episode_html", "render_tokens_html", "history_series", "rescore_table",
    "grpo_advantages", "filter_sort", "episode_frame", "available_fields", "PANELS", "JudgeAuditView", "audit_html",
]
