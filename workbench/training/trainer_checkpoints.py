"""The `Trainer`'s checkpoint methods: save, load, resume, branch from, export merged.

`Trainer` inherits them (`class Trainer(CheckpointMethods)`); they use the trainer's policy,
critic, optimizers, engine, stages, KL controller, step counter and metrics, and
`workbench.training.checkpoint` for the files (safetensors + JSON, written atomically, checked
against the run before anything is loaded).
"""
from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

import torch
import yaml

from workbench.reward import RewardManager
from workbench.training import checkpoint as ckpt


class CheckpointMethods:
    """Mixed into `Trainer` (see the module docstring)."""

    def save_checkpoint(self, path: str | Path) -> Path:
        """Weights, optimizer, RNG, config, step and metrics; written atomically, no pickles."""
        self.stages.before_save(self)  # e.g. the Ray learners' Adam moments, as one process holds them
        tensors: dict[str, Any] = {"policy": self.policy.trainable_state_dict()}
        json_files: dict[str, Any] = {}
        optimizers = {"optimizer": self.optimizer, "critic_optimizer": self.critic_optimizer}
        if self.critic is not None:
            tensors["critic"] = self.critic.trainable_state_dict()
        for name, opt in optimizers.items():
            if opt is not None:
                tensors[name], json_files[name] = ckpt.optimizer_state(opt.state_dict())
        tensors["rng"], json_files["rng"] = ckpt.rng_state()
        json_files["trainer_state"] = {
            "global_step": self.global_step, "metrics_history": self.metrics_history,
            "kl_coef": float(self.kl_ctrl.value),
            "policy_weights": "lora_adapters" if self.config.model.use_lora else "full_model"}
        config = self.config.to_dict()
        if isinstance(self.reward_fn, RewardManager):  # the weights the run actually scored with
            config["reward"] = {**config["reward"], **self.reward_fn.weights(), "max_steps": self.reward_fn.max_steps}
        written = ckpt.write_checkpoint(path, tensors, json_files,
                                        {"config.yaml": yaml.safe_dump(config, sort_keys=False)})
        self._checkpoint_step = (Path(path).resolve(), self.global_step)  # fit does not save it again
        return written

    def export_merged(self, path: str | Path) -> Path:
        """The current policy as a plain Hugging Face model folder (LoRA merged, with the
        tokenizer), loadable without peft; see `Policy.export_merged`."""
        return self.policy.export_merged(path)

    def load_checkpoint(self, path: str | Path, force: bool = False) -> None:
        """Restore a checkpoint written by `save_checkpoint`.

        Everything is verified and checked against this trainer before any state is
        touched: a corrupt checkpoint raises CheckpointError, one written for another
        model shape or algorithm CheckpointMismatchError, and so does one whose config
        differs in `ckpt.IDENTITY_FIELDS` (model, LoRA, environment, estimator) unless
        `force=True`. Nothing is loaded when it raises."""
        data = ckpt.read_checkpoint(path)
        state = ckpt.trainer_state(data, path, self.config.to_dict(), self.critic is not None, force)
        tensors, js = data["tensors"], data["json"]
        ckpt.check_weights("policy", tensors["policy"], _trained(self.policy.model))
        restore = [(self.optimizer, ckpt.optimizer_state_dict(tensors["optimizer"], js["optimizer"],
                                                              self.optimizer, "optimizer"))]
        if self.critic is not None:
            ckpt.check_weights("critic", tensors["critic"], _trained(self.critic))
            restore.append((self.critic_optimizer, ckpt.optimizer_state_dict(
                tensors.get("critic_optimizer", {}), js.get("critic_optimizer", {}), self.critic_optimizer,
                "critic optimizer")))
        rng = ckpt.prepare_rng_state(tensors["rng"], js["rng"])
        # Checked: from here on nothing raises on a well-formed checkpoint.
        for opt, sd in restore:
            opt.load_state_dict(sd)
        self.policy.load_trainable_state_dict(tensors["policy"])
        if self.critic is not None:
            self.critic.load_state_dict(tensors["critic"], strict=False)
        ckpt.set_rng_state(rng)
        self.global_step, self.metrics_history = state["global_step"], state["metrics_history"]
        self.kl_ctrl.value = state["kl_coef"]
        self.engine.sync_weights(self.policy.model)
        self.stages.after_load(self)
        self._checkpoint_step = (Path(path).resolve(), self.global_step)

    @classmethod
    def from_checkpoint(cls, checkpoint: str | Path, *, output_dir: str | Path,
                        overrides: dict[str, Any] | None = None, steps: int | None = None,
                        **trainer_kwargs: Any) -> "Trainer":
        """A branch of a run: a Trainer that continues from `checkpoint` with `overrides`
        (the remedy to try), ready to `fit`, writing only into `output_dir`
        (`workbench.training.branch` says what a branch is).

            trainer = Trainer.from_checkpoint("runs/gn/checkpoints/step_000010", output_dir="runs/gn-lr",
                                              overrides={"training.learning_rate": 1e-4}, steps=10)
            trainer.fit()          # steps 10..19; run.branched_from in load_run("runs/gn-lr")

        Args:
            checkpoint: a checkpoint folder (`RUN/checkpoints/step_N`), or a run folder (its
                newest checkpoint).
            output_dir: the branch's own run folder (logs, `branch.json`, `config.yaml`;
                checkpoints in `output_dir/checkpoints`); not inside the parent run's folder.
            overrides: settings to change, `{"section.field": value}` or `{"section": {...}}`;
                every other setting is the checkpoint's. Identity fields (model, LoRA shape,
                environment name, estimator) cannot change.
            steps: train this many RL steps after the checkpoint's step, after the SFT warm-up
                when `overrides` set `sft.steps` (sets the config's target); None keeps the
                checkpoint's target (`fit(steps=N)` works too).
            trainer_kwargs: passed to `Trainer(...)` (environment, reward_fn, dataset, tools,
                parser, engine), as the parent was built with.

        Raises `BranchError` (a ConfigError naming the field or folder) before any model
        loads, and before anything is written."""
        from workbench.training.branch import start_branch

        return start_branch(cls, checkpoint, output_dir, overrides, steps, trainer_kwargs)

    def resume(self, force: bool | None = None) -> Path | None:
        """Load the newest checkpoint in `checkpoint.output_dir` that is intact, skipping
        corrupt ones with a warning; returns its path (None if there is none).

        A checkpoint that does not fit this trainer's config raises (no fallback); `force`
        defaults to `checkpoint.resume == "force"` (see `load_checkpoint`)."""
        self._resume_tried = True
        force = self.config.checkpoint.resume == "force" if force is None else force
        for path in reversed(ckpt.list_checkpoints(self.config.checkpoint.output_dir)):
            try:
                self.load_checkpoint(path, force=force)
                return path
            except ckpt.CheckpointMismatchError:
                raise
            except ckpt.CheckpointError as exc:
                warnings.warn(f"skipping corrupt checkpoint: {exc}", stacklevel=2)
        return None



def _trained(module: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p for n, p in module.named_parameters() if p.requires_grad}
