"""What each doctor check needs to judge a run, so a check whose data a run did not record is
listed as "not checked: <why>" rather than passed in silence.

A run imported from another trainer (`workbench.importers`) says which fields its trainer
left out (`Provenance.absent`: field -> sentence, e.g. "logprobs" -> "verl records no sampling
logprobs"); `not_checked(absent, metric_names)` returns the checks that need one of them, each
with that sentence. A metric check needs its metric in the run's history ("metric:NAME").
A run the workbench trained records every field, so nothing is listed for it.
"""
from __future__ import annotations

from typing import Iterable, Mapping

__all__ = ["CHECK_NEEDS", "not_checked"]

#: Check name -> the fields (`workbench.importers.source.FIELDS`) and metrics ("metric:NAME") it reads.
CHECK_NEEDS: dict[str, tuple[str, ...]] = {
    "heldout-regression": ("held_out", "env_seed"),
    "parse-from-incidental-span": ("action_span",),
    "reward-without-success": ("success",),
    "tool-result-ignored": ("tool_calls",),
    "template-collapse": (),
    "repetition-to-limit": ("finish_reason",),
    "length-drift": ("token_ids",),
    "truncation-surge": ("finish_reason",),
    "entropy-collapse": ("metric:actor/entropy",),
    "kl-spike": ("metric:kl/mean",),
    "zero-variance-groups": (),
    "format-errors": ("parse_errors",),
    "environment-errors": ("environment_errors",),
    "tokenization-mismatch": ("alignment",),
    "engine-trainer-gap": ("metric:actor/rollout_logprob_diff",),
    "off-policy-clipped": ("metric:rollout_corr/clipped_fraction",),
}


def not_checked(absent: Mapping[str, str], metric_names: Iterable[str], source: str,
                checks: Iterable[str] | None = None) -> dict[str, str]:
    """{check: why} for each check (of `checks`, default all in `CHECK_NEEDS`) that needs a field
    in `absent` or a metric not in `metric_names` (the columns of the run's history holding a
    number); `source` names the trainer in the sentence for a missing metric."""
    have = set(metric_names)
    out: dict[str, str] = {}
    for name in checks or CHECK_NEEDS:
        for need in CHECK_NEEDS.get(name, ()):
            if need.startswith("metric:"):
                metric = need.split(":", 1)[1]
                if metric not in have:
                    out[name] = absent.get(need) or absent.get("metrics") or f"{source} records no {metric} metric"
                    break
            elif need in absent:
                out[name] = absent[need]
                break
    return out
