"""Learning: policy/reference/critic models, the stepwise Trainer, checkpoints.

    models.py            build_models(config): policy, reference, critic and AdamW, for the trainer and the learners
    policy.py            LoRA policy, adapter-disabled reference, critic, batched logprobs
    packing.py           a group's completions packed behind one copy of the shared prompt
    lora_linear.py       peft's LoRA linear as one autograd node where that is exact (LeanLoraLinear)
    fp32_products.py     the update's products with frozen bf16 base weights in fp32 where the CPU runs those faster
    head_logprobs.py     trained tokens' logprobs and entropies from the LM head's input, a chunk of rows at a time
    update.py            the actor and critic update loops as functions (one process or a learner rank)
    guards.py            an optimizer step that cannot leave the weights non-finite (or half done)
    run_lock.py          one writer per run folder (an OS lock from first write to last; pid + host for the message); earlier runs moved aside
    trainer.py           Trainer: rollout -> score -> advantages -> update, fit
    fit_loop.py          the loop behind fit: step target, lock, logs, doctor, checkpoints, time limit, Ctrl-C
    sft.py               SFT warm-up: an environment's scripted expert plays, the policy learns its turns
    dynamic_sampling.py  DAPO dynamic sampling: groups without reward variance dropped and resampled
    async_fit.py         max_staleness=k: the next k batches sampled on a thread while this one trains
    branch.py            a run branched from a checkpoint with settings changed (train --from, Trainer.from_checkpoint)
    stages.py            where rollout and update run: LocalStages here, or RayStages (ray.use_ray), same methods
    checkpoint.py        safetensors + JSON checkpoints, manifest, atomic same-path saves, recovery
    loggers.py           jsonl, tensorboard, trackio, wandb sinks for fit
    metrics_file.py      metrics.jsonl: appended per step, continued correctly after a resume
    run_files.py         each step's batch in RUN/rollouts/, held-out batches in RUN/evals/ (the run folder layout)
"""
from workbench.training.checkpoint import CheckpointError, latest_checkpoint
from workbench.training.policy import Critic, Policy
from workbench.training.trainer import Trainer
