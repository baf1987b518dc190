"""`WorkbenchCallback`: a TRL GRPOTrainer run written as a workbench run folder while it trains,
so the dashboard and the doctor follow it.

    from trl import GRPOConfig, GRPOTrainer
    from workbench.integrations.trl import WorkbenchCallback

    args = GRPOConfig(output_dir="trl_out", log_completions=True, logging_steps=1, ...)
    trainer = GRPOTrainer(model=..., reward_funcs=[...], args=args, train_dataset=...,
                          callbacks=[WorkbenchCallback("runs/trl-live", task="gsm8k")])
    trainer.train()
    # meanwhile, in another cell or process:
    run = load_run("runs/trl-live"); Dashboard(run); diagnose(run)

TRL's public hooks are `TrainerCallback`'s: `on_log` receives the step's metrics (written to
RUN/metrics.jsonl at once, mapped to the workbench's names as `workbench import` maps them),
and the completions parquet TRL writes right after that `on_log` is read at the next
`on_step_end` (or at `on_train_end` for the last step) and saved as RUN/rollouts/step_*.jsonl.gz.
So the metrics are current and the batches one step behind. It needs `log_completions=True`
(TRL writes no completions otherwise) and writes only into its run folder: TRL's output_dir is
read, never written.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from workbench.importers.source import map_metrics
from workbench.importers.trl import METRICS, TRLSource, completion_files
from workbench.importers.trl import provenance as trl_provenance
from workbench.importers.write import PROVENANCE_FILE, check_output
from workbench.training import run_files

__all__ = ["WorkbenchCallback"]


class WorkbenchCallback(TrainerCallback):
    """Appends each step of a TRL GRPOTrainer run to the workbench run folder `run_dir` (see the
    module docstring). `task` names the task (`environment.name` in its config.yaml), so
    `compare` pairs it with other runs of the task."""

    def __init__(self, run_dir: str | Path, task: str = ""):
        self.run_dir = Path(run_dir)
        self.task = task
        self.rows: list[dict[str, Any]] = []
        self.saved: set[int] = set()
        self.source: TRLSource | None = None

    # -- TrainerCallback hooks ---------------------------------------------------------------------
    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if not getattr(args, "log_completions", False):
            raise ValueError("WorkbenchCallback needs GRPOConfig(log_completions=True): without it TRL writes no "
                             "completions to read the episodes from")
        self._output_dir = Path(args.output_dir)
        if self.run_dir.exists() and any(self.run_dir.iterdir()):
            raise ValueError(f"WorkbenchCallback: {self.run_dir} already holds files; give a new run folder")
        check_output(self._output_dir, self.run_dir)
        (self.run_dir / run_files.ROLLOUTS).mkdir(parents=True, exist_ok=True)
        from workbench.config import ConfigStore

        config = ConfigStore()  # what load_run reads from the first step on (TRLSource.build_config's)
        config.environment.name, config.model.model_name, config.training.adv_estimator = self.task, "", "grpo"
        config.save(self.run_dir / run_files.CONFIG_FILE)
        (self.run_dir / run_files.METRICS_FILE).touch()  # load_run reads the run from its first step on
        self._write_provenance(trl_provenance(self._output_dir))

    def on_log(self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None,
               **kwargs: Any) -> None:
        if not logs or not state.is_world_process_zero or "train_runtime" in logs or state.global_step < 1:
            return
        if any(k.startswith("eval_") for k in logs):
            return
        row = {**logs, "source_step": state.global_step, "step": state.global_step - 1}
        self.rows.append(row)
        mapped, _ = map_metrics([row], METRICS)
        clean = {k: v for k, v in mapped[0].items() if isinstance(v, (int, float, str, bool)) and v == v}
        with (self.run_dir / run_files.METRICS_FILE).open("a", encoding="utf-8") as f:
            f.write(json.dumps(clean) + "\n")

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._sync()

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if state.is_world_process_zero:
            self._sync()

    # -- the run folder ------------------------------------------------------------------------------
    def _sync(self) -> None:
        """Save each completions file TRL finished since the last call as its step's batch."""
        steps = {s - 1 for s in completion_files(self._output_dir) if s >= 1} - self.saved
        if not steps:
            return
        if self.source is None:
            self.source = TRLSource(self._output_dir)
        self.source._history = [{**r, "step": r["source_step"]} for r in self.rows]  # the logs TRL gave on_log
        for step in sorted(steps):
            batch = self.source.batch(step)
            if len(batch):  # empty: the file did not read yet (skipped and counted); tried again next step
                run_files.save_step_batch(self.run_dir, step, batch)
                self.saved.add(step)
        self._write_provenance(self.source.provenance)

    def _write_provenance(self, provenance: Any) -> None:
        provenance.absent.pop("metrics", None)  # the metrics come from on_log, not from trainer_state.json
        provenance.notes = [n for n in provenance.notes if not n.startswith("written live")] + [
            "written live by workbench.integrations.trl.WorkbenchCallback while TRL trained"]
        (self.run_dir / PROVENANCE_FILE).write_text(json.dumps(provenance.to_dict(), indent=1, default=str),
                                                    encoding="utf-8")
