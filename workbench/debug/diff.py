"""Compare two policies token by token on the same episodes.

    from workbench.debug import compare_policies
    diff = compare_policies("base", "runs/gn/checkpoints/step_000002", batch)
    diff.top_tokens                # DataFrame: the tokens whose logprob moved most, with context
    diff.per_turn                  # DataFrame: summed change per turn
    print(diff.to_markdown())      # the same as markdown
    TokenView(diff.batch)          # colour by diff_delta / diff_kl

    python -m workbench diff base runs/gn/checkpoints/step_000002 --run runs/gn --step 1 --top 10

A policy is a checkpoint folder, "base" (the run's model without trained weights: what a
LoRA policy is with its adapters disabled), a Trainer, a `Policy` or a torch module
(`workbench.debug.policies.load_policy`). Both score the batch's trained tokens (loss
mask 1: what the policy sampled) with the training code's batched logprobs
(`workbench.training.policy.batch_logprobs`); the results are stored as token fields:

    diff_logprobs_a, diff_logprobs_b   (B, T) log p(token | prefix) under A and B, 0 elsewhere
    diff_delta                         (B, T) logprob_b - logprob_a
    diff_kl                            (B, T) k3 estimate of KL(B || A) at that token

k3 (`workbench.algo.kl_penalty(..., "low_var_kl")`) assumes the tokens were sampled from
B; on a batch sampled by another policy read it as a per-token distance, not an unbiased
KL. Simplified: only trained tokens are scored (prompts, observations and typed turns
are the same text for both policies and are not what either chose).
"""
from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from workbench.algo import kl_penalty
from workbench.debug.policies import checkpoint_config, load_policy, policy_label
from workbench.debug.runs import RunError, inside_run, read_batch
from workbench.training import run_files
from workbench.training.checkpoint import PREFIX as CHECKPOINT_PREFIX
from workbench.training.checkpoint import checkpoint_name
from workbench.trajectory import TrajectoryBatch

__all__ = ["PolicyDiff", "compare_policies", "score_tokens", "add_diff_parser", "cmd_diff", "markdown_table"]

DIFF_FIELDS = ("diff_logprobs_a", "diff_logprobs_b", "diff_delta", "diff_kl")


def score_tokens(model: torch.nn.Module, batch: TrajectoryBatch, micro_batch_size: int = 4) -> torch.Tensor:
    """(B, T) logprob of every trained token of `batch` under `model` (0 elsewhere), in
    eval mode (the module's mode is restored)."""
    from workbench.training.policy import batch_logprobs

    was_training = model.training
    model.eval()
    try:
        lengths = [ep.num_tokens for ep in batch]
        return batch_logprobs(model, batch.input_ids, batch.attention_mask, lengths, micro_batch_size,
                              loss_mask=batch.loss_mask, groups=batch.group_ids,
                              position_ids=batch.tensors.get("position_ids"))  # (B, T)
    finally:
        model.train(was_training)


def markdown_table(df: Any, floats: str = "{:+.4f}") -> str:
    """A DataFrame as a GitHub markdown table (newlines and pipes in cells escaped)."""
    def cell(v: Any) -> str:
        text = floats.format(v) if isinstance(v, float) else str(v)
        return text.replace("|", "\\|").replace("\n", "⏎")

    head = "| " + " | ".join(map(str, df.columns)) + " |"
    rule = "|" + "---|" * len(df.columns)
    rows = ["| " + " | ".join(cell(v) for v in row) + " |" for row in df.itertuples(index=False)]
    return "\n".join([head, rule, *rows])


