"""16 openai-client agents through the gateway at once vs one by one.

    PYTHONPATH=. .venv/bin/python benchmarks/gateway.py                 # embedded SmolLM2-135M
    PYTHONPATH=. .venv/bin/python benchmarks/gateway.py --model tiny    # the tiny test model

Each agent is a plain `openai` client loop of `--turns` chat calls (`--tokens` sampled per
call, a fixed seed per call so both runs sample the same tokens where batching does not
change the numerics). The same `GatewayRollout` runs with `concurrency=1` (one agent at a
time: every call is a batch of one) and with all agents at once (their calls meet in the hf
engine's dynamic batcher). Prints wall time, generated tokens/s, the engine's mean batch
size and the ratio, plus the load average, as one JSON line.
"""
from __future__ import annotations

import argparse
import json
import os
import time


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model", default="smollm2-135m-instruct", help='hub id, folder, or "tiny"')
    ap.add_argument("--agents", type=int, default=16)
    ap.add_argument("--turns", type=int, default=2)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float16", "float32"],
                    help='weights dtype (default float32; "auto": bfloat16 on CUDA and on CPUs with bf16 instructions)')
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    args = ap.parse_args()

    import openai
    import torch

    from workbench.config import resolve_device
    from workbench.engines.hf import HFEngine
    from workbench.gateway import GatewayRollout
    from workbench.models import build_tiny_model, load_model_and_tokenizer
    from workbench.models.loading import resolve_model_path

    torch.set_num_threads(args.threads)
    path = str(build_tiny_model()) if args.model == "tiny" else resolve_model_path(args.model)
    model, tok = load_model_and_tokenizer(path, dtype=args.dtype, device=resolve_device(args.device))

    def agent(base_url: str, episode_id: str, task: str) -> float:
        client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=600)
        messages = [{"role": "user", "content": task}]
        for _ in range(args.turns):
            reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=args.tokens,
                                                   temperature=1.0)
            messages += [reply.choices[0].message.model_dump(exclude_none=True),
                         {"role": "user", "content": "Say more."}]
        return 0.0

    results = {}
    for mode, concurrency in (("one_by_one", 1), ("all_at_once", None)):
        engine = HFEngine(model, tok)
        rollout = GatewayRollout(engine, agent, ["Tell me about the sea."], group_size=args.agents,
                                 max_turns=args.turns, max_tokens=args.tokens, concurrency=concurrency,
                                 episode_timeout=None, seed=0)
        start = time.perf_counter()
        batch = rollout.run()
        seconds = time.perf_counter() - start
        stats = engine.stats()
        engine.close()
        tokens = sum(ep.response_length for ep in batch)
        results[mode] = {"seconds": round(seconds, 2), "generated_tokens": tokens,
                         "tokens_per_s": round(tokens / seconds, 1),
                         "mean_batch_size": round(stats.get("batcher_mean_batch_size", 0.0), 2),
                         "misaligned": batch.meta["gateway/misaligned_episodes"]}
    one, many = results["one_by_one"], results["all_at_once"]
    results["speedup_wall"] = round(one["seconds"] / many["seconds"], 2)
    results["speedup_tokens_per_s"] = round(many["tokens_per_s"] / one["tokens_per_s"], 2)
    results.update(model=args.model, agents=args.agents, turns=args.turns, tokens=args.tokens,
                   loadavg=[round(x, 2) for x in os.getloadavg()])
    print(json.dumps(results))


if __name__ == "__main__":
    main()
