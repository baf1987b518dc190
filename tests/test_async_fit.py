"""Asynchronous training (training.max_staleness): equality at 0, one-step staleness at 1,
the truncated IS correction, and a run interrupted with a batch in flight."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

import pytest
import torch

from envs import make_env
from workbench import ConfigError, ConfigStore, Trainer, algo
from workbench.doctor.checks import run_checks
from workbench.doctor.findings import History
from workbench.doctor.thresholds import DoctorConfig
from workbench.training.policy import batch_logprobs


def config(tiny_model_path: Path, out: Path, **training) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.model.dtype = "float32"
    c.inference.max_tokens = 8
    c.inference.max_turns = 2
    c.inference.seed = 0
    c.training.batch_size = 4
    c.training.group_size = 2
    c.training.micro_batch_size = 2
    c.training.learning_rate = 1e-2
    c.training.progress = False
    c.checkpoint.output_dir = str(out)
    c.checkpoint.save_interval = 0
    c.checkpoint.resume = False
    for k, v in training.items():
        setattr(c.training, k, v)
    return c.validate()


def make_trainer(cfg: ConfigStore) -> Trainer:
    torch.manual_seed(0)  # the same LoRA initialisation for every trainer of a test
    return Trainer(cfg, environment=make_env("guess_number"))


def test_rollout_is_weights_by_hand():
    old = torch.tensor([[-1.0, -0.5, -2.0, -0.3, 0.0]])  # (1, 5)
    rollout = torch.tensor([[-1.5, -0.5, -0.2, 0.0, 0.0]])  # 0 = no engine logprob
    mask = torch.tensor([[1.0, 1.0, 1.0, 1.0, 0.0]])
    w, m = algo.rollout_is_weights(old, rollout, mask, "token", threshold=1.5)
    # exp(0.5) = 1.6487 -> capped at 1.5; exp(0) = 1; exp(-1.8) = 0.16530; no engine logprob -> 1; off mask -> 0
    assert w.tolist()[0] == pytest.approx([1.5, 1.0, math.exp(-1.8), 1.0, 0.0], abs=1e-6)
    assert m["rollout_corr/clipped_fraction"] == pytest.approx(1 / 3)
    assert m["rollout_corr/tokens"] == 3
    assert m["rollout_corr/log_ratio_abs_mean"] == pytest.approx((0.5 + 0.0 + 1.8) / 3)
    w, m = algo.rollout_is_weights(old, rollout, mask, "sequence", threshold=1.5)
    # one weight per sequence: exp(0.5 + 0 - 1.8) = exp(-1.3) on the tokens with an engine logprob
    assert w.tolist()[0] == pytest.approx([math.exp(-1.3)] * 3 + [1.0, 0.0], abs=1e-6)
    assert m["rollout_corr/clipped_fraction"] == 0.0


def test_config_checks(tiny_model_path, tmp_path):
    with pytest.raises(ConfigError, match="max_staleness"):
        config(tiny_model_path, tmp_path, max_staleness=-1)
    with pytest.raises(ConfigError, match="max_staleness"):
        config(tiny_model_path, tmp_path, max_staleness=1.5)
    with pytest.raises(ConfigError, match="rollout_is"):
        config(tiny_model_path, tmp_path, rollout_is="tokens")
    with pytest.raises(ConfigError, match="rollout_is_threshold"):
        config(tiny_model_path, tmp_path, rollout_is_threshold=0.5)


def test_staleness_0_is_the_stepwise_loop(tiny_model_path, tmp_path):
    """fit with max_staleness=0 equals rollout/score/compute_advantages/update cells, bit for bit."""
    cfg = dict(max_staleness=0, reuse_update_logprobs=False)
    fitted = make_trainer(config(tiny_model_path, tmp_path / "a", **cfg))
    history = fitted.fit(steps=3)
    cells = make_trainer(config(tiny_model_path, tmp_path / "b", **cfg))
    rows = []
    for _ in range(3):
        batch = cells.rollout()
        cells.score(batch)
        cells.compute_advantages(batch)
        rows.append(cells.update(batch))
        cells.global_step += 1
    a, b = fitted.policy.trainable_state_dict(), cells.policy.trainable_state_dict()
    assert all(torch.equal(a[k], b[k]) for k in a)
    for got, want in zip(history, rows):
        for key in ("actor/pg_loss", "actor/grad_norm", "actor/entropy"):
            assert got[key] == want[key]
        assert not any(k.startswith(("async/", "rollout_corr/")) for k in got)
    assert [ep.weight_version for ep in fitted.last_batch] == [2] * 4  # the synchronous loop: version = step
    assert not fitted.last_batch.has("rollout_is_weights")


def test_staleness_1_trains_on_the_previous_weights_samples(tiny_model_path, tmp_path):
    trainer = make_trainer(config(tiny_model_path, tmp_path, max_staleness=1))
    versions = {0: trainer.policy.trainable_state_dict()}  # weights after k steps, by k
    batches = {}

    def keep(tr, metrics):
        batches[metrics["step"]] = tr.last_batch
        versions[tr.global_step] = tr.policy.trainable_state_dict()
        assert tr.ahead.in_flight == (tr.global_step if tr.global_step < 4 else None)

    history = trainer.fit(steps=4, callbacks=[keep])
    assert trainer.ahead is None and trainer.engine.model is trainer.policy.model  # as before fit
    assert [m["async/staleness_max"] for m in history] == [0.0, 1.0, 1.0, 1.0]
    for step in (1, 2, 3):
        batch = batches[step]
        assert {ep.weight_version for ep in batch} == {step - 1}
        mask = batch.loss_mask.bool() & (batch.rollout_logprobs != 0)  # (B, T)

        sampler = _logprobs_with(trainer, versions[step - 1], batch)
        trained = _logprobs_with(trainer, versions[step], batch)
        # The engine's recorded logprobs are those of the weights of step n-1, not of step n.
        assert (sampler - batch.rollout_logprobs)[mask].abs().max() < 1e-4
        assert (trained - batch.rollout_logprobs)[mask].abs().max() > 1e-3
        # The correction: w = min(pi_old / pi_rollout, 2) with pi_old the weights of step n.
        want = torch.exp(trained - batch.rollout_logprobs).clamp(max=2.0)
        assert torch.allclose(batch.rollout_is_weights[mask], want[mask], atol=1e-4)
        assert 0.0 <= history[step]["rollout_corr/clipped_fraction"] <= 1.0
    trainer.policy.load_trainable_state_dict(versions[4])
    # The doctor: the stale steps' gap is staleness, not a missed sync; the clipped share has its own check.
    h = History(metrics=history)
    h.add(batches[3], 3)
    assert not run_checks(h, DoctorConfig(), ["engine-trainer-gap"])[0].fired
    worst = max(m["rollout_corr/clipped_fraction"] for m in history[1:])
    assert worst > 0  # lr 1e-2 on the tiny model moves some tokens' ratio past 2
    f = run_checks(h, DoctorConfig(off_policy_clipped_share=worst), ["off-policy-clipped"])[0]
    assert f.fired and f.value == worst and f.evidence and "weight version 2" in f.evidence[0].text
    assert not run_checks(h, DoctorConfig(off_policy_clipped_share=min(1.0, worst + 0.01)),
                          ["off-policy-clipped"])[0].fired
    # The views: each episode's weight version; the weights are a token field to colour by.
    from workbench.widgets.conversation import render_episode_html
    from workbench.widgets.tokens import available_fields, render_tokens_html

    assert "rollout_is_weights" in available_fields(batches[3])
    assert "sampled by weights v2" in render_tokens_html(batches[3], 0, "rollout_is_weights", trainer.tokenizer)
    assert "weights v2" in render_episode_html(batches[3][0])


@pytest.mark.parametrize("k", [1, 2])
def test_interrupt_with_a_batch_in_flight_resumes_without_gap(tiny_model_path, tmp_path, k):
    """Ctrl-C in a callback with the next k steps' batches queued or being sampled: fit drops
    them all, and a resumed run continues without a gap or a duplicate."""
    cfg = config(tiny_model_path, tmp_path, max_staleness=k)
    cfg.checkpoint.save_interval = 1
    trainer = make_trainer(cfg)
    seen = []

    def interrupt(tr, metrics):
        seen.append(tr.ahead.in_flight)
        if metrics["step"] == 1:
            raise KeyboardInterrupt  # Ctrl-C while step 2's batch is being sampled

    with pytest.raises(KeyboardInterrupt):
        trainer.fit(steps=4, callbacks=[interrupt])
    assert seen == [1, 2]
    assert trainer.global_step == 2 and trainer.ahead is None
    assert trainer.engine.model is trainer.policy.model
    batch = trainer.rollout()  # stepwise cells still work, on the current weights
    assert {ep.weight_version for ep in batch} == {2}

    cfg2 = config(tiny_model_path, tmp_path, max_staleness=k)
    cfg2.checkpoint.save_interval, cfg2.checkpoint.resume = 1, True
    resumed = make_trainer(cfg2)
    history = resumed.fit(until_step=4)
    assert [m["step"] for m in history] == [0, 1, 2, 3]
    lines = [json.loads(x) for x in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [0, 1, 2, 3]
    saved = sorted(p.name for p in (tmp_path / "rollouts").iterdir())
    assert saved == [f"step_{i:06d}.jsonl.gz" for i in range(4)]
    assert history[2]["async/staleness_max"] == 0.0  # the step in flight was sampled anew after the resume
    assert history[3]["async/staleness_max"] == 1.0


def _wait_for_the_batch_two_steps_ahead(holder: dict, last_step: int):
    """An advantage estimator (GRPO's) that first waits, at step n <= last_step - 2 whose
    batch of step n+2 is queued, until the rollout thread has started sampling it. The estimator runs in the main
    thread after the next batches are queued and before the update publishes the weights of
    step n+1, so that batch is sampled with the weights of step n: staleness 2 at step n+2,
    by ordering, not by timing."""
    grpo = algo.get_advantage_estimator("grpo")

    def estimator(**kwargs):
        tr = holder["trainer"]
        n = tr.global_step
        if n + 2 <= last_step and any(j["step"] == n + 2 for j in tr.ahead.jobs):
            deadline = time.monotonic() + 120
            while not any(j["step"] == n + 2 and j["state"] != "queued" for j in tr.ahead.jobs):
                assert time.monotonic() < deadline, f"step {n + 2}'s batch never started: {tr.ahead.jobs}"
                time.sleep(0.01)
            holder.setdefault("waited", []).append(n)
        return grpo(**kwargs)

    return estimator


@pytest.fixture
def wait_two_ahead():
    """The estimator "test_wait_two_ahead" (see `_wait_for_the_batch_two_steps_ahead`), removed afterwards."""
    holder: dict = {}
    algo.register_advantage_estimator("test_wait_two_ahead")(_wait_for_the_batch_two_steps_ahead(holder, 4))
    yield holder
    algo.advantages._ADVANTAGE_ESTIMATORS.pop("test_wait_two_ahead", None)


def test_staleness_2_trains_on_weights_up_to_two_updates_old(tiny_model_path, tmp_path, wait_two_ahead):
    trainer = make_trainer(config(tiny_model_path, tmp_path, max_staleness=2, adv_estimator="test_wait_two_ahead"))
    wait_two_ahead["trainer"] = trainer
    versions = {0: trainer.policy.trainable_state_dict()}  # weights after k steps, by k
    batches, queues = {}, {}

    def keep(tr, metrics):
        batches[metrics["step"]] = tr.last_batch
        versions[tr.global_step] = tr.policy.trainable_state_dict()
        queues[metrics["step"]] = [j["step"] for j in tr.ahead.jobs]

    history = trainer.fit(steps=5, callbacks=[keep])
    assert wait_two_ahead["waited"] == [0, 1, 2]
    assert queues == {0: [1, 2], 1: [2, 3], 2: [3, 4], 3: [4], 4: []}  # the next k steps, within the fit
    assert [m["async/staleness_max"] for m in history] == [0.0, 1.0, 2.0, 2.0, 2.0]
    # Step 1's batch started with the weights of step 0 (published before its update); from
    # step 2 on, each batch started while the update two steps before it ran.
    assert [{ep.weight_version for ep in batches[s]} for s in range(5)] == [{0}, {0}, {0}, {1}, {2}]
    for step in (1, 2, 3, 4):
        batch = batches[step]
        sampled_with = step - int(history[step]["async/staleness_max"])
        mask = batch.loss_mask.bool() & (batch.rollout_logprobs != 0)  # (B, T)

        sampler = _logprobs_with(trainer, versions[sampled_with], batch)
        trained = _logprobs_with(trainer, versions[step], batch)
        # The engine's recorded logprobs are those of the weights that sampled the batch.
        assert (sampler - batch.rollout_logprobs)[mask].abs().max() < 1e-4
        if sampled_with != step:
            assert (trained - batch.rollout_logprobs)[mask].abs().max() > 1e-3
        # The correction: w = min(pi_old / pi_rollout, 2), pi_old the weights of step n.
        want = torch.exp(trained - batch.rollout_logprobs).clamp(max=2.0)
        assert torch.allclose(batch.rollout_is_weights[mask], want[mask], atol=1e-4)
    trainer.policy.load_trainable_state_dict(versions[5])
    # After fit: nothing queued, the engine samples from the trainer's module, cells work.
    assert trainer.ahead is None and trainer.engine.model is trainer.policy.model
    batch = trainer.rollout()
    assert {ep.weight_version for ep in batch} == {5}
    trainer.score(batch)
    trainer.compute_advantages(batch)
    assert math.isfinite(trainer.update(batch)["actor/pg_loss"])


def test_a_batch_past_the_bound_is_refused(tiny_model_path, tmp_path, wait_two_ahead):
    """The bound is checked when a batch is taken: a run whose bound is lowered to 1 after
    step 2's batch started with the weights of step 0 stops at step 2 with an error."""
    trainer = make_trainer(config(tiny_model_path, tmp_path, max_staleness=2, adv_estimator="test_wait_two_ahead"))
    wait_two_ahead["trainer"] = trainer

    def lower(tr, metrics):
        tr.ahead.max_staleness = 1

    with pytest.raises(RuntimeError, match="2 updates old, past training.max_staleness=1"):
        trainer.fit(steps=3, callbacks=[lower])
    assert trainer.global_step == 2 and trainer.ahead is None


def test_a_failing_rollout_ahead_is_raised_at_its_step(tiny_model_path, tmp_path):
    """The rollout thread meets an item whose environment cannot be built (low > high):
    fit raises that error, naming the step sampled ahead; the trainer stays consistent."""
    trainer = make_trainer(config(tiny_model_path, tmp_path, max_staleness=1))
    from workbench.data import EpisodeDataset

    trainer.dataset = EpisodeDataset([0, 1, {"seed": 2, "params": {"low": 9, "high": 1}}, 3])
    with pytest.raises(ValueError, match="low") as info:
        trainer.fit(steps=3)
    assert any("rollout of step 1, sampled ahead" in n for n in getattr(info.value, "__notes__", []))
    assert trainer.global_step == 1 and trainer.ahead is None
    assert trainer.engine.model is trainer.policy.model


def test_dynamic_sampling_extra_rounds_sample_with_the_current_weights(tiny_model_path, tmp_path):
    """With dynamic sampling, a step's extra rounds run after its batch sampled ahead was taken
    (the engine then holds the step's own weights): their episodes carry version n, the
    batch sampled ahead version n-1, and the batch size is kept."""
    from tests.test_dynamic_sampling import SeedParity

    cfg = config(tiny_model_path, tmp_path, max_staleness=1, dynamic_sampling=True, dynamic_sampling_max_batches=3)
    cfg.inference.max_turns = 1
    torch.manual_seed(0)
    trainer = Trainer(cfg, environment=SeedParity())
    batches = {}
    history = trainer.fit(steps=3, callbacks=[lambda tr, m: batches.__setitem__(m["step"], tr.last_batch)])
    for step in (1, 2):
        batch = batches[step]
        assert len(batch) == 4
        versions = [ep.weight_version for ep in batch]
        assert set(versions) <= {step - 1, step}
        assert step - 1 in versions and step in versions  # seed parity: half the groups are flat, resampled
        assert history[step]["async/staleness_max"] == 1.0


def test_dynamic_sampling_with_staleness_2_waits_for_the_engine(tiny_model_path, tmp_path):
    """k=2 with dynamic sampling: a step's extra rounds run in the main thread while the
    next batches are queued; they wait for the batch being sampled, pause the queue and
    sample with the step's own weights. Every episode's recorded logprobs are those of the
    weight version it carries (no round sampled while the thread changed the engine's
    weights), the extra rounds' version is the step, the others' at most 2 older."""
    from tests.test_dynamic_sampling import SeedParity

    cfg = config(tiny_model_path, tmp_path, max_staleness=2, dynamic_sampling=True, dynamic_sampling_max_batches=3)
    cfg.inference.max_turns = 1
    torch.manual_seed(0)
    trainer = Trainer(cfg, environment=SeedParity())
    versions = {0: trainer.policy.trainable_state_dict()}
    batches = {}

    def keep(tr, metrics):
        batches[metrics["step"]] = tr.last_batch
        versions[tr.global_step] = tr.policy.trainable_state_dict()

    history = trainer.fit(steps=4, callbacks=[keep])
    model = trainer.policy.model
    for step in (1, 2, 3):
        batch = batches[step]
        assert len(batch) == 4
        got = [ep.weight_version for ep in batch]
        assert step in got and any(v < step for v in got)  # seed parity: half the groups are flat, resampled
        assert all(step - 2 <= v <= step for v in got)
        assert history[step]["async/staleness_max"] == float(step - min(got))
        mask = batch.loss_mask.bool() & (batch.rollout_logprobs != 0)  # (B, T)
        lengths = [ep.num_tokens for ep in batch]
        for version in set(got):
            trainer.policy.load_trainable_state_dict(versions[version])
            lp = batch_logprobs(model, batch.input_ids, batch.attention_mask, lengths, 2, False,
                                batch.loss_mask, batch.group_ids)
            rows = torch.tensor([v == version for v in got])  # (B,)
            assert (lp - batch.rollout_logprobs)[mask & rows[:, None]].abs().max() < 1e-4
    trainer.policy.load_trainable_state_dict(versions[4])


def test_evaluate_in_a_callback_with_staleness_2_samples_with_the_current_weights(tiny_model_path, tmp_path):
    """evaluate inside fit (k=2, the next batches queued or being sampled): it waits for the
    running batch, pauses the queue and samples with the trainer's current weights (the
    eval episodes' recorded logprobs are the current weights'); the queue then goes on."""
    trainer = make_trainer(config(tiny_model_path, tmp_path, max_staleness=2))
    checked = []

    def evaluate(tr, metrics):
        tr.evaluate([0, 1])
        batch = tr.last_eval_batch
        mask = batch.loss_mask.bool() & (batch.rollout_logprobs != 0)  # (B, T)
        lp = batch_logprobs(tr.policy.model, batch.input_ids, batch.attention_mask, [ep.num_tokens for ep in batch],
                            2, False, batch.loss_mask, batch.group_ids)
        assert (lp - batch.rollout_logprobs)[mask].abs().max() < 1e-4
        assert not tr.ahead.running  # paused: nothing samples until the next step takes its batch
        checked.append(metrics["step"])

    history = trainer.fit(steps=4, callbacks=[evaluate])
    assert checked == [0, 1, 2, 3]
    assert [m["async/staleness_max"] <= 2 for m in history] == [True] * 4
    assert history[0]["async/staleness_max"] == 0.0 and history[3]["async/staleness_max"] >= 1.0


def test_the_cli_flag_reaches_the_run(tiny_model_path, tmp_path):
    import yaml

    from workbench.cli import main

    out = tmp_path / "out"
    assert main(["train", "--model", str(tiny_model_path), "--steps", "2", "--batch-size", "4", "--group-size", "2",
                 "--max-tokens", "4", "--max-turns", "1", "--eval-episodes", "0", "--save-interval", "0",
                 "--output", str(out), "--training.max_staleness", "1"]) == 0
    assert yaml.safe_load((out / "config.yaml").read_text())["training"]["max_staleness"] == 1
    rows = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["async/staleness_max"] for r in rows] == [0.0, 1.0]


