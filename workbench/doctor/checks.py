"""The run doctor's checks: small named functions over a `History` (the latest batch,
per-step stats since the first steps, metric rows), like `check_env`'s.

Each check is `check(history, config) -> Finding | None`: None when it cannot judge
(too few samples, no history, a metric not recorded), else a `Finding` whose `fired`
says whether the threshold (a `DoctorConfig` field) was crossed. `CHECKS` lists them by
name; `run_checks` runs them all; `StepDoctor` is what `Trainer.fit` calls once per step
(cheap: string work on one batch, no model, no files).

Core layer: imports only `trajectory` and the `doctor` modules beside it, so `training` can call it;
`workbench.debug.doctor` is the public front (`diagnose`, the CLI).
"""
from __future__ import annotations

import math
import re
import time
from collections import Counter
from statistics import median
from typing import Any, Callable

from workbench.doctor.findings import (
    BatchStats, DoctorConfig, Evidence, Finding, History, RunFacts, model_turns,
)
from workbench.doctor.held_out import GAP_ADVICE, check_heldout_regression, first_rl_step, gap_remedy, solved
from workbench.doctor.judges import JUDGE_CHECKS
from workbench.doctor.remedies import OVERLONG_WINDOW, REMEDIES, remedy_for  # noqa: F401 - importable here too
from workbench.doctor.remedies import finding as _finding

Check = Callable[[History, DoctorConfig], "Finding | None"]
_NUMBER_RE = re.compile(r"-?\d+(?:\.\d+)?")
#: Episode warnings that are not token alignment problems (context cuts, settle hooks).
_NOT_ALIGNMENT = ("context:", "on_truncate(")


def _span(turn: Any) -> list[int] | None:
    span = turn.info.get("action_span")
    ok = isinstance(span, (list, tuple)) and len(span) == 2 and 0 <= span[0] <= span[1] <= len(turn.action)
    return list(span) if ok else None


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


def _same_form(base: list[BatchStats], last: BatchStats, cfg: DoctorConfig) -> list[BatchStats]:
    """The first steps to compare the latest batch with. When the latest replies are whole
    actions (at least `cfg.whole_action_share` of them), only first steps whose replies were
    too: empty when the policy went from sentences to the bare action (a strict format
    learned, an SFT warm-up), whose fewer distinct, shorter replies are the format, not a
    collapse. Otherwise all of them (bare actions -> padded sentences is a drift)."""
    if last.whole_action_share < cfg.whole_action_share:
        return list(base)
    return [b for b in base if b.whole_action_share >= cfg.whole_action_share]


def _form_note(base: list[BatchStats], last: BatchStats) -> str:
    return (f"; not compared: the replies changed form ({last.whole_action_share:.0%} are the whole action, "
            f"first steps {_mean([b.whole_action_share for b in base]):.0%})")


# -- reward hacking ---------------------------------------------------------------------
def check_parse_from_incidental_span(h: History, cfg: DoctorConfig) -> Finding | None:
    """Rewarded turns whose action (the span the environment read, `info["action_span"]`)
    is a small part of the reply: the reward comes from what a parser pulled out of a
    sentence ("You have [[5]] guesses left, so"), not from an answer."""
    if h.batch is None:
        return None
    rewarded = [(ep, t, _span(t)) for ep, t in model_turns(h.batch) if t.reward > 0 and _span(t)]
    if len(rewarded) < cfg.min_samples:
        return None
    cover = [(s[1] - s[0]) / max(len(t.action.strip()), 1) for _, t, s in rewarded]
    incidental = [(r, c) for r, c in zip(rewarded, cover) if c < cfg.incidental_coverage]
    share = len(incidental) / len(rewarded)
    example = ""
    if incidental:
        (ep, t, s), _ = incidental[0]
        example = f", e.g. {t.action[s[0]:s[1]]!r} read from {t.action.strip()!r}"
    return _finding(
        "parse-from-incidental-span", "warning", share, cfg.incidental_share, share >= cfg.incidental_share,
        f"{len(incidental)} of {len(rewarded)} rewarded turns were rewarded for an action that is a small part "
        f"of the reply (median {median(cover):.0%} of it){example}: the parser pulled the action out of a "
        "sentence, so the reward may come from a parser exploit rather than the task",
        "Make the action format strict: set environment.strict_format=true (CLI: --environment.strict_format "
        "true), so only a reply that is the action counts (e.g. a bare number) and anything else is a format "
        "error the model sees; and read the evidence episodes before trusting the success rate.",
        h, [h.evidence(ep, t, s) for ((ep, t, s), _) in incidental], cfg)


