"""What a run writes for people to read: episode transcripts (markdown), the reward
curve (png) and summary tables (markdown). Pure formatting: no training here.

    write_transcript(batch, out / "transcript.md", "guess_number: held-out episodes")
    plot_curve(trainer.metrics_history, out / "reward_curve.png", evals)
    summary_table([{"step": 0, "reward_mean": 0.5}])
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

from workbench.trajectory import Episode, TrajectoryBatch
from workbench.utils.files import write_text


def episode_transcript(ep: Episode, title: str) -> str:
    """Markdown of one episode: each message, with rewards per turn."""
    lines = [f"### {title}: episode {ep.episode_id} (seed {ep.env_seed}), "
             + (f"score {ep.score:+.2f}, " if ep.score is not None else f"return {ep.total_reward:+.2f}, ") +
             f"success {ep.success}, turns {ep.num_turns}" + (f", truncated: {ep.truncation_reason}" if ep.truncated else ""), ""]
    turn = 0
    for msg in ep.messages:
        role = msg["role"]
        text = str(msg["content"]).strip().replace("\n", "\n> ")
        if role == "assistant":
            t = ep.turns[turn]
            lines.append(f"**assistant** (turn {turn}, reward {t.reward:+.2f}{', ' + t.parse_error if t.parse_error else ''}):")
            turn += 1
        else:
            lines.append(f"**{role}**:")
        lines.append(f"> {text}")
        lines.append("")
    if ep.warnings:
        lines.append(f"warnings: {ep.warnings}")
    return "\n".join(lines)


def write_transcript(batch: TrajectoryBatch, path: Path, heading: str) -> Path:
    eps = sorted(batch, key=lambda e: e.outcome)
    parts = [f"# {heading}", ""]
    if eps:
        parts.append(episode_transcript(eps[-1], "Best"))
        if len(eps) > 1:
            parts.append(episode_transcript(eps[0], "Worst"))
    write_text(path, "\n\n".join(parts))
    return path


def plot_curve(history: list[dict[str, Any]], path: Path, evals: list[dict[str, float]] | None = None) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = [m["step"] for m in history]
    mean = [m["reward/mean"] for m in history]
    std = [m["reward/std"] for m in history]
    fig, ax = plt.subplots(1, 2, figsize=(10, 3.5))
    ax[0].plot(steps, mean, label="reward mean")
    ax[0].fill_between(steps, [m - s for m, s in zip(mean, std)], [m + s for m, s in zip(mean, std)], alpha=0.2)
    ax[0].set_xlabel("step"), ax[0].set_title("train reward")
    ax[1].plot(steps, [m["env/success_rate"] for m in history], label="train success")
    if evals:
        ax[1].plot([e["step"] for e in evals], [e["eval/success_rate"] for e in evals], "o-", label="held-out success")
    ax[1].set_ylim(-0.05, 1.05), ax[1].set_xlabel("step"), ax[1].set_title("success rate"), ax[1].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return path


def summary_table(rows: list[dict[str, Any]]) -> str:
    """A Markdown table of `rows` (floats to 3 significant digits; "-" where a row has no value,
    e.g. the reward of an SFT step)."""
    keys = list(rows[0]) if rows else []
    out = ["| " + " | ".join(keys) + " |", "|" + "---|" * len(keys)]
    for r in rows:
        out.append("| " + " | ".join(_cell(r[k]) for k in keys) + " |")
    return "\n".join(out)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return "-" if value != value else f"{value:.3g}"  # NaN: no value
    return str(value)
