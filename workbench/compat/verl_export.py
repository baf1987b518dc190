"""`python -m workbench export-verl`: a folder that verl's multi-turn agent loop runs.

    python -m workbench export-verl --env guess_number --out verl_gn
    python -m workbench export-verl --config runs/train/config.yaml --env arithmetic --out verl_ar

    from workbench.compat.verl_export import export_verl, to_verl
    export_verl(config, "verl_gn")         # the same from a ConfigStore
    to_verl(config)                        # just the trainer config, as a nested dict

What the folder holds (NAME is the environment's name made into an identifier):

  * `NAME_verl.py`: `NameInteraction` (and `NameTool` when the environment has tools),
    subclasses of `workbench.compat.verl_runtime.WorkbenchInteraction` / `WorkbenchTool` that
    carry the environment's import path, its `EnvironmentConfig` and the `reward`
    weights; and `compute_score`, verl's custom reward function.
  * `interaction.yaml`, `tools.yaml`: the files verl's
    `initialize_interactions_from_config` / `initialize_tools_from_config` read.
  * `train.parquet`, `val.parquet`: one row per environment seed, in the columns
    verl's `RLHFDataset` reads: `prompt` (the system prompt and the first observation
    of `env.reset(seed)`), `data_source`, `agent_name`, `reward_model.ground_truth`
    (the seed as text; the reward function does not read it), `extra_info` (`index`,
    `seed`, `split`, `interaction_kwargs` = {name, seed}, and `tools_kwargs` =
    {tool: {create_kwargs: {seed}}} when there are tools).
  * `verl_trainer.yaml`: verl's `ppo_trainer` config with our `ConfigStore` mapped onto
    it (`to_verl`) and the multi-turn settings that point at the files above.
  * `README.md`: the command line.

`to_verl` reads `workbench.compat.verl_config.MAPPING` (the verl -> workbench table) backwards:
every verl key in it gets the value of its workbench field, except the keys verl's
`ppo_trainer.yaml` does not have (`NOT_IN_VERL`) and fields that are None (verl's
default stays; a value that only its inverse makes None, keep_last_n = 0, is written as
null). `REVERSE` holds the inverse of each converter that is not the identity, and the
count changes (verl counts prompts where we count episodes). Export-only keys (paths,
`rollout.mode`, the agent loop, the reward function, trainer.project_name,
trainer.logger) are set in `trainer_yaml`.

The environment is built as workbench's Trainer builds it, `make_env(environment.name,
config.environment)`, so its `max_steps` is `environment.max_steps`.
"""
from __future__ import annotations

import argparse
import ast
import dataclasses
import json
import pprint
import re
from pathlib import Path
from typing import Any, Callable

import yaml

from workbench.compat.verl_config import MAPPING, _same
from workbench.compat.verl_runtime import verl_tool_schema
from workbench.config import EMBEDDED_MODEL, ConfigError, ConfigStore

#: The Hugging Face id of the embedded model (verl loads models by id or folder).
EMBEDDED_HF_ID = "HuggingFaceTB/SmolLM2-135M-Instruct"
#: Keys of `MAPPING` that verl 0.7.1's ppo_trainer config does not have (seed configs put them there).
NOT_IN_VERL = ("trainer.seed", "algorithm.clip_ratio")
#: Rollout engines verl's agent loop serves (async servers); others export as "vllm".
VERL_ROLLOUTS = ("vllm", "sglang")
#: Seeds of the validation rows start here (the CLI's held-out seeds).
VAL_SEED_START = 10_000


def _prompts(config: ConfigStore, episodes: int, field: str) -> int:
    n = config.training.group_size
    if episodes % n:
        raise ConfigError(f"{field} ({episodes}) must be a multiple of training.group_size ({n}): verl counts "
                          f"prompts, each rolled out rollout.n = group_size times")
    return episodes // n


def _model_path(value: Any, config: ConfigStore) -> str:
    path = config.model.path
    return EMBEDDED_HF_ID if path == EMBEDDED_MODEL else path


def _prompt_length(value: Any, config: ConfigStore) -> int:
    length = config.inference.max_context_tokens - config.inference.max_tokens
    if length <= 0:
        raise ConfigError(f"inference.max_context_tokens ({config.inference.max_context_tokens}) must exceed "
                          f"inference.max_tokens ({config.inference.max_tokens}): verl's data.max_prompt_length "
                          "is their difference")
    return length