def check_reward_without_success(h: History, cfg: DoctorConfig) -> Finding | None:
    """Mean reward rising over the first steps' while the environment's success rate does
    not: the policy found reward the task did not mean to give (shaping, partial credit)."""
    base = h.baseline(cfg.baseline_steps)
    if not base or h.batch is None or not h.stats[-1].reports_success:
        return None
    last = h.stats[-1]
    rise = last.reward_mean - _mean([b.reward_mean for b in base])
    # the environment reports success (the latest batch says so): a first batch where no step
    # mentioned it (an environment that only ever says True, and nobody won) won nothing
    success_rise = last.success_rate - _mean([b.success_rate if b.reports_success else 0.0 for b in base])
    fired = rise >= cfg.reward_rise and success_rise < cfg.success_rise
    unsuccessful = sorted((e for e in h.batch if not e.success), key=lambda e: -e.outcome)
    return _finding(
        "reward-without-success", "warning", rise, cfg.reward_rise, fired,
        f"mean reward rose by {rise:+.3f} over the first steps while the success rate moved {success_rise:+.3f}",
        "Look at what the rewarded unsuccessful episodes do and remove the reward they exploit (shaping, "
        "partial credit, a lenient check).",
        h, [h.evidence(e, None, text=f"reward {e.outcome:+.3f}, success {e.success}") for e in unsuccessful], cfg)


def check_tool_result_ignored(h: History, cfg: DoctorConfig) -> Finding | None:
    """In tool environments, final answers that contain none of the tool results the
    episode received (numbers compared as numbers): the tool call is decoration."""
    if h.batch is None:
        return None
    judged, ignored = 0, []
    for ep in h.batch:
        results: list[str] = []
        final = None
        for t in ep.turns:
            if t.source != "model":
                continue
            if t.tool_calls or "tool_result" in t.info:
                results += [str(c.get("result")) for c in t.tool_calls if c.get("success") and c.get("result")]
                results += [str(t.info["tool_result"])] if "tool_result" in t.info else []
            elif results and not t.parse_error and not t.info.get("invalid_action"):
                final = t
        if final is None:
            continue
        judged += 1
        said = final.action
        numbers = {float(x) for x in _NUMBER_RE.findall(said)}
        used = any(r.strip() and (r.strip() in said or {float(x) for x in _NUMBER_RE.findall(r)} & numbers)
                   for r in results)
        if not used:
            ignored.append(h.evidence(ep, final, _span(final)))
    if judged < cfg.min_samples:
        return None
    share = len(ignored) / judged
    return _finding(
        "tool-result-ignored", "warning", share, cfg.tool_ignored_share, share >= cfg.tool_ignored_share,
        f"{len(ignored)} of {judged} final answers given after a tool result contain none of the results",
        "Reward answers that use the tool's result (or check the result reaches the model in a form it reads).",
        h, ignored, cfg)


