"""The hf engine's decode steps replayed from a CUDA graph (`inference.cuda_graphs`, off by
default until a GPU run of `benchmarks/gpu.py` and `pytest -m gpu` has checked it).

On a GPU a small model's decode step is launch-bound: measured on an H100 (2026-11-27,
Qwen3-0.6B shape, bf16), a step of `decode_step.DecodeStep` took 30-50 ms at 8 rows whatever
the rows, ~1,000 kernel launches from Python, while its arithmetic takes well under 1 ms.
A CUDA graph records the step's kernels once and launches them all with one call.

A graph replays fixed shapes and fixed addresses, so the step runs in its static form
(`DecodeStep.__call__` with `col`): each layer's keys/values are written at a column held in
a (1,) device tensor into the cache's preallocated room (`_GrowingLayerMixin.write_at`), and
attention reads the whole buffer, room included, under a (B, cap) mask that the step marks
itself. The room is zeroed first (masked positions still meet the value products: 0 x NaN
garbage would be NaN). The token ids, the positions and the column are copied into the
graph's input buffers before each replay; the logits come back in its output buffer. The
sampling, which reads the host once per step, runs outside the graph, as before.

One graph per chunk of a call (its rows and room fix the shapes): the first step runs
eagerly on a side stream (it warms cuBLAS and is that step's real result), the graph is
captured right after, and every later step replays it. Rows do not leave the batch while a
graph runs (finished rows decode along, their ids unused; a launch-bound step costs the
same with them). `usable` says when the step can be graphed at all: CUDA, a decode step
without a shared-prompt read, rotary embeddings that need no host decision (not "dynamic").

The CPU runs the same static step without the graph (`GraphedDecode(..., capture=False)`),
which is how tests/test_graphed_decode.py checks it against the step's ordinary form.
"""
from __future__ import annotations

from typing import Any

import torch


def usable(step: Any, device: torch.device) -> bool:
    """Whether `step` (a `DecodeStep`) can run from a CUDA graph on `device`."""
    if device.type != "cuda" or step is None:
        return False
    rope = getattr(step.body.rotary_emb, "rope_type", "default")
    return "dynamic" not in str(rope)


class GraphedDecode:
    """The decode steps of one chunk (module docstring).

    Args:
        step: the chunk's `DecodeStep`.
        cache: its cache of growing layers, filled to the prefill's length, with room.
        attention: (B, T) 1 at the real positions of the prefill (device).
        capture: record and replay a CUDA graph (False: run the static step every time).
    """

    def __init__(self, step: Any, cache: Any, attention: torch.Tensor, capture: bool = True):
        self.step, self.layers, self.capture = step, list(cache.layers), capture
        first = self.layers[0]
        B, T = attention.shape
        cap = first._kbuf.shape[-2]
        if any(layer._length != T or layer._kbuf.shape[-2] != cap for layer in self.layers):
            raise ValueError("every cache layer must hold the prefill's positions and the same room")
        for layer in self.layers:
            layer.clear_room()
        device = attention.device
        self.length = T
        self.mask = torch.zeros((B, cap), dtype=attention.dtype, device=device)  # (B, cap) 1 = real position
        self.mask[:, :T] = attention
        self.tokens = torch.zeros(B, dtype=torch.long, device=device)  # (B,) the graph's inputs
        self.positions = torch.zeros((B, 1), dtype=torch.long, device=device)  # (B, 1)
        self.col = torch.zeros(1, dtype=torch.long, device=device)  # (1,) the column this step writes
        self.graph: Any = None
        self.out: torch.Tensor | None = None  # (B, V) the graph's logits
        self.replays = 0
        self.capture_error: str | None = None

    @property
    def room(self) -> int:
        """Positions left to write."""
        return self.layers[0]._kbuf.shape[-2] - self.length

    def _run(self) -> torch.Tensor:
        return self.step(self.tokens, self.mask, self.positions, self, col=self.col)

    def _first_and_capture(self) -> torch.Tensor:
        """Run this step eagerly on a side stream (its real result; it warms the kernels),
        then record the step into a graph on that stream (recorded, not run). A step that
        cannot be recorded (an op that reads the host, say) leaves `capture` off: every later
        step then runs eagerly, and `capture_error` says why."""
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            logits = self._run()
        torch.cuda.current_stream().wait_stream(side)
        torch.cuda.synchronize()  # once per chunk: nothing in flight when the capture begins
        graph = torch.cuda.CUDAGraph()
        try:
            with torch.cuda.stream(side):
                graph.capture_begin()
                try:
                    out = self._run()
                finally:
                    graph.capture_end()
        except RuntimeError as exc:
            self.capture, self.capture_error = False, str(exc).splitlines()[0][:300]
            return logits
        torch.cuda.current_stream().wait_stream(side)
        self.graph, self.out = graph, out
        return logits

    def __call__(self, tokens: torch.Tensor, positions: torch.Tensor) -> torch.Tensor:
        """One decode step: tokens (B,), positions (B, 1) -> (B, V) fp32 logits (the graph's
        buffer when graphed: read or copy them before the next step)."""
        if self.room < 1:
            raise RuntimeError("the chunk's cache room is used up")
        self.tokens.copy_(tokens, non_blocking=True)
        self.positions.copy_(positions, non_blocking=True)
        self.col.fill_(self.length)
        if not self.capture:
            logits = self._run()
        elif self.graph is None:
            logits = self._first_and_capture()
        else:
            self.graph.replay()
            self.replays += 1
            logits = self.out
        for layer in self.layers:
            layer.advance(1)
        self.length += 1
        return logits


__all__ = ["GraphedDecode", "usable"]