#: verl key -> fn(workbench value, config) -> verl value, for the keys whose converter in
#: `MAPPING` is not the identity, and those whose count or meaning differs.
REVERSE: dict[str, Callable[[Any, ConfigStore], Any]] = {
    "trainer.device": lambda v, c: "cuda" if v == "auto" or str(v).startswith("cuda") else v,
    "trainer.save_freq": lambda v, c: v if v > 0 else -1,
    "trainer.max_actor_ckpt_to_keep": lambda v, c: v if v else None,
    "trainer.resume_mode": lambda v, c: "disable" if v is False else "auto",
    "algorithm.kl_ctrl.type": lambda v, c: "adaptive" if v else "fixed",
    "actor_rollout_ref.hybrid_engine": lambda v, c: True,
    "actor_rollout_ref.model.path": _model_path,
    "actor_rollout_ref.model.lora_rank": lambda v, c: v if c.model.use_lora else 0,
    "data.train_batch_size": lambda v, c: _prompts(c, v, "training.batch_size"),
    "actor_rollout_ref.actor.ppo_mini_batch_size": lambda v, c: _prompts(
        c, c.training.batch_size if v is None else v, "training.mini_batch_size"),
    "data.max_prompt_length": _prompt_length,
    "actor_rollout_ref.actor.clip_ratio_low": lambda v, c: c.training.clip_ratio if v is None else v,
    "actor_rollout_ref.actor.clip_ratio_high": lambda v, c: c.training.clip_ratio if v is None else v,
    "actor_rollout_ref.rollout.name": lambda v, c: v if v in VERL_ROLLOUTS else "vllm",
    "actor_rollout_ref.rollout.multi_turn.enable": lambda v, c: True,
}


def to_verl(config: ConfigStore) -> dict[str, Any]:
    """verl's nested config sections for `config`, from `MAPPING` read backwards (module docstring)."""
    missing = [k for k, (_, conv) in MAPPING.items() if conv is not _same and k not in REVERSE]
    if missing:  # a converter was added to MAPPING without its inverse here
        raise ConfigError(f"workbench.compat.verl_export.REVERSE has no inverse for {missing}")
    out: dict[str, Any] = {}
    for key, (target, _) in MAPPING.items():
        if key in NOT_IN_VERL:
            continue
        raw = None
        if target is not None:
            section, name = target.split(".")
            raw = getattr(getattr(config, section), name)
        value = REVERSE[key](raw, config) if key in REVERSE else raw
        if value is None and raw is None:  # unset here: verl's default stays
            continue
        node = out
        *parents, leaf = key.split(".")
        for part in parents:
            node = node.setdefault(part, {})
        node[leaf] = list(value) if isinstance(value, tuple) else value
    return out


def slug(spec: str) -> str:
    """An identifier for the environment: the name, or the class / id of a `module:Class` / `scheme:id` spec."""
    text = spec.rsplit(":", 1)[-1].rsplit(".", 1)[-1] if ":" in spec and "." in spec.split(":")[0] else spec
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])", "_", text)
    text = re.sub(r"\W+", "_", text).strip("_").lower() or "env"
    return "env_" + text if text[0].isdigit() else text


def _camel(name: str) -> str:
    return "".join(part.capitalize() for part in name.split("_") if part)


def _literal(value: Any, what: str) -> str:
    text = pprint.pformat(value, width=100, sort_dicts=False)
    try:
        same = ast.literal_eval(text) == value
    except (ValueError, SyntaxError):
        same = False
    if not same:
        raise ConfigError(f"{what} must hold plain values (str, numbers, bool, None, lists, dicts) to be written "
                          f"into the generated module; got {value!r}")
    return text


def env_source(config: ConfigStore) -> tuple[Any, str, dict[str, Any]]:
    """(environment, spec that rebuilds it, its config as a dict), built as workbench's Trainer does."""
    from workbench.environments.registry import describe_env, make_env

    try:
        env = make_env(config.environment.name, config.environment)
    except (ValueError, TypeError) as exc:  # unknown params, bad values: the message names them
        raise ConfigError(f"environment {config.environment.name!r} with environment.params "
                          f"{config.environment.params}: {exc}") from exc
    described = describe_env(env)
    spec = described.import_path if ":" not in described.name else described.name
    if spec.startswith("__main__:"):
        raise ConfigError(f"environment class {spec} is defined in __main__ (a notebook or script); move it to "
                          "a module that verl's workers can import")
    env_config = dataclasses.asdict(described)
    env_config.pop("import_path", None)
    env_config["name"] = spec
    rebuilt = make_env(spec, dict(env_config))
    if rebuilt.reset(seed=0) != env.reset(seed=0):
        raise ConfigError(f"the environment rebuilt from {spec} with its recorded config gives a different "
                          f"first observation for seed 0 than {config.environment.name!r}; export a spec "
                          "that rebuilds it (module:Class with its params)")
    return env, spec, env_config