@dataclass
class PolicyDiff:
    """The result of `compare_policies`.

    Attributes:
        batch: the batch with the `diff_*` token fields set.
        label_a, label_b: what A and B were.
        per_episode: one row per episode: summed logprob under A and B, their difference,
            summed KL, trained tokens, mean |delta|.
        per_turn: the same sums per turn (one row per turn with trained tokens).
        top_tokens: the `top` tokens with the largest |delta|, with turn, position, the
            token and the text just before it.
        top_turns: the `top` turns with the largest |summed delta|, with their action text.
    """

    batch: TrajectoryBatch
    label_a: str
    label_b: str
    per_episode: Any
    per_turn: Any
    top_tokens: Any
    top_turns: Any

    @property
    def max_abs_delta(self) -> float:
        """The largest |logprob_b - logprob_a| over every trained token."""
        return float(self.batch.diff_delta.abs().max()) if self.batch.diff_delta.numel() else 0.0

    def to_markdown(self, top: int | None = None) -> str:
        """Headline numbers, the most changed tokens and turns, and per-episode sums."""
        n = top or len(self.top_tokens)
        mask = self.batch.loss_mask.bool()
        tokens = int(mask.sum())
        mean_kl = float(self.batch.diff_kl[mask].mean()) if tokens else 0.0
        lines = [f"# Policy diff: A = {self.label_a}, B = {self.label_b}", "",
                 f"{len(self.batch)} episodes, {tokens} trained tokens; Δ = logprob under B − under A. "
                 f"Summed Δ {float(self.batch.diff_delta.sum()):+.4f}, max |Δ| {self.max_abs_delta:.4f}, "
                 f"mean KL(B‖A) estimate {mean_kl:.4g}.", "",
                 f"## Most changed tokens (top {min(n, len(self.top_tokens))})", "",
                 markdown_table(self.top_tokens.head(n)), "",
                 f"## Most changed turns (top {min(n, len(self.top_turns))})", "",
                 markdown_table(self.top_turns.head(n)), "", "## Per episode", "",
                 markdown_table(self.per_episode)]
        return "\n".join(lines) + "\n"

    def _repr_markdown_(self) -> str:
        return self.to_markdown()

    def __repr__(self) -> str:
        return (f"PolicyDiff(A={self.label_a}, B={self.label_b}, episodes={len(self.batch)}, "
                f"max|Δ|={self.max_abs_delta:.4g})")


def _tables(batch: TrajectoryBatch, tokenizer: Any, top: int, context_tokens: int) -> tuple[Any, Any, Any, Any]:
    import pandas as pd

    decode = (lambda ids: tokenizer.decode(ids, skip_special_tokens=False)) if tokenizer is not None else str
    episodes, turns, tokens = [], [], []
    for b, ep in enumerate(batch):
        n = ep.num_tokens
        lp_a, lp_b, delta, kl = (batch.tensors[f][b, :n].tolist() for f in DIFF_FIELDS)
        trained = [i for i in range(n) if ep.loss_mask[i]]
        episodes.append({"episode": b, "episode_id": ep.episode_id, "group": ep.group_id, "outcome": ep.outcome,
                         "tokens": len(trained), "logprob_a": sum(lp_a[i] for i in trained),
                         "logprob_b": sum(lp_b[i] for i in trained), "delta": sum(delta[i] for i in trained),
                         "kl": sum(kl[i] for i in trained),
                         "mean_abs_delta": sum(abs(delta[i]) for i in trained) / max(len(trained), 1)})
        for t in ep.turns:
            idx = [i for i in trained if ep.turn_index[i] == t.index]
            if idx:
                turns.append({"episode": b, "turn": t.index, "action": t.action, "tokens": len(idx),
                              "logprob_a": sum(lp_a[i] for i in idx), "logprob_b": sum(lp_b[i] for i in idx),
                              "delta": sum(delta[i] for i in idx), "kl": sum(kl[i] for i in idx)})
        for i in trained:
            tokens.append((abs(delta[i]), b, i, ep.turn_index[i], lp_a[i], lp_b[i], delta[i], kl[i]))
    tokens.sort(key=lambda r: -r[0])
    top_tokens = [{"episode": b, "turn": turn, "position": i, "token": decode([batch[b].token_ids[i]]),
                   "context": decode(batch[b].token_ids[max(0, i - context_tokens):i]),
                   "logprob_a": a, "logprob_b": bb, "delta": d, "kl": k}
                  for _, b, i, turn, a, bb, d, k in tokens[:top]]
    per_turn = pd.DataFrame(turns, columns=["episode", "turn", "action", "tokens", "logprob_a", "logprob_b",
                                            "delta", "kl"])
    top_turns = per_turn.reindex(per_turn["delta"].abs().sort_values(ascending=False).index).head(top)
    return (pd.DataFrame(episodes), per_turn, pd.DataFrame(top_tokens, columns=[
        "episode", "turn", "position", "token", "context", "logprob_a", "logprob_b", "delta", "kl"]),
        top_turns.reset_index(drop=True))


