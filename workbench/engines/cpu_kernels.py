"""Kernels compiled on the machine that runs them, for the hf engine's CPU decode step.

`decode_attention` (`csrc/decode_attention.cpp`) is the attention of a decode step's new
token over the KV cache: one pass over each row's keys and values for all the query heads
that share them, in fp32, rounded once. torch's `scaled_dot_product_attention` runs
a flash-attention kernel built for long queries; for the one new token per row it spent
several times the cache read (`benchmarks/decode_floor.py`: at 128 rows in bf16 on a
2-core Xeon, 2.2 ms per layer where the layer's keys and values are read in ~0.3 ms).

`rms_norm` and `silu_mul` (`csrc/decode_ops.cpp`) are the step's RMSNorm and `silu(gate) *
up`, one pass each on the calling thread instead of six and two eager ops, rounding where
those round.

`skinny_linear` (`csrc/skinny_linear.cpp`) multiplies a few rows by a weight laid out once in
panels of 16 outputs (`skinny_weights.pack`), each panel one contiguous stream read once per block
of rows, the sums in registers: a decode step's products at a few rows are bound by reading the
weights, which MKL's and oneDNN's kernels, made for products with reuse, do far below the
machine's bandwidth (`skinny_weights.py`). `skinny_halves` runs half of its panels on the helper
thread below, and `decode_attention(..., helper=True)` half of its (row, KV head) pairs.

`linear_halves` (`csrc/decode_helper.cpp`) runs one half of a product's outputs on a helper
thread that spins while a decode step is open (`helper_begin` / `helper_end`) and sleeps
otherwise, the other half on the calling thread: two threads stream the weights with no
OpenMP wake-up per product (`decode_threads.SpinHelper`).

Building: the first call of `available()` in a process compiles the sources with the C++
compiler (`$CXX`, else `c++`) against this torch's headers and libraries, `-O3
-march=native -fopenmp`, in a scratch folder renamed to `$WORKBENCH_CACHE/kernels/<key>`
(key: the sources, the compiler's flags, torch's version and the CPU's flags, so another
machine or torch builds its own), and loads it with `torch.ops.load_library`; later
processes load the cached build. A build takes ~40 s on 2 cores (the sources compile at once, one
per core); `make install` runs it
(`cpu_kernels.main()`), so the first rollout does not. Where it cannot be built (no
compiler, headers missing, a compiler error), `available()` is False, `why_unavailable()`
says why, the engine warns once and its decode steps run torch's ops (and the Python
`MatmulHelper` in the split mode). `inference.cpu_kernels=false` skips all of this.
"""
from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import threading
from pathlib import Path

import torch

from workbench.models.loading import cache_dir, publish_folder, scratch_folder

#: The kernels' C++ sources, built into one library.
SOURCES = tuple(Path(__file__).with_name("csrc") / name for name in ("decode_attention.cpp", "decode_ops.cpp",
                                                                       "decode_helper.cpp", "skinny_linear.cpp"))
#: The headers they include.
HEADERS = tuple(Path(__file__).with_name("csrc") / name for name in ("fast_exp.h", "simd.h", "helper.h"))
#: The shared library's name in its cache folder (also the folder's completeness mark).
LIBRARY = "workbench_cpu.so"
#: The compiler's flags. -fopenmp: at::parallel_for's threads; the library then needs
#: libgomp.so.1, which resolves to the one torch loaded (torch/lib's, the same soname): one
#: OpenMP pool, torch's thread count.
CXXFLAGS = ("-shared", "-fPIC", "-O3", "-march=native", "-fopenmp", "-std=c++17")
#: Longest a build may take before it counts as failed (seconds).
BUILD_TIMEOUT_S = 600

_lock = threading.Lock()
_state: dict[str, object] = {}  # "loaded": bool, "why": str | None (after the first attempt)


def _cpu_flags() -> str:
    """The CPU's feature flags (what `-march=native` compiles for)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("flags"):
                return " ".join(sorted(line.split(":", 1)[1].split()))
    except OSError:
        pass
    return platform.processor()


def build_key() -> str:
    """What a build depends on: the sources and headers, the compiler's flags, torch's version
    and the CPU (16 hex digits)."""
    h = hashlib.sha256()
    for part in (*(src.read_bytes() for src in (*SOURCES, *HEADERS)), " ".join(CXXFLAGS).encode(),
                 torch.__version__.encode(), _cpu_flags().encode(), platform.machine().encode()):
        h.update(part)
        h.update(b"\0")
    return h.hexdigest()[:16]


def build_folder() -> Path:
    """Where this machine's build lives (`$WORKBENCH_CACHE/kernels/<build_key()>`)."""
    return cache_dir() / "kernels" / build_key()


def _compile(out: Path) -> None:
    """Compile SOURCES into the shared library `out`, each source to an object file at once (one
    compiler per core; each spends most of its time in torch's headers), then link them; raises
    RuntimeError with the compiler's output."""
    from torch.utils.cpp_extension import include_paths

    cxx = os.environ.get("CXX") or "c++"
    if shutil.which(cxx) is None:
        raise RuntimeError(f"no C++ compiler: {cxx!r} is not on PATH (install g++, or set CXX)")
    libdir = Path(torch.__file__).parent / "lib"
    abi = int(getattr(torch._C, "_GLIBCXX_USE_CXX11_ABI", True))
    flags = [f for f in CXXFLAGS if f != "-shared"]
    objects = [out.with_name(f"{src.stem}.o") for src in SOURCES]
    compiles = [[cxx, *flags, "-c", f"-D_GLIBCXX_USE_CXX11_ABI={abi}", *[f"-I{p}" for p in include_paths()],
                 str(src), "-o", str(obj)] for src, obj in zip(SOURCES, objects)]
    link = [cxx, *CXXFLAGS, *map(str, objects), "-o", str(out), f"-L{libdir}", "-lc10", "-ltorch_cpu",
            f"-Wl,-rpath,{libdir}"]
    width = max(1, min(len(compiles), os.cpu_count() or 1))
    for i in range(0, len(compiles), width):
        _run_all(compiles[i:i + width], cxx)
    _run_all([link], cxx)
    for obj in objects:
        obj.unlink(missing_ok=True)