def module_text(name: str, spec: str, env_config: dict, reward: dict, has_tools: bool) -> str:
    """The generated `NAME_verl.py`."""
    cls = _camel(name)
    parts = [
        f'"""verl classes for the workbench environment {spec}, written by `python -m workbench export-verl`.\n\n'
        f"verl imports {cls}Interaction (interaction.yaml){f' and {cls}Tool (tools.yaml)' if has_tools else ''} "
        "from this module\nand loads compute_score from this file (reward.custom_reward_function); see README.md.\n"
        '"""',
        "from workbench.compat.verl_runtime import WorkbenchInteraction, WorkbenchTool, compute_score  # noqa: F401",
        "",
        "#: The environment's import path (`workbench.make_env(ENV_SPEC, ENV_CONFIG)` builds it).",
        f"ENV_SPEC = {spec!r}",
        "#: Its EnvironmentConfig as a dict (fields and params).",
        f"ENV_CONFIG = {_literal(env_config, 'the environment config')}",
        "#: RewardManager weights (the `reward` config section) that shape the turn rewards.",
        f"REWARD_CONFIG = {_literal(reward, 'the reward config')}",
        "", "",
        f"class {cls}Interaction(WorkbenchInteraction):",
        f'    """{spec} as a verl interaction."""',
        "", "    env_spec = ENV_SPEC", "    env_config = ENV_CONFIG", "    reward_config = REWARD_CONFIG",
    ]
    if has_tools:
        parts += ["", "", f"class {cls}Tool(WorkbenchTool):", f'    """A tool of {spec} as a verl tool."""',
                  "", "    env_spec = ENV_SPEC", "    env_config = ENV_CONFIG"]
    return "\n".join(parts) + "\n"


def dataset_rows(env: Any, name: str, seeds: list[int], split: str, tool_names: list[str]) -> list[dict]:
    """One verl dataset row per seed (the columns in the module docstring)."""
    rows = []
    for index, seed in enumerate(seeds):
        obs = env.reset(seed=seed)
        extra: dict[str, Any] = {"split": split, "index": index, "seed": seed,
                                 "interaction_kwargs": {"name": name, "seed": seed}}
        if tool_names:
            extra["tools_kwargs"] = {t: {"create_kwargs": {"seed": seed}} for t in tool_names}
        rows.append({"data_source": f"workbench/{name}", "agent_name": "tool_agent",
                     "prompt": [{"role": "system", "content": env.get_prompt_prefix()},
                                {"role": "user", "content": obs}],
                     "reward_model": {"ground_truth": str(seed)}, "extra_info": extra})
    return rows


def trainer_yaml(config: ConfigStore, name: str, module: str, has_tools: bool) -> dict[str, Any]:
    """`verl_trainer.yaml`: verl's ppo_trainer defaults, `to_verl(config)` and the multi-turn settings."""
    data = to_verl(config)
    data.setdefault("trainer", {}).setdefault("experiment_name", name)
    data["trainer"].update(project_name="workbench", logger=["console"])
    data.setdefault("data", {}).update(train_files="train.parquet", val_files="val.parquet", return_raw_chat=True)
    rollout = data["actor_rollout_ref"]["rollout"]
    rollout["mode"] = "async"
    rollout["multi_turn"].update(interaction_config_path="interaction.yaml", format="hermes",
                                 tool_config_path="tools.yaml" if has_tools else None)
    rollout["agent"] = {"default_agent_loop": "tool_agent"}
    data["reward"] = {"custom_reward_function": {"path": f"{module}.py", "name": "compute_score"}}
    return {"hydra": {"searchpath": ["pkg://verl.trainer.config"]}, "defaults": ["ppo_trainer", "_self_"], **data}


