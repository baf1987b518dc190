"""Smoke benchmark of the in-process vLLM engine on a real model.

    PYTHONPATH=. .venv/bin/python benchmarks/engines_smoke.py --dtype bfloat16 --prompts 32 --tokens 64

Reports engine start time (import + engine construction), generation throughput for a
batch of chat prompts, the max |logprob| difference against a float32 transformers
forward (on `--device`, default "auto": CUDA when available, else CPU) at the sampled ids, and the time of one `sync_weights` of the full model.
"""
from __future__ import annotations

import argparse
import json
import os
import time

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--dtype", default="bfloat16", choices=["auto", "bfloat16", "float32", "float16"],
                    help='the vLLM engine\'s dtype ("auto": bfloat16 on GPU, float32 on CPU)')
    ap.add_argument("--device", default="auto", help="device of the float32 transformers reference")
    ap.add_argument("--prompts", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=1, help="torch threads while generating (0: process setting)")
    ap.add_argument("--parity-prompts", type=int, default=4)
    args = ap.parse_args()

    import torch

    from workbench.engines.base import SamplingParams
    from workbench.config import resolve_device
    from workbench.models.loading import load_model_and_tokenizer, resolve_model_path

    path = resolve_model_path(args.model)
    device = resolve_device(args.device, field="--device")
    hf, tok = load_model_and_tokenizer(path, dtype="float32", device=device)  # the parity reference
    t0 = time.perf_counter()
    from workbench.engines.vllm_engine import VLLMEngine

    engine = VLLMEngine(path, tok, dtype=args.dtype, max_model_len=2048, generate_threads=args.threads or None)
    start_s = time.perf_counter() - t0

    topics = ["the weather", "a number game", "grid worlds", "cooking pasta", "prime numbers", "the moon",
              "chess openings", "a short poem"]
    prompts = [
        list(tok.apply_chat_template([{"role": "user", "content": f"Tell me about {topics[i % len(topics)]} ({i})."}],
                                     add_generation_prompt=True, return_dict=False))
        for i in range(args.prompts)
    ]
    params = SamplingParams(max_tokens=args.tokens, temperature=1.0, seed=0)
    engine.generate_ids(prompts[:2], SamplingParams(max_tokens=4))  # warm-up (first forward allocates)
    t1 = time.perf_counter()
    results = engine.generate_ids(prompts, params)
    gen_s = time.perf_counter() - t1
    n_tokens = sum(len(r.token_ids) for r in results)

    worst = 0.0
    with torch.no_grad():
        for prompt, r in zip(prompts[: args.parity_prompts], results):
            logits = hf(torch.tensor([prompt + r.token_ids], device=device)).logits[0, len(prompt) - 1 : -1]
            ref = torch.log_softmax(logits.float().cpu(), -1)[torch.arange(len(r.token_ids)), torch.tensor(r.token_ids)]
            worst = max(worst, (torch.tensor(r.logprobs) - ref).abs().max().item())

    t2 = time.perf_counter()
    engine.sync_weights(hf)
    sync_s = time.perf_counter() - t2
    report = {
        "model": args.model, "dtype": args.dtype, "reference_device": str(device), "generate_threads": args.threads or torch.get_num_threads(),
        "engine_start_s": round(start_s, 1), "prompts": args.prompts, "max_tokens": args.tokens,
        "generated_tokens": n_tokens, "generate_s": round(gen_s, 2), "tokens_per_s": round(n_tokens / gen_s, 1),
        "max_abs_logprob_diff_vs_hf_fp32": worst, "sync_weights_s": round(sync_s, 2),
        "stats": engine.stats(),
    }
    engine.close()
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
