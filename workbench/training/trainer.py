"""`Trainer`: rollout -> score -> advantages -> update, as cells.

    trainer = Trainer(config, environment=env, reward_fn=None)
    batch = trainer.rollout()              # TrajectoryBatch, token-exact
    batch = trainer.score(batch)           # token_level_scores / rewards, episode.score
    batch = trainer.compute_advantages(batch)   # old/ref logprobs, KL, values, advantages
    metrics = trainer.update(batch)        # PPO/GRPO epochs; new logprobs, ratio, entropy
    trainer.fit(steps=20)                  # the same, looped, with checkpoints: 20 more steps

The trainer is glue: numerics live in `workbench.algo`, token bookkeeping in
`workbench.rollout`, models in `workbench.training.policy`. Every stage returns the
batch (or metrics) so a notebook can look at what it did.

Reward placement: with a `reward_fn`, its score sits on the episode's last policy
token; without one, each turn's environment reward sits on the last token of that
turn (so GAE can credit turns separately; GRPO sums them either way).

Where rollout and update run is `self.stages` (`workbench.training.stages`): in this
process, or with `config.ray.use_ray=True` on Ray rollout workers and FSDP2 learners
(`workbench.distributed.controller.RayStages`), behind the same methods; this object stays
the single controller and every stage returns the same objects either way.

Settings: models and optimizers come from `build_models(config)`, rollouts from
`workbench.rollout.make_rollout(config, ...)`, on every path. The environment object's
own settings are recorded in `config.environment` (`record_environment`): a value the
config set that the environment contradicts is warned about, naming both, never
replaced in silence; run-level settings (`step_timeout`) stay the config's.
"""
from __future__ import annotations

import gc
import time
import warnings
from typing import Any, Callable, Sequence

import torch

from workbench import algo
from workbench.config import ConfigError, ConfigStore
from workbench.data import EpisodeDataset, PromptEnvironment, make_episode_env
from workbench.doctor.checks import StepDoctor
from workbench.doctor.findings import RunFacts
from workbench.engines import GenerationEngine, make_engine
from workbench.environments.registry import make_env, make_environment, record_environment
from workbench.reward import (
    RewardError, RewardFn, check_env_rewards, overlong_summary, score_batch,
)
from workbench.reward.sources import ModelRewards, model_reward_summary
from workbench.rollout.configured import check_chat_template
from workbench.rollout.template import tool_parser
from workbench.rollout.fork import fork_episode
from workbench.rollout.rollout import Rollout
from workbench.training import dynamic_sampling
from workbench.training.async_fit import RolloutAhead, stamp_versions, staleness_metrics
from workbench.training.fit_loop import FitTargetReachedWarning, run_fit  # noqa: F401 (the warning stays importable here)
from workbench.training.models import build_models
from workbench.training.constrained import allowed_tokens, model_vocab_size
from workbench.training.policy import batch_logprobs, batch_values
from workbench.training.stages import LocalStages, check_stages, make_stages
from workbench.training.trainer_checkpoints import CheckpointMethods
from workbench.training.trainer_sft import SFTMethods
from workbench.training.update import NothingToTrainError, failed_episodes_line, require_trained_tokens, set_kl
from workbench.trajectory import TrajectoryBatch, format_rate
from workbench.utils.progress import write

Callback = Callable[["Trainer", dict], None]

#: Estimators whose advantages are rewards relative to the episode's group: a group
#: with identical rewards contributes nothing to the update (`workbench.algo`'s tuple).
GROUP_RELATIVE_ESTIMATORS = algo.GROUP_RELATIVE_ESTIMATORS


class NothingToTrainWarning(UserWarning):
    """No episode of a step's batch has a trained token (every one failed): the step is skipped."""


class ZeroVarianceWarning(UserWarning):
    """Every group of a batch has identical rewards: a group-relative update is a no-op."""


