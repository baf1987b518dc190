"""`RewardTuner`: move reward-shaping sliders, see how a stored batch would be re-scored.

    tuner = RewardTuner(batch)                 # sliders for RewardManager's weights
    tuner.set_weights(success_bonus=2.0)       # same as moving the slider
    tuner.table                                # DataFrame: score/rank/advantage before and after
    tuner.set_reward_fn(my_fn)                 # a custom fn(episode) -> float from a code cell
    RewardTuner(run, step=3)                   # a reopened run (`load_run`) with its own config

"Before" is the batch as stored (each episode's `score`, or its summed environment
reward when unscored); "after" is `reward_fn(episode)` with the current weights. For a batch
a judge scored (`Episode.judgments`), "after" is `reward.env_weight` times that plus the
recorded model reward, and the table shows the judge's score and reason beside the
environment's reward; the re-judge panel (`tuner.rejudge(rubric)`, `judge=` or the config's
`reward.judge`) judges the batch again with an edited rubric and lists the episodes that changed
rank (`workbench.widgets.rejudge`).
The reward function gets the environment the episodes ran with (`environment=`:
an environment, a zero-argument factory, or a dict env name -> environment; default:
`workbench.environments.registry.make_env(episode.env_name)`), so terms that need it (the
efficiency bonus's step budget, `max_steps`) use the real one.
For both, advantages of the configured estimator (`config=trainer.config` or
`adv_estimator=`; default GRPO) are computed with `workbench.reward.episode_advantages`
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
from workbench.widgets._runs import batch_of, is_run
from workbench.widgets.dashboard import sync_figure_state
from workbench.widgets.rejudge import judge_columns, rejudge_html, rejudge_table

__all__ = ["RewardTuner", "rescore_table", "grpo_advantages", "score_of", "SHAPING_WEIGHTS", "episode_environments",
           "shared_bins", "plural"]

#: RewardManager arguments shown as sliders (when the class has them).
SHAPING_WEIGHTS = ("success_bonus", "invalid_action_penalty", "efficiency_bonus", "step_reward_weight")


def score_of(result: Any) -> float:
    """A reward function's result as a float (number, dict with score/reward, or object with
    .score): `workbench.reward`'s rule, which the trainer applies too."""
    from workbench.reward import _as_float

    return _as_float(result)


def stored_scores(batch: TrajectoryBatch) -> list[float]:
    """Scores as stored: `episode.score`, or the summed environment reward when unscored."""
    return [e.outcome for e in batch.episodes]


def plural(n: int, word: str) -> str:
    """"1 episode", "2 episodes"."""
    return f"{n} {word}" if n == 1 else f"{n} {word}s"


def _as_env(obj: Any) -> Any:
    """An environment from an environment or a zero-argument factory (as `Trainer.environment`)."""
    if obj is None or hasattr(obj, "step") or not callable(obj):
        return obj
    return obj()


def episode_environments(batch: TrajectoryBatch, environment: Any = None) -> list[Any]:
    """The environment each episode is scored with.

    `environment`: one environment (or zero-argument factory) for all episodes, a dict
    env name -> environment, or None: the environment that played each episode
    (`episode.environment`), else `make_env(episode.env_name)` from the registry (None
    for an episode whose name does not build).
    """
    if environment is not None and not isinstance(environment, Mapping):
        env = _as_env(environment)
        return [env for _ in batch.episodes]
    given = {k: _as_env(v) for k, v in (environment or {}).items()}
    built: dict[str, Any] = {}
    out = []
    for ep in batch.episodes:
        name = ep.env_name
        if environment is None and ep.environment is not None:
            out.append(ep.environment)
            continue
        if name in given:
            out.append(given[name])
            continue
        if name not in built:
            built[name] = _registry_env(name)
        out.append(built[name])
    return out


