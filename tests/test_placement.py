"""`workbench.distributed.placement` without a cluster: what the configured groups ask
for (CPU shares that fit a small machine, GPU shares from verl's placement table), the
error that names it, and which environment modules must travel by value."""
from __future__ import annotations

import sys

from envs.guess_number import GuessNumberEnv
from workbench.config import ConfigStore
from workbench.distributed.placement import (
    Demand, _cause, demands, driver_only_modules, fair_cpu_share, placement_error,
)
from workbench.verl_compat import ResourcePoolManager, Role, ray_groups_from_pools


def test_cpu_shares_fit_the_machine():
    assert fair_cpu_share(2, 4) == 0.5 and fair_cpu_share(8, 4) == 1.0 and fair_cpu_share(2, 3) == 0.66
    c = ConfigStore()
    c.ray.num_actors, c.ray.num_learners, c.ray.num_gpus_per_learner = 2, 2, 0.0
    assert [(d.role, d.count, d.cpus, d.gpus) for d in demands(c, 2.0)] == [
        ("rollout worker", 2, 0.5, 0.0), ("learner", 2, 0.5, 0.0)]
    c.ray.num_cpus_per_learner = 1.5  # a set value is kept
    assert demands(c, 2.0)[1].cpus == 1.5


def test_gpu_shares_follow_the_verl_placement_table():
    pools = ResourcePoolManager({"global_pool": [4]}, {Role.ActorRollout: "global_pool"})
    c = ConfigStore()
    for k, v in ray_groups_from_pools({Role.ActorRollout: object}, pools, on_cuda=True).items():
        setattr(c.ray, k, v)
    asked = demands(c, 16.0)
    assert [(d.count, d.gpus) for d in asked] == [(4, 0.5), (4, 0.5)]
    assert asked[0].bundle() == {"CPU": 1.0, "GPU": 0.5}


def test_placement_error_names_the_demand_the_cluster_and_the_settings():
    asked = [Demand("rollout worker", 2, 0.2, 0.0), Demand("learner", 8, 0.2, 1.0)]
    msg = str(placement_error(asked, {"CPU": 2.0}, {"CPU": 2.0}, "too big"))
    assert "8 learners x (0.2 CPU, 1 GPU)" in msg and "= 2 CPU, 8 GPU" in msg and "the cluster has 2 CPU, 0 GPU" in msg
    assert "ray.num_learners, ray.num_gpus_per_learner" in msg and "ray.num_cpus" not in msg


def test_only_modules_the_workers_cannot_import_are_shipped(tmp_path, monkeypatch):
    (tmp_path / "my_notebook_env.py").write_text(
        "from envs.guess_number import GuessNumberEnv\nclass MyEnv(GuessNumberEnv):\n    pass\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    import my_notebook_env

    try:
        assert driver_only_modules([my_notebook_env.MyEnv()]) == ["my_notebook_env"]
        assert driver_only_modules([my_notebook_env.MyEnv]) == ["my_notebook_env"]
        assert driver_only_modules([GuessNumberEnv(), None]) == []
    finally:
        sys.modules.pop("my_notebook_env", None)


def test_the_cause_is_read_out_of_a_ray_error():
    text = ("The actor died because of an error raised in its creation task\nTraceback (most recent call last):\n"
            '  File "x.py", line 1\nModuleNotFoundError: No module named \'my_env\'')
    assert _cause(RuntimeError(text)) == "ModuleNotFoundError: No module named 'my_env'"


def test_an_actor_killed_for_memory_is_named_out_of_memory():
    import ray

    exc = ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.\n"
                                          "Memory on the node was 22.51GB used / 23.54GB limit\n" + "detail\n" * 40)
    assert _cause(exc) == "out of memory: Task was killed due to the node running low on memory."
