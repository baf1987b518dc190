"""The peers' own writers, run in a subprocess with each peer installed in a folder of its own
(`make install` puts them under $WORKBENCH_CACHE/pkgs, see the Makefile): the files the importer
tests read are written by verl's, verifiers' and ART's own code, not made by hand.

    run_peer("verl", VERL_WRITER, spec, tmp_path)    # spec: what to write, as JSON

Each writer script below only calls the peer's public writer with the rows the test chose.
"""
from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

PKGS = Path(os.environ.get("WORKBENCH_CACHE", Path.home() / ".cache" / "workbench")).expanduser() / "pkgs"
#: Peer -> (its folder under PKGS, the module that must import from it).
PEERS = {"verl": ("verl-0.9.1", "verl"), "verifiers": ("verifiers-0.3.1", "verifiers"),
         "art": ("art-0.5.18", "art")}


def peer_dir(name: str) -> Path:
    folder, module = PEERS[name]
    path = PKGS / folder
    if not (path / module).is_dir():
        pytest.skip(f"{name} is not installed in {path} (make install puts it there)")
    return path


def run_peer(name: str, code: str, spec: dict[str, Any], tmp: Path, timeout: int = 600) -> str:
    """Run `code` (reading the JSON `spec` from sys.argv[1]) with the peer on PYTHONPATH; its stdout."""
    tmp.mkdir(parents=True, exist_ok=True)
    spec_path = tmp / f"{name}_spec.json"
    spec_path.write_text(json.dumps(spec))
    env = {**os.environ, "PYTHONPATH": str(peer_dir(name)), "LITELLM_LOCAL_MODEL_COST_MAP": "True",
           "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1"}
    done = subprocess.run([sys.executable, "-c", code, str(spec_path)], env=env, cwd=tmp, capture_output=True,
                          text=True, timeout=timeout)
    assert done.returncode == 0, f"{name}'s writer failed:\n{done.stderr[-4000:]}"
    return done.stdout


def tree_digest(root: Path) -> dict[str, str]:
    """{relative path: sha256} of every file under `root` (what an import must leave as it was)."""
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


#: verl 0.9.1: `RayPPOTrainer._write_generations` (the static method `_dump_generations` runs in a
#: thread) writes each dump; verl's `file` tracking backend (`FileLogger`) writes the metrics.
VERL_WRITER = r'''
import json, os, sys
spec = json.load(open(sys.argv[1]))
import verl
assert verl.__version__ == "0.9.1", verl.__version__
from verl.trainer.ppo.ray_trainer import RayPPOTrainer
for d in spec["dumps"]:
    RayPPOTrainer._write_generations(d["inputs"], d["outputs"], d["gts"], d["scores"], d["extra"], d["dir"], d["step"])
if spec.get("metrics"):
    os.environ["VERL_FILE_LOGGER_PATH"] = spec["metrics_path"]
    from verl.utils.tracking import FileLogger
    logger = FileLogger("workbench", "import-test")
    for row in spec["metrics"]:
        logger.log(data=row["data"], step=row["step"])
    logger.finish()
'''

#: verifiers 0.3.1 (vf-eval's writer): `state_to_output` turns each rollout's State into a
#: RolloutOutput, `save_outputs` appends them to results.jsonl, `save_metadata` writes metadata.json.
VERIFIERS_WRITER = r'''
import json, sys
from pathlib import Path
spec = json.load(open(sys.argv[1]))
from verifiers.legacy.types import State, RolloutTiming
from verifiers.legacy.utils.save_utils import state_to_output, save_outputs, save_metadata
from verifiers.legacy.utils.version_utils import get_version_info
outputs = []
for r in spec["rollouts"]:
    state = State(r["state"])
    state["timing"] = RolloutTiming()
    outputs.append(state_to_output(state, state_columns=spec.get("state_columns")))
path = Path(spec["dir"])
save_outputs(outputs, path)
save_metadata({**spec["metadata"], "version_info": get_version_info(spec["metadata"]["env_id"]),
               "path_to_save": path, "date": "2026-12-01"}, path)
'''

#: ART 0.5.18: `Model.log(trajectory_groups, split=..., step=...)` writes trajectories/{split}/{step:04d}.parquet
#: (`write_trajectory_groups_parquet`) and its averages to history.jsonl.
ART_WRITER = r'''
import asyncio, json, sys
spec = json.load(open(sys.argv[1]))
import art
from art.trajectories import Trajectory, TrajectoryGroup
model = art.Model(name=spec["model"], project=spec["project"], base_path=spec["base"])
async def main():
    for batch in spec["batches"]:
        groups = [TrajectoryGroup([Trajectory(**t) for t in g]) for g in batch["groups"]]
        await model.log(groups, split=batch["split"], step=batch["step"])
asyncio.run(main())
'''


def open_in_every_view(run: Any) -> dict[str, Any]:
    """Build each view on an imported `run` (the conversation, the table, the dashboard, the reward
    tuner with a new reward function, the findings panel; the token view where it has tokens or
    says why not) and check each shows the run's episodes; returns the views."""
    from workbench.debug import diagnose
    from workbench.widgets import ConversationView, FindingsPanel, RewardTuner, TokenView, TrainingDashboard
    from workbench.widgets.table import TrajectoryTable

    batch = run.batch()
    views = {"conversation": ConversationView(run), "table": TrajectoryTable(run),
             "dashboard": TrainingDashboard(run), "tuner": RewardTuner(run)}
    first = batch[0].turns[0].action
    assert views["conversation"].html and (first[:20] in views["conversation"].html or not first)
    assert len(views["table"].df) == len(batch)
    assert views["dashboard"].steps == len(run.metrics)
    views["tuner"].set_reward_fn(lambda ep: float(len(ep.turns[-1].action) if ep.turns else 0))
    assert views["tuner"].table["score_after"].tolist() == [float(len(e.turns[-1].action)) for e in batch]
    findings = diagnose(run)
    views["findings"] = FindingsPanel(findings, run)
    if findings and findings[0].evidence:
        assert views["findings"].pick(0) is not None
    if any(e.token_ids for e in batch):
        views["tokens"] = TokenView(run, field="loss_mask")
        assert "episode" in views["tokens"].html
    else:
        with pytest.raises(ValueError, match="no tokens to show: .* records no token ids"):
            TokenView(run)
    return views
