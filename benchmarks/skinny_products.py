"""A decode step's products alone, per row count: the skinny kernel against MKL's / oneDNN's packed
weights and plain `F.linear`, in one run.

    python benchmarks/skinny_products.py                              # fp32, 1 to 128 rows
    python benchmarks/skinny_products.py --dtype bfloat16 --rows 8,16,32 --out benchmarks/results/skinny_products_bf16.json

The products: SmolLM2-135M's 121 decode weights (30 layers of q/k/v fused (960 x 576), o (576
x 576), gate/up fused (3072 x 576), down (576 x 1536), and the LM head (49152 x 576)), random
values of the dtype, each multiplied by B rows of random inputs, one pass over all 121 per
"step". Ways, each timed `--reps` times in turn per row count (the median printed, with the
weights' bytes over it as GB/s):
- `plain`: `F.linear` on torch's threads;
- `packed`: fp32: MKL's packed GEMM for B rows (`packed_matmul.py`); bf16: oneDNN's packed
  weights (`onednn_weights.py`), where this CPU has its bf16 kernels;
- `skinny`: `cpu_kernels.skinny_linear` on torch's threads (`--threads`);
- `skinny/1`: the same on one thread;
- `skinny halves`: one thread plus the spinning helper (`cpu_kernels.skinny_halves`), as the
  engine's split decode mode runs it.
Printed: ms per step per way and the ratio of each to `packed` (or `plain`), measured in this run.
"""
from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks._common import load, machine, machine_line  # noqa: E402

#: SmolLM2-135M's decode products (N, K): per layer, then the LM head.
SHAPES = [(960, 576), (576, 576), (3072, 576), (576, 1536)] * 30 + [(49152, 576)]


def main(argv: list[str] | None = None) -> int:
    import torch

    from workbench.engines import cpu_kernels
    from workbench.engines.onednn_weights import available as onednn_available
    from workbench.engines.skinny_weights import pack

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--rows", default="1,4,8,16,32,64,128")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    if not cpu_kernels.available():
        print(f"the CPU kernels do not build here: {cpu_kernels.why_unavailable()}")
        return 1
    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    g = torch.Generator().manual_seed(0)
    weights = [(torch.randn(N, K, generator=g) * K ** -0.5).to(dtype) for N, K in SHAPES]
    panels = [pack(w) for w in weights]
    nbytes = sum(w.numel() * w.element_size() for w in weights)
    has_packed = dtype == torch.float32 or onednn_available(dtype)
    onednn = {}
    if dtype == torch.bfloat16 and has_packed:
        onednn = {i: torch.ops.mkldnn._reorder_linear_weight(w, None) for i, w in enumerate(weights)}

    def ways(rows: int) -> dict:
        xs = {K: torch.randn(rows, K, generator=g).to(dtype) for K in (576, 1536)}
        mkl = {}
        if dtype == torch.float32:
            mkl = {i: torch.ops.mkl._mkl_reorder_linear_weight(w, rows) for i, w in enumerate(weights)}

        def plain() -> None:
            for w in weights:
                torch.nn.functional.linear(xs[w.shape[1]], w)

        def packed() -> None:
            for i, w in enumerate(weights):
                if mkl:
                    torch.ops.mkl._mkl_linear(xs[w.shape[1]], mkl[i], w, None, rows)
                else:
                    torch.ops.mkldnn._linear_pointwise(xs[w.shape[1]], onednn[i], None, "none", [], "")

        def skinny() -> None:
            for w, pw in zip(weights, panels):
                cpu_kernels.skinny_linear(xs[w.shape[1]], pw, None, w.shape[0])

        def skinny_1() -> None:
            torch.set_num_threads(1)
            try:
                skinny()
            finally:
                torch.set_num_threads(args.threads)

        def halves() -> None:
            torch.set_num_threads(1)
            cpu_kernels.helper_begin()
            try:
                for w, pw in zip(weights, panels):
                    cpu_kernels.skinny_halves(xs[w.shape[1]], pw, None, w.shape[0])
            finally:
                cpu_kernels.helper_end()
                torch.set_num_threads(args.threads)

        out = {"plain": plain, **({"packed": packed} if has_packed else {}), "skinny": skinny,
               "skinny/1": skinny_1, "skinny halves": halves}
        return out

    print(f"{machine_line()}; {args.dtype}; {args.threads} threads; SmolLM2's 121 decode products; "
          f"{nbytes / 1e6:.0f} MB of weights")
    result = {"benchmark": "skinny_products", "command": "python benchmarks/skinny_products.py "
              + " ".join(argv if argv is not None else sys.argv[1:]),
              "date": time.strftime("%Y-%m-%d"), "machine": {**machine(), "threads": args.threads,
                                                            "load_before": load()},
              "dtype": args.dtype, "weight_bytes": nbytes, "rows": {}}
    for rows in (int(r) for r in args.rows.split(",")):
        fns = ways(rows)
        times: dict[str, list[float]] = {name: [] for name in fns}
        for fn in fns.values():
            fn()  # warm: first touch of the inputs and outputs
        for _ in range(args.reps):
            for name, fn in fns.items():
                start = time.perf_counter()
                fn()
                times[name].append(time.perf_counter() - start)
        med = {name: statistics.median(t) for name, t in times.items()}
        base = "packed" if has_packed else "plain"
        result["rows"][str(rows)] = {name: {"ms_median": 1000 * m, "gb_s": nbytes / m / 1e9,
                                            f"{base}_over_this": med[base] / m} for name, m in med.items()}
        print(f"{rows:4d} rows: " + "  ".join(f"{name} {1000 * m:6.1f} ms ({nbytes / m / 1e9:4.1f} GB/s, "
                                              f"{med[base] / m:.2f}x)" for name, m in med.items()), flush=True)
    result["machine"]["load_after"] = load()
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1) + "\n")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