# -- collapse -----------------------------------------------------------------------------
def check_template_collapse(h: History, cfg: DoctorConfig) -> Finding | None:
    """Replies collapsing onto a template: the share of distinct replies in the batch fell
    below a threshold and far below the first steps', or the replies' word-bigram entropy
    fell far below the first steps'. Needs at least two batches. Compared only with first
    steps whose replies have the same form (`_same_form`): a policy that went from
    sentences to bare actions has fewer distinct replies because the actions are few. When
    the replies are bare actions, the value is the most common reply's share (it must reach
    `bare_collapse_share`): a converged policy in a small action space repeats its best
    actions, which the distinct share alone would call a collapse."""
    base = h.baseline(cfg.baseline_steps)
    if not base or h.batch is None or h.stats[-1].model_turns < cfg.min_samples:
        return None
    last = h.stats[-1]
    same = _same_form(base, last, cfg)
    ref = same or base  # sentences -> bare actions: nothing fires
    ratio0, ent0 = _mean([b.distinct_ratio for b in ref]), _mean([b.bigram_entropy for b in ref])
    by_ratio = last.distinct_ratio < cfg.min_distinct_ratio and last.distinct_ratio < cfg.collapse_fraction * ratio0
    by_entropy = ent0 > 0 and last.bigram_entropy < cfg.collapse_fraction * ent0
    turns = model_turns(h.batch)
    common, count = Counter(t.action.strip() for _, t in turns).most_common(1)[0]
    described = (f"{last.distinct_ratio:.0%} of replies are distinct (first steps {ratio0:.0%}), reply bigram "
                 f"entropy {last.bigram_entropy:.2f} nats (first steps {ent0:.2f}); the most common reply, "
                 f"{common!r}, is {count} of {len(turns)}")
    if same and last.whole_action_share >= cfg.whole_action_share:  # bare actions, as in the first steps
        share = count / len(turns)
        value, threshold = share, cfg.bare_collapse_share
        fired = share >= cfg.bare_collapse_share and last.distinct_ratio < cfg.collapse_fraction * ratio0
    else:
        value, threshold = last.distinct_ratio, min(cfg.min_distinct_ratio, cfg.collapse_fraction * ratio0)
        fired = bool(same) and (by_ratio or by_entropy)
    return _finding(
        "template-collapse", "warning", value, threshold, fired,
        described + ("" if same else _form_note(base, last)),
        "Raise the entropy bonus or temperature, add a KL term, or vary the prompts; check whether the common "
        "reply is a trick (see the other findings).",
        h, [h.evidence(ep, t) for ep, t in turns if t.action.strip() == common], cfg)


def check_repetition_to_limit(h: History, cfg: DoctorConfig) -> Finding | None:
    """Replies cut at max_tokens (`finish_reason == "length"`) that end inside a repeated
    unit ("Answer: 12 Answer: 12 Answer: 1"): the model loops until the token limit."""
    if h.batch is None:
        return None
    turns = model_turns(h.batch)
    if len(turns) < cfg.min_samples:
        return None
    looping = []
    for ep, t in turns:
        if t.finish_reason == "length":
            tail = _repeated_tail(t.action.rstrip(), cfg.repeat_count, cfg.repeat_max_period)
            if tail:
                looping.append(h.evidence(ep, t, tail))
    share = len(looping) / len(turns)
    return _finding(
        "repetition-to-limit", "warning", share, cfg.repetition_share, share >= cfg.repetition_share and looping,
        f"{len(looping)} of {len(turns)} replies hit max_tokens while repeating the same text",
        "Penalise replies that run to the limit with the overlong penalty (reward.overlong_penalty, e.g. 1.0, "
        "over the last reward.overlong_buffer tokens), or end the turn at the answer with a stop string "
        "(inference.stop), so looping to the limit earns nothing.",
        h, looping, cfg)