def _run_all(cmds: list[list[str]], cxx: str) -> None:
    """Run the compiler commands at once; the first failure's output as a RuntimeError."""
    procs = [subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for cmd in cmds]
    failure = None
    for proc in procs:
        try:
            output, _ = proc.communicate(timeout=BUILD_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            failure = failure or f"the build took over {BUILD_TIMEOUT_S} s"
            continue
        if proc.returncode != 0:
            failure = failure or f"{cxx} failed (exit {proc.returncode}): {output[-2000:]}"
    if failure:
        raise RuntimeError(failure)


def _load() -> None:
    """Build (unless cached) and load the library; raises RuntimeError saying why not."""
    target = build_folder()
    if not (target / LIBRARY).exists():
        tmp = scratch_folder(target)
        try:
            _compile(tmp / LIBRARY)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        publish_folder(tmp, target, (LIBRARY,))
    try:
        torch.ops.load_library(str(target / LIBRARY))
    except OSError as exc:
        raise RuntimeError(f"cannot load {target / LIBRARY}: {exc}") from exc


def available() -> bool:
    """Whether the kernels are loaded in this process (built first where needed; once per process)."""
    with _lock:
        if "loaded" not in _state:
            try:
                _load()
                _state.update(loaded=True, why=None)
            except RuntimeError as exc:
                _state.update(loaded=False, why=str(exc))
        return bool(_state["loaded"])


def why_unavailable() -> str | None:
    """Why `available()` is False (None when the kernels loaded, or before the first try)."""
    return _state.get("why")  # type: ignore[return-value]


def decode_attention(q: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, bias: torch.Tensor,
                     scale: float, helper: bool = False) -> torch.Tensor:
    """q (B, KV, G, D), keys/values (B, KV, T, D) with a unit stride on D, bias (B, 1, 1, T)
    additive, all one dtype (bf16 or fp32), on the CPU -> (B, KV, G, D):
    softmax(q @ keys^T * scale + bias) @ values, in fp32 rounded once, on torch's threads, or
    with `helper` half of the (row, KV head) pairs on the calling thread and half on the
    spinning helper's (needs `available()`)."""
    return torch.ops.workbench_cpu.decode_attention(q, keys, values, bias, scale, helper)


def linear_halves(kind: int, x: torch.Tensor, w0: torch.Tensor, w1: torch.Tensor, o0: torch.Tensor,
                  o1: torch.Tensor, b0: torch.Tensor | None, b1: torch.Tensor | None, batch: int) -> torch.Tensor:
    """x (B, K) through two halves of a weight's outputs at once, one on the helper thread ->
    (B, N0 + N1). `kind` 0: oneDNN's packed bf16 linear (w0, w1 packed; o0, o1 unused), 1: MKL's
    packed fp32 one (o0, o1 the halves' original weights, `batch` the rows they were packed
    for), 2: `F.linear` (w0, w1 the halves). Needs `available()`."""
    return torch.ops.workbench_cpu.linear_halves(kind, x, w0, w1, o0, o1, b0, b1, batch)


def skinny_linear(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """x (M, K) fp32 or bf16 @ W.T + bias -> (M, n) in x's dtype, W (n, K) given as `packed`
    (P, K, 16) = `skinny_weights.pack(W)` (fp32 or bf16), summed in fp32 and rounded once; on
    torch's threads (needs `available()`)."""
    return torch.ops.workbench_cpu.skinny_linear(x, packed, bias, n)


def skinny_halves(x: torch.Tensor, packed: torch.Tensor, bias: torch.Tensor | None, n: int) -> torch.Tensor:
    """`skinny_linear` with its first half of panels on the calling thread and the rest on the
    helper thread at once (needs `available()`)."""
    return torch.ops.workbench_cpu.skinny_halves(x, packed, bias, n)


def helper_begin() -> None:
    """A decode step opens: the helper thread spins for `linear_halves` until `helper_end()`."""
    torch.ops.workbench_cpu.helper_begin()


def helper_end() -> None:
    """The decode step is done: the helper thread sleeps again (after the last open step ends)."""
    torch.ops.workbench_cpu.helper_end()


def helper_threads() -> int:
    """The OpenMP threads the helper thread's halves run on (1)."""
    return int(torch.ops.workbench_cpu.helper_threads())


def rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """LlamaRMSNorm of x (..., E) with weight (E,), one dtype (bf16 or fp32), on the CPU: x in
    fp32 times 1/sqrt(mean(x^2) + eps), rounded to the dtype, times the weight (needs `available()`)."""
    return torch.ops.workbench_cpu.rms_norm(x, weight, eps)


def silu_mul(gate: torch.Tensor, up: torch.Tensor) -> torch.Tensor:
    """`F.silu(gate) * up` for (B, N) gate and up of one dtype (bf16 or fp32; rows with a unit
    stride, e.g. the halves of a fused gate/up product), on the CPU (needs `available()`)."""
    return torch.ops.workbench_cpu.silu_mul(gate, up)


def main() -> int:
    """`make install`: build this machine's kernels once and say where (or why not); exit 0 either way."""
    ok = available()
    print(f"cpu kernels: {'in ' + str(build_folder()) if ok else 'not available: ' + str(why_unavailable())}")
    return 0