def test_sft_warm_up_steps_come_first_and_nothing_is_sampled_ahead_for_them(tiny_model_path, tmp_path):
    cfg = config(tiny_model_path, tmp_path, max_staleness=1)
    cfg.sft.steps, cfg.sft.episodes = 1, 2
    trainer = make_trainer(cfg)
    flights = []
    history = trainer.fit(steps=3, callbacks=[lambda tr, m: flights.append(tr.ahead.in_flight)])
    assert "sft/nll" in history[0] and "async/staleness_max" not in history[0]
    assert flights == [None, 2, None]  # the first RL step samples its own batch and starts step 2's
    assert [history[1]["async/staleness_max"], history[2]["async/staleness_max"]] == [0.0, 1.0]
    assert {ep.weight_version for ep in trainer.last_batch} == {1}


def _weights_and_batches(tr0: Trainer) -> tuple[dict, dict, object]:
    """{version: trainable weights} (from version 0), {step: batch} and the fit callback
    that fills both."""
    versions, batches = {0: tr0.policy.trainable_state_dict()}, {}

    def keep(tr, metrics):
        batches[metrics["step"]] = tr.last_batch
        versions[tr.global_step] = tr.policy.trainable_state_dict()

    return versions, batches, keep


def _logprobs_with(trainer: Trainer, state: dict, batch) -> torch.Tensor:
    """(B, T) logprobs of `batch`'s tokens under the trainable weights `state`."""
    trainer.policy.load_trainable_state_dict(state)
    return batch_logprobs(trainer.policy.model, batch.input_ids, batch.attention_mask,
                          [ep.num_tokens for ep in batch], 2, False, batch.loss_mask, batch.group_ids)


