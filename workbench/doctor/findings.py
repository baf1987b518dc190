"""What the run doctor reports and what it keeps between steps: `Finding` and `Evidence`,
`BatchStats` (a few numbers per batch that the drift checks compare with the first steps)
and `History` (the stats of every step seen, the latest batch and the metric rows). The
thresholds, `DoctorConfig`, live in `workbench.doctor.thresholds` (the config's `doctor`
section) and are importable here too.

Core layer (beside `trajectory`): `workbench.doctor.checks` holds the checks,
`Trainer.fit` runs them per step, `workbench.debug.doctor` is the public front.
"""
from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import asdict, dataclass, field
from typing import Any

from workbench.doctor.judge_stats import judge_score
from workbench.doctor.thresholds import DoctorConfig  # noqa: F401 - importable from here too
from workbench.trajectory import Episode, TrajectoryBatch, Turn, success_reported

#: Severities, mildest first.
SEVERITIES = ("info", "warning", "error")
_WORD_RE = re.compile(r"\S+")
#: A reply is "the whole action" when the span the environment read covers at least this
#: share of it (parse-from-incidental-span's default `incidental_coverage`).
WHOLE_ACTION_COVERAGE = 0.5


@dataclass
class Evidence:
    """Where a finding shows: one turn of one episode, with the span of its reply."""

    episode_id: int
    """`Episode.episode_id` in the batch of `step`."""
    step: int | None
    """Training step of the batch (for `source="eval"`: the global step it was evaluated at)."""
    turn: int | None
    """0-based turn index, or None when the whole episode is the evidence."""
    text: str = ""
    """The reply of that turn (or a short description of the episode)."""
    span: list[int] | None = None
    """[start, end] of `text` that matters (the action read, the repeated tail), or None."""
    source: str = "train"
    """"train" (a training step's batch) or "eval" (a held-out batch)."""
    seed: int | None = None
    """The episode's environment seed."""

    def quote(self, width: int = 60) -> str:
        """The reply with the span in [[...]], cut to about `width` characters around it."""
        text = self.text
        if self.span:
            s, e = self.span
            text = f"{text[:s]}[[{text[s:e]}]]{text[e:]}"
            s = max(0, s - width // 2)
            text = ("..." if s else "") + text[s:s + width + 4] + ("..." if len(text) > s + width + 4 else "")
        elif len(text) > width:
            text = text[:width] + "..."
        return text.replace("\n", " ")

    def where(self) -> str:
        """"held-out episode 3 (seed 10003), step 8, turn 1"-style location."""
        kind = "held-out episode" if self.source == "eval" else "episode"
        parts = [f"{kind} {self.episode_id}" + (f" (seed {self.seed})" if self.seed is not None else "")]
        if self.step is not None:
            parts.append(f"step {self.step}")
        if self.turn is not None:
            parts.append(f"turn {self.turn}")
        return ", ".join(parts)


@dataclass
class Finding:
    """One check's verdict: what was measured, against which threshold, where it shows,
    and one sentence of what to do. `fired` is False for a measurement under threshold
    (kept for the `diagnose/<name>` metrics; `diagnose` returns only fired ones)."""

    name: str
    """The check's name, e.g. "parse-from-incidental-span" (metric `diagnose/<name>`)."""
    severity: str
    """"info", "warning" or "error"."""
    value: float
    """The measured number."""
    threshold: float
    """The threshold it was compared with (`DoctorConfig`)."""
    message: str
    """What was measured, in one or two sentences."""
    advice: str
    """One sentence of what to do."""
    evidence: list[Evidence] = field(default_factory=list)
    """Episodes that show it (up to `DoctorConfig.max_evidence`)."""
    step: int | None = None
    """Step (batch or metrics row) the number was measured at."""
    source: str = "train"
    """"train" or "eval" (the held-out batches)."""
    fired: bool = True
    """Whether the threshold was crossed."""
    remedy: dict[str, Any] = field(default_factory=dict)
    """The setting(s) to try against it, as config overrides `{"section.field": value}` (what
    `branch_run(checkpoint, finding.remedy, ...)` and `train --from CKPT` take); {} when the
    fix is not a setting, and then `advice` says what to look at instead."""
    branch_step: int | None = None
    """A branch that tries `remedy` starts from a checkpoint at or before this step; None: at
    or before `step`. Set when the cause began before the step it was measured at: a policy
    that stopped exploring before it met the games it loses is branched from before its first
    RL update (`workbench.doctor.held_out.first_rl_step`)."""

    def remedy_flags(self) -> str:
        """`remedy` as CLI flags ("--environment.strict_format true"); "" when there is none."""
        def text(v: Any) -> str:
            return str(v).lower() if isinstance(v, bool) else str(v)
        return " ".join(f"--{k} {text(v)}" for k, v in self.remedy.items())

    def line(self) -> str:
        """One line: name, severity, the number against its threshold, the first evidence."""
        where = f"; see {self.evidence[0].where()}: {self.evidence[0].quote()!r}" if self.evidence else ""
        held = " (held-out)" if self.source == "eval" else ""
        return (f"doctor: {self.name}{held} [{self.severity}] {self.value:.3g} vs {self.threshold:.3g}: "
                f"{self.message}{where}")

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> "Finding":
        data = dict(data)
        data["evidence"] = [Evidence(**e) for e in data.get("evidence", [])]
        return cls(**data)

    def __str__(self) -> str:
        return self.line()


def model_turns(batch: TrajectoryBatch) -> list[tuple[Episode, Turn]]:
    """(episode, turn) for every turn the policy sampled."""
    return [(ep, t) for ep in batch for t in ep.turns if t.source == "model"]


def bigram_entropy(texts: list[str]) -> float:
    """Entropy (nats) of the word bigrams of all `texts` pooled (0.0 when there are none)."""
    counts: Counter = Counter()
    for text in texts:
        words = ["<s>", *_WORD_RE.findall(text), "</s>"]
        counts.update(zip(words, words[1:]))
    n = sum(counts.values())
    return -sum(c / n * math.log(c / n) for c in counts.values()) if n else 0.0


def is_whole_action(turn: Turn) -> bool:
    """Whether a model turn's reply is the action itself: parsed, not invalid, and the span
    the environment read (`info["action_span"]`) covers at least `WHOLE_ACTION_COVERAGE` of
    the stripped reply (a bare "5", "Answer: 12"; not "The number is 5.")."""
    span = turn.info.get("action_span")
    if turn.parse_error or turn.info.get("invalid_action"):
        return False
    if not (isinstance(span, (list, tuple)) and len(span) == 2 and 0 <= span[0] <= span[1] <= len(turn.action)):
        return False
    return (span[1] - span[0]) / max(len(turn.action.strip()), 1) >= WHOLE_ACTION_COVERAGE


@dataclass
class BatchStats:
    """The numbers of one batch that the drift checks compare across steps."""

    step: int
    """Training step (or evaluation step) of the batch."""
    model_turns: int
    """Turns sampled by the policy."""
    reply_tokens_mean: float
    """Mean tokens per model turn."""
    truncation_rate: float
    """Share of model turns that ended at max_tokens (`finish_reason == "length"`)."""
    distinct_ratio: float
    """Distinct (stripped) replies / model turns."""
    bigram_entropy: float
    """`bigram_entropy` of the model turns' replies."""
    reward_mean: float
    """Mean episode outcome (`Episode.outcome`)."""
    success_rate: float
    """Share of episodes with `success` (NaN when the environment does not report success)."""
    reports_success: bool
    """Whether the environment reports success (`workbench.trajectory.success_reported`)."""
    whole_action_share: float = 0.0
    """Share of model turns whose reply is the whole action (`is_whole_action`)."""
    judge_score_mean: float | None = None
    """Mean judge score (`workbench.doctor.judge_stats.judge_score`) of the episodes a judge scored;
    None when none was (no model reward in the run)."""

    @classmethod
    def of(cls, batch: TrajectoryBatch, step: int) -> "BatchStats":
        turns = model_turns(batch)
        replies = [t.action.strip() for _, t in turns]
        n, eps = max(len(turns), 1), max(len(batch), 1)
        return cls(
            step=step, model_turns=len(turns),
            reply_tokens_mean=sum(t.token_end - t.token_start for _, t in turns) / n,
            truncation_rate=sum(t.finish_reason == "length" for _, t in turns) / n,
            distinct_ratio=len(set(replies)) / n, bigram_entropy=bigram_entropy(replies),
            reward_mean=sum(e.outcome for e in batch) / eps,
            success_rate=sum(bool(e.success) for e in batch) / eps if success_reported(batch) else float("nan"),
            reports_success=success_reported(batch),
            whole_action_share=sum(is_whole_action(t) for _, t in turns) / n,
            judge_score_mean=_judge_mean(batch))


def _judge_mean(batch: TrajectoryBatch) -> float | None:
    scores = [s for s in (judge_score(e) for e in batch) if s is not None]
    return sum(scores) / len(scores) if scores else None


@dataclass
class EpisodeRecord:
    """What `heldout-regression` keeps of one held-out episode: enough to pair it with the
    same seed's episode at another evaluation and to point at where the two part."""

    episode_id: int
    """`Episode.episode_id` in its batch."""
    seed: int | None
    """`Episode.env_seed`."""
    success: bool
    """`Episode.success`."""
    turns: tuple[int, ...]
    """`Turn.index` of each model turn."""
    replies: tuple[str, ...]
    """Each model turn's reply (`Turn.action`)."""
    actions: tuple[str, ...]
    """Each model turn's action: the span the environment read (`info["action_span"]`), or
    the stripped reply when there is none."""
    spans: tuple[list[int] | None, ...]
    """Each model turn's `info["action_span"]` (None when there is none)."""

    @classmethod
    def of(cls, ep: Episode) -> "EpisodeRecord":
        turns = [t for t in ep.turns if t.source == "model"]
        spans = [_action_span(t) for t in turns]
        actions = [t.action[s[0]:s[1]].strip() if s else t.action.strip() for t, s in zip(turns, spans)]
        return cls(episode_id=ep.episode_id, seed=ep.env_seed, success=bool(ep.success),
                   turns=tuple(t.index for t in turns), replies=tuple(t.action for t in turns),
                   actions=tuple(actions), spans=tuple(spans))


def _action_span(turn: Turn) -> list[int] | None:
    span = turn.info.get("action_span")
    ok = isinstance(span, (list, tuple)) and len(span) == 2 and 0 <= span[0] <= span[1] <= len(turn.action)
    return list(span) if ok else None


def episode_records(batch: TrajectoryBatch) -> dict[tuple[int, int], EpisodeRecord]:
    """A held-out batch's episodes by (environment seed, occurrence of that seed in the
    batch): the key pairs an episode with the same seed's at another evaluation of the same
    seeds (the k-th of each seed when a seed is played more than once). Episodes without a
    seed are left out."""
    out: dict[tuple[int, int], EpisodeRecord] = {}
    seen: Counter = Counter()
    for ep in batch:
        if ep.env_seed is None:
            continue
        out[(ep.env_seed, seen[ep.env_seed])] = EpisodeRecord.of(ep)
        seen[ep.env_seed] += 1
    return out


@dataclass(frozen=True)
class RunFacts:
    """What a finding's words and remedy must fit besides the batches: the run's settings and
    what its environment can do. None where unknown (a batch judged on its own): the remedy is
    then the plain one (`workbench.doctor.checks.REMEDIES`)."""

    adv_estimator: str | None = None
    """`training.adv_estimator`."""
    group_relative: bool | None = None
    """Whether that estimator's advantages are rewards relative to the episode's group (GRPO,
    RLOO, REINFORCE++ with baseline): only then do flat groups give zero advantages, and only
    then is dynamic sampling a remedy."""
    max_tokens: int | None = None
    """`inference.max_tokens`: the overlong penalty's window must fit inside it."""
    has_expert: bool | None = None
    """Whether the environment has a scripted expert (`expert_action`): an SFT warm-up needs one."""
    supports_strict_format: bool | None = None
    """Whether the environment has a strict action format (`supports_strict_format`)."""
    group_size: int | None = None
    """`training.group_size`: a policy that wins its batches and loses held-out games is
    offered more groups per step (`workbench.doctor.held_out.gap_remedy`)."""
    env_weight: float | None = None
    """`reward.env_weight`: the judge remedies weight the environment's reward up from it."""
    model_sources: tuple[str, ...] | None = None
    """The model rewards that are on ("judge", "group_judge", "reward_model"); () for none."""

    @classmethod
    def of(cls, config: Any, environment: Any = None) -> "RunFacts":
        """The facts of a run of `config` (a `ConfigStore`) on `environment` (an environment
        object or class; None: unknown)."""
        from workbench.algo.advantages import GROUP_RELATIVE_ESTIMATORS

        t, i = config.training, config.inference
        env_type = environment if isinstance(environment, type) or environment is None else type(environment)
        r = getattr(config, "reward", None)
        sources = None if r is None else tuple(n for n in ("judge", "group_judge", "reward_model")
                                               if getattr(r, n, None) is not None)
        return cls(adv_estimator=t.adv_estimator, group_relative=t.adv_estimator in GROUP_RELATIVE_ESTIMATORS,
                   max_tokens=i.max_tokens, group_size=t.group_size,
                   env_weight=None if r is None else getattr(r, "env_weight", None), model_sources=sources,
                   has_expert=None if env_type is None else callable(getattr(env_type, "expert_action", None)),
                   supports_strict_format=None if env_type is None else bool(getattr(env_type,
                                                                                     "supports_strict_format", False)))


@dataclass
class History:
    """What the checks look at: per-step `BatchStats` (earliest first), the latest batch
    (the evidence comes from it) and the metric rows (one dict per training step)."""

    source: str = "train"
    """"train" or "eval"."""
    stats: list[BatchStats] = field(default_factory=list)
    """One entry per batch added, earliest first."""
    batch: TrajectoryBatch | None = None
    """The latest batch added."""
    step: int | None = None
    """Its step."""
    metrics: list[dict[str, Any]] = field(default_factory=list)
    """Metric rows (`Trainer.metrics_history` or metrics.jsonl), earliest first."""
    records: list[dict[tuple[int, int], EpisodeRecord]] = field(default_factory=list)
    """For `source="eval"`: one `episode_records` per batch added, earliest first (what
    heldout-regression pairs by seed); empty for training batches (new seeds every step)."""
    run: RunFacts | None = None
    """The run's settings the findings' words and remedies fit (`RunFacts`); None: unknown."""
    held_out: TrajectoryBatch | None = None
    """For `source="train"`: the latest held-out evaluation's batch (games on unseen seeds),
    when the caller has one (`diagnose` and `train_and_report` do; `fit`'s per-step doctor
    does not). The checks that spare a policy winning its training batches (entropy-collapse,
    zero-variance-groups) ask it too: a policy that wins its batches and loses held-out games
    has not solved the task (`workbench.doctor.checks.solved`)."""
    held_out_step: int | None = None
    """The step `held_out` was evaluated at."""

    def add(self, batch: TrajectoryBatch, step: int) -> "History":
        """Record `batch` as step `step` (its stats are kept, the batch replaces the last one;
        a held-out batch's episodes are kept as `records` too)."""
        self.stats.append(BatchStats.of(batch, step))
        if self.source == "eval":
            self.records.append(episode_records(batch))
        self.batch, self.step = batch, step
        return self

    def baseline(self, n: int) -> list[BatchStats]:
        """The first steps' stats: at most `n`, never the latest one (empty with one batch)."""
        return self.stats[:max(0, min(n, len(self.stats) - 1))]

    def evidence(self, ep: Episode, turn: Turn | None, span: list[int] | None = None,
                 text: str | None = None) -> Evidence:
        """Evidence for a turn (or a whole episode) of the latest batch."""
        return Evidence(episode_id=ep.episode_id, step=self.step, turn=None if turn is None else turn.index,
                        text=text if text is not None else (turn.action if turn is not None else ""),
                        span=list(span) if span else None, source=self.source, seed=ep.env_seed)