def compare_policies(a: Any, b: Any, batch: TrajectoryBatch, *, config: Any = None, tokenizer: Any = None,
                     top: int = 20, micro_batch_size: int = 4, context_tokens: int = 12) -> PolicyDiff:
    """Score `batch`'s trained tokens under policies `a` and `b` (see the module docstring).

    Args:
        a, b: checkpoint folders, "base", Trainers, `Policy`s or torch modules.
        batch: the episodes (e.g. `TrajectoryBatch.load("RUN/rollouts/step_000001.jsonl.gz")`);
            its `diff_*` fields are set in place.
        config: the run config ("base" needs one; default: a checkpoint's or Trainer's own).
        tokenizer: decodes the tables' tokens (default: a policy's own).
        top: rows of the most-changed tables.
        micro_batch_size: episodes per forward.
        context_tokens: tokens of text shown before each top token.
    """
    loaded: dict[int, tuple[Any, Any, Any]] = {}
    for i, spec in enumerate((a, b)):  # the named policies first: they can supply the config "base" needs
        if not (isinstance(spec, str) and spec == "base"):
            loaded[i] = load_policy(spec, config)
            config = config if config is not None else loaded[i][2]
    for i, spec in enumerate((a, b)):
        if i not in loaded:
            loaded[i] = load_policy(spec, config)
    tokenizer = tokenizer or loaded[0][1] or loaded[1][1]
    lp_a = score_tokens(loaded[0][0], batch, micro_batch_size)  # (B, T)
    lp_b = score_tokens(loaded[1][0], batch, micro_batch_size)  # (B, T)
    mask = batch.loss_mask.float()  # (B, T)
    batch.set("diff_logprobs_a", lp_a * mask)
    batch.set("diff_logprobs_b", lp_b * mask)
    batch.set("diff_delta", (lp_b - lp_a) * mask)
    batch.set("diff_kl", kl_penalty(lp_b, lp_a, "low_var_kl") * mask)
    per_episode, per_turn, top_tokens, top_turns = _tables(batch, tokenizer, top, context_tokens)
    return PolicyDiff(batch, policy_label(a), policy_label(b), per_episode, per_turn, top_tokens, top_turns)


# -- command line ----------------------------------------------------------------------------
def add_diff_parser(subparsers: Any) -> argparse.ArgumentParser:
    """The `diff` command's arguments (registered by `workbench.cli`)."""
    p = subparsers.add_parser("diff", help="compare two policies token by token on a saved batch "
                                           "(the tokens and turns whose logprob changed most)")
    p.add_argument("a", metavar="CKPT_A", help='checkpoint folder, "base" (the run\'s model without trained '
                                                'weights) or, with --run, a step number')
    p.add_argument("b", metavar="CKPT_B", help="the same for policy B")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--run", help="run folder (config.yaml, checkpoints/, rollouts/, evals/)")
    src.add_argument("--batch", help="a batch file written by TrajectoryBatch.save (.jsonl or .jsonl.gz)")
    which = p.add_mutually_exclusive_group()
    which.add_argument("--step", type=int,
                       help="with --run: the batch of training step N (rollouts/; default: the last)")
    which.add_argument("--eval", type=int, metavar="STEP",
                       help="with --run: the held-out batch at global step STEP (evals/)")
    p.add_argument("--config", help="run config YAML (default: RUN/config.yaml, else a checkpoint's config.yaml)")
    p.add_argument("--out", dest="output", default=None, help="also write the report (markdown) here")
    p.add_argument("--top", type=int, default=10, help="rows of the most-changed tables (default 10)")
    return p


