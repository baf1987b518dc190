"""The hf engine's decode step beside the machine's floor for it, per phase.

    python benchmarks/decode_floor.py                          # bf16 and fp32, 8 / 32 / 128 rows
    python benchmarks/decode_floor.py --dtypes bfloat16 --rows 8,128 --steps 48

The machine, measured here with the engine's threads (`--threads`, default 2) and with one:
- memory bandwidth: a read (`sum` of a 1 GiB fp32 tensor) and a copy (1 GiB into another,
  counted as the bytes read plus the bytes written);
- the matmul peak of each dtype: a 2048^3 `torch.mm`, `2 n^3 / t`.
Each is the best of `--reps` runs (the machine is shared: the best is what it can do;
the median is printed beside it).

The floor of one decode step of the embedded model (SmolLM2-135M) at B rows: the bytes
it must read (every decode weight once: the 30 layers' projections and the LM head, in
the dtype; the KV cache of B rows at the step's context) over the read bandwidth, or its
FLOPs (2 x B x those weights' parameters, plus attention's 4 x B x layers x heads x
context x head_dim) over the matmul peak, whichever is larger. The peak is that of the
fastest kernel that computes the products exactly: for bf16 weights the larger of the
bf16 and fp32 peaks (a bf16 product is exact in fp32; on a CPU without amx the fp32
kernels are the faster), for fp32 the fp32 peak. The machine is measured again after
each dtype's run and the best figures are used. Printed for the engine's threads (the
machine's floor) and for one thread.

The measured step: the hf engine (`HFEngine`, as `make_engine` builds it, prefix cache
off) samples `--steps` tokens for B copies of update.py's GRPO prompt (the guess_number
opening, rendered with the chat template; no stop ids, so every row runs every step),
after a warm-up call of the same shape in which the engine times its decode modes.
Phases per step, timed around the engine's own functions while it runs (the wrappers
add ~1 us per call):
- `layers`: the 30 layers' projections (q/k/v, o, gate/up, down; `decode_step._Proj.fused`),
  LoRA adapters included;
- `attention`: the cache write and `DecodeStep._attention` of every layer;
- `lm_head`: the LM head's product;
- `other_ops`: the rest of the decode step (embedding, norms, rotary, residuals, SiLU);
- `sampling`: `_DecodeState.step` (log-softmax, the draw, the logprob gather, the step's
  one host read, stop checks);
- `python`: the engine's loop around them (attention-mask growth, the mode timing).
The step is the decode loop's wall time per step (the call's time less its prefill).

OpenMP's wait policy is PASSIVE unless `OMP_WAIT_POLICY` is set (as `python -m workbench`, the
notebooks and the tests run; docs/results.md says why); it is recorded with the machine. Two
threads that sleep between ops pay a wake-up per op, hundreds per step: on a 2-core Xeon with
amx (bf16, 2026-12-03) the step at 8 rows took 47 ms under PASSIVE (the engine keeps one
thread) and 31.5 ms under `OMP_WAIT_POLICY=ACTIVE` (two threads).

`--fast off,on` runs the engine with `inference.packed_decode` off and on in one run
(off: plain products; on: the engine's default, packed weights), their timed calls
interleaved (`--rounds` rounds of one call each), so the printed ratio (the median over
rounds of off's step over on's) is measured against a baseline under the same load.
`--setting cpu_kernels` switches `inference.cpu_kernels` instead (off: torch's sdpa, norms
and SiLU and the Python split helper; on: the kernels compiled for the machine,
`workbench/engines/cpu_kernels.py`), packed products on in both. Results go to `benchmarks/results/decode_floor.json` (`--out`).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # as the other benchmarks (see benchmarks/engines.py)
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import load, machine  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
PHASES = ("layers", "attention", "lm_head", "other_ops", "sampling", "python")


# -- the machine ------------------------------------------------------------------------
def _best_and_median(fn: Any, reps: int) -> tuple[float, float]:
    fn()  # first touch / first-call allocations
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times), statistics.median(times)


def machine_floors(threads: int, reps: int, bf16: bool = True) -> dict[str, Any]:
    """Read and copy bandwidth (bytes/s) and the bf16 / fp32 matmul peaks (FLOP/s) at
    `threads` threads: best and median of `reps`. `bf16` False: the fp32 peak only (a run
    without bf16 steps; on a CPU without bf16 instructions a 2048^3 bf16 matmul takes minutes)."""
    import torch

    original = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        n = 1 << 28  # 1 GiB of fp32
        x = torch.ones(n, dtype=torch.float32)
        y = torch.empty_like(x)
        nbytes = x.numel() * x.element_size()
        best, med = _best_and_median(lambda: x.sum(), reps)
        out: dict[str, Any] = {"threads": threads, "read_bytes_per_s": nbytes / best,
                               "read_bytes_per_s_median": nbytes / med}
        best, med = _best_and_median(lambda: y.copy_(x), reps)
        out["copy_bytes_per_s"], out["copy_bytes_per_s_median"] = 2 * nbytes / best, 2 * nbytes / med
        del x, y
        m = 2048
        for dtype in (torch.bfloat16, torch.float32) if bf16 else (torch.float32,):
            a, b = torch.randn(m, m, dtype=dtype), torch.randn(m, m, dtype=dtype)
            best, med = _best_and_median(lambda: torch.mm(a, b), reps)
            name = str(dtype).removeprefix("torch.")
            out[f"matmul_{name}_flops"], out[f"matmul_{name}_flops_median"] = 2 * m ** 3 / best, 2 * m ** 3 / med
    finally:
        torch.set_num_threads(original)
    return out


# -- the step's bytes and FLOPs --------------------------------------------------------
def step_work(model: Any, rows: int, context: float) -> dict[str, float]:
    """Bytes read and FLOPs of one decode step of `rows` rows at mean `context` cache positions."""
    import torch

    from workbench.engines.kv_cache import kv_bytes_per_token

    c = model.config
    weights = [m.weight for m in model.modules() if isinstance(m, torch.nn.Linear)]  # the layers' and the head's
    params = sum(w.numel() for w in weights)
    weight_bytes = sum(w.numel() * w.element_size() for w in weights)
    kv_bytes = rows * context * kv_bytes_per_token(model)
    heads, layers = c.num_attention_heads, c.num_hidden_layers
    head_dim = getattr(c, "head_dim", None) or c.hidden_size // heads
    flops = 2 * rows * params + 4 * rows * layers * heads * context * head_dim
    return {"weight_bytes": weight_bytes, "kv_bytes": kv_bytes, "flops": flops, "matmul_params": params}


def floor_seconds(work: dict[str, float], machine_row: dict[str, Any], dtype: str) -> dict[str, float]:
    """The step's floor: its bytes over the read bandwidth or its FLOPs over the fastest
    matmul that computes its products exactly, whichever is larger. A bf16 product is exact
    in fp32 (both kernels accumulate in fp32), so a bf16 step's peak is the larger of the
    two dtypes' (on a CPU without amx the fp32 one; `packed_matmul.Fp32Products`);
    `compute_own_dtype_s` is the FLOPs over the bf16 peak alone."""
    memory = (work["weight_bytes"] + work["kv_bytes"]) / machine_row["read_bytes_per_s"]
    own = machine_row[f"matmul_{dtype}_flops"]
    peak = max(own, machine_row["matmul_float32_flops"]) if dtype == "bfloat16" else own
    compute = work["flops"] / peak
    return {"memory_s": memory, "compute_s": compute, "compute_own_dtype_s": work["flops"] / own,
            "floor_s": max(memory, compute), "bound": "memory" if memory >= compute else "compute"}


def best_of(rows: list[dict[str, Any]]) -> dict[str, Any]:
    """The machine's best figures over several measurements of `machine_floors` (load comes and goes)."""
    out = dict(rows[0])
    for key in out:
        if key != "threads" and not key.endswith("_median"):
            out[key] = max(r[key] for r in rows)
    return out


