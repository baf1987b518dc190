"""The same work with 1 vs 2 Ray rollout workers and 1 vs 2 FSDP2 learners, in one run.

    python benchmarks/scaling.py                       # embedded SmolLM2, CPU, gloo
    python benchmarks/scaling.py --model /path/to/tiny --episodes 8

Rollout: `--episodes` guess_number episodes (groups of 2, up to 3 turns, greedy so both
sides do identical work) through `RolloutWorkerGroup` with 1, then 2 workers of one torch
thread each. Update: one GRPO update of the batch those episodes make through
`LearnerGroup` with 1, then 2 learners (one thread each). Each is timed `--repeats`
times after a warm-up; the median is reported with throughput and parallel efficiency
(speed-up / workers). On a 2-core machine the ideal is 2x; anything else the machine is
doing takes from it.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import ray  # noqa: E402
import torch  # noqa: E402

from envs import make_env  # noqa: E402
from workbench import ConfigStore, Trainer  # noqa: E402
from workbench.distributed import LearnerGroup, RolloutWorkerGroup  # noqa: E402


def median_seconds(fn, repeats: int) -> float:
    fn()  # warm-up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="smollm2-135m-instruct")
    ap.add_argument("--episodes", type=int, default=16)
    ap.add_argument("--max-tokens", type=int, default=24)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--device", default="cpu", help='default "cpu" (the 1-thread workers this measures); "auto", "cuda", ...')
    ap.add_argument("--dtype", default="float32", choices=["auto", "bfloat16", "float16", "float32"],
                    help='weights dtype (default float32; "auto": bfloat16 on CUDA and on CPUs with bf16 instructions)')
    ap.add_argument("--out", default=str(Path(__file__).parent / "results" / "scaling.json"))
    args = ap.parse_args()

    torch.set_num_threads(1)
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    config = ConfigStore()
    config.model.model_name = args.model
    config.model.device, config.model.dtype = args.device, args.dtype
    config.inference.max_tokens, config.inference.max_turns = args.max_tokens, 3
    config.inference.temperature = 0.0
    config.training.batch_size, config.training.group_size = args.episodes, 2
    config.training.micro_batch_size = 2
    config.checkpoint.save_interval = 0
    config.validate()
    env = make_env("guess_number")
    seeds = list(range(args.episodes // 2))
    results: dict[str, float] = {}

    # A real batch to update on: the single-process trainer's rollout, scored, with advantages.
    trainer = Trainer(config, environment=env, reward_fn=lambda trajectory: float(sum(trajectory.token_ids) % 7))
    batch = trainer.compute_advantages(trainer.score(trainer.rollout()), old_logprobs=False)
    tokens = int(batch.loss_mask.sum())

    for n in (1, 2):
        group = RolloutWorkerGroup(config, n, env, torch_threads=1)
        generated = []

        def run_rollout():
            out = group.run(seeds, 2)
            generated.append(sum(e.response_length for e in out))

        results[f"rollout_{n}_s"] = median_seconds(run_rollout, args.repeats)
        results[f"rollout_{n}_tok_per_s"] = generated[-1] / results[f"rollout_{n}_s"]
        group.shutdown()

    for n in (1, 2):
        learners = LearnerGroup(config, n, num_threads=1)
        state = {"policy": trainer.policy.trainable_state_dict()}

        def run_update():
            learners.load_state_dict(state)  # the same starting weights every time
            for name in ("old_logprobs", "kl", "new_logprobs", "ratio", "entropy"):
                batch.tensors.pop(name, None)
            learners.update(batch, 0)

        results[f"update_{n}_s"] = median_seconds(run_update, args.repeats)
        results[f"update_{n}_trained_tok_per_s"] = tokens / results[f"update_{n}_s"]
        learners.shutdown()
    trainer.cleanup()
    ray.shutdown()

    for stage in ("rollout", "update"):
        speedup = results[f"{stage}_1_s"] / results[f"{stage}_2_s"]
        results[f"{stage}_speedup"] = speedup
        results[f"{stage}_efficiency"] = speedup / 2
        print(f"{stage}: 1 worker {results[f'{stage}_1_s']:.1f} s, 2 workers {results[f'{stage}_2_s']:.1f} s "
              f"(median of {args.repeats}): {speedup:.2f}x, efficiency {speedup / 2:.0%}")
    results.update({"model": args.model, "episodes": args.episodes, "trained_tokens": tokens,
                    "cores": os.cpu_count(), "load_1min": os.getloadavg()[0]})
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
