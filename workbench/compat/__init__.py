"""Compatibility layers: the seeds' and verl's names and formats, on top of the core.

| module          | what                                                                          |
|-----------------|-------------------------------------------------------------------------------|
| `seed_api`      | seed 000's pipeline: `InferenceEngine(model_path)`, `MultiTurnChatHarness`, `PPOTrainer`, its games |
| `inference`     | the seeds' text inference API: `create_inference_engine`, `MultiTurnInferenceEngine`, `BatchInferenceManager` |
| `verl_data`     | verl's `RLHFDataset`, `collate_fn` and the `DataProto` view of a batch         |
| `verl_config`   | verl's YAML (`trainer`, `data`, `actor_rollout_ref`, ...) into `ConfigStore`, one mapping table |
| `verl_compat`   | verl's `RayPPOTrainer(config, tokenizer, role_worker_mapping, ...)`, `Role`, `ResourcePoolManager`, reward wrappers |
| `verl_runtime`  | interaction and tool classes for verl's multi-turn agent loop (imports verl)   |
| `verl_export`   | `workbench export-verl`: an environment and its tools as a verl job            |

No core module imports this package (a test checks it); `import workbench` re-exports
its public names, and the modules' old paths (`workbench.verl_config`, ...) still import.
"""