# -- the measured step, per phase -------------------------------------------------------
class PhaseClock:
    """Seconds spent in the engine's decode functions while `timing()` is on (module docstring)."""

    def __init__(self) -> None:
        self.seconds = {p: 0.0 for p in (*PHASES, "forward", "prefill")}
        self.on = False
        self._patches: list[tuple[Any, str, Any]] = []

    def _wrap(self, owner: Any, name: str, phase_of: Any) -> None:
        original = getattr(owner, name)
        clock = self

        def timed(*args: Any, **kwargs: Any) -> Any:
            if not clock.on:
                return original(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return original(*args, **kwargs)
            finally:
                phase = phase_of(args)
                clock.seconds[phase] += time.perf_counter() - t0

        self._patches.append((owner, name, original))
        setattr(owner, name, timed)

    @contextmanager
    def installed(self, engine: Any) -> Iterator["PhaseClock"]:
        from workbench.engines import decode_step, kv_cache
        from workbench.engines.decode_state import _DecodeState

        def proj_phase(args: tuple) -> str:
            step = engine._decode_step
            return "lm_head" if step is not None and args[0] is step.head else "layers"

        self._wrap(decode_step._Proj, "fused", proj_phase)  # `_Proj.__call__` runs it too
        self._wrap(decode_step.DecodeStep, "_attention", lambda a: "attention")
        self._wrap(kv_cache._GrowingLayerMixin, "update", lambda a: "attention")
        self._wrap(decode_step.DecodeStep, "__call__", lambda a: "forward")
        self._wrap(_DecodeState, "step", lambda a: "sampling")
        self._wrap(type(engine), "_prefill", lambda a: "prefill")
        try:
            yield self
        finally:
            for owner, name, original in reversed(self._patches):
                setattr(owner, name, original)
            self._patches.clear()

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.seconds, 0.0)