def _registry_env(name: str) -> Any:
    """`make_env(name)`; `Rollout` records the class name (e.g. "GuessNumberEnv"), so a name that
    is not registered is matched against the classes of the registered names. None if neither builds."""
    if not name:
        return None
    try:
        from workbench.environments import registry as env_registry
    except ImportError:
        return None
    try:
        return env_registry.make_env(name)
    except Exception:
        pass
    for spec in env_registry.list_envs():
        try:
            target = env_registry.REGISTRY.resolve(spec) if hasattr(env_registry, "REGISTRY") else None
        except Exception:
            continue
        if getattr(target, "__name__", None) == name:
            try:
                return env_registry.make_env(spec)
            except Exception:
                return None
    return None


def apply_reward_fn(batch: TrajectoryBatch, reward_fn: Callable[[Episode], Any],
                    environments: Sequence[Any] | None = None) -> list[float]:
    """`reward_fn(episode)` for each episode, leaving each episode's stored score untouched.

    Functions taking `(trajectory, environment)` get the episode's entry of `environments`
    (see `episode_environments`), else the environment that played it
    (`episode.environment`): `workbench.reward.episode_scores`.
    """
    from workbench.reward import episode_scores  # the scoring the trainer and the CLI use

    saved = [ep.score for ep in batch.episodes]
    try:
        return episode_scores(batch, reward_fn, list(environments) if environments is not None else None,
                              own_first=False)
    finally:
        for ep, score in zip(batch.episodes, saved):
            ep.score = score


def takes_environment(fn: Callable[..., Any]) -> bool:
    """Whether `fn` gets the environment: `workbench.reward.takes_environment` (the trainer's rule)."""
    from workbench.reward import takes_environment as rule

    return rule(fn)


