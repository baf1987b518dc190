"""The run doctor's environment-errors check: episodes that ended because their environment
failed (a step or reset that raised, a server error, a timeout), which the update leaves out
(`TrajectoryBatch.untrained_rows`). A run where every episode hit one trains on nothing; the
finding gives their share, the first error's text and the episodes as evidence, so the error is
seen on the console and in `diagnose`, not only in a transcript.

Core layer, like `workbench.doctor.checks` (which lists it in `CHECKS`).
"""
from __future__ import annotations

from workbench.doctor.findings import DoctorConfig, Finding, History


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
