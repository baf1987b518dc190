"""`RewardTuner`: move reward-shaping sliders, see how a stored batch would be re-scored.

    tuner = RewardTuner(batch)                 # sliders for RewardManager's weights
    tuner.set_weights(success_bonus=2.0)       # same as moving the slider
    tuner.table                                # DataFrame: score/rank/advantage before and after
    tuner.set_reward_fn(my_fn)                 # a custom fn(episode) -> float from a code cell

"Before" is the batch as stored (each episode's `score`, or its summed environment
reward when unscored); "after" is `reward_fn(episode)` with the current weights.
For both, GRPO advantages are computed with `workbench.algo.compute_grpo_advantage`
over the batch's groups (episodes sharing an environment seed), which is what the
policy update would see. Histograms compare the distributions; the table lists
episodes whose rank changed. The stored batch is not modified until `apply()`.

`rescore_table(batch, reward_fn)` is the plain function behind it.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Mapping, Sequence

import ipywidgets as widgets
import torch
import traitlets

from workbench.trajectory import Episode, TrajectoryBatch
from workbench.widgets._html import STYLE, esc, html_table
from workbench.widgets.dashboard import sync_figure_state

__all__ = ["RewardTuner", "rescore_table", "grpo_advantages", "score_of", "SHAPING_WEIGHTS"]

#: RewardManager arguments shown as sliders (when the class has them).
SHAPING_WEIGHTS = ("success_bonus", "invalid_action_penalty", "efficiency_bonus", "step_reward_weight")


def score_of(result: Any) -> float:
    """A reward function's result as a float (number, dict with score/reward, or object with .score)."""
    if isinstance(result, Mapping):
        for key in ("score", "reward", "total"):
            if key in result:
                return float(result[key])
        raise TypeError(f"reward function returned a dict without 'score'/'reward': {sorted(result)}")
    if hasattr(result, "score") and not isinstance(result, (int, float)):
        return float(result.score)
    return float(result)


def stored_scores(batch: TrajectoryBatch) -> list[float]:
    """Scores as stored: `episode.score`, or the summed environment reward when unscored."""
    return [float(e.score) if e.score is not None else e.total_reward for e in batch.episodes]


def apply_reward_fn(batch: TrajectoryBatch, reward_fn: Callable[[Episode], Any]) -> list[float]:
    """`reward_fn(episode)` for each episode, leaving each episode's stored score untouched.

    Functions taking `(trajectory, environment)` get `environment` (None here, as for a stored batch).
    """
    from workbench.reward import _arity

    two = _arity(reward_fn) >= 2
    out = []
    for ep in batch.episodes:
        saved = ep.score
        try:
            out.append(score_of(reward_fn(ep, None) if two else reward_fn(ep)))
        finally:
            ep.score = saved
    return out


def grpo_advantages(scores: Sequence[float], group_ids: Sequence[Any], epsilon: float = 1e-6,
                    norm_adv_by_std: bool = True) -> list[float]:
    """Per-episode GRPO advantage of outcome scores (workbench.algo.compute_grpo_advantage)."""
    from workbench import algo

    if not len(scores):
        return []
    rewards = torch.tensor([float(s) for s in scores], dtype=torch.float32)[:, None]  # (B, 1)
    adv, _ = algo.compute_grpo_advantage(rewards, torch.ones_like(rewards), index=list(group_ids),
                                         epsilon=epsilon, norm_adv_by_std_in_grpo=norm_adv_by_std)
    return adv[:, 0].tolist()


def rescore_table(batch: TrajectoryBatch, reward_fn: Callable[[Episode], Any] | None = None,
                  after: Sequence[float] | None = None, norm_adv_by_std: bool = True):
    """DataFrame with one row per episode: score, rank (1 = best) and GRPO advantage before and after.

    Give either `reward_fn` (applied to each episode) or the new scores `after`.
    Columns: episode, group, score_before, score_after, rank_before, rank_after,
    rank_change (positive = moved up), adv_before, adv_after, success.
    """
    import pandas as pd

    before = stored_scores(batch)
    if after is None:
        if reward_fn is None:
            raise ValueError("rescore_table needs reward_fn or after")
        after = apply_reward_fn(batch, reward_fn)
    groups = [e.group_id or f"ep{i}" for i, e in enumerate(batch.episodes)]
    df = pd.DataFrame({
        "episode": list(range(len(batch))),
        "group": groups,
        "score_before": before,
        "score_after": [float(a) for a in after],
    })
    df["rank_before"] = df["score_before"].rank(ascending=False, method="min").astype(int)
    df["rank_after"] = df["score_after"].rank(ascending=False, method="min").astype(int)
    df["rank_change"] = df["rank_before"] - df["rank_after"]
    df["adv_before"] = grpo_advantages(before, groups, norm_adv_by_std=norm_adv_by_std)
    df["adv_after"] = grpo_advantages(list(after), groups, norm_adv_by_std=norm_adv_by_std)
    df["success"] = [e.success for e in batch.episodes]
    return df


