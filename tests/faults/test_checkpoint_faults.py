"""Checkpoint faults: planted pickles, kills during a same-path re-save, checkpoints of
another config, malformed manifests, and metrics.jsonl after an interrupted CLI run.

Every test here failed on 49a37c7 (pickles ran, the re-save lost the checkpoint and
left temp folders, the trainer half-loaded, the manifest crashed `latest_checkpoint`,
metrics.jsonl repeated a step)."""
from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch

from envs import make_env
from tests.faults.forks import Forks
from tests.test_trainer import tiny_config, trained_weights
from workbench import Trainer
from workbench.training import checkpoint as ckpt


class Payload:
    """Unpickling this writes `marker` (stands in for `os.system`)."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return exec, (f"open({self.marker!r}, 'w').write('ran')",)


def _manifest(folder: Path) -> dict:
    return json.loads((folder / ckpt.MANIFEST).read_text())


def _file_table(manifest: dict) -> dict:
    """The {name: {bytes, sha256}} table (under "files" now; the whole manifest at 49a37c7)."""
    return manifest["files"] if "files" in manifest else manifest


def _list_in_manifest(folder: Path, name: str) -> None:
    """Add `name` to the manifest with its true size and hash, as an attacker could."""
    manifest = _manifest(folder)
    data = (folder / name).read_bytes()
    _file_table(manifest)[name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (folder / ckpt.MANIFEST).write_text(json.dumps(manifest))


def test_planted_pickles_are_never_unpickled(tiny_model_path, tmp_path):
    c = tiny_config(tiny_model_path, tmp_path)
    trainer = Trainer(c, environment=make_env("guess_number"))
    trainer.train_step()
    path = trainer.save_checkpoint(tmp_path / "ckpt" / "step_000001")
    fresh = Trainer(c, environment=make_env("guess_number"))

    # 1. An extra .pt file the manifest does not list: ignored, the checkpoint loads.
    unlisted = tmp_path / "unlisted-ran"
    torch.save(Payload(unlisted), path / "extra.pt")
    fresh.load_checkpoint(path)
    assert not unlisted.exists(), "an unlisted file was unpickled"
    assert fresh.global_step == 1
    assert all(torch.equal(v, trained_weights(trainer)[k]) for k, v in trained_weights(fresh).items())

    # 2. A .pt file listed in the manifest with its true hash: refused, never opened.
    listed = tmp_path / "listed-ran"
    torch.save(Payload(listed), path / "optimizer.pt")
    _list_in_manifest(path, "optimizer.pt")
    other = Trainer(c, environment=make_env("guess_number"))
    with pytest.raises(ckpt.CheckpointError, match="unsafe"):
        other.load_checkpoint(path)
    assert not listed.exists(), "a listed pickle was unpickled"
    assert other.global_step == 0

    # 3. A checkpoint in 49a37c7's layout (flat manifest, pickled optimizer.pt/rng.pt).
    old = tmp_path / "ckpt" / "step_000002"
    old.mkdir()
    old_ran = tmp_path / "old-format-ran"
    torch.save(Payload(old_ran), old / "rng.pt")
    (old / "policy.safetensors").write_bytes((path / "policy.safetensors").read_bytes())
    table = {}
    for f in ("rng.pt", "policy.safetensors"):
        data = (old / f).read_bytes()
        table[f] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (old / ckpt.MANIFEST).write_text(json.dumps(table))
    with pytest.raises(ckpt.CheckpointError, match="older, unsafe checkpoint format"):
        ckpt.read_checkpoint(old)
    # Resuming skips both poisoned folders (with a warning) and finds nothing else.
    with pytest.warns(UserWarning, match="skipping corrupt checkpoint"):
        assert other.resume() is None
    assert not old_ran.exists() and not listed.exists()
    assert other.global_step == 0


CHILD = r"""
import importlib.util, inspect, os, shutil, signal, sys
import torch
spec = importlib.util.spec_from_file_location("ckpt", sys.argv[1])
ckpt = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ckpt)


def scenario(root, when, k):
    def save(value):
        kw = dict(tensors={"policy": {"w": torch.full((32, 32), float(value))}},
                  json_files={"trainer_state": {"value": value}}, texts={"config.yaml": f"value: {value}\n"})
        if "objects" in inspect.signature(ckpt.write_checkpoint).parameters:
            kw["objects"] = {}  # 49a37c7's signature
        ckpt.write_checkpoint(os.path.join(root, "step_000001"), **kw)

    save(1)
    calls = 0

    def killing(fn):
        def run(*args, **kwargs):
            nonlocal calls
            calls += 1
            if when == "before" and calls == k:
                os.kill(os.getpid(), signal.SIGKILL)
            out = fn(*args, **kwargs)
            if when == "after" and calls == k:
                os.kill(os.getpid(), signal.SIGKILL)
            return out
        return run
    os.rename, os.replace, shutil.rmtree = killing(os.rename), killing(os.replace), killing(shutil.rmtree)
    save(2)