def _repeated_tail(text: str, count: int, max_period: int) -> list[int] | None:
    """[start, end] of the longest periodic tail of `text` holding >= `count` repeats of a unit."""
    n = len(text)
    for p in range(1, min(max_period, n // count) + 1):
        if text[n - p * count:n - p] == text[n - p * (count - 1):n]:  # the last count*p chars have period p
            start = n - p * count
            while start > 0 and text[start - 1] == text[start - 1 + p]:
                start -= 1
            if n - start >= 8 and text[start:n].strip():
                return [start, n]
    return None


def check_length_drift(h: History, cfg: DoctorConfig) -> Finding | None:
    """Mean reply length (tokens per model turn) moving far from the first steps' (with
    `_same_form`: sentences -> the bare action is not a drift; the other way it is)."""
    base = h.baseline(cfg.baseline_steps)
    if not base or h.batch is None:
        return None
    last = h.stats[-1]
    same = _same_form(base, last, cfg)
    ref = _mean([b.reply_tokens_mean for b in same or base])  # sentences -> bare actions: nothing fires
    if ref <= 0 or last.model_turns < cfg.min_samples:
        return None
    ratio = last.reply_tokens_mean / ref
    fired = bool(same) and (ratio >= cfg.length_ratio or ratio <= 1 / cfg.length_ratio)
    turns = sorted(model_turns(h.batch), key=lambda x: x[1].token_end - x[1].token_start, reverse=ratio >= 1)
    return _finding(
        "length-drift", "warning", ratio, cfg.length_ratio, fired,
        f"replies average {last.reply_tokens_mean:.1f} tokens, {ratio:.2f}x the first steps' {ref:.1f}"
        + ("" if same else _form_note(base, last)),
        "Read the longest (or shortest) replies: padding, looping or answer-only collapse; add a length penalty "
        "or adjust max_tokens if it is a hack.",
        h, [h.evidence(ep, t) for ep, t in turns], cfg)


def check_truncation_surge(h: History, cfg: DoctorConfig) -> Finding | None:
    """The share of replies cut at max_tokens rising far above the first steps'."""
    base = h.baseline(cfg.baseline_steps)
    if not base or h.batch is None or h.stats[-1].model_turns < cfg.min_samples:
        return None
    last, ref = h.stats[-1], _mean([b.truncation_rate for b in base])
    rise = last.truncation_rate - ref
    cut = [(ep, t) for ep, t in model_turns(h.batch) if t.finish_reason == "length"]
    thinking = [(ep, t) for ep, t in cut if t.reasoning_cut]  # cut inside <think>: no action at all
    return _finding(
        "truncation-surge", "warning", rise, cfg.truncation_rise, rise >= cfg.truncation_rise,
        f"{last.truncation_rate:.0%} of replies end at max_tokens (first steps {ref:.0%})"
        + (f"; {len(thinking)} of the {len(cut)} cut replies ended inside their reasoning block (<think> "
           "without </think>), so they had no action" if thinking else ""),
        ("Replies cut inside their reasoning never act: raise inference.max_tokens so the reasoning can end, or "
         "turn thinking off (inference.enable_thinking false). " if thinking else "")
        + "Read the truncated replies; penalise running to the limit with the overlong penalty "
        "(reward.overlong_penalty, over the last reward.overlong_buffer tokens), or raise inference.max_tokens "
        "if the answers need it.",
        h, [h.evidence(ep, t) for ep, t in thinking + [c for c in cut if not c[1].reasoning_cut]], cfg)


def _metric_rows(h: History, key: str) -> list[tuple[Any, float, dict[str, Any]]]:
    """(step, value, row) of every metrics row, in order, whose `key` is a finite number."""
    return [(r.get("step"), float(r[key]), r) for r in h.metrics
            if isinstance(r.get(key), (int, float)) and math.isfinite(r[key])]


def check_entropy_collapse(h: History, cfg: DoctorConfig) -> Finding | None:
    """`actor/entropy` (recorded by the update) falling far below the first steps', while the
    task is not solved (`solved`): a policy that wins at least `cfg.solved_success_rate` of
    its batch at that step (`env/success_rate`), and of the held-out games when the history
    holds an evaluation, converged on what wins, and a low entropy is that. One that wins its
    batches and loses held-out games stopped exploring before it found how to win them: the
    finding then names the gap, with the held-out games it loses as the evidence."""
    rows = [(step, v) for step, v, _ in _metric_rows(h, "actor/entropy")]
    if len(rows) <= cfg.baseline_steps:
        return None
    ref = _mean([v for _, v in rows[:cfg.baseline_steps]])
    if ref <= 0:
        return None
    step, last = rows[-1]
    ratio = last / ref
    success = next((float(r["env/success_rate"]) for r in h.metrics if r.get("step") == step
                    and isinstance(r.get("env/success_rate"), (int, float))), None)
    verdict = solved(h, cfg, success, step)
    ev = list(verdict.evidence)
    if h.batch is not None:
        common = Counter(t.action.strip() for _, t in model_turns(h.batch)).most_common(1)
        ev += [h.evidence(ep, t) for ep, t in model_turns(h.batch) if common and t.action.strip() == common[0][0]]
    if verdict.solved:
        state = f"the policy converged on a batch it wins ({verdict.words})"
    elif verdict.gap:
        state = f"the policy is nearly deterministic and {verdict.words}, so exploration no longer finds the games it loses"
    else:
        state = "the policy has nearly stopped exploring"
    f = _finding(
        "entropy-collapse", "warning", ratio, cfg.entropy_fraction, ratio <= cfg.entropy_fraction and not verdict.solved,
        f"policy entropy {last:.3g} is {ratio:.0%} of the first steps' {ref:.3g}: {state}",
        "Add an entropy bonus (training.entropy_coeff, e.g. 0.01) or a KL term (use_kl_loss), or lower the "
        "learning rate." + (GAP_ADVICE if verdict.gap else ""),
        h, ev, cfg, step=step)
    if verdict.gap:
        f.remedy.update(gap_remedy(h))
        f.branch_step = first_rl_step(h)
    return f


def check_kl_spike(h: History, cfg: DoctorConfig) -> Finding | None:
    """A step whose `kl/mean` (policy vs reference) jumps far above the median of the steps
    before it; the worst such step is reported."""
    rows = [(step, v) for step, v, _ in _metric_rows(h, "kl/mean")]
    if len(rows) <= cfg.baseline_steps:
        return None
    worst = None
    for i in range(cfg.baseline_steps, len(rows)):
        ref = max(median(abs(v) for _, v in rows[:i]), 1e-12)
        ratio = abs(rows[i][1]) / ref
        if worst is None or ratio > worst[0]:
            worst = (ratio, rows[i][0], rows[i][1], ref)
    ratio, step, value, ref = worst
    threshold = max(cfg.kl_spike_factor * ref, cfg.kl_spike_min)
    ev = []
    if h.batch is not None and h.step == step and h.batch.has("kl"):
        kl = h.batch.kl.abs().sum(dim=1)  # (B,)
        order = sorted(range(len(h.batch)), key=lambda b: -float(kl[b]))
        ev = [h.evidence(h.batch[b], None, text=f"summed |KL| {float(kl[b]):.3g}") for b in order]
    return _finding(
        "kl-spike", "warning", value, threshold, abs(value) >= threshold,
        f"kl/mean {value:.3g} at step {step} is {ratio:.1f}x the median {ref:.3g} of the steps before",
        "Lower the learning rate or raise the KL coefficient, and look at that step's batch for a degenerate reply.",
        h, ev, cfg, step=step)


# -- dead signal ----------------------------------------------------------------------------
def check_zero_variance_groups(h: History, cfg: DoctorConfig) -> Finding | None:
    """Share of GRPO groups (episodes with one `group_id`) whose rewards are all equal, in a
    batch whose task is not solved (`solved`: a batch won at `cfg.solved_success_rate` or
    more, and held-out games too when the history holds an evaluation, has nothing left to
    learn). Those groups give a group-relative estimator nothing. When the batch is won but
    held-out games are lost, the evidence is the held-out games lost, then the flat groups."""
    if h.batch is None:
        return None
    groups: dict[str, list] = {}
    for ep in h.batch:
        groups.setdefault(ep.group_id, []).append(ep)
    groups = {g: eps for g, eps in groups.items() if len(eps) > 1}
    if len(groups) < 2:
        return None
    flat = [eps for eps in groups.values() if len({round(e.outcome, 9) for e in eps}) == 1]
    share = len(flat) / len(groups)
    success = h.stats[-1].success_rate
    verdict = solved(h, cfg, success)
    fired = share >= cfg.zero_variance_share and not verdict.solved
    why = (f"; {verdict.words}: the batches are won alike, so nothing teaches the games it loses" if verdict.gap
           else "")
    rate = f"success rate {success:.0%}" if h.stats[-1].reports_success else "success not reported"
    head = f"{len(flat)} of {len(groups)} groups have identical rewards ({rate}): "
    ways = ("make the task easier (or harder), raise training.group_size or inference.temperature, or shape the "
            "reward so a group's episodes differ.")
    if h.run is None or h.run.group_relative is not False:
        estimator = h.run.adv_estimator if h.run is not None else "a group-relative estimator"
        message = head + f"under {estimator} their advantages are 0 and they teach nothing{why}"
        advice = ("Turn on dynamic sampling (training.dynamic_sampling=true: flat groups are dropped and resampled, "
                  "at most training.dynamic_sampling_max_batches extra rounds), or " + ways)
    else:  # GAE and REINFORCE++ do not center rewards on the group: the advantages are not 0
        message = head + (f"under {h.run.adv_estimator} their advantages are not 0 (they come from the returns"
                          + (" and the critic's values" if h.run.adv_estimator == "gae" else "")
                          + "), but the reward does not tell these episodes apart, so the update cannot learn "
                          f"which of them was better{why}")
        advice = ("Dynamic sampling does not apply (it needs a group-relative training.adv_estimator); " + ways)
    f = _finding(
        "zero-variance-groups", "warning", share, cfg.zero_variance_share, fired, message,
        advice + (GAP_ADVICE if verdict.gap else ""),
        h, verdict.evidence + [h.evidence(eps[0], None, text=f"group {eps[0].group_id}: all {len(eps)} rewards "
                                                             f"{eps[0].outcome:+.3f}") for eps in flat], cfg)
    if verdict.gap:
        f.remedy.update(gap_remedy(h))
        f.branch_step = first_rl_step(h)
    return f


def check_format_errors(h: History, cfg: DoctorConfig) -> Finding | None:
    """Share of model turns whose action could not be parsed (`Turn.parse_error`) or that
    the environment called invalid (`info["invalid_action"]`)."""
    if h.batch is None:
        return None
    turns = model_turns(h.batch)
    if len(turns) < cfg.min_samples:
        return None
    bad = [(ep, t) for ep, t in turns if t.parse_error or t.info.get("invalid_action")]
    share = len(bad) / len(turns)
    return _finding(
        "format-errors", "warning", share, cfg.format_error_share, share >= cfg.format_error_share,
        f"{len(bad)} of {len(turns)} replies could not be parsed or were invalid actions",
        ("Warm up with SFT on the environment's scripted expert (sft.steps, e.g. 4: the policy learns the "
         "format from demonstrations), sample under the action's grammar (environment.constrained_decoding), "
         "show the reply format in the system prompt, or use a lenient parser."
         if h.run is None or h.run.has_expert is not False else
         "Sample under the action's grammar (environment.constrained_decoding, where the environment has one), "
         "show the reply format in the system prompt or use a lenient parser; an SFT warm-up (sft.steps) needs "
         "the environment to have a scripted expert (an expert_action method), which this one has not."),
        h, [h.evidence(ep, t) for ep, t in bad], cfg)


def check_environment_errors(h: History, cfg: DoctorConfig) -> Finding | None:
    """Share of the latest batch's episodes that ended in an environment error
    (`Episode.environment_error`); fires above `environment_error_share`."""
    if h.batch is None or not len(h.batch):
        return None
    eps = list(h.batch)
    failed = [ep for ep in eps if ep.environment_error]
    share = len(failed) / len(eps)
    first = failed[0].environment_error if failed else ""
    errors = sorted({ep.environment_error for ep in failed})
    return Finding(
        name="environment-errors", severity="error", value=share, threshold=cfg.environment_error_share,
        fired=share > cfg.environment_error_share,
        message=(f"{len(failed)} of {len(eps)} episodes ended in an environment error ({len(errors)} distinct); "
                 f"first: {first}" if failed else f"0 of {len(eps)} episodes ended in an environment error"),
        advice="The update leaves these episodes out (their reward is the environment's failure). Read the "
               "error: a server that is down or refuses the action's format, an environment that raises, a step "
               "past environment.step_timeout; try the environment with workbench.check_env or one Rollout.",
        evidence=[h.evidence(ep, None, text=ep.environment_error or "") for ep in failed][:cfg.max_evidence],
        step=h.step, source=h.source)


def check_tokenization_mismatch(h: History, cfg: DoctorConfig) -> Finding | None:
    """Episodes whose tokens differ from a re-render of their conversation (the alignment
    warnings in `Episode.warnings`): the trained tokens are not what the model will see."""
    if h.batch is None or not len(h.batch):
        return None
    bad = [ep for ep in h.batch if any(not w.startswith(_NOT_ALIGNMENT) for w in ep.warnings)]
    share = len(bad) / len(h.batch)
    return _finding(
        "tokenization-mismatch", "error", share, cfg.mismatch_share, share > cfg.mismatch_share,
        f"{len(bad)} of {len(h.batch)} episodes have token alignment warnings",
        "Fix the chat template or the observation rendering named in the episode warning before training on "
        "these tokens.",
        h, [h.evidence(ep, None, text=next(w for w in ep.warnings if not w.startswith(_NOT_ALIGNMENT)))
            for ep in bad], cfg)


def _largest_gap_evidence(h: History, versions: bool) -> list[Evidence]:
    """The current batch's episodes by mean |trainer - engine| logprob gap of their trained
    tokens, largest first, each at its first model turn (with its weight version and gap
    when `versions`); [] when the batch has no engine logprobs."""
    b = h.batch
    gap = b.engine_logprob_gap() if b is not None else None
    if gap is None:
        return []
    diff, mask = gap  # (B, T) each
    per_episode = diff.sum(1) / mask.sum(1).clamp(min=1)  # (B,)
    ev = []
    for i in per_episode.argsort(descending=True).tolist():
        ep = b.episodes[i]
        turns = [t for t in ep.turns if t.source == "model"]
        if mask[i].any() and turns:
            text = (f"weight version {ep.weight_version}, mean gap {float(per_episode[i]):.3g} nats"
                    if versions else None)
            ev.append(h.evidence(ep, turns[0], text=text))
    return ev


def check_engine_trainer_gap(h: History, cfg: DoctorConfig) -> Finding | None:
    """`actor/rollout_logprob_diff` (recorded by the update): the sampling engine's
    logprobs of the trained tokens far from the trainer's, at the worst step. Then the
    engine sampled from other weights than the trainer's (a missed weight sync, another
    checkpoint, another dtype or template), and the PPO ratio's "old" policy is not the
    one that sampled. Steps that trained on episodes sampled with older weights
    (`async/staleness_max` > 0, `training.max_staleness`) are left out: their gap is the
    staleness, which `off-policy-clipped` watches."""
    rows = [(step, v) for step, v, r in _metric_rows(h, "actor/rollout_logprob_diff")
            if not r.get("async/staleness_max")]
    if not rows:
        return None
    step, worst = max(rows, key=lambda r: r[1])
    return _finding(
        "engine-trainer-gap", "error", worst, cfg.engine_logprob_gap, worst >= cfg.engine_logprob_gap,
        f"at step {step} the engine's logprobs of the sampled tokens differ from the trainer's by {worst:.3g} "
        "nats on average: the engine did not sample from the weights the trainer holds",
        "Check that the engine gets the trainer's weights after every update (sync_weights; a vLLM or server "
        "engine's weight sync) and uses the same model, dtype and chat template; bf16 rounding alone gives a few "
        "hundredths.", h, _largest_gap_evidence(h, versions=False), cfg, step=step)


def check_off_policy_clipped(h: History, cfg: DoctorConfig) -> Finding | None:
    """`rollout_corr/clipped_fraction` (the update's truncated importance weights,
    `training.rollout_is`): the share of trained tokens whose ratio pi_old / pi_rollout
    went past the cap, at the worst step. A growing share means the sampler's weights are
    too far behind the trainer's (asynchronous training, `training.max_staleness`) for the
    correction to keep the update unbiased. Evidence: the step's episodes with the largest
    mean |trainer - engine| logprob gap, with their weight version."""
    rows = [(step, v, r.get("async/staleness_max")) for step, v, r in _metric_rows(h, "rollout_corr/clipped_fraction")]
    if not rows:
        return None
    step, worst, stale = max(rows, key=lambda r: r[1])
    return _finding(
        "off-policy-clipped", "warning", worst, cfg.off_policy_clipped_share, worst >= cfg.off_policy_clipped_share,
        f"at step {step} the importance weights of {worst:.0%} of the trained tokens were cut at the cap "
        f"(staleness up to {stale if stale is not None else '?'}): the episodes were sampled by weights far "
        "from the trainer's",
        "Lower training.max_staleness (0 = synchronous), lower the learning rate, or raise "
        "training.rollout_is_threshold if the clipped tokens are harmless.", h,
        _largest_gap_evidence(h, versions=True), cfg, step=step)


#: Every check by name, in report order.
CHECKS: dict[str, Check] = {
    # First: the demo prints the first held-out finding, and a policy that got worse is the news.
    "heldout-regression": check_heldout_regression,
    "parse-from-incidental-span": check_parse_from_incidental_span,
    "reward-without-success": check_reward_without_success,
    "tool-result-ignored": check_tool_result_ignored,
    "template-collapse": check_template_collapse,
    "repetition-to-limit": check_repetition_to_limit,
    "length-drift": check_length_drift,
    "truncation-surge": check_truncation_surge,
    "entropy-collapse": check_entropy_collapse,
    "kl-spike": check_kl_spike,
    "zero-variance-groups": check_zero_variance_groups,
    "format-errors": check_format_errors,
    "environment-errors": check_environment_errors,
    "tokenization-mismatch": check_tokenization_mismatch,
    "engine-trainer-gap": check_engine_trainer_gap,
    "off-policy-clipped": check_off_policy_clipped,
    **JUDGE_CHECKS,  # judge-hacking, judge-unreliable, judge-failures (workbench.doctor.judges)
}


#: Checks that judge only held-out batches (`History.records`): `StepDoctor` skips them and
#: records no `diagnose/<name>` metric for them; `diagnose` runs them over the held-out batches.
HELD_OUT_CHECKS = ("heldout-regression",)
#: What `StepDoctor` runs on every training step.
STEP_CHECKS = [n for n in CHECKS if n not in HELD_OUT_CHECKS]


def run_checks(history: History, config: DoctorConfig | None = None,
               names: list[str] | None = None) -> list[Finding]:
    """Every check (or `names`) on `history`; measured ones, fired or not, in `CHECKS` order."""
    cfg = config or DoctorConfig()
    out = []
    for name in names or CHECKS:
        found = CHECKS[name](history, cfg)
        if found is not None:
            out.append(found)
    return out


class StepDoctor:
    """The per-step doctor `Trainer.fit` runs: `observe(batch, step, metrics)` adds the
    step, runs the checks that read training steps (`STEP_CHECKS`), prints one line per
    finding not printed before (through `write`), and returns `{"diagnose/<name>": value}`
    for each of them (NaN when it
    measured nothing this step) plus `perf/doctor_seconds` (what the checks cost this step).

    Args:
        config: thresholds (default `DoctorConfig()`).
        write: where finding lines go (default `print`).
    """

    def __init__(self, config: DoctorConfig | None = None, write: Callable[[str], Any] = print):
        self.config = config or DoctorConfig()
        self.write = write
        self.history = History()
        self.findings: list[Finding] = []
        """The fired findings of the latest step."""
        self.reported: set[str] = set()
        """Names already printed."""

    def observe(self, batch: Any, step: int, metrics: list[dict[str, Any]],
                run: RunFacts | None = None) -> dict[str, float]:
        """`run`: the run's settings the findings' words and remedies fit (`RunFacts`)."""
        start = time.perf_counter()
        if run is not None:
            self.history.run = run
        self.history.add(batch, step)
        self.history.metrics = list(metrics)
        measured = run_checks(self.history, self.config, STEP_CHECKS)
        self.findings = [f for f in measured if f.fired]
        for f in self.findings:
            if f.name not in self.reported:
                self.reported.add(f.name)
                self.write(f.line())
        # Every check's metric on every step (NaN where it measured nothing yet, e.g. the drift
        # checks on the first step), so the names in metrics.jsonl and the dashboards are fixed.
        out = {f"diagnose/{name}": float("nan") for name in STEP_CHECKS}
        out.update({f"diagnose/{f.name}": f.value for f in measured})
        out["perf/doctor_seconds"] = time.perf_counter() - start
        return out
