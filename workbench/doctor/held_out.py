"""The run doctor's checks that read held-out games: whether a policy that wins its training
batches has solved the task (`solved`, asked by entropy-collapse and zero-variance-groups
before they spare a converged policy), and heldout-regression (held-out games won earlier and
lost now).

Core layer, like `workbench.doctor.checks` (which lists heldout-regression in `CHECKS`).
"""
from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from workbench.doctor.findings import DoctorConfig, EpisodeRecord, Evidence, Finding, History
from workbench.doctor.remedies import finding as _finding

_SENTENCE_RE = re.compile(r"(?<=[.!?])\s+")


# -- solved or not ------------------------------------------------------------------------
@dataclass
class Solved:
    """`solved`'s verdict on a policy at one step."""

    solved: bool
    """Wins its training batch (at `solved_success_rate`) and the held-out games, when known."""
    gap: bool
    """Wins its training batch but not the held-out games: the case `solved` exists to catch."""
    words: str
    """The numbers in words, e.g. "wins 100% of its training batch but 75% of 32 held-out games"."""
    evidence: list[Evidence] = field(default_factory=list)
    """With `gap`: the held-out games lost (each episode with its moves and the last answer)."""


GAP_ADVICE = (" A policy that wins its training batches and loses held-out games needs to meet the games it "
               "loses while it still explores: more groups per step (a smaller training.group_size at the same "
               "training.batch_size, as the remedy sets, or a larger batch_size), a larger entropy bonus than the "
               "one it trained with, and a branch from a checkpoint taken before the entropy fell (the SFT "
               "warm-up's last step); read the held-out games it loses.")