class Trainer(CheckpointMethods, SFTMethods):
    """PPO / GRPO trainer for multi-turn environments (see module docstring).

    Args:
        config: the run's ConfigStore (validated here).
        environment: a prototype environment (deep-copied per episode) or a
            zero-argument factory; defaults to `make_env(config.environment.name, ...)`
            (`workbench.environments.registry`). The trainer records it in `config.environment`
            (`record_environment`: the name that rebuilds it, `import_path`, params).
        reward_fn: `fn(trajectory)` or `fn(trajectory, environment)` -> float; None
            uses the environment's rewards.
        dataset: items to draw episode groups from (cycled): int environment seeds, or
            dicts with `prompt` and/or `seed` / `params` (see `workbench.data`), as a list
            or any map-style Dataset (indexed, never iterated); without an environment, a
            prompt dataset runs single-turn episodes (`PromptEnvironment`). Default: fresh
            seeds derived from `training.seed` and the step.
        tools: extra tools offered in every episode.
        parser: action parser for all episodes (default: each env's `action_parser`).
        engine: an already running generation engine to sample with instead of starting
            the one `config.inference.backend` names (e.g. one vLLM engine shared by
            several trainers in a notebook). It is loaded with this trainer's policy
            weights at once (`engine.sync_weights`), and after every update as usual.
    """

    def __init__(self, config: ConfigStore, environment: Any = None, reward_fn: RewardFn | None = None,
                 dataset: Any = None, tools: Sequence[Any] = (), parser: Any = None,
                 engine: GenerationEngine | None = None):
        self.config = config.validate()
        check_stages(config)  # e.g. Ray groups the cluster cannot hold: PlacementError now, before any model loads
        t = config.training
        self.dataset = EpisodeDataset(dataset) if dataset is not None else None
        if environment is None and self.dataset is not None and self.dataset.has_prompts:
            environment = PromptEnvironment(config.environment)  # a prompt dataset: single-turn episodes
        self.environment = environment if environment is not None else _default_env(config)
        if self.dataset is not None:
            make_episode_env(self.make_environment, self.dataset.first)  # a bad item fails here, not at every reset
        # Record what this run trains on (name that rebuilds it, class, params) in the config.
        env = self.make_environment()
        self._env_type = type(env)  # what the doctor's remedies fit (run_facts)
        self.config.environment = record_environment(self.config.environment, env)
        self.reward_fn = reward_fn
        #: The judges / reward model `config.reward` turns on, built by `score` (None: none is on).
        self.model_rewards: ModelRewards | None = None
        self.tools, self.parser = list(tools), parser
        models = build_models(config)
        self.policy, self.critic = models.policy, models.critic
        self.optimizer, self.critic_optimizer = models.optimizer, models.critic_optimizer
        self.tokenizer = self.policy.tokenizer
        #: The chat template as this run uses it (checked now: `check_chat_template`).
        self.chat = check_chat_template(config, self.tokenizer)
        # inference.tool_format against the environment's parser: a ConfigError now, not at the first reset
        tool_parser(parser if parser is not None else getattr(env, "action_parser", None), type(env).__name__,
                    config.inference.tool_format, self.chat.profile)
        self._owns_engine = engine is None
        if engine is None:
            self.engine = make_engine(config, self.policy.model, self.tokenizer)
        else:
            self.engine = engine
            self.engine.stop = list(config.inference.stop)  # this trainer's stop strings
            self.engine.sync_weights(self.policy.model)
        self.kl_ctrl = algo.KLController(t.kl_coef, t.target_kl, adaptive=t.adaptive_kl, horizon=t.kl_horizon)
        self.global_step = 0
        self.metrics_history: list[dict[str, float]] = []
        self.last_batch: TrajectoryBatch | None = None
        #: Where this trainer's run branched from (`from_checkpoint`), else None.
        self.branched_from: Any = None
        self._resume_tried = False  # fit() resumes once, unless resume() ran already
        self._run_started = False  # the run folder was resumed or set up (workbench.training.run_lock.start_run)
        self._run_lock: Any = None  # the run folders' lock while this trainer writes there (run_lock)
        self._run_lock_kept = False  # held past fit (the CLI, until its reports are written)
        self._reports_interrupt = False  # the CLI says where a Ctrl-C'd run resumes (fit_loop.save_after_interrupt)
        # fit runs the doctor's batch checks each step (workbench.doctor.checks) with the thresholds of
        # config.doctor (the same object: a threshold changed on the config applies from the next step);
        # None turns them off.
        self.doctor: StepDoctor | None = StepDoctor(config.doctor, write=write)
        # Where rollout and update run: this process, or Ray workers (ray.use_ray).
        self.stages = make_stages(self)
        #: `fit`'s rollouts of the next steps on a thread (`training.max_staleness` >= 1), else None.
        self.ahead: RolloutAhead | None = None

    def checked_config(self) -> ConfigStore:
        """`self.config`, validated again: a notebook may set a field on `trainer.config` after
        the trainer was built (`trainer.config.training.max_staleness = 2`), and every stage
        (`rollout`, `score`, `compute_advantages`, `update`, `train_step`, `sft_step`,
        `evaluate`, `fork`, `fit`) checks it before using it, so a bad value is a ConfigError
        naming the field, not a TypeError deep inside. Fields that shaped what was built
        (model, LoRA, estimator's critic, engine) do not change the built objects."""
        return self.config.validate()

    def run_facts(self) -> RunFacts:
        """What the doctor's findings and remedies must fit (`workbench.doctor.findings.RunFacts`):
        this run's estimator and `max_tokens`, and whether its environment has a scripted expert
        and a strict format."""
        env_type = getattr(self, "_env_type", None)
        if env_type is None:
            self._env_type = env_type = type(self.make_environment())
        return RunFacts.of(self.config, env_type)

    @property
    def ray_stages(self) -> Any:
        """The Ray stages when `ray.use_ray` is set, else None."""
        stages = getattr(self, "stages", None)
        return None if stages is None or isinstance(stages, LocalStages) else stages

    # -- seed-compatible attributes ---------------------------------------------------
    @property
    def model(self) -> torch.nn.Module:
        """The policy module being trained."""
        return self.policy.model

    @property
    def needs_reference(self) -> bool:
        t = self.config.training
        return t.use_kl_in_reward or t.use_kl_loss

    # -- stage 1: rollout ---------------------------------------------------------------
    def _step_seeds(self, step: int) -> list[int]:
        t = self.config.training
        n_groups = t.batch_size // t.group_size
        if self.dataset:
            return [self.dataset[(step * n_groups + g) % len(self.dataset)] for g in range(n_groups)]
        return [t.seed * 1_000_003 + step * n_groups + g for g in range(n_groups)]

    def make_environment(self) -> Any:
        """One episode's environment: a call of the factory, or a deep copy of the prototype."""
        return make_environment(self.environment)

    def sampling_seed(self, step: int) -> int | None:
        """The base sampling seed of training step `step`: derived from `inference.seed`
        and `training.seed`, different every step; None when `inference.seed` is None."""
        inf, t = self.config.inference, self.config.training
        return None if inf.seed is None else inf.seed * 7_919 + t.seed * 104_729 + step

    def make_rollout(self, seeds: Sequence[int], group_size: int, temperature: float | None = None,
                     sampling_seed: Any = "step") -> Rollout:
        """A `Rollout` over `group_size` episodes per seed with this run's settings
        (an `AsyncRollout` when `inference.async_rollout` is set), in this process.
        `sampling_seed` defaults to the current step's (`sampling_seed(global_step)`)."""
        if sampling_seed == "step":
            sampling_seed = self.sampling_seed(self.global_step)
        if self.ahead is not None:  # e.g. evaluate in a fit callback: the engine is free, with the current weights
            self.ahead.settle()
        rollout = LocalStages().make_rollout(self, seeds, group_size, temperature, sampling_seed)
        rollout.progress_leave = not getattr(self, "_fitting", False)  # fit's own bar stays, step bars go
        return rollout

    @torch.no_grad()
    def rollout(self) -> TrajectoryBatch:
        """Sample `training.batch_size` episodes (groups of `group_size` per seed).

        With `training.dynamic_sampling`, this is the step's first round only: the groups
        whose rewards are all equal are dropped and replaced after scoring, by
        `filter_groups` (`train_step` calls it; stepwise, call it after `score`). Inside
        `fit` with `training.max_staleness` >= 1, the batch sampled ahead for this step is
        taken instead (`workbench.training.async_fit`); outside `fit` there is none.
        Every episode records the weight version that sampled it (`weight_version`)."""
        self.checked_config()
        self.policy.model.eval()
        batch = self.ahead.take(self.global_step) if self.ahead is not None else None  # async_fit
        self.last_batch = batch if batch is not None else self._sample(self.global_step, self.global_step)
        return self.last_batch

    def _sample(self, step: int, version: int) -> TrajectoryBatch:
        """The batch of training step `step`, sampled with weight version `version`."""
        start = time.perf_counter()
        batch = self.stages.rollout(self, self._step_seeds(step), self.config.training.group_size, None,
                                    self.sampling_seed(step))
        generated = sum(ep.response_length for ep in batch)
        batch.meta.update({"step": step, "rollout_seconds": time.perf_counter() - start,
                           "generated_tokens": generated})
        stamp_versions(batch, version)
        return batch

    # -- stage 2: score -------------------------------------------------------------------
    def score(self, batch: TrajectoryBatch, reward_fn: RewardFn | None = None) -> TrajectoryBatch:
        """Place rewards on tokens: `token_level_scores` (and `token_level_rewards`), and set
        each `episode.score`, with `workbench.reward.score_batch` (the CLI and the reward
        tuner use the same function): the reward_fn, called with the environment copy that
        played each episode, else the environment rewards shaped by `config.reward`; plus
        the overlong penalty (`reward.overlong_penalty`) of replies near `inference.max_tokens`.

        All-or-nothing: a failing reward_fn or a non-finite / float32-overflowing reward
        raises RewardError naming the episode, and no episode's `score` changes.

        Rewards from models (`reward.judge`, `reward.group_judge`, `reward.reward_model`) are
        added by weight (`self.model_rewards`, `workbench.reward.sources`); an episode whose
        judgment failed gets no score and `Episode.reward_error`, and the update leaves it out."""
        fn = reward_fn if reward_fn is not None else self.reward_fn
        self.checked_config()
        self.model_rewards = ModelRewards.reuse(self.config.reward, self.model_rewards)  # judges: reward.judge ...
        return score_batch(batch, fn, self.environment, self.config.reward, max_tokens=self._max_tokens,
                           model_rewards=self.model_rewards)

    @property
    def _max_tokens(self) -> int:
        """The token limit of this run's replies (`inference.max_tokens`), which the overlong
        penalty ramps toward."""
        return self.config.inference.max_tokens

    def filter_groups(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """Dynamic sampling (`training.dynamic_sampling`): the scored `batch` without its
        groups of identical rewards, topped up with fresh groups rolled out in their place,
        at most `training.dynamic_sampling_max_batches` extra rounds; `batch` itself when the
        setting is off. The result is the batch to train on (and `last_batch`); see
        `workbench.training.dynamic_sampling`."""
        self.checked_config()
        with torch.no_grad():
            return dynamic_sampling.filter_groups(self, batch)

    # -- stage 3: advantages -------------------------------------------------------------
    def _lengths(self, batch: TrajectoryBatch) -> list[int]:
        return [ep.num_tokens for ep in batch]

    @property
    def update_is_on_policy(self) -> bool:
        """True when the update takes one optimizer step on weights that sampled the batch
        (one PPO epoch, one mini-batch), so old_logprobs equal the update's own logprobs."""
        t = self.config.training
        return t.ppo_epochs == 1 and (t.mini_batch_size is None or t.mini_batch_size >= t.batch_size)

    def _reuse_update_logprobs(self) -> bool:
        t = self.config.training
        return t.reuse_update_logprobs and self.update_is_on_policy and not t.use_kl_in_reward

    @torch.no_grad()
    def compute_logprobs(self, batch: TrajectoryBatch, old_logprobs: bool = True) -> TrajectoryBatch:
        """old_logprobs (policy before the update) and ref_logprobs (if KL is used).

        old_logprobs=False skips the policy forward; `update` then takes them from its own
        forward (only valid when `update_is_on_policy`)."""
        t = self.config.training
        model = self.policy.model
        model.eval()
        lengths = self._lengths(batch)
        groups = batch.group_ids  # micro-batches keep a group (and its shared prompt) together
        # constrained turns: the masked distribution the engine sampled from (training/constrained.py)
        allowed = allowed_tokens(batch, self.tokenizer, model_vocab_size(model))
        if old_logprobs:
            batch.set("old_logprobs", batch_logprobs(model, batch.input_ids, batch.attention_mask, lengths,
                                                     t.micro_batch_size, t.autocast_bf16, batch.loss_mask, groups,
                                                     allowed, batch.tensors.get("position_ids")))
        if self.needs_reference:
            with self.policy.reference() as ref:
                batch.set("ref_logprobs", batch_logprobs(ref, batch.input_ids, batch.attention_mask, lengths,
                                                         t.micro_batch_size, t.autocast_bf16, batch.loss_mask,
                                                         groups, allowed, batch.tensors.get("position_ids")))
        return batch

    @torch.no_grad()
    def compute_values(self, batch: TrajectoryBatch) -> TrajectoryBatch:
        """Critic values per token (PPO with GAE)."""
        if self.critic is None:
            raise ConfigError("compute_values needs training.adv_estimator='gae' (the critic is built only then)")
        self.critic.eval()
        batch.set("values", batch_values(self.critic, batch.input_ids, batch.attention_mask,
                                         self._lengths(batch), self.config.training.micro_batch_size,
                                         batch.loss_mask, batch.tensors.get("position_ids")))
        return batch

    def compute_advantages(self, batch: TrajectoryBatch, old_logprobs: bool = True) -> TrajectoryBatch:
        """Logprobs, KL (penalty), values and advantages/returns for the batch.

        old_logprobs=False leaves old_logprobs (and the KL view) to `update` (see
        `training.reuse_update_logprobs`); not allowed with a KL penalty in the reward."""
        t = self.checked_config().training
        if not old_logprobs and (t.use_kl_in_reward or not self.update_is_on_policy):
            raise ConfigError("old_logprobs=False needs an on-policy update (ppo_epochs=1, one mini-batch) and "
                              "training.use_kl_in_reward=False; call compute_advantages(batch)")
        if not batch.has("token_level_scores"):
            self.score(batch)
        dynamic_sampling.check_filtered(self, batch)
        self.compute_logprobs(batch, old_logprobs=old_logprobs)
        mask = batch.loss_mask
        if batch.has("ref_logprobs") and batch.has("old_logprobs"):
            set_kl(batch, t)  # (B, T), by the estimator the run trains with
            if t.use_kl_in_reward:
                rewards, kl_value = algo.apply_kl_penalty(
                    batch.token_level_scores, batch.old_logprobs, batch.ref_logprobs, mask,
                    kl_coef=self.kl_ctrl.value, kl_penalty=t.kl_penalty)
                batch.set("token_level_rewards", rewards)
                batch.meta["kl_value"] = kl_value
                self.kl_ctrl.update(kl_value, n_steps=len(batch))
        if self.critic is not None:
            self.compute_values(batch)
        if t.adv_estimator in GROUP_RELATIVE_ESTIMATORS:
            stats = batch.group_stats()
            batch.meta.update(stats)
            if stats["reward/zero_std_group_rate"] == 1.0 and stats["reward/groups"] > 0:
                warnings.warn(
                    f"every group of this batch has identical rewards, so {t.adv_estimator} advantages are all 0 "
                    "and this update will not change the policy (reward/zero_std_group_rate=1.0); turn on "
                    "training.dynamic_sampling (flat groups resampled), make the task easier or harder, raise "
                    "training.group_size or inference.temperature, or shape the reward",
                    ZeroVarianceWarning, stacklevel=2)
        estimator = algo.get_advantage_estimator(t.adv_estimator)
        adv, ret = estimator(
            token_level_rewards=batch.token_level_rewards, response_mask=mask, index=batch.update_group_ids(),
            values=batch.tensors.get("values"), gamma=t.gamma, lam=t.lam,
            norm_adv_by_std_in_grpo=t.norm_adv_by_std_in_grpo,
        )
        batch.set("advantages", adv.float() * mask)
        batch.set("returns", ret.float())
        return batch

    # -- stage 4: update ------------------------------------------------------------------
    def update(self, batch: TrajectoryBatch) -> dict[str, float]:
        """PPO epochs over mini-batches (gradient accumulation over micro-batches), then the
        critic; the loops are `workbench.training.update` (the same functions data-parallel
        learners run)."""
        self.checked_config()
        start = time.perf_counter()
        metrics = self.stages.update(self, batch)
        metrics["perf/update_seconds"] = time.perf_counter() - start
        self.policy.model.eval()
        if self.ahead is None:
            self.engine.sync_weights(self.policy.model)
        else:  # async_fit: the rollout thread loads this copy when it starts its next batch
            self.ahead.publish(self.global_step + 1)
        return metrics

    # -- loop -------------------------------------------------------------------------------
    def train_step(self) -> dict[str, float]:
        """One full step: rollout, score, (dynamic sampling: `filter_groups`), advantages,
        update; metrics appended to history. While `sft.start_step <= global_step <
        sft.end_step` it is an SFT step instead (`sft_step`).

        Episodes without a trained token (failed at reset, ...) are left out of the update
        and counted (`rollout/failed_episodes`, a line naming them). A batch with no trained
        token at all is not updated: `NothingToTrainWarning` names the episodes' errors,
        `actor/skipped_updates` is 1, and the step still counts (the next one samples anew)."""
        s = self.checked_config().sft
        if s.start_step <= self.global_step < s.end_step:  # the run's SFT warm-up comes first (config.sft)
            return self.sft_step()
        start = time.perf_counter()
        self._updating = False
        batch = self.rollout()
        self.score(batch)
        batch = self.filter_groups(batch)  # the batch itself unless training.dynamic_sampling
        ahead = self.ahead
        stamp_versions(batch, self.global_step)  # extra rounds: sampled with this step's weights (ahead.settle)
        if ahead is not None:  # async_fit: the next steps' batches are sampled while this one trains
            ahead.fill(self.global_step)
        update_start = time.perf_counter()
        failed = failed_episodes_line(batch)
        if failed:
            write(failed)
        try:
            require_trained_tokens(batch)
        except NothingToTrainError as exc:
            warnings.warn(f"step {self.global_step} is skipped: {exc}", NothingToTrainWarning, stacklevel=2)
            update_metrics: dict[str, Any] = {"actor/skipped_updates": 1.0,
                                              "actor/skipped_reason": "no trained token in the batch"}
        else:
            self.compute_advantages(batch, old_logprobs=not self._reuse_update_logprobs())
            self._updating = True  # until global_step counts this update (see fit_loop.save_after_interrupt)
            update_metrics = self.update(batch)
        metrics: dict[str, Any] = {"step": self.global_step}
        metrics.update(batch.summary())
        metrics.update({k: float(v) for k, v in batch.meta.items() if k.startswith("rollout/")})
        metrics.update(overlong_summary(batch, self.config.reward, self._max_tokens))  # {} when off
        metrics.update(model_reward_summary(batch))  # judges and reward models: {} when off
        metrics.update(update_metrics)
        if ahead is not None:
            ahead.mark_update(update_start, time.perf_counter())
            metrics.update(staleness_metrics(batch, self.global_step))
        if batch.has("kl"):
            metrics["kl/mean"] = float(algo.masked_mean(batch.kl, batch.loss_mask))
        metrics["kl/coef"] = float(self.kl_ctrl.value)
        metrics["perf/rollout_seconds"] = batch.meta["rollout_seconds"]
        metrics["perf/tokens_per_s"] = batch.meta["generated_tokens"] / max(batch.meta["rollout_seconds"], 1e-9)
        metrics["perf/step_seconds"] = time.perf_counter() - start
        metrics["policy_loss"] = metrics.get("actor/pg_loss", float("nan"))  # the seeds' name
        self.global_step += 1
        self._updating = False
        self.metrics_history.append(metrics)
        return metrics

    def fit(self, num_epochs: int | None = None, num_iters_per_epoch: int | None = None,
            callbacks: Sequence[Callback] = (), time_limit_s: float | None = None, *,
            steps: int | None = None, until_step: int | None = None) -> list[dict[str, float]]:
        """Train in a loop, checkpointing and logging as configured; returns `metrics_history`.

        How far (give one of them):
            steps: N more steps from where the trainer is (after resuming), so running a
                cell with `fit(steps=20)` again trains 20 more.
            until_step: up to the absolute step `until_step` (`global_step == until_step`).
            num_epochs, num_iters_per_epoch: the older form, also absolute: up to step
                `sft.steps + num_epochs * num_iters_per_epoch` (either one defaults to
                `training.*`); with none of these, the same with `training.num_epochs *
                training.num_iters_per_epoch` RL steps. A run resumed from a checkpoint
                thus stops at the step it was meant to.
        The first `sft.steps` steps of a run (of a branch that sets `sft.steps`: from its
        checkpoint's step, `sft.start_step`) are SFT steps on the expert's demonstrations
        (`sft_step`; saved once as RUN/demonstrations.jsonl.gz, not seen by the doctor).
        An absolute target the trainer has already reached trains nothing and warns
        (`FitTargetReachedWarning`).

        With `time_limit_s`, training stops after the step that ends past that many seconds
        since `fit` began; `self.stop_reason` then says so (it is None after a full run) and
        callbacks see it on that step.

        Checkpoints (when `checkpoint.save_interval` is not 0): every `save_interval` steps,
        and always of the last step, however `fit` ends: steps done, time limit, or Ctrl-C
        between steps or in a rollout (the weights of the last finished step; an interrupt
        inside an update saves nothing and says so), unless the newest checkpoint holds it.

        Resumes (`resume`) from the newest valid checkpoint in `checkpoint.output_dir`
        when `checkpoint.resume` is set and no step was taken (or resumed) yet; the step
        counter continues from there. With `checkpoint.resume=False` an earlier run's
        checkpoints and logs in that folder are moved to `previous_runs/<date-time>/`
        first. While it trains, `fit` holds the folder's lock: a second run into the same
        folder raises `RunLockedError` naming the process that holds it
        (`workbench.training.run_lock`).

        With `training.max_staleness=k` (>= 1) the next k steps' batches are sampled on a
        thread while this step's trains (`workbench.training.async_fit`: what it means for the
        checkpoints, Ctrl-C and the cells after `fit`).

        Every step's metrics go to `training.loggers` (`workbench.training.loggers`), its
        scored batch to `rollouts/` in the run folder (`training.save_rollouts_every`,
        `workbench.training.run_files`), and a progress bar counts steps up to the target
        (`training.progress`). Each step's batch goes through the run doctor's checks
        (`self.doctor`, `workbench.doctor.checks`): a line per new finding, `diagnose/<name>`
        in the metrics.
        """
        return run_fit(self, num_epochs, num_iters_per_epoch, callbacks, time_limit_s, steps, until_step)

    @torch.no_grad()
    def evaluate(self, seeds: Sequence[int], temperature: float = 0.0, group_size: int = 1) -> dict[str, float]:
        """Success rate and reward on given (e.g. held-out) seeds; greedy by default.

        Environment rewards are checked as training scoring checks them
        (`workbench.reward.check_env_rewards`): a non-finite or float32-overflowing one raises
        `RewardError` naming the episode and turn, instead of a NaN mean. The batch is kept in
        `last_eval_batch` either way, to look at."""
        self.checked_config()
        self.policy.model.eval()
        rollout = self.make_rollout(seeds, group_size, temperature=temperature, sampling_seed=0)
        rollout.progress_desc = "eval"
        batch = rollout.run()
        self.last_eval_batch = batch
        try:
            for ep in batch:
                check_env_rewards(ep)
        except RewardError as exc:
            raise RewardError(f"evaluation (seeds {list(seeds)[:8]}{'...' if len(seeds) > 8 else ''}): {exc}") from exc
        s = batch.summary()
        return {"eval/success_rate": s["env/success_rate"], "eval/reward_mean": s["reward/mean"],
                "eval/episodes": float(len(batch))}

    @torch.no_grad()
    def fork(self, episode: Any, turn: int, action: str | None = None, observation: str | None = None,
             n: int = 4, temperature: float | None = None, **kwargs: Any) -> TrajectoryBatch:
        """`n` branches of a recorded `episode` parting at `turn`, sampled with this trainer's
        engine, config, environment, parser and tools, then scored like a training batch
        (`workbench.rollout.fork.fork_episode`: replay checked, `action`/`observation` edit)."""
        self.checked_config()
        self.policy.model.eval()
        if self.ahead is not None:
            self.ahead.settle()
        batch = fork_episode(episode, turn, self.engine, action=action, observation=observation, n=n,
                             config=self.config, environment=self.make_environment, parser=self.parser,
                             tools=self.tools, temperature=temperature, **kwargs)
        self.model_rewards = ModelRewards.reuse(self.config.reward, self.model_rewards)
        return score_batch(batch, self.reward_fn, self.environment, self.config.reward,
                           max_tokens=kwargs.get("max_tokens", self._max_tokens),
                           model_rewards=self.model_rewards)  # as `score`, at the branches' limit

    def metrics_df(self):
        """metrics_history as a pandas DataFrame (one row per step)."""
        import pandas as pd

        return pd.DataFrame(self.metrics_history)

    def close(self) -> None:
        """Release what the trainer holds: its engine (unless it was passed in) and the
        engine's threads, the models (accelerator memory), the Ray stages and the run folders'
        lock; the threads it started have ended when this returns. The same as `cleanup`."""
        self.cleanup()

    def cleanup(self) -> None:
        """Release the engine (unless it was passed in) and models (frees accelerator memory),
        and the run folders' lock if this trainer still holds it (see `close`)."""
        lock = getattr(self, "_run_lock", None)
        if lock is not None:
            lock.release()
        if self._owns_engine and self.engine is not None:
            self.engine.close()
        if getattr(self, "stages", None) is not None:
            self.stages.close()
            self.stages = None
        if getattr(self, "model_rewards", None) is not None:
            self.model_rewards.close()
            self.model_rewards = None
        for name in ("engine", "critic", "policy", "optimizer", "critic_optimizer"):
            setattr(self, name, None)
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()

    # -- display ----------------------------------------------------------------------------
    def __repr__(self) -> str:
        t = self.config.training
        last = self.metrics_history[-1] if self.metrics_history else {}
        return (f"Trainer({t.adv_estimator}, model={self.config.model.path}, backend={self.config.inference.backend}, "
                f"step={self.global_step}, reward={last.get('reward/mean', float('nan')):.3g}, "
                f"success={format_rate(last.get('env/success_rate'))})")

    def _repr_html_(self) -> str:
        rows = "".join(f"<tr><td>{k}</td><td>{v:.4g}</td></tr>" for k, v in
                       (self.metrics_history[-1] if self.metrics_history else {}).items()
                       if isinstance(v, (int, float)))
        return f"<p><b>{self!r}</b></p><table>{rows}</table>"


def _default_env(config: ConfigStore) -> Any:
    """The environment `config.environment` names (see `workbench.environments.registry.make_env`)."""
    return make_env(config.environment.name, config.environment)


