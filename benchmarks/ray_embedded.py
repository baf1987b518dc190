"""Three GRPO steps with ray.use_ray=True on the embedded SmolLM2 (2 rollout workers + 2 FSDP2
learners on CPU, gloo), printing each step's time split and the weight versions episodes were
sampled with.

    python benchmarks/ray_embedded.py                                  # model.device/dtype "auto"
    python benchmarks/ray_embedded.py --device cpu --dtype float32

Measured here (2 cores, 2026-11-23, other jobs running): start 67.7 s (Ray + 5 model copies),
steps 34.6 / 25.0 / 19.7 s (rollout 13.0 / 16.3 / 10.7 s), 149 s in all; versions [0], [1], [2].
"""
import argparse
import os
import tempfile
import time

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import ray  # noqa: E402

from envs import make_env  # noqa: E402
from workbench import ConfigStore  # noqa: E402
from workbench.training import Trainer  # noqa: E402

if __name__ == "__main__":
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="auto", help='"auto" (CUDA when available, else CPU), "cpu", "cuda", ...')
    ap.add_argument("--dtype", default="auto", choices=["auto", "bfloat16", "float16", "float32"],
                    help='"auto": bfloat16 on CUDA and on CPUs with bf16 instructions, else float32')
    args = ap.parse_args()
    t0 = time.time()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    c = ConfigStore()
    c.model.device, c.model.dtype = args.device, args.dtype
    c.ray.use_ray, c.ray.num_actors, c.ray.num_learners = True, 2, 2
    c.inference.async_rollout = True
    c.inference.max_tokens, c.inference.max_turns = 24, 4
    c.training.batch_size, c.training.group_size = 4, 2
    c.checkpoint.output_dir = tempfile.mkdtemp(); c.checkpoint.save_interval = 0
    trainer = Trainer(c, environment=make_env("guess_number"))
    print(f"start: {time.time()-t0:.1f} s")
    for _ in range(3):
        m = trainer.train_step()
        print(f"step {m['step']}: {m['perf/step_seconds']:.1f} s (rollout {m['perf/rollout_seconds']:.1f}, update {m['perf/update_seconds']:.1f}), reward {m['reward/mean']:.2f}, pg_loss {m['actor/pg_loss']:.4f}, grad_norm {m.get('actor/grad_norm', float('nan')):.3f}, versions {sorted({e.weight_version for e in trainer.last_batch})}")
    trainer.cleanup(); ray.shutdown()
    print(f"total {time.time()-t0:.1f} s")
