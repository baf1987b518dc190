"""Ray started the way a user starts it: by the workbench itself (`ray.address=None`), with
this machine's real CPU count (2 here), in a fresh Python process (the session's
`ray_cluster` fixture must not be the one used).

One subprocess (a Ray cluster start costs ~20 s on 2 cores) checks, in order:
  * 8 learners asking for a GPU each on a CPU machine: `PlacementError` naming what was
    asked and what the machine has, well within 30 s (before Ray is started);
  * the README's snippet (2 rollout workers, 2 learners) with the tiny model and an
    environment class from a module found only through `sys.path.insert`: one GRPO step
    on a cluster of this machine's CPUs;
  * while it holds every CPU, a second trainer joining the cluster (`ray.address`) waits
    `ray.placement_timeout_s` (2 s) and fails naming what is free;
  * an environment that cannot be rebuilt on a worker: `ActorStartError` naming the
    rollout worker and the cause, not a hang and not Ray's traceback.
"""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

pytestmark = pytest.mark.ray
pytest.importorskip("ray")

ENV_MODULE = '''
from envs.guess_number import GuessNumberEnv


class DriverOnlyGuess(GuessNumberEnv):
    """guess_number from a module only the driver can import (its folder is on the
    driver's sys.path, not on the workers')."""
'''

SCRIPT = '''
import json, os, pathlib, sys, time
sys.path.insert(0, {env_dir!r})
out = {{}}
from tests.test_trainer import tiny_config
from workbench import Trainer
from workbench.distributed.placement import ActorStartError, PlacementError
import driver_only_env

tmp = pathlib.Path({tmp!r})
model = {model!r}

class Unbuildable(driver_only_env.DriverOnlyGuess):
    driver_pid = os.getpid()  # pickled with the class (by value: it is defined in __main__)

    def __setstate__(self, state):
        if os.getpid() != self.driver_pid:  # only on the workers
            raise RuntimeError("the game data file is missing on this node")
        self.__dict__.update(state)

def cfg(name):
    c = tiny_config(model, tmp / name)
    c.ray.use_ray, c.ray.num_actors, c.ray.num_learners, c.ray.address = True, 2, 2, None
    return c

c = cfg("unfit")
c.ray.num_learners, c.ray.num_gpus_per_learner = 8, 1.0
t = time.monotonic()
try:
    Trainer(c, environment=driver_only_env.DriverOnlyGuess())
except PlacementError as exc:
    out["unfit"] = [str(exc), time.monotonic() - t]

t = time.monotonic()
trainer = Trainer(cfg("snippet"), environment=driver_only_env.DriverOnlyGuess())
out["build_s"] = time.monotonic() - t
t = time.monotonic()
metrics = trainer.train_step()
out["step_s"] = time.monotonic() - t
out["step"] = [trainer.global_step, len(trainer.last_batch), metrics["reward/mean"]]
out["errors"] = [e.error for e in trainer.last_batch if getattr(e, "error", None)]
import ray
out["cpus"] = ray.cluster_resources().get("CPU")

# The snippet's trainer holds every CPU: on a joined cluster (which might grow) a second
# one waits ray.placement_timeout_s, then fails naming what is free.
c = cfg("second")
c.ray.address, c.ray.placement_timeout_s, c.ray.num_cpus_per_actor = "auto", 2.0, 1.0
t = time.monotonic()
try:
    Trainer(c, environment=driver_only_env.DriverOnlyGuess())
except PlacementError as exc:
    out["wait"] = [str(exc), time.monotonic() - t]
trainer.cleanup()

t = time.monotonic()
try:
    Trainer(cfg("broken"), environment=Unbuildable())
except ActorStartError as exc:
    out["broken"] = [str(exc), time.monotonic() - t, repr(exc.__cause__)[:80]]
print("RESULT " + json.dumps(out))
'''


def test_ray_as_a_user_starts_it(tiny_model_path, tmp_path):
    env_dir = tmp_path / "notebook_folder"
    env_dir.mkdir()
    (env_dir / "driver_only_env.py").write_text(ENV_MODULE)
    script = tmp_path / "run.py"
    script.write_text(SCRIPT.format(env_dir=str(env_dir), tmp=str(tmp_path), model=str(tiny_model_path)))
    root = Path(__file__).resolve().parents[2]
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["PYTHONPATH"] = str(root)  # the workbench and envs/, as an installed package would be
    proc = subprocess.run([sys.executable, str(script)], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=420)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, proc.stdout[-3000:] + proc.stderr[-5000:]
    out = json.loads(lines[-1][len("RESULT "):])
    print(textwrap.shorten(json.dumps(out), 2000))

    message, seconds = out["unfit"]
    assert seconds < 30
    assert "8 learners x (" in message and "8 GPU" in message and f"this machine has {os.cpu_count()} CPU" in message
    assert "ray.num_gpus_per_learner" in message and "ray.num_learners" in message

    assert out["step"][:2] == [1, 4] and not out["errors"] and out["cpus"] == os.cpu_count()

    message, seconds = out["wait"]
    assert "within ray.placement_timeout_s=2 s" in message and "(0 CPU, 0 GPU free)" in message and seconds < 15

    message, seconds, cause = out["broken"]
    assert message.startswith("rollout worker 0 died while starting") or "rollout worker" in message
    assert "the game data file is missing on this node" in message
    assert "Traceback" not in message and seconds < 120
