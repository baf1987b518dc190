"""The LoRA update with its frozen bf16 base products in fp32 against the same update in bf16.

    python benchmarks/fp32_products.py                 # 7 rounds, 2 threads
    python benchmarks/fp32_products.py --rounds 11 --out benchmarks/results/fp32_products.json

One process, one batch: `benchmarks/update.py`'s trainer (the embedded model in bf16, LoRA
r=16 on every linear, 1 prompt x 8 completions of up to 64 tokens) samples and scores one
batch, then `Trainer.update` runs on that batch `--rounds` times each way, in turn: with the
policy's LoRA layers holding fp32 copies of their base weights
(`workbench/training/fp32_products.py`) and without. Each update changes the adapters a
little, so both ways train from nearly the same weights on the same tokens. Printed: the
median and best seconds of each way and the ratio of the medians, with what "auto" would
choose on this CPU (`model.fp32_base_products`) and the timed product behind that choice.
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


def main(argv: list[str] | None = None) -> int:
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--rounds", type=int, default=7, help="updates each way, in turn")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", default=None, help="write the result as JSON here")
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)

    from benchmarks.update import make_trainer
    from workbench.training.fp32_products import Fp32BaseWeights, use_fp32_products, wants_fp32_products

    trainer = make_trainer(torch.device("cpu"), torch.bfloat16)
    model = trainer.policy.model
    auto, why = wants_fp32_products("auto", model)
    batch = trainer.rollout()
    trainer.score(batch)
    trainer.compute_advantages(batch)
    store = Fp32BaseWeights()
    seconds: dict[str, list[float]] = {"bf16": [], "fp32": []}
    loads = [load()]
    for _ in range(args.rounds):
        for name in ("bf16", "fp32"):
            use_fp32_products(model, store if name == "fp32" else None)
            start = time.perf_counter()
            trainer.update(batch)
            seconds[name].append(time.perf_counter() - start)
        loads.append(load())
    trainer.cleanup()
    med = {k: statistics.median(v) for k, v in seconds.items()}
    result = {"machine": machine(), "threads": args.threads, "rounds": args.rounds,
              "tokens": int(sum(ep.num_tokens for ep in batch)), "auto_chooses_fp32": auto, "auto_reason": why,
              "seconds": seconds, "median_seconds": med, "best_seconds": {k: min(v) for k, v in seconds.items()},
              "speedup_median": med["bf16"] / med["fp32"], "fp32_copies_made": store.copies_made,
              "loads": loads}
    print(machine_line())
    print(f"update of one batch ({result['tokens']} tokens), {args.rounds} rounds each way, load "
          f"{min(loads):.1f}-{max(loads):.1f}")
    for name in ("bf16", "fp32"):
        print(f"  base products in {name}: median {med[name]:.2f} s, best {min(seconds[name]):.2f} s")
    print(f"fp32 base products: {result['speedup_median']:.2f}x the bf16 update (medians); "
          f"\"auto\" here: {why}")
    if args.out:
        Path(args.out).write_text(json.dumps(result, indent=1))
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