README = """# verl export of `{spec}`

Written by `python -m workbench export-verl`. verl 0.7.1 (verl 0.8 dropped interactions)
runs this environment with its multi-turn tool agent loop; from this folder:

```bash
cd {out}
PYTHONPATH="$PWD:$PYTHONPATH" python -m verl.trainer.main_ppo --config-path "$PWD" --config-name verl_trainer \\
    data.train_files="$PWD/train.parquet" data.val_files="$PWD/val.parquet" \\
    actor_rollout_ref.rollout.multi_turn.interaction_config_path="$PWD/interaction.yaml" \\{tool_override}
    reward.custom_reward_function.path="$PWD/{module}.py"
```

`verl_trainer.yaml` names these files by relative paths; the command gives them as
absolute paths because verl's Ray workers need not run in this folder. `PYTHONPATH`
makes `{module}` importable by verl's processes. Every process (every node of a
cluster) must be able to import `workbench`, `{import_module}` and `{module}`, and read
the files at these paths. Add more overrides as usual, e.g. `trainer.n_gpus_per_node=1`
(verl's default is 8).

## Files

| file | what it is |
|---|---|
| `{module}.py` | {classes}, which hold the environment's import path, config and reward weights, and `compute_score`, the reward function |
| `interaction.yaml` | verl's interaction config: interaction `{name}` is `{module}.{cls}Interaction` |
{tools_file}| `train.parquet` | {train} rows, seeds {train_range}: the system prompt and `env.reset(seed)` as the prompt, `extra_info.interaction_kwargs` = {{name: {name}, seed}} |
| `val.parquet` | {val} rows, seeds {val_range} |
| `verl_trainer.yaml` | verl's `ppo_trainer` defaults with this run's config mapped onto them (`workbench.compat.verl_export.to_verl`) and `actor_rollout_ref.rollout.multi_turn` pointing at the files above |

## What verl does with them

Each row is rolled out `actor_rollout_ref.rollout.n` = {n} times. The interaction
resets the environment with the row's seed; each assistant message without a tool call
is one `env.step`, whose observation comes back as the next user message and whose
reward is that turn's score (shaped by the `reward` weights {reward}).
{tool_sentence}The episode ends when the environment is done, after
`multi_turn.max_assistant_turns` = {max_turns} assistant turns, or when the response
reaches `actor_rollout_ref.rollout.response_length` tokens; verl checks the last two
before the interaction, so the message that reaches either limit is not an environment
step. `compute_score` adds up the turn scores (and tool rewards) into the response's
reward.

Notes on the mapping:

* verl counts `data.max_response_length` and `actor_rollout_ref.rollout.response_length`
  over the whole conversation (every assistant turn and every observation); both are
  exported as `inference.max_tokens` = {max_tokens} (per turn in workbench), so raise
  both for multi-turn runs, e.g. `data.max_response_length={suggested}
  actor_rollout_ref.rollout.response_length={suggested}`.
* one epoch is {steps} step(s) of `data.train_batch_size` = {prompts} prompts (verl drops an incomplete
  last batch); `trainer.total_epochs` = {epochs}.
{notes}"""