#: Slider ranges of the known shaping weights (others: symmetric, 3x the default).
RANGES = {"success_bonus": (0.0, 10.0), "invalid_action_penalty": (0.0, 2.0), "efficiency_bonus": (0.0, 1.0),
          "step_reward_weight": (0.0, 3.0)}


def _slider_range(name: str, default: float) -> tuple[float, float]:
    lo, hi = RANGES.get(name, (-max(1.0, 3 * abs(default)), max(1.0, 3 * abs(default))))
    return min(lo, default), max(hi, default)


class RewardTuner(widgets.VBox):
    """Sliders over reward-shaping weights re-scoring a stored batch (see the module docstring).

    Args:
        batch: a stored `TrajectoryBatch` (e.g. `trainer.rollout()` or `TrajectoryBatch.load(path)`).
        reward_factory: builds the reward function from the weights; default
            `workbench.reward.RewardManager`.
        weights: initial weights (default: the factory's defaults); their names are the sliders.
        norm_adv_by_std: GRPO (True) or Dr.GRPO (False) advantages.
    """

    weights = traitlets.Dict(help="current slider values")
    custom = traitlets.Bool(False, help="a custom reward fn (set_reward_fn) replaces the sliders")

    def __init__(self, batch: TrajectoryBatch, reward_factory: Callable[..., Callable[[Episode], Any]] | None = None,
                 weights: Mapping[str, float] | None = None, norm_adv_by_std: bool = True, **kwargs: Any):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        if reward_factory is None:
            from workbench.reward import RewardManager

            reward_factory = RewardManager
        self.batch = batch
        self.reward_factory = reward_factory
        self.norm_adv_by_std = norm_adv_by_std
        self._custom_fn: Callable[[Episode], Any] | None = None
        defaults = self.default_weights(reward_factory)
        defaults.update(weights or {})
        self.sliders: dict[str, widgets.FloatSlider] = {}
        for name, value in defaults.items():
            lo, hi = _slider_range(name, float(value))
            s = widgets.FloatSlider(value=float(value), min=lo, max=hi, step=0.01, description=name,
                                    continuous_update=False, readout_format=".2f",
                                    style={"description_width": "170px"}, layout=widgets.Layout(width="460px"))
            s.observe(self._on_slider, names="value")
            self.sliders[name] = s
        self._note = widgets.HTML()
        self._apply = widgets.Button(description="Apply to batch", icon="check",
                                     tooltip="write the new scores into the batch (episode.score)")
        self._apply.on_click(lambda _: self.apply())
        self.figure = go.FigureWidget(make_subplots(rows=1, cols=2, subplot_titles=[
            "episode reward", "GRPO advantage"]))
        for col, what in ((1, "reward"), (2, "advantage")):
            for when, color in (("before", "#9e9e9e"), ("after", "#d62728")):
                self.figure.add_histogram(x=[], name=f"{what} {when}", marker_color=color, opacity=0.6,
                                          nbinsx=20, row=1, col=col, showlegend=True)
        self.figure.update_layout(barmode="overlay", height=300, template="plotly_white",
                                  margin=dict(l=40, r=10, t=40, b=30), legend=dict(orientation="h", y=-0.2))
        self._table = widgets.HTML()
        self._table.add_class("wb-tuner-table")
        left = widgets.VBox(list(self.sliders.values()) + [self._apply])
        super().__init__([widgets.HBox([left, self._note]), self.figure, self._table], **kwargs)
        self.add_class("wb-reward-tuner")
        self.table = None
        self.weights = dict(defaults)
        self.recompute()

    # -- public ------------------------------------------------------------------------------
    @staticmethod
    def default_weights(factory: Callable[..., Any]) -> dict[str, float]:
        """Numeric keyword defaults of the factory (the shaping weights when it has them)."""
        try:
            params = inspect.signature(factory).parameters
        except (TypeError, ValueError):
            return {}
        numeric = {n: float(p.default) for n, p in params.items()
                   if isinstance(p.default, (int, float)) and not isinstance(p.default, bool)}
        shaping = {n: v for n, v in numeric.items() if n in SHAPING_WEIGHTS}
        return shaping or numeric

    def set_weights(self, **weights: float) -> None:
        """Set slider values (one recompute at the end)."""
        unknown = set(weights) - set(self.sliders)
        if unknown:
            raise KeyError(f"unknown weights {sorted(unknown)}; sliders: {sorted(self.sliders)}")
        self._hold = True
        try:
            for k, v in weights.items():
                s = self.sliders[k]
                s.min, s.max = min(s.min, v), max(s.max, v)
                s.value = v
        finally:
            self._hold = False
        self.weights = {k: s.value for k, s in self.sliders.items()}
        self.recompute()

    def set_reward_fn(self, fn: Callable[[Episode], Any] | None) -> None:
        """Use a custom `fn(episode) -> float` instead of the sliders; None returns to the sliders."""
        self._custom_fn = fn
        self.custom = fn is not None
        for s in self.sliders.values():
            s.disabled = self.custom
        self.recompute()

    @property
    def reward_fn(self) -> Callable[[Episode], Any]:
        """The reward function currently applied."""
        if self._custom_fn is not None:
            return self._custom_fn
        return self.reward_factory(**{k: s.value for k, s in self.sliders.items()})

    @property
    def scores_after(self) -> list[float]:
        return list(self.table["score_after"])

    @property
    def changed(self):
        """Rows of episodes whose rank changed, biggest move first."""
        t = self.table
        moved = t[t["rank_change"] != 0]
        return moved.reindex(moved["rank_change"].abs().sort_values(ascending=False).index)

    def recompute(self) -> None:
        """Re-score the batch with the current reward function and redraw."""
        try:
            self.table = rescore_table(self.batch, self.reward_fn, norm_adv_by_std=self.norm_adv_by_std)
        except Exception as exc:  # a broken custom fn should not kill the widget
            self._note.value = f'{STYLE}<div class="wb-root wb-errline">reward fn failed: {esc(type(exc).__name__)}: {esc(exc)}</div>'
            raise
        t = self.table
        with self.figure.batch_update():
            self.figure.data[0].x = t["score_before"].tolist()
            self.figure.data[1].x = t["score_after"].tolist()
            self.figure.data[2].x = t["adv_before"].tolist()
            self.figure.data[3].x = t["adv_after"].tolist()
        sync_figure_state(self.figure)
        self._note.value = self._note_html()
        self._table.value = self._table_html()

    def apply(self) -> TrajectoryBatch:
        """Write the current scores into the stored batch (via `workbench.reward.rescore` when available)."""
        try:
            from workbench.reward import rescore
        except ImportError:
            rescore = None
        if rescore is not None:
            result = rescore(self.batch, self.reward_fn)
            if isinstance(result, TrajectoryBatch):
                self.batch = result
        else:
            for ep, s in zip(self.batch.episodes, self.scores_after):
                ep.score = s
        self.recompute()
        return self.batch

    # -- internals ------------------------------------------------------------------------------
    _hold = False

    def _on_slider(self, change: dict) -> None:
        if self._hold:
            return
        self.weights = {k: s.value for k, s in self.sliders.items()}
        self.recompute()

    def _note_html(self) -> str:
        t = self.table
        src = "custom reward fn" if self.custom else f"{getattr(self.reward_factory, '__name__', 'reward')}(" + ", ".join(
            f"{k}={v:.2f}" for k, v in self.weights.items()) + ")"
        n_moved = int((t["rank_change"] != 0).sum())
        sign_flips = int(((t["adv_before"] > 0) != (t["adv_after"] > 0)).sum())
        return (f'{STYLE}<div class="wb-root" style="padding-left:12px">'
                f'<div><b>{len(t)}</b> episodes, {t["group"].nunique()} groups · scoring with <code>{esc(src)}</code></div>'
                f'<div>reward mean {t["score_before"].mean():+.3g} → <b>{t["score_after"].mean():+.3g}</b> · '
                f'std {t["score_before"].std(ddof=0):.3g} → <b>{t["score_after"].std(ddof=0):.3g}</b></div>'
                f'<div><b>{n_moved}</b> episodes changed rank · <b>{sign_flips}</b> advantages changed sign</div></div>')

    def _table_html(self) -> str:
        cols = ["episode", "group", "score_before", "score_after", "rank_before", "rank_after", "rank_change",
                "adv_before", "adv_after", "success"]
        moved = self.changed
        if not len(moved):
            return f'{STYLE}<div class="wb-root wb-legend">no episode changed rank</div>'
        return (f'{STYLE}<div class="wb-root"><div class="wb-head">episodes that changed rank '
                f'(rank 1 = best; rank_change &gt; 0 moved up)</div>'
                + html_table(moved.to_dict("records"), cols, max_rows=50) + "</div>")

    def __repr__(self) -> str:
        w = ", ".join(f"{k}={v:.2f}" for k, v in self.weights.items())
        return f"RewardTuner({len(self.batch)} episodes, {'custom fn' if self.custom else w})"