@pytest.mark.ray
def test_ray_rollout_workers_sample_ahead(ray_cluster, tiny_model_path, tmp_path):
    """1 rollout worker + 1 learner: the worker samples step n+1 while the learner updates
    step n; the episodes trained at step n carry version n-1, and the workers' logprobs are
    those of the weights of step n-1."""
    pytest.importorskip("ray")
    cfg = config(tiny_model_path, tmp_path, max_staleness=1)
    cfg.ray.use_ray, cfg.ray.num_actors, cfg.ray.num_learners = True, 1, 1
    trainer = make_trainer(cfg.validate())
    try:
        versions, batches, keep = _weights_and_batches(trainer)
        history = trainer.fit(steps=3, callbacks=[keep])
        assert [m["async/staleness_max"] for m in history] == [0.0, 1.0, 1.0]
        for step in (1, 2):
            batch = batches[step]
            assert {ep.weight_version for ep in batch} == {step - 1}
            assert batch.meta["weight_versions"] == [step - 1] * len(batch)
            mask = batch.loss_mask.bool() & (batch.rollout_logprobs != 0)
            sampler = _logprobs_with(trainer, versions[step - 1], batch)
            assert (sampler - batch.rollout_logprobs)[mask].abs().max() < 1e-4
            # The correction ran on the learner against the workers' logprobs (w = min(pi_old / pi_rollout, 2)).
            trained = _logprobs_with(trainer, versions[step], batch)
            want = torch.exp(trained - batch.rollout_logprobs).clamp(max=2.0)
            assert torch.allclose(batch.rollout_is_weights[mask], want[mask], atol=1e-4)
            assert 0.0 <= history[step]["rollout_corr/clipped_fraction"] <= 1.0
    finally:
        trainer.cleanup()