def gap_remedy(h: History) -> dict[str, Any]:
    """The settings added to a finding's remedy when its verdict is a gap (`Solved.gap`):
    half the group size at the same batch size, so a step plays twice as many games (a
    guess_number batch of 2 groups of 8 meets a secret 8 in 23% of the steps; 4 groups of 4,
    in 41%). The group size is the run's (`RunFacts.group_size`), else the largest group in
    the latest batch; {} when groups would drop below 2 or the size is unknown."""
    size = h.run.group_size if h.run is not None else None
    if size is None and h.batch is not None:
        sizes = Counter(ep.group_id for ep in h.batch)
        size = max(sizes.values()) if sizes else None
    if (h.run is not None and h.run.group_relative is False) or not size or size < 4:
        return {}
    return {"training.group_size": size // 2}


def first_rl_step(h: History) -> int | None:
    """The step of the first RL update in `h` (its first batch, else its first metric row that
    is not an SFT step): a checkpoint at that step holds the policy before RL changed it (after
    any SFT warm-up). None when `h` has neither."""
    if h.stats:
        return h.stats[0].step
    steps = [m["step"] for m in h.metrics if "step" in m and "sft/nll" not in m]
    return int(steps[0]) if steps else None


def solved(h: History, cfg: DoctorConfig, success: float | None, step: int | None = None) -> Solved:
    """Whether a policy whose training batch of step `step` (default: the latest batch's) won
    `success` (a share; None or NaN when not recorded or not reported) has solved the task: `success` reaches
    `cfg.solved_success_rate`, and so does the share of held-out games won when the history holds a held-out evaluation (`History.held_out`, at
    least `cfg.min_samples` games). A batch of a few secrets can be won by a policy that loses
    others; the held-out games are the task."""
    if success is not None and success != success:  # NaN: the environment reports no success
        success = None
    if success is None or success < cfg.solved_success_rate:
        words = f"wins {success:.0%} of its training batch" if success is not None else ""
        return Solved(False, False, words)
    step = h.step if step is None else step
    batch = f"wins {success:.0%} of its training batch" + (f" at step {step}" if step is not None else "")
    held = h.held_out
    if held is None or len(held) < cfg.min_samples:
        return Solved(True, False, f"{success:.0%} success")
    lost = [ep for ep in held if not ep.success]
    rate = 1 - len(lost) / len(held)
    at = f" at step {h.held_out_step}" if h.held_out_step is not None else ""
    if rate >= cfg.solved_success_rate:
        return Solved(True, False, f"{success:.0%} success; {rate:.0%} of {len(held)} held-out games won{at}")
    ev = [Evidence(episode_id=ep.episode_id, step=h.held_out_step, turn=None, source="eval", seed=ep.env_seed,
                   text=_played(ep)) for ep in lost]
    return Solved(False, True, f"{batch} but only {rate:.0%} of the {len(held)} held-out games{at}", ev)


def _played(ep: Any, tail: int = 30) -> str:
    """"played 4, 5, 6, 7; lost (...The number was 8.)": the moves, the outcome and the end of
    the environment's last answer (its last sentences that fit in `tail` characters, else its
    last `tail` characters), short enough for `Evidence.quote`'s line."""
    turns = [t for t in ep.turns if t.source == "model"]
    moves = ", ".join(t.action.strip() or repr(t.action) for t in turns)
    last = next((t.observation for t in reversed(ep.turns) if isinstance(t.observation, str) and t.observation), "")
    last = " ".join(last.split())
    end = last
    if len(last) > tail:
        kept = ""
        for sentence in reversed(_SENTENCE_RE.split(last)):
            if len(sentence) + len(kept) + 1 > tail:
                break
            kept = f"{sentence} {kept}".strip()
        end = "..." + (kept or last[-tail:].lstrip())
    return f"played {moves}; {'won' if ep.success else 'lost'}" + (f" ({end})" if end else "")


# -- held-out ---------------------------------------------------------------------------
def check_heldout_regression(h: History, cfg: DoctorConfig) -> Finding | None:
    """Held-out games the policy used to win and now loses. Pairs the latest held-out
    evaluation with the earlier one that won the most games (ties: the latest of them) by
    environment seed (`History.records`; the CLI and the demo evaluate the same seeds before
    training, after SFT and after RL) and takes the share of the earlier one's wins that the
    latest lost. The best earlier evaluation, not the previous one: a decline spread over
    several evaluations, each under the threshold, adds up, and the best one is the
    checkpoint worth going back to. Held-out batches only (training steps play new seeds);
    silent when the earlier evaluation won fewer than `min_samples` games (an untrained model
    that won nothing has nothing to lose). Fires at `heldout_regression_share` when the
    success rate on the paired seeds fell too: a policy that traded a few wins for more new
    ones improved. Evidence: the lost episodes at the turn where they part from the same
    seed's episode at the earlier step."""
    if h.source != "eval" or len(h.records) < 2 or len(h.records) != len(h.stats):
        return None
    later, step_b = h.records[-1], h.stats[-1].step
    best = None  # (wins, i, won keys) of the earlier evaluation with the most wins on seeds the latest played
    for i, recs in enumerate(h.records[:-1]):
        won = [k for k, r in recs.items() if r.success and k in later]
        if best is None or len(won) >= best[0]:
            best = (len(won), i, won)
    wins, i, won = best
    if wins < cfg.min_samples:
        return None
    earlier, step_a = h.records[i], h.stats[i].step
    paired = [k for k in later if k in earlier]
    lost = sorted(k for k in won if not later[k].success)
    x, y = wins / len(paired), sum(later[k].success for k in paired) / len(paired)
    share = len(lost) / wins
    common = Counter(later[k].actions for k in lost).most_common(1)
    pattern = ""
    if common and common[0][1] >= 2 and common[0][0]:  # the lost games share a sequence of actions
        seq, n = common[0]
        pattern = f"; {'all' if n == len(lost) else n} of them play {', '.join(a or repr(a) for a in seq)}"
    ev = [_parting_evidence(later[k], earlier[k], step_b) for k in lost]
    return _finding(
        "heldout-regression", "warning", share, cfg.heldout_regression_share,
        share >= cfg.heldout_regression_share and y < x,
        f"held-out success {'fell' if y < x else 'went'} from {x:.2f} at step {step_a} to {y:.2f} at step "
        f"{step_b}: {len(lost)} of {wins} games won at step {step_a} are lost at step {step_b}{pattern}",
        f"Training made the policy worse on held-out games it used to win. Keep the step-{step_a} policy: "
        f"branch from its checkpoint (python -m workbench train --from RUN/checkpoints/step_{step_a:06d} "
        "--output NEW, or Trainer.from_checkpoint) if the run saved one (checkpoint.save_interval and "
        f"checkpoint.keep_last_n decide which steps are kept; else rerun with a save_interval that divides "
        f"{step_a}), and train on with a lower training.learning_rate, more groups per step "
        "(a larger training.batch_size at the same training.group_size) so a few groups do not steer an "
        "update, or "
        "fewer steps (--steps); read the evidence episodes to see which move it unlearned.",
        h, ev, cfg, step=step_b)


def _parting_evidence(b: EpisodeRecord, a: EpisodeRecord, step: int | None) -> Evidence:
    """Episode `b` (held-out, at `step`) at its first model turn whose action differs from the
    same seed's episode `a`; the whole episode when they never part."""
    j = next((j for j in range(len(b.actions)) if j >= len(a.actions) or b.actions[j] != a.actions[j]), None)
    if j is None:
        return Evidence(episode_id=b.episode_id, step=step, turn=None, source="eval", seed=b.seed,
                        text=f"played {', '.join(b.actions)}; {'won' if b.success else 'lost'}")
    return Evidence(episode_id=b.episode_id, step=step, turn=b.turns[j], text=b.replies[j], span=b.spans[j],
                    source="eval", seed=b.seed)
