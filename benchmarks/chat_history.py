"""What `inference.history` costs: "sampled" vs "rendered" on Qwen3's published template.

    PYTHONPATH=. .venv/bin/python benchmarks/chat_history.py
    PYTHONPATH=. .venv/bin/python benchmarks/chat_history.py --episodes 16 --turns 4 --tokens 24 --thinking false

A tiny random-weight Qwen3 on Qwen3's published tokenizer and chat template
(`~/.cache/workbench/tokenizers/qwen3`, fetched by `make tokenizers`; `build_family_model`)
plays guess_number for `--turns` turns of `--tokens` sampled tokens, once per history
setting, then one GRPO step (logprobs, advantages, update) runs on the batch. "rendered"
keeps one sequence per turn wherever the template's render of the conversation stops
extending the ids before it (Qwen3 re-renders the turn before the last user message), so
its batch holds more tokens for the same sampled ones. Prints, per setting, the batch's
tokens (all, trained, the longest row), the rollout and the update seconds, as JSON lines.
The speed of a tiny model says little about a real one; the token counts carry over.
"""
from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--tokenizer", default=str(Path.home() / ".cache" / "workbench" / "tokenizers" / "qwen3"),
                    help="folder with Qwen3's tokenizer.json and tokenizer_config.json (make tokenizers)")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--turns", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=24, help="sampled tokens per turn")
    ap.add_argument("--thinking", default="none", choices=["none", "true", "false"],
                    help="inference.enable_thinking (none: the template's default, thinking on)")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    args = ap.parse_args()

    import torch

    from workbench import ConfigStore, Trainer
    from workbench.models import build_family_model

    torch.set_num_threads(args.threads)
    path = build_family_model(args.tokenizer, "qwen3")
    for history in ("sampled", "rendered"):
        c = ConfigStore()
        c.model.model_name, c.model.dtype, c.model.device, c.model.lora_rank = str(path), "float32", "cpu", 8
        c.inference.history, c.inference.max_turns, c.inference.max_tokens = history, args.turns, args.tokens
        c.inference.enable_thinking = {"none": None, "true": True, "false": False}[args.thinking]
        c.environment.name = "guess_number"
        c.training.batch_size, c.training.group_size = args.episodes, 4
        c.training.loggers, c.checkpoint.save_interval = [], 0
        trainer = Trainer(c, reward_fn=lambda ep: float(ep.episode_id % 3))  # rewards that differ in a group
        t0 = time.perf_counter()
        batch = trainer.rollout()
        t1 = time.perf_counter()
        trainer.update(trainer.compute_advantages(trainer.score(batch)))
        t2 = time.perf_counter()
        print(json.dumps({
            "history": history, "episodes": len(batch), "turns": args.turns, "tokens_per_turn": args.tokens,
            "enable_thinking": args.thinking, "batch_tokens": sum(e.num_tokens for e in batch),
            "trained_tokens": int(batch.loss_mask.sum()), "longest_row": int(batch.input_ids.shape[1]),
            "sequences": sum(1 + len(e.segments) for e in batch), "rollout_s": round(t1 - t0, 2),
            "update_s": round(t2 - t1, 2), "load": round(os.getloadavg()[0], 2)}))


if __name__ == "__main__":
    main()