def measure_step(engine: Any, prompt: list[int], rows: int, steps: int, clock: PhaseClock) -> dict[str, Any]:
    """Warm-up call (the engine times its modes), then one timed call of `steps` tokens per row."""
    from workbench.engines.base import SamplingParams

    params = SamplingParams(max_tokens=steps, temperature=1.0, seed=1, keep_kv=False)
    engine.generate_ids([list(prompt)] * rows, params)  # warm-up: the engine's timed decode choice
    clock.reset()
    clock.on = True
    load0 = load()
    t0 = time.perf_counter()
    out = engine.generate_ids([list(prompt)] * rows, SamplingParams(max_tokens=steps, temperature=1.0, seed=2,
                                                                       keep_kv=False))
    wall = time.perf_counter() - t0
    clock.on = False
    assert all(len(r.token_ids) == steps for r in out), "every row runs every step (no stop ids)"
    s = clock.seconds
    decode = wall - s["prefill"]
    n = steps - 1  # decode steps: the first token is sampled from the prefill's logits
    per = {p: s[p] / n for p in ("layers", "attention", "lm_head", "sampling")}
    per["sampling"] = s["sampling"] / steps
    per["other_ops"] = (s["forward"] - s["layers"] - s["attention"] - s["lm_head"]) / n
    step_s = decode / n
    per["python"] = step_s - sum(per.values())
    return {"rows": rows, "steps": steps, "step_s": step_s, "phases_s": per, "prefill_s": s["prefill"],
            "load": round((load0 + load()) / 2, 2),
            "decode_choice": {k: round(v, 2) for k, v in engine.stats().items() if k.startswith("decode_")}}


def run_dtype(dtype_name: str, args: argparse.Namespace, machines: dict[int, dict[str, Any]]) -> dict[str, Any]:
    """Every `--fast` setting's engine over one model; per row count, `--rounds` rounds, each
    measuring every setting once in turn (so load that comes and goes hits all of them)."""
    import torch

    from benchmarks.update import prompt_messages
    from workbench.config import EMBEDDED_MODEL, ConfigStore
    from workbench.engines import make_engine
    from workbench.models import load_model_and_tokenizer

    model, tok = load_model_and_tokenizer(EMBEDDED_MODEL, dtype=getattr(torch, dtype_name), device="cpu")
    model.eval()
    prompt = list(tok.apply_chat_template(prompt_messages(), add_generation_prompt=True, return_dict=False))
    out: dict[str, Any] = {"prompt_tokens": len(prompt), "rows": {}}
    engines = {}
    for fast in args.fast:
        config = ConfigStore()
        config.inference.enable_prefix_caching = False
        config.inference.max_batch_size = max(args.rows)
        setattr(config.inference, args.setting, fast == "on")
        engines[fast] = make_engine(config, model, tok)
    for rows in args.rows:
        context = len(prompt) + args.steps / 2  # the cache positions a step reads, on average
        work = step_work(model, rows, context)
        floors = {str(t): floor_seconds(work, machines[t], dtype_name) for t in machines}
        floor = floors[str(args.threads)]["floor_s"]
        runs: dict[str, list[dict[str, Any]]] = {fast: [] for fast in args.fast}
        for _ in range(args.rounds):
            for fast, engine in engines.items():
                clock = PhaseClock()
                with clock.installed(engine):
                    m = measure_step(engine, prompt, rows, args.steps, clock)
                runs[fast].append(m)
                phases = "  ".join(f"{p} {1000 * v:.1f}" for p, v in m["phases_s"].items())
                print(f"[{dtype_name} {args.setting}={fast}] {rows:3d} rows: step {1000 * m['step_s']:.1f} ms, floor so "
                      f"far {1000 * floor:.1f} ms ({floors[str(args.threads)]['bound']}), {m['step_s'] / floor:.2f}x; "
                      f"{phases} (ms); load {m['load']}", flush=True)
        entry: dict[str, Any] = {"work": work, "floor": floors}
        for fast, ms in runs.items():
            step = statistics.median(m["step_s"] for m in ms)
            entry[f"{args.setting}_{fast}"] = {
                "step_s_median": step, "step_over_floor": step / floor, "runs": ms,
                "phases_s_median": {p: statistics.median(m["phases_s"][p] for m in ms) for p in PHASES},
                "decode_choice": ms[-1]["decode_choice"]}
        if "on" in runs and "off" in runs:  # per round, then the median: both sides under the same load
            entry["speedup_on_over_off"] = statistics.median(
                a["step_s"] / b["step_s"] for a, b in zip(runs["off"], runs["on"]))
        out["rows"][str(rows)] = entry
    for engine in engines.values():
        engine.close()
    return out


