"""verl's Role / ResourcePoolManager placement mapped onto `config.ray` (the table in
`workbench.compat.verl_compat`), and through verl's `RayPPOTrainer(...)` form."""
from __future__ import annotations

import pytest

from workbench.compat.verl_compat import ResourcePoolManager, Role, ray_groups_from_pools


def test_colocated_actor_rollout_shares_each_gpu():
    pools = ResourcePoolManager({"global_pool": [8, 8]}, {Role.ActorRollout: "global_pool",
                                                          Role.Critic: "global_pool"})
    assert ray_groups_from_pools({Role.ActorRollout: object}, pools, on_cuda=True) == {
        "num_learners": 16, "num_actors": 16, "num_gpus_per_learner": 0.5, "num_gpus_per_actor": 0.5}
    # on a CPU the counts apply and nothing reserves a GPU
    assert ray_groups_from_pools({}, pools, on_cuda=False) == {"num_learners": 16, "num_actors": 16}


def test_separate_actor_and_rollout_pools():
    pools = ResourcePoolManager({"train": [4], "gen": [2, 2]},
                                {Role.Actor: "train", Role.Rollout: "gen", Role.RefPolicy: "gen"})
    assert ray_groups_from_pools({}, pools, on_cuda=True) == {
        "num_learners": 4, "num_gpus_per_learner": 1.0, "num_actors": 4, "num_gpus_per_actor": 1.0}
    assert ray_groups_from_pools({Role.Actor: object}, None, on_cuda=True) == {}


@pytest.mark.parametrize("mapping,message", [
    ({Role.Actor: "a", Role.CriticValue: "b"}, "map Role.Critic to the actor's pool"),
    ({Role.ActorRollout: "empty"}, "no GPUs"),
])
def test_placements_this_design_cannot_run_say_why(mapping, message):
    pools = ResourcePoolManager({"a": [2], "b": [2], "empty": [0]}, mapping)
    with pytest.raises(ValueError, match=message):
        ray_groups_from_pools({}, pools, on_cuda=False)


def test_verl_form_sets_the_groups_on_the_trainer_config(tiny_model_path, tmp_path):
    from tests.test_trainer import tiny_config
    from workbench.compat.verl_compat import RayPPOTrainer

    config = tiny_config(tiny_model_path, tmp_path)
    pools = ResourcePoolManager({"global_pool": [3]}, {Role.ActorRollout: "global_pool"})
    trainer = RayPPOTrainer(config, role_worker_mapping={Role.ActorRollout: object}, resource_pool_manager=pools)
    try:
        assert (trainer.config.ray.num_learners, trainer.config.ray.num_actors) == (3, 3)
        assert trainer.config.ray.use_ray is False and trainer.ray_stages is None  # counts only until use_ray
    finally:
        trainer.cleanup()