def _run_batch_path(run: Path, step: int | None, eval_step: int | None) -> Path:
    """The saved batch of training step `step` (or the held-out batch at `eval_step`) of a
    run folder (`workbench.training.run_files`); the last saved one when no step is given.
    Raises `RunError` for a negative step, a missing file or a link out of the run folder."""
    evals = eval_step is not None
    number = eval_step if evals else step
    folder = inside_run(run, run / (run_files.EVALS if evals else run_files.ROLLOUTS))
    saved = run_files.saved_steps(folder)
    if number is None:
        if not saved:
            raise RunError(f"{folder} holds no step_*.jsonl.gz batches; give --batch FILE")
        number = saved[-1]
    if number < 0:
        raise RunError(f"--{'eval' if evals else 'step'} {number}: a step is a 0-based step number (>= 0); "
                       f"saved in {folder}: {_steps_text(saved)}")
    path = inside_run(run, (run_files.eval_path if evals else run_files.rollout_path)(run, number))
    if not path.exists():
        raise RunError(f"{path} does not exist: no batch of step {number} was saved (saved in {folder}: "
                       f"{_steps_text(saved)})")
    return path


def _steps_text(steps: list[int]) -> str:
    return ", ".join(map(str, steps)) or "none"


def _policy_arg(spec: str, run: Path | None) -> str:
    """A policy argument as load_policy takes it: with --run, a step number N is the run's
    checkpoint of step N (RUN/checkpoints/step_00000N), which must be there; a folder must exist."""
    if run is not None and re.fullmatch(r"\d+", spec):
        folder = inside_run(run, run / run_files.CHECKPOINTS)
        path = inside_run(run, folder / checkpoint_name(int(spec)))
        if not path.exists():
            there = sorted(p.name for p in folder.iterdir() if p.is_dir() and p.name.startswith(CHECKPOINT_PREFIX)) \
                if folder.is_dir() else []
            raise RunError(f"there is no checkpoint of step {int(spec)} in {folder} ({path.name} does not exist); "
                           f"checkpoints there: {', '.join(there) or 'none'}. A run saves one every "
                           "checkpoint.save_interval steps and at its end; give one of those steps, or \"base\"")
        return str(path)
    if spec != "base" and not Path(spec).exists():
        raise RunError(f"{spec}: no such checkpoint folder; give a checkpoint folder (e.g. RUN/checkpoints/"
                       f"step_000010), \"base\", or with --run RUN a step number")
    return spec


def cmd_diff(args: argparse.Namespace) -> int:
    """`python -m workbench diff`: print (and with --out, write) the most changed tokens."""
    from workbench.config import ConfigStore

    from workbench.training.checkpoint import CheckpointError

    run = Path(args.run) if args.run else None
    if run is None and (args.step is not None or args.eval is not None):
        print("diff: --step and --eval need --run RUN_DIR", file=sys.stderr)
        return 2
    try:
        path = _run_batch_path(run, args.step, args.eval) if run is not None else Path(args.batch)
        batch = read_batch(path)
        a, b = _policy_arg(args.a, run), _policy_arg(args.b, run)
        config = None
        if args.config:
            config = ConfigStore.load(args.config)
        elif run is not None and inside_run(run, run / run_files.CONFIG_FILE).exists():
            config = checkpoint_config(run)
        diff = compare_policies(a, b, batch, config=config, top=args.top)
    except (FileNotFoundError, CheckpointError, RunError) as exc:  # a wrong path: the message says which
        print(f"diff: {exc}", file=sys.stderr)
        return 2
    report = f"batch: {path}\n\n" + diff.to_markdown(args.top)
    print(report)
    if args.output:
        Path(args.output).write_text(report)
        print(f"wrote {args.output}")
    return 0