def run(line):  # each forked child (tests/faults/forks.py): "ROOT WHEN K"
    root, when, k = line.split()
    scenario(root, when, int(k))
"""


def test_kill_at_every_step_of_a_same_path_resave_keeps_a_checkpoint(tmp_path):
    """A child saves step_000001, then re-saves it and is SIGKILLed just before or just
    after its k-th rename/rmtree, for every k. The folder must always load (old or new
    content), and recovery must leave no temp or set-aside folders behind."""
    with Forks(CHILD, ckpt.__file__) as forks:
        _kill_at_every_step(forks, tmp_path)


def _kill_at_every_step(forks: Forks, tmp_path: Path) -> None:
    for when in ("before", "after"):
        for k in range(1, 8):
            root = tmp_path / f"{when}-{k}"
            forks.start(f"{root} {when} {k}")
            ended = forks.ended()
            completed = ended == 0
            assert completed or ended == -signal.SIGKILL, (ended, when, k)
            with warnings.catch_warnings():
                warnings.simplefilter("error")  # no corrupt checkpoint may be seen
                latest = ckpt.latest_checkpoint(root)
            assert latest is not None and latest.name == "step_000001", f"checkpoint lost killed {when} op {k}"
            data = ckpt.read_checkpoint(latest)
            value = data["json"]["trainer_state"]["value"]
            assert value == (2 if completed else value) and value in (1, 2)
            assert torch.equal(data["tensors"]["policy"]["w"], torch.full((32, 32), float(value)))
            assert sorted(p.name for p in root.iterdir()) == ["step_000001"], f"leftovers killed {when} op {k}"
            if completed:
                assert k > 1, "the re-save renames or deletes at least once"
                break
        else:
            pytest.fail(f"the re-save never completed with a kill {when} op 1..7")


def test_temp_folder_of_a_live_writer_is_kept(tmp_path):
    root = tmp_path / "ckpt"
    root.mkdir()
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        busy = root / f".step_000001.tmp-{writer.pid}-abc123"
        busy.mkdir()
        (busy / "policy.safetensors").write_bytes(b"half")
        assert ckpt.list_checkpoints(root) == []
        assert busy.exists(), "a live writer's temp folder was deleted"
    finally:
        writer.kill()
        writer.wait()
    assert ckpt.latest_checkpoint(root) is None
    assert list(root.iterdir()) == [], "a dead writer's temp folder was kept"


def _bad_manifests(table: dict) -> dict[str, object]:
    name = next(iter(table))
    no_bytes = {n: {"sha256": m["sha256"]} for n, m in table.items()}
    outside = {**table, "../step_000001/MANIFEST.json": table[name]}
    nested = {**table, "sub/x.json": table[name]}
    bad_hash = {**table, name: {"bytes": table[name]["bytes"], "sha256": "xyz"}}
    return {"a list": [table], "no bytes": no_bytes, "path outside": outside, "nested path": nested,
            "bad hash field": bad_hash, "a number": 3}


@pytest.mark.parametrize("variant", ["a list", "no bytes", "path outside", "nested path", "bad hash field",
                                     "a number"])
def test_malformed_manifest_is_a_checkpoint_error_and_falls_back(tiny_model_path, tmp_path, variant):
    c = tiny_config(tiny_model_path, tmp_path)
    trainer = Trainer(c, environment=make_env("guess_number"))
    out = Path(c.checkpoint.output_dir)
    trainer.save_checkpoint(out / "step_000001")
    newest = trainer.save_checkpoint(out / "step_000002")
    manifest = _manifest(newest)
    bad = _bad_manifests(_file_table(manifest))[variant]
    if isinstance(bad, dict) and "files" in manifest:
        bad = {**manifest, "files": bad}
    (newest / ckpt.MANIFEST).write_text(json.dumps(bad))
    with pytest.raises(ckpt.CheckpointError):
        ckpt.read_checkpoint(newest)
    with pytest.warns(UserWarning, match="skipping corrupt checkpoint"):
        assert ckpt.latest_checkpoint(out).name == "step_000001"


def test_checkpoint_of_another_config_is_refused_before_anything_loads(tiny_model_path, tmp_path):
    grpo = Trainer(tiny_config(tiny_model_path, tmp_path / "a"), environment=make_env("guess_number"))
    grpo.train_step()
    path = grpo.save_checkpoint(tmp_path / "a" / "step_000001")

    def snapshot(t: Trainer):
        return (t.global_step, trained_weights(t), torch.get_rng_state(),
                json.dumps(t.optimizer.state_dict()["param_groups"]), len(t.optimizer.state))

    def unchanged(t: Trainer, before) -> bool:
        after = snapshot(t)
        return (after[0] == before[0] and after[1].keys() == before[1].keys()
                and all(torch.equal(after[1][k], before[1][k]) for k in after[1])
                and torch.equal(after[2], before[2]) and after[3:] == before[3:])

    # A critic-based PPO trainer: the config check names the field; forced, the missing
    # critic is found before anything is loaded.
    ppo = Trainer(tiny_config(tiny_model_path, tmp_path / "b", adv_estimator="gae"), environment=make_env("grid"))
    before = snapshot(ppo)
    with pytest.raises(ckpt.CheckpointError, match="training.adv_estimator.*'grpo'.*'gae'") as refused:
        ppo.load_checkpoint(path)
    assert unchanged(ppo, before)
    assert refused.type is ckpt.CheckpointMismatchError  # resume() does not fall back past it
    with pytest.raises(ckpt.CheckpointMismatchError, match="no critic"):
        ppo.load_checkpoint(path, force=True)
    assert unchanged(ppo, before)

    # Another LoRA rank: refused by name; forced, the weight shapes do not fit.
    c8 = tiny_config(tiny_model_path, tmp_path / "c")
    c8.model.lora_rank = 8
    rank8 = Trainer(c8, environment=make_env("guess_number"))
    before = snapshot(rank8)
    with pytest.raises(ckpt.CheckpointMismatchError, match="model.lora_rank: checkpoint 4, this run 8"):
        rank8.load_checkpoint(path)
    with pytest.raises(ckpt.CheckpointMismatchError, match="policy weights do not fit"):
        rank8.load_checkpoint(path, force=True)
    assert unchanged(rank8, before)


def test_resume_refuses_another_config_unless_forced(tiny_model_path, tmp_path):
    c = tiny_config(tiny_model_path, tmp_path)
    c.checkpoint.save_interval = 1
    Trainer(c, environment=make_env("guess_number")).fit(num_epochs=1, num_iters_per_epoch=1)
    other = tiny_config(tiny_model_path, tmp_path)
    other.environment.name = "grid"
    trainer = Trainer(other, environment=make_env("grid"))
    with pytest.raises(ckpt.CheckpointError, match="environment.name: checkpoint 'guess_number'"):
        trainer.fit(num_epochs=1, num_iters_per_epoch=2)
    assert trainer.global_step == 0
    other.checkpoint.resume = "force"
    forced = Trainer(other.validate(), environment=make_env("grid"))
    assert forced.resume().name == "step_000001"
    assert forced.global_step == 1
    assert ckpt.read_checkpoint(tmp_path / "ckpt" / "step_000001")["json"]["trainer_state"][
        "policy_weights"] == "lora_adapters"


def test_metrics_log_continues_from_the_checkpoint_step(tiny_model_path, tmp_path):
    from workbench.cli import main

    out = tmp_path / "run"
    args = ["train", "--env", "guess_number", "--model", str(tiny_model_path), "--output", str(out),
            "--save-interval", "2", "--eval-episodes", "0", "--batch-size", "4", "--group-size", "2",
            "--max-tokens", "8", "--max-turns", "2"]
    # Three steps with a checkpoint after two: step index 2 ran after the last
    # checkpoint, as when a run is interrupted.
    assert main(args + ["--steps", "3"]) == 0
    log = out / "metrics.jsonl"
    assert main(args + ["--steps", "4"]) == 0  # resumes from step_000002
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0, 1, 2, 3]
    # Killed mid-line: the cut-off line is dropped on the next resume (from step_000004).
    with log.open("a") as f:
        f.write('{"step": 4, "reward/me')
    assert main(args + ["--steps", "5"]) == 0
    assert [json.loads(line)["step"] for line in log.read_text().splitlines()] == [0, 1, 2, 3, 4]


def test_ppo_checkpoint_restores_both_optimizers_and_rngs_exactly(tiny_model_path, tmp_path):
    """Optimizer state goes through safetensors + JSON, RNG state through both: the
    round trip must be exact (no pickle to fall back on)."""
    import random

    import numpy as np

    c = tiny_config(tiny_model_path, tmp_path, adv_estimator="gae")
    trainer = Trainer(c, environment=make_env("grid"))
    trainer.train_step()
    path = trainer.save_checkpoint(tmp_path / "ckpt" / "step_000001")
    saved = {"opt": trainer.optimizer.state_dict(), "critic_opt": trainer.critic_optimizer.state_dict()}
    draws = (torch.rand(3), random.random(), np.random.rand())

    fresh = Trainer(c, environment=make_env("grid"))
    fresh.load_checkpoint(path)
    assert (torch.rand(3).tolist(), random.random(), np.random.rand()) == (draws[0].tolist(), *draws[1:])
    for name, opt in (("opt", fresh.optimizer), ("critic_opt", fresh.critic_optimizer)):
        got, want = opt.state_dict(), saved[name]
        assert got["param_groups"] == want["param_groups"]
        assert got["state"].keys() == want["state"].keys() and len(got["state"]) > 0
        for idx, entry in want["state"].items():
            assert entry.keys() == got["state"][idx].keys()
            assert all(torch.equal(v, got["state"][idx][k]) for k, v in entry.items())
    critic = {k: v for k, v in fresh.critic.state_dict().items() if k in trainer.critic.trainable_state_dict()}
    assert all(torch.equal(v, trainer.critic.trainable_state_dict()[k]) for k, v in critic.items())
    assert critic.keys() == trainer.critic.trainable_state_dict().keys()
