"""Bring your agent: a plain two-turn `openai`-client agent (add two numbers, then answer with
just the number), trained with GRPO through the gateway (the "Bring your agent" section quotes this run).

    PYTHONPATH=. .venv/bin/python benchmarks/bring_your_agent.py --steps 6

The agent never sees workbench: it gets a base_url and talks the OpenAI API. Each step runs
it `--group-size` times on `--tasks` additions (`GatewayRollout`), scores, computes GRPO
advantages and updates the LoRA policy (`Trainer.score/compute_advantages/update`).
Held-out success (greedy, `--eval` unseen additions) is measured before and after.
Prints one JSON line per step and a summary line; writes the last batch's first episode
rendered with its trained spans in [[...]] to `--out`.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import time

import openai

# ---- the agent: plain openai client code, nothing from workbench ------------------------
def agent(base_url: str, episode_id: str, task: dict) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages = [{"role": "user", "content": f"What is {task['a']} + {task['b']}?"}]
    for follow_up in ("Check it, then reply with just the number.", None):
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=24,
                                               temperature=task["temperature"])
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        if follow_up:
            messages.append({"role": "user", "content": follow_up})
    answer = (reply.choices[0].message.content or "").strip().rstrip(".")
    right = str(task["a"] + task["b"])
    return 1.0 if answer == right else 0.5 if right in answer else 0.0
# -----------------------------------------------------------------------------------------


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=6)
    ap.add_argument("--tasks", type=int, default=4, help="tasks (GRPO groups) per step")
    ap.add_argument("--group-size", type=int, default=4)
    ap.add_argument("--eval", type=int, default=16, help="held-out tasks, greedy")
    ap.add_argument("--lr", type=float, default=5e-4)
    ap.add_argument("--high", type=int, default=20, help="numbers are drawn from 1..high")
    ap.add_argument("--temperature", type=float, default=0.8, help="sampling temperature while training")
    ap.add_argument("--out", default="runs/bring_your_agent")
    ap.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                    help='"auto": bfloat16 on CUDA and on CPUs with bf16 instructions, else float32')
    args = ap.parse_args()

    from workbench import ConfigStore, Trainer
    from workbench.gateway import GatewayRollout

    cfg = ConfigStore()  # the embedded SmolLM2-135M-Instruct, LoRA r=16
    cfg.model.device, cfg.model.dtype = args.device, args.dtype
    cfg.update("training", {"adv_estimator": "grpo", "learning_rate": args.lr, "batch_size": args.tasks * args.group_size,
                            "group_size": args.group_size, "micro_batch_size": args.group_size,
                            "use_kl_loss": False, "use_kl_in_reward": False, "seed": 0})
    cfg.checkpoint.output_dir = os.path.join(args.out, "checkpoints")
    cfg.checkpoint.save_interval = 0
    trainer = Trainer(cfg.validate())
    rng = random.Random(0)
    held_out = [{"a": rng.randint(1, args.high), "b": rng.randint(1, args.high), "temperature": 0.0}
                for _ in range(args.eval)]

    def evaluate() -> float:
        batch = GatewayRollout(trainer.engine, agent, held_out, max_turns=2, seed=0).run()
        return sum(ep.outcome for ep in batch) / len(batch)

    start = time.perf_counter()
    before = evaluate()
    print(json.dumps({"held_out_success_before": before, "seconds": round(time.perf_counter() - start, 1)}), flush=True)
    for step in range(args.steps):
        t0 = time.perf_counter()
        tasks = [{"a": rng.randint(1, args.high), "b": rng.randint(1, args.high), "temperature": args.temperature}
                 for _ in range(args.tasks)]
        batch = GatewayRollout(trainer.engine, agent, tasks, group_size=args.group_size, max_turns=2,
                               seed=1000 + step).run()
        trainer.score(batch)
        trainer.compute_advantages(batch)
        metrics = trainer.update(batch)
        print(json.dumps({"step": step, "reward_mean": round(batch.summary()["reward/mean"], 3),
                          "misaligned": batch.meta["gateway/misaligned_episodes"],
                          "rollout_s": round(batch.meta["rollout_seconds"], 1),
                          "step_s": round(time.perf_counter() - t0, 1),
                          "pg_loss": round(metrics.get("actor/pg_loss", float("nan")), 4)}), flush=True)
    after = evaluate()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "episode.txt"), "w") as f:
        f.write(batch[0].render(trainer.tokenizer))
    print(json.dumps({"held_out_success_before": before, "held_out_success_after": after, "steps": args.steps,
                      "minutes": round((time.perf_counter() - start) / 60, 1),
                      "loadavg": [round(x, 2) for x in os.getloadavg()]}), flush=True)


if __name__ == "__main__":
    main()
