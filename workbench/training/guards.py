"""An optimizer step that cannot leave the weights non-finite.

A finite loss and a finite gradient norm do not guarantee finite weights after the
step: a learning rate that overflows, an Adam second moment that underflows to zero
in low precision, or a gradient that is finite but huge can still write inf/NaN into
the parameters. Every later step would then see a non-finite loss and be skipped, so
one bad step silently ends learning.

`guarded_step` keeps a copy of the trainable parameters and of their optimizer state
(for LoRA a few MB; for full fine-tuning as much again as the parameters plus Adam's
moments), steps, checks all parameters with one reduction (one host sync per
optimizer step, not per micro-batch), and on a non-finite result puts both back
exactly, so the step is skipped and the run goes on from the weights it had.

The step is also atomic: an exception raised inside it (a KeyboardInterrupt from a
notebook's stop button, an out-of-memory error) puts every parameter and its optimizer
state back before it propagates, so an interrupted step never leaves some tensors
updated and Adam's step counts split.
"""
from __future__ import annotations

from typing import Callable, Sequence

import torch


def _snapshot_state(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor]) -> list[dict]:
    out = []
    for p in params:
        state = optimizer.state.get(p, {})
        out.append({k: (v.detach().clone() if torch.is_tensor(v) else v) for k, v in state.items()})
    return out


@torch.no_grad()
def all_finite(params: Sequence[torch.Tensor]) -> bool:
    """True when every element of every tensor is finite (one host sync)."""
    if not params:
        return True
    return bool(torch.stack([torch.isfinite(p).all() for p in params]).all())


@torch.no_grad()
def guarded_step(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor],
                 finite: Callable[[list[torch.Tensor]], bool] = all_finite) -> bool:
    """`optimizer.step()`, undone when it leaves any of `params` non-finite.

    `finite(params)` decides after the step (a data-parallel learner passes one that
    checks its shards and agrees with the other ranks). Returns True when the step was
    kept, False when parameters and optimizer state were restored to what they were
    before the step. An exception inside the step (KeyboardInterrupt included) restores
    them too, then propagates.
    """
    params = [p for p in params if p.requires_grad]
    saved_params = [p.detach().clone() for p in params]
    saved_state = _snapshot_state(optimizer, params)
    try:
        optimizer.step()
        if finite(params):
            return True
    except BaseException:  # interrupted half way: nothing of this step may stay
        _restore(optimizer, params, saved_params, saved_state)
        raise
    _restore(optimizer, params, saved_params, saved_state)
    return False


def _restore(optimizer: torch.optim.Optimizer, params: Sequence[torch.Tensor], saved_params: Sequence[torch.Tensor],
             saved_state: Sequence[dict]) -> None:
    """Put parameters and their optimizer state back to the snapshot."""
    with torch.no_grad():
        for p, old, state in zip(params, saved_params, saved_state):
            p.copy_(old)
            if state:
                optimizer.state[p] = state
            else:
                optimizer.state.pop(p, None)