def _machine_line(m: dict[str, Any]) -> str:
    bf16 = (f"bf16 {m['matmul_bfloat16_flops'] / 1e9:.0f} GFLOP/s (median {m['matmul_bfloat16_flops_median'] / 1e9:.0f}), "
            if "matmul_bfloat16_flops" in m else "")
    return (f"{m['threads']} thread(s): read {m['read_bytes_per_s'] / 1e9:.1f} GB/s (median "
            f"{m['read_bytes_per_s_median'] / 1e9:.1f}), copy {m['copy_bytes_per_s'] / 1e9:.1f} GB/s; matmul {bf16}"
            f"fp32 {m['matmul_float32_flops'] / 1e9:.0f} GFLOP/s (median {m['matmul_float32_flops_median'] / 1e9:.0f})")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dtypes", default="bfloat16,float32")
    p.add_argument("--rows", default="8,32,128")
    p.add_argument("--steps", type=int, default=48, help="tokens sampled per row in the timed call")
    p.add_argument("--threads", type=int, default=2, help="the engine's torch threads")
    p.add_argument("--reps", type=int, default=7, help="runs of each bandwidth / peak measurement")
    p.add_argument("--rounds", type=int, default=3, help="timed calls per setting and row count, interleaved")
    p.add_argument("--fast", default="off,on", help="values of --setting to run, in order")
    p.add_argument("--setting", default="packed_decode", choices=["packed_decode", "cpu_kernels"],
                   help="the inference setting --fast switches (the other one keeps its default, on)")
    p.add_argument("--out", default=str(RESULTS / "decode_floor.json"))
    args = p.parse_args(argv)
    args.rows = [int(r) for r in args.rows.split(",")]
    args.fast = [f.strip() for f in args.fast.split(",") if f.strip()]
    import torch

    torch.set_num_threads(args.threads)
    dtypes = [d.strip() for d in args.dtypes.split(",") if d.strip()]
    bf16 = "bfloat16" in dtypes
    samples = {t: [machine_floors(t, args.reps, bf16)] for t in sorted({args.threads, 1})}
    machines = {t: best_of(rows) for t, rows in samples.items()}
    for t, m in machines.items():
        print(f"[machine] {_machine_line(m)}; load {load()}; OMP_WAIT_POLICY={os.environ.get('OMP_WAIT_POLICY')}",
              flush=True)
    result: dict[str, Any] = {
        "benchmark": "decode_floor", "command": "python benchmarks/decode_floor.py " + " ".join(
            sys.argv[1:] if argv is None else argv), "date": time.strftime("%Y-%m-%d"),
        "machine": {**machine(), "threads": args.threads, "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                    "load_before": load()},
        "dtypes": {}}
    for dtype in dtypes:
        result["dtypes"][dtype] = run_dtype(dtype, args, machines)
        for t, rows in samples.items():  # the machine again: the floors use its best figures of the run
            rows.append(machine_floors(t, args.reps, bf16))
            machines[t] = best_of(rows)
    for dtype, d in result["dtypes"].items():  # every step's floor, with the run's best figures
        for r in d["rows"].values():
            r["floor"] = {str(t): floor_seconds(r["work"], machines[t], dtype) for t in machines}
            floor = r["floor"][str(args.threads)]["floor_s"]
            for key, e in r.items():
                if key.startswith(f"{args.setting}_"):
                    e["step_over_floor"] = e["step_s_median"] / floor
    result["floors"] = {str(t): m for t, m in machines.items()}
    result["floor_samples"] = {str(t): rows for t, rows in samples.items()}
    result["machine"]["load_after"] = load()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    for m in machines.values():
        print(f"machine, best of the run: {_machine_line(m)}")
    for dtype, d in result["dtypes"].items():
        for rows, r in d["rows"].items():
            e = r[f"{args.setting}_{args.fast[-1]}"]
            print(f"{dtype} {rows} rows, {args.setting} {args.fast[-1]}, median ms per step: " + ", ".join(
                f"{p} {1000 * v:.1f}" for p, v in e["phases_s_median"].items()))
            floor = r["floor"][str(args.threads)]
            line = (f"{dtype} {rows} rows: floor {1000 * floor['floor_s']:.1f} ms ({floor['bound']}; bytes "
                    f"{1000 * floor['memory_s']:.1f}, FLOPs {1000 * floor['compute_s']:.1f})")
            for fast in args.fast:
                e = r[f"{args.setting}_{fast}"]
                line += f"; {args.setting} {fast}: step {1000 * e['step_s_median']:.1f} ms = {e['step_over_floor']:.2f}x"
            if "speedup_on_over_off" in r:
                line += f"; on vs off {r['speedup_on_over_off']:.2f}x"
            print(line)
    print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
