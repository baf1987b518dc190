"""GRPO step time: workbench `Trainer.train_step()` vs TRL's `GRPOTrainer`, in one process.

    python benchmarks/update.py                 # 1 warm-up + 4 timed steps per side
    python benchmarks/update.py --steps 6 --device cuda --dtype bfloat16

One single-turn config on both sides: the embedded model (SmolLM2-135M-Instruct) on
`--device` (default "auto": CUDA when available, else CPU) with weights in `--dtype`
(default "auto": bfloat16 on CUDA and on CPUs with bf16 instructions, else float32),
TRL on the same device and dtype;
LoRA r=16 / alpha=32 on all linear layers, one prompt x 8 completions per step, at
most 64 new tokens, temperature 1.0, learning rate 1e-5, no KL term, one optimizer
step per batch. The prompt is guess_number's opening (system prompt + first
observation, range 1..8) rendered with the chat template; the reward is the same
plain python function of the completion text on both sides (`reward_text`).

Timed per side: the median of `--steps` steps after one warm-up step, each step =
generation + reward + advantages + loss forward/backward + optimizer step; and the
"update" part alone (ours: old-logprob forward + `update()`, from the trainer's
stage timers; TRL: step minus its `_generate_and_score_completions`).

FLOP/s: a large matmul in the weights' dtype, timed on the same device (`2 n^3 / t`),
is the peak, and our update's FLOPs are counted on the tokens actually fed: our update packs the 8
completions behind one copy of the shared prompt (`workbench/training/packing.py`),
so fed tokens = prompt + completion tokens, not 8 x (prompt + longest completion).
A forward is 2 x N x fed tokens, where N excludes the input embedding (a lookup) and the
LM head (run only at completion positions, counted there: 2 x N_head x completion
tokens); forward + backward is 3 forwards' worth (the 6N convention), plus one more
forward when the old logprobs are recomputed separately (not when the step is
on-policy: `training.reuse_update_logprobs`). LoRA skips the frozen weights' gradient
matmuls, so 6N over-counts: the "lora-aware" figure counts 4N for forward + backward.
By phase (`UpdatePhases`, timers around the body's forwards, the LM head's logprobs
forward and backward, the rest of the backward, the optimizer step): each phase's FLOPs
so counted over its seconds, as a share of the peak.

Last line: `speedup vs TRL: N.Nx` (TRL median step / ours).
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # see benchmarks/learning.py
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from benchmarks._common import load  # noqa: E402

from workbench.config import DTYPES, EMBEDDED_MODEL, resolve_device, resolve_dtype  # noqa: E402

RESULTS = ROOT / "benchmarks" / "results"
GROUP = 8
MAX_NEW = 64
LR = 1e-5
ENV_PARAMS = {"low": 1, "high": 8, "max_steps": 4}


def reward_text(text: str) -> float:
    """1 if the reply's first number is a valid guess (1..8), else 0; minus a length cost."""
    from envs._common import first_number

    n = first_number(text)
    return (1.0 if n is not None and 1 <= n <= 8 else 0.0) - 0.002 * len(text)


def prompt_messages() -> list[dict[str, str]]:
    from envs import make_env

    env = make_env("guess_number", **ENV_PARAMS)
    obs = env.reset()  # the opening line does not depend on the seed
    return [{"role": "system", "content": env.get_prompt_prefix()}, {"role": "user", "content": obs}]


def sync(device: Any) -> None:
    """Wait for queued kernels so wall-clock times are real (a no-op off CUDA)."""
    import torch

    if torch.device(device).type == "cuda":
        torch.cuda.synchronize(device)


def matmul_peak(device: Any, dtype: Any, n: int = 2048, reps: int = 5) -> float:
    import torch

    a = torch.randn(n, n, dtype=dtype, device=device)
    b = torch.randn(n, n, dtype=dtype, device=device)
    torch.mm(a, b)
    times = []
    for _ in range(reps):
        sync(device)
        t = time.perf_counter()
        torch.mm(a, b)
        sync(device)
        times.append(time.perf_counter() - t)
    return 2 * n ** 3 / min(times)