@pytest.mark.ray
def test_ray_staleness_2_pushes_the_published_weights_when_a_batch_starts(ray_cluster, tiny_model_path, tmp_path,
                                                                         wait_two_ahead):
    """k=2 on Ray (1 rollout worker + 1 learner): the rollout thread pushes the newest
    published weights to the worker when it starts a batch; with the waiting estimator,
    step n+2's batch is sampled by the worker with the weights of step n, and the worker's
    recorded logprobs are those weights'."""
    pytest.importorskip("ray")
    cfg = config(tiny_model_path, tmp_path, max_staleness=2, adv_estimator="test_wait_two_ahead")
    cfg.ray.use_ray, cfg.ray.num_actors, cfg.ray.num_learners = True, 1, 1
    trainer = make_trainer(cfg.validate())
    wait_two_ahead["trainer"] = trainer
    try:
        versions, batches, keep = _weights_and_batches(trainer)
        history = trainer.fit(steps=4, callbacks=[keep])
        assert [m["async/staleness_max"] for m in history] == [0.0, 1.0, 2.0, 2.0]
        for step, version in ((1, 0), (2, 0), (3, 1)):
            batch = batches[step]
            assert batch.meta["weight_versions"] == [version] * len(batch)
            mask = batch.loss_mask.bool() & (batch.rollout_logprobs != 0)
            sampler = _logprobs_with(trainer, versions[version], batch)
            assert (sampler - batch.rollout_logprobs)[mask].abs().max() < 1e-4
        trainer.policy.load_trainable_state_dict(versions[4])
        batch = trainer.rollout()  # after fit the workers hold the trainer's weights
        assert batch.meta["weight_versions"] == [4] * len(batch)
    finally:
        trainer.cleanup()