def shared_bins(*series: Sequence[float], nbins: int = 20) -> dict[str, float]:
    """One plotly `xbins` (start, end, size) covering all series, so before/after bars line up."""
    values = [float(v) for s in series for v in s]
    if not values:
        return dict(start=0.0, end=1.0, size=1.0)
    lo, hi = min(values), max(values)
    if hi - lo < 1e-9:
        return dict(start=lo - 0.5, end=hi + 0.5, size=1.0)
    size = (hi - lo) / nbins
    return dict(start=lo - size / 2, end=hi + size / 2, size=size)


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
                  after: Sequence[float] | None = None, norm_adv_by_std: bool = True,
                  environments: Sequence[Any] | None = None, adv_estimator: str = "grpo"):
    """DataFrame with one row per episode: score, rank (1 = best) and advantage before and after.

    Give either `reward_fn` (applied to each episode, with `environments` as in
    `apply_reward_fn`) or the new scores `after`. Advantages are those of `adv_estimator`
    (`workbench.reward.episode_advantages`; `training.adv_estimator`, default GRPO).
    Columns: episode, group, score_before, score_after, rank_before, rank_after,
    rank_change (positive = moved up), adv_before, adv_after, success, env_reward, judge (the
    recorded judge score, NaN without one), judge_reason.
    """
    import pandas as pd

    before = stored_scores(batch)
    if after is None:
        if reward_fn is None:
            raise ValueError("rescore_table needs reward_fn or after")
        after = apply_reward_fn(batch, reward_fn, environments)
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
    from workbench.reward import episode_advantages

    df["adv_before"] = episode_advantages(before, groups, adv_estimator, norm_adv_by_std_in_grpo=norm_adv_by_std)
    df["adv_after"] = episode_advantages(list(after), groups, adv_estimator, norm_adv_by_std_in_grpo=norm_adv_by_std)
    df["success"] = [e.success for e in batch.episodes]
    df["env_reward"] = [e.total_reward for e in batch.episodes]
    for name, values in judge_columns(batch).items():  # what the judges said (NaN without one)
        df[name] = values
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
        batch: a stored `TrajectoryBatch` (e.g. `trainer.rollout()` or `TrajectoryBatch.load(path)`),
            or a `Run` (`workbench.debug.load_run`): its step `step` (default: the last saved),
            with the run's config as `config` unless one is given.
        reward_factory: builds the reward function from the weights; default
            `workbench.reward.RewardManager`.
        weights: initial weights (default: the factory's defaults); their names are the sliders.
        norm_adv_by_std: GRPO (True) or Dr.GRPO (False) advantages.
        environment: what reward functions taking `(trajectory, environment)` get for
            episodes without their own (`episode.environment`, the copy that played it,
            comes first): the environment the episodes ran with (e.g. `trainer.environment`),
            a dict env name -> environment, or None for `make_env(episode.env_name)`.
        config: a run's `ConfigStore` (e.g. `trainer.config`): the sliders start at its
            `reward` weights and advantages follow its `training.adv_estimator`
            (and `norm_adv_by_std_in_grpo`).
        adv_estimator: the advantage estimator shown (default: the config's, else "grpo").
        step: with a `Run`, the saved step whose batch is re-scored.
        judge: a `workbench.reward.Judge` or `GroupJudge` for the re-judge panel; default: the
            one `config.reward` names (`reward.judge`, else `reward.group_judge`), built on the
            first re-judge; no panel when there is neither.
    """

    weights = traitlets.Dict(help="current slider values")
    custom = traitlets.Bool(False, help="a custom reward fn (set_reward_fn) replaces the sliders")

    def __init__(self, batch: TrajectoryBatch, reward_factory: Callable[..., Callable[[Episode], Any]] | None = None,
                 weights: Mapping[str, float] | None = None, norm_adv_by_std: bool = True,
                 environment: Any = None, config: Any = None, adv_estimator: str | None = None,
                 step: int | None = None, judge: Any = None, **kwargs: Any):
        import plotly.graph_objects as go
        from plotly.subplots import make_subplots

        if reward_factory is None:
            from workbench.reward import RewardManager

            reward_factory = RewardManager
        if config is None and is_run(batch):
            config = batch.config  # the weights and estimator the run trained with
        batch = batch_of(batch, step)
        self.batch = batch
        self.reward_factory = reward_factory
        self.norm_adv_by_std = norm_adv_by_std
        training = getattr(config, "training", None)
        if training is not None and norm_adv_by_std:
            self.norm_adv_by_std = training.norm_adv_by_std_in_grpo
        self.adv_estimator = adv_estimator or (training.adv_estimator if training is not None else "grpo")
        self.environments = episode_environments(batch, environment)
        self._custom_fn: Callable[[Episode], Any] | None = None
        defaults = self.default_weights(reward_factory)
        if getattr(config, "reward", None) is not None:  # start from the run's configured weights
            defaults.update({k: float(getattr(config.reward, k)) for k in defaults if hasattr(config.reward, k)})
        defaults.update(weights or {})
        self.sliders: dict[str, widgets.FloatSlider] = {}
        for name, value in defaults.items():
            lo, hi = _slider_range(name, float(value))
            s = widgets.FloatSlider(value=float(value), min=lo, max=hi, step=0.01, description=name,
                                    continuous_update=False, readout_format=".2f",
                                    style={"description_width": "170px"}, layout=widgets.Layout(width="480px"))
            s.observe(self._on_slider, names="value")
            self.sliders[name] = s
        self._note = widgets.HTML()
        self._apply = widgets.Button(description="Apply to batch", icon="check",
                                     tooltip="write the new scores into the batch (episode.score)",
                                     layout=widgets.Layout(width="auto", min_width="150px"))
        self._apply.on_click(lambda _: self.apply())
        self.figure = go.FigureWidget(make_subplots(rows=1, cols=2, subplot_titles=[
            "episode reward", f"{self.adv_estimator} advantage"]))
        for col, what in ((1, "reward"), (2, "advantage")):
            for when, color in (("before", "#9e9e9e"), ("after", "#d62728")):
                self.figure.add_histogram(x=[], name=f"{what} {when}", marker_color=color, opacity=0.6,
                                          nbinsx=20, row=1, col=col, showlegend=True,
                                          legend="legend" if col == 1 else "legend2")
        # each chart's legend under it, at its left edge
        legends = {name: dict(orientation="h", x=domain[0], xanchor="left", y=-0.15, yanchor="top")
                   for name, domain in (("legend", self.figure.layout.xaxis.domain),
                                        ("legend2", self.figure.layout.xaxis2.domain))}
        self.figure.update_layout(barmode="overlay", height=320, template="plotly_white",
                                  margin=dict(l=40, r=10, t=40, b=40), **legends)
        self._table = widgets.HTML()
        self._table.add_class("wb-tuner-table")
        # Judged batches: the recorded model reward is added to what the sliders score, with the
        # run's reward.env_weight (`workbench.reward.recorded_model_scores`).
        self.config, self.judge, self.rejudged = config, judge, None
        reward = getattr(config, "reward", None)
        self._env_weight = float(getattr(reward, "env_weight", 1.0)) if reward is not None else 1.0
        panel = []
        if judge is not None or (reward is not None and (reward.judge or reward.group_judge)):
            from workbench.reward.judges import DEFAULT_RUBRIC

            rubric = getattr(judge, "rubric", None) or getattr(reward, "judge_rubric", DEFAULT_RUBRIC)
            self._rubric = widgets.Textarea(value=rubric, description="rubric",
                                            layout=widgets.Layout(width="640px", height="72px"))
            self._rejudge = widgets.Button(description="re-judge", icon="refresh",
                                           tooltip="judge the batch again with this rubric; list rank changes")
            self._rejudge.on_click(lambda _: self.rejudge(self._rubric.value))
            self._rejudged = widgets.HTML()
            panel = [widgets.VBox([widgets.HBox([self._rubric, self._rejudge]), self._rejudged])]
        # Sliders in their own row, the summary below them: side by side, a narrow output
        # area let the summary cover the sliders' readouts.
        self._controls = widgets.VBox(list(self.sliders.values()) + [self._apply])
        self._controls.add_class("wb-tuner-sliders")
        self._note.add_class("wb-tuner-note")
        super().__init__([self._controls, self._note, self.figure, self._table, *panel], **kwargs)
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

    def rejudge(self, rubric: str | None = None):
        """Judge the batch again with `rubric` (default: the panel's text) and show which episodes
        changed rank (`workbench.widgets.rejudge.rejudge_table`); returns the table."""
        if self.judge is None:
            from workbench.reward.group_judge import GroupJudge
            from workbench.reward.judges import Judge

            reward = getattr(self.config, "reward", None)
            if reward is None or not (reward.judge or reward.group_judge):
                raise ValueError("no judge to re-judge with: pass judge= or a config whose reward.judge is set")
            self.judge = (Judge if reward.judge else GroupJudge).from_config(reward)
        rubric = rubric if rubric is not None else getattr(self, "_rubric", None) and self._rubric.value
        self.rejudged = rejudge_table(self.batch, self.judge, rubric or None)
        if hasattr(self, "_rejudged"):
            self._rejudged.value = rejudge_html(self.rejudged, rubric or self.judge.rubric)
        return self.rejudged

    def _after(self) -> list[float] | None:
        """Scores after, for a judged batch: env_weight x the reward function's + the recorded
        model reward (an episode whose judgment failed: none added); None for other batches."""
        if not any(ep.judgments for ep in self.batch.episodes):
            return None
        from workbench.reward import recorded_model_scores

        env = apply_reward_fn(self.batch, self.reward_fn, self.environments)
        model = recorded_model_scores(self.batch, getattr(self.config, "reward", None))
        return [self._env_weight * e + (m or 0.0) for e, m in zip(env, model)]

    def recompute(self) -> None:
        """Re-score the batch with the current reward function and redraw."""
        try:
            self.table = rescore_table(self.batch, self.reward_fn, after=self._after(),
                                       norm_adv_by_std=self.norm_adv_by_std,
                                       environments=self.environments, adv_estimator=self.adv_estimator)
        except Exception as exc:  # a broken custom fn should not kill the widget
            self._note.value = f'{STYLE}<div class="wb-root wb-errline">reward fn failed: {esc(type(exc).__name__)}: {esc(exc)}</div>'
            raise
        t = self.table
        with self.figure.batch_update():
            self.figure.data[0].x = t["score_before"].tolist()
            self.figure.data[1].x = t["score_after"].tolist()
            self.figure.data[2].x = t["adv_before"].tolist()
            self.figure.data[3].x = t["adv_after"].tolist()
            for col, (a, b) in enumerate((("score_before", "score_after"), ("adv_before", "adv_after"))):
                bins = shared_bins(t[a].tolist(), t[b].tolist())
                for k in (2 * col, 2 * col + 1):  # before and after share their bins
                    self.figure.data[k].xbins = bins
                    self.figure.data[k].autobinx = False
        sync_figure_state(self.figure)
        self._note.value = self._note_html()
        self._table.value = self._table_html()

    def apply(self) -> TrajectoryBatch:
        """Write the current scores into the stored batch with `workbench.reward.score_batch`
        (the trainer's scoring): `episode.score` and the token rewards the next
        `trainer.compute_advantages(batch)` uses."""
        from workbench.reward import score_batch

        self.batch = score_batch(self.batch, self.reward_fn, self.environments, own_first=False)
        self.recompute()
        return self.batch

    # -- internals ------------------------------------------------------------------------------
    _hold = False

    def _budget_note(self) -> str:
        """Where the efficiency bonus's step budget comes from (only when that weight exists)."""
        if "efficiency_bonus" not in self.sliders or self.custom:
            return ""
        fixed = self.weights.get("max_steps") or getattr(self.reward_fn, "max_steps", None)
        if fixed:
            return f"<div>efficiency bonus: step budget max_steps={int(fixed)}</div>"
        budgets = sorted({getattr(env, "max_steps", None) for env in self.environments}, key=str)
        if budgets == [None]:
            return ("<div>efficiency bonus: no environment with max_steps, so the budget is each episode's "
                    "own turn count and the bonus is 0 (pass <code>environment=</code>)</div>")
        return ("<div>efficiency bonus: step budget max_steps=" + ", ".join(esc(b) for b in budgets)
                + " from the episodes' environment</div>")

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
                f'<div>{plural(len(t), "episode")}, {plural(t["group"].nunique(), "group")} · '
                f'scoring with <code>{esc(src)}</code></div>'
                f'<div>reward mean {t["score_before"].mean():+.3g} → <b>{t["score_after"].mean():+.3g}</b> · '
                f'std {t["score_before"].std(ddof=0):.3g} → <b>{t["score_after"].std(ddof=0):.3g}</b></div>'
                f'<div>{plural(n_moved, "episode")} changed rank · '
                f'{plural(sign_flips, "advantage")} changed sign</div>{self._budget_note()}</div>')

    def _table_html(self) -> str:
        cols = ["episode", "group", "score_before", "score_after", "rank_before", "rank_after", "rank_change",
                "adv_before", "adv_after", "success", "env_reward"]
        if self.table["judge"].notna().any():  # a judged batch: the judge's score and reason beside the env's
            cols += ["judge", "judge_reason"]
        moved = self.changed
        if not len(moved):
            return f'{STYLE}<div class="wb-root wb-legend">no episode changed rank</div>'
        return (f'{STYLE}<div class="wb-root"><div class="wb-head">episodes that changed rank '
                f'(rank 1 = best; rank_change &gt; 0 moved up)</div>'
                + html_table(moved.to_dict("records"), cols, max_rows=50) + "</div>")

    def __repr__(self) -> str:
        w = ", ".join(f"{k}={v:.2f}" for k, v in self.weights.items())
        return f"RewardTuner({plural(len(self.batch), 'episode')}, {'custom fn' if self.custom else w})"