def export_verl(config: ConfigStore, out_dir: str | Path, train_size: int | None = None,
                val_size: int = 32) -> dict[str, Path]:
    """Write the folder (module docstring) for `config.environment`; returns the paths by file kind.

    Args:
        config: the run's config (its environment, training, inference, model, reward sections).
        out_dir: the folder (created; files in it are overwritten).
        train_size: rows in train.parquet (seeds 0..N-1); None: `num_iters_per_epoch`
            steps of `batch_size / group_size` prompts, so a verl epoch is our epoch.
        val_size: rows in val.parquet (seeds from 10000, the CLI's held-out seeds); >= 1.
    """
    import pandas as pd

    on = [f"reward.{k}" for k in ("judge", "group_judge", "reward_model") if getattr(config.reward, k) is not None]
    if on:  # the exported reward function computes the environment's reward only: say so, do not drop them
        raise ConfigError(f"{', '.join(on)} cannot be exported: the folder's reward function (compute_score) adds up "
                          "the environment's turn rewards only; set them to null to export, and give verl its own "
                          "reward model (reward_model.enable, reward_model.model.path)")
    env, spec, env_config = env_source(config)
    name = slug(config.environment.name)
    module, cls = f"{name}_verl", _camel(name)
    tools = list(env.get_tools() or [])
    tool_names = [t.name for t in tools]
    trainer = trainer_yaml(config, name, module, bool(tools))
    prompts = trainer["data"]["train_batch_size"]
    if train_size is None:
        train_size = prompts * config.training.num_iters_per_epoch
    if train_size < prompts or val_size < 1:
        raise ConfigError(f"the train size must be at least data.train_batch_size = {prompts} prompts (verl drops "
                          f"an incomplete last batch) and the val size at least 1; got {train_size} and {val_size}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = {"module": out / f"{module}.py", "interaction": out / "interaction.yaml",
             "train": out / "train.parquet", "val": out / "val.parquet", "trainer": out / "verl_trainer.yaml",
             "readme": out / "README.md"}
    reward = dataclasses.asdict(config.reward)
    paths["module"].write_text(module_text(name, spec, env_config, reward, bool(tools)))
    interaction = {"interaction": [{"name": name, "class_name": f"{module}.{cls}Interaction",
                                    "config": {"max_live_episodes": 4096}}]}
    paths["interaction"].write_text(yaml.safe_dump(interaction, sort_keys=False))
    if tools:
        paths["tools"] = out / "tools.yaml"
        entries = [{"class_name": f"{module}.{cls}Tool", "config": {"type": "native", "tool_name": t.name},
                    "tool_schema": verl_tool_schema(t)} for t in tools]
        paths["tools"].write_text(yaml.safe_dump({"tools": entries}, sort_keys=False))
    elif (out / "tools.yaml").exists():
        (out / "tools.yaml").unlink()  # from an earlier export of an environment with tools
    val_seeds = list(range(VAL_SEED_START, VAL_SEED_START + val_size))
    for split, seeds in (("train", list(range(train_size))), ("val", val_seeds)):
        pd.DataFrame(dataset_rows(env, name, seeds, split, tool_names)).to_parquet(paths[split], index=False)
    paths["trainer"].write_text("# written by python -m workbench export-verl; see README.md\n"
                                + yaml.safe_dump(trainer, sort_keys=False))
    notes = []
    if config.inference.backend not in VERL_ROLLOUTS:
        notes.append(f"* `inference.backend` = {config.inference.backend!r} has no verl agent-loop rollout; "
                     "`actor_rollout_ref.rollout.name` is \"vllm\".")
    if config.model.path == EMBEDDED_MODEL:
        notes.append(f"* the embedded model {EMBEDDED_MODEL!r} is `actor_rollout_ref.model.path` = {EMBEDDED_HF_ID}.")
    if config.training.dynamic_sampling:
        notes.append(f"* `training.dynamic_sampling` is not exported: verl's DAPO recipe has it as "
                     f"`algorithm.filter_groups.enable=true` with `max_num_gen_batches` (which counts the step's own "
                     f"batch: {config.training.dynamic_sampling_max_batches + 1} here).")
    if config.reward.overlong_penalty:
        notes.append(f"* `reward.overlong_penalty` is not exported (`compute_score` has no reply lengths): verl's "
                     f"`dapo` reward manager has it as `overlong_buffer.enable=true`, `len` = "
                     f"{config.reward.overlong_buffer}, `penalty_factor` = {config.reward.overlong_penalty:g}.")
    r = trainer["actor_rollout_ref"]["rollout"]
    paths["readme"].write_text(README.format(
        spec=spec, out=out, module=module, cls=cls, name=name, import_module=spec.split(":")[0],
        tool_override=('\n    actor_rollout_ref.rollout.multi_turn.tool_config_path="$PWD/tools.yaml" \\'
                       if tools else ""),
        classes=(f"`{cls}Interaction` and `{cls}Tool`, subclasses of `workbench.compat.verl_runtime.WorkbenchInteraction`"
                 " and `WorkbenchTool`" if tools else
                 f"`{cls}Interaction`, a subclass of `workbench.compat.verl_runtime.WorkbenchInteraction`"),
        tools_file=(f"| `tools.yaml` | verl's tool config: {', '.join(f'`{t}`' for t in tool_names)} is "
                    f"`{module}.{cls}Tool`, with verl's OpenAI function schema |\n") if tools else "",
        train=train_size, train_range=f"0..{train_size - 1}", val=val_size,
        val_range=f"{VAL_SEED_START}..{VAL_SEED_START + val_size - 1}",
        n=r["n"], reward=json.dumps(reward), max_turns=r["multi_turn"]["max_assistant_turns"],
        tool_sentence=(f"A message with a tool call ({', '.join(tool_names)}) runs the tool instead: its result "
                       "comes back as a tool message and is not an environment step.\n") if tools else "",
        max_tokens=config.inference.max_tokens,
        suggested=config.inference.max_tokens * config.inference.max_turns * 2,
        steps=train_size // prompts, prompts=prompts, epochs=config.training.num_epochs,
        notes="\n".join(notes) + ("\n" if notes else "")))
    return paths


def cmd_export_verl(args: argparse.Namespace) -> int:
    """The `export-verl` command: build the config (--config, --env, --env-param) and export."""
    from workbench.environments.params import apply_env_params

    config = ConfigStore.load(args.config) if getattr(args, "config", None) else ConfigStore()
    if getattr(args, "env", None):
        config.environment.name = args.env
    if "," in config.environment.name:
        raise ConfigError(f"export-verl exports one environment; --env {config.environment.name!r} names several")
    apply_env_params(config, getattr(args, "env_param", None) or [])
    config.validate()
    paths = export_verl(config, args.output, train_size=args.train_size, val_size=args.val_size)
    for kind, path in paths.items():
        print(f"{kind:12s} {path}")
    print(f"run it: see {paths['readme']}")
    return 0