# -- ours: the update's phases ---------------------------------------------------------
class UpdatePhases:
    """Seconds of our update's phases while `installed`: the model body's forwards (the
    old-logprob one and the update's; forward hooks on the body), the LM head's logprobs
    forward and backward (`head_logprobs._HeadLogprobs`), the body's backward (the whole
    `Tensor.backward` less the head's part) and the optimizer step; only inside the
    trainer's `compute_logprobs` and `update` (not the engine's prefills)."""

    PHASES = ("body_forward", "head_forward", "head_backward", "body_backward", "optimizer")

    def __init__(self) -> None:
        self.seconds = dict.fromkeys(self.PHASES, 0.0)
        self.forwards = 0  # body forwards run (1 or 2 per step)
        self.active = False  # inside compute_logprobs / update

    def reset(self) -> None:
        self.seconds = dict.fromkeys(self.PHASES, 0.0)
        self.forwards = 0

    def _timed(self, fn: Any, phase: str) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            if not self.active:
                return fn(*args, **kwargs)
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[phase] += time.perf_counter() - t0
        return run

    def _activating(self, fn: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            self.active = True
            try:
                return fn(*args, **kwargs)
            finally:
                self.active = False
        return run

    def install(self, trainer: Any) -> None:
        import torch

        from workbench.training import head_logprobs

        inner = trainer.policy.model
        inner = inner.get_base_model() if hasattr(inner, "get_base_model") else inner
        body = inner.model  # the decoder stack under the causal-LM wrapper
        starts: list[float] = []

        def pre(module: Any, args: Any) -> None:
            if self.active:
                starts.append(time.perf_counter())

        def post(module: Any, args: Any, out: Any) -> None:
            if self.active and starts:
                self.seconds["body_forward"] += time.perf_counter() - starts.pop()
                self.forwards += 1

        body.register_forward_pre_hook(pre)
        body.register_forward_hook(post)
        fn = head_logprobs._HeadLogprobs
        fn.forward = staticmethod(self._timed(fn.forward, "head_forward"))
        fn.backward = staticmethod(self._timed(fn.backward, "head_backward"))
        backward = torch.Tensor.backward
        torch.Tensor.backward = self._timed(backward, "body_backward")  # less the head's part: `phases`
        trainer.optimizer.step = self._timed(trainer.optimizer.step, "optimizer")
        trainer.compute_logprobs = self._activating(trainer.compute_logprobs)
        trainer.update = self._activating(trainer.update)

    def phases(self) -> dict[str, float]:
        out = dict(self.seconds)
        out["body_backward"] -= out["head_backward"]  # the head's backward ran inside Tensor.backward
        return out


# -- ours ---------------------------------------------------------------------------
def make_trainer(device: Any, dtype: Any, model: str = EMBEDDED_MODEL, lora: bool = True,
                 cuda_graphs: bool = False, max_new: int = MAX_NEW) -> Any:
    """Our side's `Trainer`: the module docstring's config (also benchmarks/floors.py's GRPO step
    and benchmarks/gpu.py's, there on another `model` folder, with `lora` off and with
    `inference.cuda_graphs` on too; its CPU rehearsal samples fewer tokens, `max_new`)."""
    from envs import make_env
    from workbench.config import ConfigStore
    from workbench.training.trainer import Trainer

    cfg = ConfigStore()
    cfg.model.model_name = model
    cfg.model.device, cfg.model.dtype = str(device), str(dtype).removeprefix("torch.")
    cfg.model.use_lora = lora
    cfg.inference.cuda_graphs = cuda_graphs
    cfg.model.lora_rank, cfg.model.lora_alpha, cfg.model.lora_target_modules = 16, 32, "all-linear"
    cfg.inference.multi_turn = False
    cfg.inference.max_turns = 1
    cfg.inference.max_tokens = max_new
    cfg.inference.temperature = 1.0
    t = cfg.training
    t.adv_estimator, t.batch_size, t.group_size, t.micro_batch_size = "grpo", GROUP, GROUP, GROUP
    t.learning_rate, t.loss_agg_mode, t.use_kl_loss, t.use_kl_in_reward = LR, "token-mean", False, False
    env = make_env("guess_number", **ENV_PARAMS)
    return Trainer(cfg, environment=env, reward_fn=lambda ep: reward_text(ep.turns[0].action if ep.turns else ""))


def run_ours(steps: int, bf16_steps: int, device: Any, dtype: Any, model: str = EMBEDDED_MODEL,
             lora: bool = True, cuda_graphs: bool = False, warmup: int = 1, max_new: int = MAX_NEW) -> dict[str, Any]:
    """`warmup` untimed steps (rows marked "warmup"), then `steps` timed ones, each sampling at
    most `max_new` tokens a completion."""
    from workbench.training.policy import shared_prefix_length

    trainer = make_trainer(device, dtype, model, lora, cuda_graphs, max_new)
    # Stage timers: old-logprob forward (inside compute_advantages) and update.
    timings: dict[str, float] = {}
    orig_logprobs = trainer.compute_logprobs

    def timed_logprobs(batch, **kw):
        t0 = time.perf_counter()
        out = orig_logprobs(batch, **kw)
        # 0 when train_step takes old_logprobs from the update's forward (reuse_update_logprobs)
        timings["logprob_seconds"] = time.perf_counter() - t0
        lengths = [ep.num_tokens for ep in batch]
        T = max(lengths)
        timings["padded_tokens"] = T * len(lengths)  # one micro-batch of GROUP rows
        # fed tokens, packed: the shared prompt once, then every row's own tokens (no padding)
        shared = shared_prefix_length(batch.input_ids[:, :T], batch.attention_mask[:, :T], batch.loss_mask[:, :T])
        timings["fed_tokens"] = shared + sum(n - shared for n in lengths)
        timings["old_logprob_forward"] = kw.get("old_logprobs", True)
        timings["completion_tokens"] = float(batch.loss_mask.sum())
        timings["tokens"] = float(sum(lengths))
        return out

    trainer.compute_logprobs = timed_logprobs  # type: ignore[method-assign]
    phases = UpdatePhases()
    phases.install(trainer)
    rows = []
    for i in range(warmup + steps):
        l0 = load()
        phases.reset()
        t0 = time.perf_counter()
        m = trainer.train_step()
        dt = time.perf_counter() - t0
        row = {"step_seconds": dt, "rollout_seconds": m["perf/rollout_seconds"],
               "update_seconds": m["perf/update_seconds"] + timings["logprob_seconds"],
               "logprob_seconds": timings["logprob_seconds"], "backward_update_seconds": m["perf/update_seconds"],
               "tokens": timings["tokens"], "padded_tokens": timings["padded_tokens"],
               "fed_tokens": timings["fed_tokens"], "old_logprob_forward": timings["old_logprob_forward"],
               "completion_tokens": timings["completion_tokens"], "reward": m["reward/mean"],
               "phases": phases.phases(), "body_forwards": phases.forwards,
               "rollout_logprob_diff": m.get("actor/rollout_logprob_diff"),
               "load": (l0 + load()) / 2, "warmup": i < warmup}
        rows.append(row)
        print(f"[ours] step {i}{' (warm-up)' if i < warmup else ''}: {dt:.2f}s (rollout {row['rollout_seconds']:.2f}s, "
              f"update {row['update_seconds']:.2f}s), {row['completion_tokens']:.0f} completion tokens, "
              f"load {row['load']:.1f}", flush=True)
    # training.autocast_bf16: the same steps with bf16 autocast in the logprob/update forwards.
    bf16_rows = []
    if bf16_steps:
        trainer.config.training.autocast_bf16 = True
        for i in range(bf16_steps):
            l0 = load()
            m = trainer.train_step()
            bf16_rows.append({"update_seconds": m["perf/update_seconds"] + timings["logprob_seconds"],
                              "padded_tokens": timings["padded_tokens"], "load": (l0 + load()) / 2})
            print(f"[ours] bf16 autocast step {i}: update {bf16_rows[-1]['update_seconds']:.2f}s "
                  f"({timings['padded_tokens']} padded tokens, load {bf16_rows[-1]['load']:.1f})", flush=True)
    n_params = sum(p.numel() for p in trainer.policy.model.parameters() if not p.requires_grad)
    # model.fp32_base_products: whether the body's base products ran in fp32 (workbench/training/fp32_products.py)
    fp32 = any(getattr(m, "fp32_base_weights", None) is not None for m in trainer.policy.model.modules())
    trainer.cleanup()
    return {"rows": rows, "frozen_params": n_params, "bf16_rows": bf16_rows, "fp32_base_products": fp32}


# -- TRL ----------------------------------------------------------------------------
def run_trl(steps: int, tmpdir: str, device: Any, dtype: Any, model_name: str = EMBEDDED_MODEL,
            lora: bool = True, warmup: int = 1, max_new: int = MAX_NEW) -> dict[str, Any]:
    """TRL's `GRPOTrainer` on the same prompt and reward: `warmup` untimed steps, then `steps`
    timed ones, at most `max_new` tokens a completion."""
    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from workbench.models.loading import resolve_model_path

    path = resolve_model_path(model_name)
    tok = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=dtype).to(device)
    ds = Dataset.from_list([{"prompt": prompt_messages()} for _ in range(64)])

    def reward_fn(prompts, completions, **kwargs):
        return [reward_text(c[0]["content"] if isinstance(c, list) else c) for c in completions]

    args = GRPOConfig(
        output_dir=tmpdir, per_device_train_batch_size=GROUP, num_generations=GROUP, gradient_accumulation_steps=1,
        max_completion_length=max_new, temperature=1.0, learning_rate=LR, beta=0.0, num_iterations=1,
        loss_type="dapo", max_steps=warmup + steps, logging_steps=1, save_strategy="no", report_to="none",
        use_cpu=device.type == "cpu", bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16, seed=0, dataloader_num_workers=0, disable_dropout=True,
        shuffle_dataset=False,
    )
    peft_cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.0, target_modules="all-linear", bias="none",
                          task_type="CAUSAL_LM")
    trainer = GRPOTrainer(model=model, reward_funcs=reward_fn, args=args, train_dataset=ds,
                          processing_class=tok, peft_config=peft_cfg if lora else None)
    gen_times: list[float] = []
    completion_tokens: list[float] = []
    orig = trainer._generate_and_score_completions

    def timed(batch):
        t0 = time.perf_counter()
        out = orig(batch)
        gen_times.append(time.perf_counter() - t0)
        completion_tokens.append(float(out["completion_mask"].sum()))
        return out

    trainer._generate_and_score_completions = timed  # type: ignore[method-assign]
    rows: list[dict[str, Any]] = []

    class Timer(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0, self.l0 = time.perf_counter(), load()

        def on_step_end(self, args, state, control, **kw):
            dt = time.perf_counter() - self.t0
            i = len(rows)
            row = {"step_seconds": dt, "rollout_seconds": gen_times[-1], "update_seconds": dt - gen_times[-1],
                   "completion_tokens": completion_tokens[-1], "load": (self.l0 + load()) / 2, "warmup": i < warmup}
            rows.append(row)
            print(f"[trl ] step {i}{' (warm-up)' if i < warmup else ''}: {dt:.2f}s (generate+score "
                  f"{row['rollout_seconds']:.2f}s, update {row['update_seconds']:.2f}s), "
                  f"{row['completion_tokens']:.0f} completion tokens, load {row['load']:.1f}", flush=True)

    trainer.add_callback(Timer())
    trainer.train()
    return {"rows": rows}


def med(rows: list[dict[str, Any]], key: str) -> float:
    return statistics.median(r[key] for r in rows if not r["warmup"])


def main(argv: list[str] | None = None) -> int:
    import tempfile

    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--steps", type=int, default=4, help="timed steps per side (after one warm-up)")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--skip-trl", action="store_true")
    p.add_argument("--bf16-steps", type=int, default=2, help="extra steps of ours with training.autocast_bf16")
    p.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    p.add_argument("--dtype", default="auto", choices=["auto", *DTYPES],
                   help='weights dtype for both sides; "auto": bfloat16 on CUDA and on CPUs with bf16 '
                        'instructions, else float32')
    p.add_argument("--out", default=str(RESULTS / "update.json"))
    args = p.parse_args(argv)
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    device = resolve_device(args.device, field="--device")
    dtype = resolve_dtype(args.dtype, device, field="--dtype")
    dtype_name = str(dtype).removeprefix("torch.")

    peak0 = matmul_peak(device, dtype)
    print(f"device {device}, dtype {dtype_name}; matmul peak ({dtype_name} 2048^3, best of 5): "
          f"{peak0 / 1e9:.1f} GFLOP/s, load {load()}", flush=True)
    ours = run_ours(args.steps, args.bf16_steps, device, dtype)
    peak1 = matmul_peak(device, dtype)
    trl = None if args.skip_trl else run_trl(args.steps, tempfile.mkdtemp(prefix="wb_trl_"), device, dtype)
    peak2 = matmul_peak(device, dtype)
    peak = max(peak0, peak1, peak2)

    # Our update FLOPs (see the module docstring).
    from transformers import AutoConfig

    from workbench.models.loading import resolve_model_path

    mc = AutoConfig.from_pretrained(resolve_model_path("smollm2-135m-instruct"))
    n_head = mc.vocab_size * mc.hidden_size
    n_body = ours["frozen_params"] - n_head  # embedding (tied with the head) excluded: a lookup
    timed = [r for r in ours["rows"] if not r["warmup"]]
    def flops(r: dict[str, Any], train_forwards: int) -> float:
        forwards = train_forwards + (1 if r["old_logprob_forward"] else 0)
        return 2 * forwards * (n_body * r["fed_tokens"] + n_head * r["completion_tokens"])

    # Per phase (`UpdatePhases`): a forward is 2 x N x tokens; LoRA's backward computes the
    # activations' gradients only (2 x N x tokens; the adapters' own are ~r/E of that).
    phase_flops = {"body_forward": lambda r: 2 * n_body * r["fed_tokens"] * r["body_forwards"],
                   "head_forward": lambda r: 2 * n_head * r["completion_tokens"] * r["body_forwards"],
                   "head_backward": lambda r: 2 * n_head * r["completion_tokens"],
                   "body_backward": lambda r: 2 * n_body * r["fed_tokens"]}
    # The body's products ran in fp32 with model.fp32_base_products: its phases against the fp32 peak.
    body_peak = matmul_peak(device, torch.float32) if ours["fp32_base_products"] else peak
    by_phase = {}
    for name in UpdatePhases.PHASES:
        secs = statistics.median(r["phases"][name] for r in timed)
        entry = {"seconds_median": secs}
        if name in phase_flops:
            fps = statistics.median(phase_flops[name](r) / r["phases"][name] for r in timed if r["phases"][name] > 0)
            entry.update({"flops_per_s": fps,
                          "fraction_of_peak": fps / (body_peak if name.startswith("body") else peak)})
        by_phase[name] = entry

    flops_6n = [flops(r, 3) for r in timed]
    flops_lora = [flops(r, 2) for r in timed]
    fps_6n = statistics.median(f / r["update_seconds"] for f, r in zip(flops_6n, timed))
    fps_lora = statistics.median(f / r["update_seconds"] for f, r in zip(flops_lora, timed))

    result: dict[str, Any] = {
        "config": {"model": "smollm2-135m-instruct", "device": str(device), "dtype": dtype_name, "lora": "r=16, alpha=32, all-linear",
                   "completions_per_step": GROUP, "prompts_per_step": 1, "max_new_tokens": MAX_NEW,
                   "temperature": 1.0, "learning_rate": LR, "kl": "off", "threads": args.threads,
                   "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
                   "fp32_base_products": ours["fp32_base_products"],
                   "prompt": "guess_number (1..8, 4 guesses) system prompt + first observation, chat template",
                   "reward": "reward_text: 1 if the first number is in 1..8, minus 0.002 per character"},
        "ours": {"step_seconds_median": med(ours["rows"], "step_seconds"),
                 "rollout_seconds_median": med(ours["rows"], "rollout_seconds"),
                 "update_seconds_median": med(ours["rows"], "update_seconds"),
                 "completion_tokens_median": med(ours["rows"], "completion_tokens"),
                 "steps": ours["rows"]},
        "matmul_peak_flops": peak, "matmul_peak_samples": [peak0, peak1, peak2],
        "update_flops": {"counting": "2 x forwards x (N_body x fed tokens + N_head x completion tokens); "
                                     "forwards = 3 (fwd+bwd, 6N convention) + 1 if old logprobs were "
                                     "recomputed; lora_aware: 2 instead of 3",
                         "n_body": n_body, "n_head": n_head,
                         "flops_per_s_6n": fps_6n, "fraction_of_peak_6n": fps_6n / peak,
                         "flops_per_s_lora_aware": fps_lora, "fraction_of_peak_lora_aware": fps_lora / peak,
                         "by_phase": by_phase,
                         "by_phase_counting": "forward 2 x N x tokens per body forward (the head at trained "
                                              "positions only); backward 2 x N x tokens (LoRA: activation "
                                              "gradients only); fraction of the same-dtype matmul peak (the "
                                              "body's phases: of the fp32 peak when fp32_base_products)",
                         "fp32_matmul_peak_flops": body_peak if ours["fp32_base_products"] else None},
        "bf16_autocast": {"steps": ours["bf16_rows"],
                          "note": "update seconds (old-logprob forward + update) per padded token, without "
                                  "vs with bf16 autocast; the matmul rows are the weights' dtype vs bf16 "
                                  "2048^3 torch.mm",
                          "no_autocast_seconds_per_1k_padded_tokens": statistics.median(
                              1000 * r["update_seconds"] / r["padded_tokens"] for r in timed),
                          "bf16_seconds_per_1k_padded_tokens": (statistics.median(
                              1000 * r["update_seconds"] / r["padded_tokens"] for r in ours["bf16_rows"])
                              if ours["bf16_rows"] else None),
                          "matmul_peak_flops": peak,
                          # only with bf16 steps: capped at AVX2 (ATEN_CPU_CAPABILITY=avx2 ONEDNN_MAX_CPU_ISA=AVX2
                          # MKL_ENABLE_INSTRUCTIONS=AVX2) one 1024^3 bf16 product took 2.3 s on the Xeon
                          "matmul_bf16_flops": matmul_peak(device, torch.bfloat16) if ours["bf16_rows"] else None},
        "loads": [load()],
    }
    print(f"our update: {result['ours']['update_seconds_median']:.2f}s median, "
          f"{fps_6n / 1e9:.1f} GFLOP/s (6N counting) = {fps_6n / peak:.0%} of the {peak / 1e9:.1f} GFLOP/s "
          f"matmul peak ({fps_lora / peak:.0%} LoRA-aware)", flush=True)
    print("our update by phase (median s, share of the matmul peak"
          + (f"; the body's of the fp32 peak, {body_peak / 1e9:.1f} GFLOP/s: fp32 base products"
             if ours["fp32_base_products"] else "") + "): " + "; ".join(
        f"{name} {e['seconds_median']:.3f}s" + (f" {e['fraction_of_peak']:.0%}" if "fraction_of_peak" in e else "")
        for name, e in by_phase.items()), flush=True)
    if trl is not None:
        result["trl"] = {"version": __import__("trl").__version__,
                         "step_seconds_median": med(trl["rows"], "step_seconds"),
                         "rollout_seconds_median": med(trl["rows"], "rollout_seconds"),
                         "update_seconds_median": med(trl["rows"], "update_seconds"),
                         "completion_tokens_median": med(trl["rows"], "completion_tokens"),
                         "steps": trl["rows"]}
        result["speedup_step"] = result["trl"]["step_seconds_median"] / result["ours"]["step_seconds_median"]
        result["speedup_update"] = result["trl"]["update_seconds_median"] / result["ours"]["update_seconds_median"]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1))
    o = result["ours"]
    print(f"ours: step {o['step_seconds_median']:.2f}s (generate {o['rollout_seconds_median']:.2f}s, "
          f"update {o['update_seconds_median']:.2f}s)")
    if trl is not None:
        r = result["trl"]
        print(f"TRL:  step {r['step_seconds_median']:.2f}s (generate {r['rollout_seconds_median']:.2f}s, "
              f"update {r['update_seconds_median']:.2f}s); update-only speedup {result['speedup_update']:.1f}x")
        print(f"speedup vs TRL: {result['speedup_step']:.1f}x")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
