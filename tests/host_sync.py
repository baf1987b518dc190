"""Count, on the CPU, the points where a decode loop would stop a GPU's launch queue.

On a CUDA device every read of a device value by the host (`.item()`, `.tolist()`,
`bool(t)`, `.cpu()`, `nonzero`, ...) waits until every queued kernel has run, and so does
a blocking host-to-device copy (`.to(device)` without `non_blocking=True` synchronises
the stream after the copy). On the CPU nothing waits, so the counter decides which
tensors *would live on the accelerator* and counts the operations that would wait on them.

Which tensors are "device" tensors (taint, kept per storage):
* the watched model's parameters and buffers;
* tensors made by a factory given an explicit `device=` (`torch.zeros(..., device=d)`),
  and tensors uploaded with `.to(<device>)` / `torch.tensor(..., device=d)`;
* every output of an ATen op with a device tensor among its inputs, and every tensor an
  op writes into (in place or `out=`) from a device tensor.
  An op's fresh output made only from host tensors is a host tensor. Marks are kept by
  storage address and dropped when the storage is freed (the allocator reuses addresses).

What is counted:
* `reads`: device-to-host reads of device tensors. At the ATen level (a
  `TorchDispatchMode`, so syncs inside C++ ops are seen too): `_local_scalar_dense`
  (what `.item()`, `bool(t)`, `int(t)` and `if t:` become), `nonzero` (also boolean-mask
  indexing), `is_nonzero`, `equal`, `masked_select`, `unique`s and `repeat_interleave`
  with a tensor of repeats (their output size depends on the data), and indexing with a
  boolean mask that is a device tensor (`t[mask]`, `t[mask] = v`). At the Python level (a
  `TorchFunctionMode`, because on the CPU these dispatch no ATen op): `Tensor.tolist`,
  `Tensor.numpy`, `Tensor.cpu`.
* `uploads`: blocking host-to-device copies: `.to(<device>)` of a host tensor without
  `non_blocking=True`, and `torch.tensor`/`torch.as_tensor` with `device=`.
* `ops`: every ATen op dispatched.

Blind spot: on the CPU a `.to("cpu")` of a device tensor cannot be told from a
device-to-device no-op (models call `x.to(y.device)` on device tensors all the time), so
it is not counted; code under test moves values to the host with `.cpu()` / `.tolist()`.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.overrides import TorchFunctionMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_flatten

_aten = torch.ops.aten
#: ATen ops whose result the host must read before it can go on (or size its output).
SYNC_OPS = {
    _aten._local_scalar_dense.default, _aten.nonzero.default, _aten.is_nonzero.default,
    _aten.equal.default, _aten.masked_select.default, _aten._unique2.default,
    _aten.unique_consecutive.default, _aten.unique_dim.default, _aten.repeat_interleave.Tensor,
}
#: Indexing ops that turn a boolean mask into indices first (`nonzero`, inside the kernel).
MASK_INDEX_OPS = {_aten.index.Tensor, _aten.index_put.default, _aten.index_put_.default,
                  _aten._index_put_impl_.default}
_HOST_READS = {torch.Tensor.tolist, torch.Tensor.numpy, torch.Tensor.cpu}
_FACTORIES = {torch.zeros, torch.ones, torch.full, torch.empty, torch.arange, torch.rand, torch.randn,
              torch.zeros_like, torch.ones_like, torch.full_like, torch.empty_like, torch.eye, torch.linspace}


def _tensors(obj: Any) -> list[torch.Tensor]:
    return [t for t in tree_flatten(obj)[0] if isinstance(t, torch.Tensor)]


def _key(t: torch.Tensor) -> int | None:
    try:
        ptr = t.untyped_storage().data_ptr()
    except (RuntimeError, NotImplementedError):
        return None
    return ptr or None


@dataclass
class Counts:
    reads: int = 0
    uploads: int = 0
    ops: int = 0
    where: list[str] = field(default_factory=list)  # what each read/upload was

    def __sub__(self, other: "Counts") -> "Counts":
        return Counts(self.reads - other.reads, self.uploads - other.uploads, self.ops - other.ops,
                      self.where[len(other.where):])


class SyncCounter:
    """`with SyncCounter(model) as c: ...`; then `c.counts` (see the module docstring).

    `c.snapshot()` copies the running counts, so a caller can split them by step."""

    def __init__(self, *modules: torch.nn.Module):
        self.counts = Counts()
        self._device: set[int] = set()
        for m in modules:
            for t in list(m.parameters()) + list(m.buffers()):
                self._mark(t, True)
        self._fn = _FunctionCounter(self)
        self._dispatch = _DispatchCounter(self)

    def snapshot(self) -> Counts:
        c = self.counts
        return Counts(c.reads, c.uploads, c.ops, list(c.where))

    def is_device(self, t: torch.Tensor) -> bool:
        k = _key(t)
        return k is not None and k in self._device

    def _mark(self, t: torch.Tensor, device: bool) -> None:
        k = _key(t)
        if k is None:
            return
        if device:
            if k not in self._device:
                # forget the mark when the memory is freed (the allocator hands it out again)
                weakref.finalize(t.untyped_storage(), self._device.discard, k)
            self._device.add(k)
        else:
            self._device.discard(k)

    def __enter__(self) -> "SyncCounter":
        self._fn.__enter__()
        self._dispatch.__enter__()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._dispatch.__exit__(*exc)
        self._fn.__exit__(*exc)


class _DispatchCounter(TorchDispatchMode):
    def __init__(self, owner: SyncCounter):
        super().__init__()
        self.owner = owner

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = self.owner
        inputs = _tensors((args, kwargs))
        tainted = any(owner.is_device(t) for t in inputs)
        owner.counts.ops += 1
        if func in SYNC_OPS and tainted:
            owner.counts.reads += 1
            owner.counts.where.append(str(func))
        elif func in MASK_INDEX_OPS and any(t.dtype in (torch.bool, torch.uint8) and owner.is_device(t)
                                            for t in _tensors(args[1])):
            owner.counts.reads += 1  # a boolean mask index is a nonzero on the device
            owner.counts.where.append(f"{func} (boolean mask)")
        out = func(*args, **kwargs)
        schema = func._schema
        mutated = [a for a, arg in zip(args, schema.arguments) if arg.alias_info is not None and arg.alias_info.is_write]
        mutated += [kwargs[arg.name] for arg in schema.arguments
                    if arg.alias_info is not None and arg.alias_info.is_write and arg.name in kwargs]
        for t in _tensors(mutated):
            if tainted:
                owner._mark(t, True)
        if not mutated:
            in_keys = {_key(t) for t in inputs}
            for t in _tensors(out):
                # a view keeps its base's mark; a fresh tensor gets its inputs'
                if _key(t) not in in_keys:
                    owner._mark(t, tainted)
        return out


def _device_target(args: tuple, kwargs: dict) -> bool:
    """Whether a `Tensor.to(...)` call names a device (not only a dtype)."""
    if "device" in kwargs and kwargs["device"] is not None:
        return True
    return any(isinstance(a, (torch.device, str, torch.Tensor)) for a in args[1:])


class _FunctionCounter(TorchFunctionMode):
    def __init__(self, owner: SyncCounter):
        super().__init__()
        self.owner = owner

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        owner = self.owner
        if func in _HOST_READS and args and owner.is_device(args[0]):
            owner.counts.reads += 1
            owner.counts.where.append(func.__name__)
        upload = False
        if func is torch.Tensor.to and args and _device_target(args, kwargs) and not owner.is_device(args[0]):
            upload = True
            if not kwargs.get("non_blocking", False) and not (len(args) > 2 and args[2] is True):
                owner.counts.uploads += 1
                owner.counts.where.append("to(device)")
        if func in (torch.tensor, torch.as_tensor) and kwargs.get("device") is not None:
            upload = True
            owner.counts.uploads += 1
            owner.counts.where.append(func.__name__)
        out = func(*args, **kwargs)
        if func is torch.Tensor.cpu and args and owner.is_device(args[0]):
            # On the CPU `.cpu()` returns the tensor itself; on a GPU it is a new host tensor.
            with _disable_current_modes():
                out = out.clone()
            owner._mark(out, False)
        if upload and args and isinstance(args[0], torch.Tensor) and isinstance(out, torch.Tensor) \
                and _key(out) == _key(args[0]):
            # On the CPU `.to(device)` returns the host tensor itself; on a GPU it is a new one.
            with _disable_current_modes():
                out = out.clone()
        if upload or (func in _FACTORIES and kwargs.get("device") is not None):
            for t in _tensors(out):
                owner._mark(t, True)
        return out
