"""What verl's multi-turn agent loop runs: one of our environments as a verl interaction,
its tools as verl tools, and the reward function that adds up their scores.

    from workbench.compat.verl_runtime import WorkbenchInteraction, WorkbenchTool  # imports verl

`python -m workbench export-verl` (`workbench.compat.verl_export`) writes a small module that
subclasses these two with the environment's import path and config; verl imports that
module by the class names in `interaction.yaml` / `tools.yaml`. `WorkbenchInteraction`
and `WorkbenchTool` subclass verl's `BaseInteraction` / `BaseTool`, so they are built on
first access (this module imports without verl; the two names need it).

How verl 0.7.1's `ToolAgentLoop` (`verl.experimental.agent_loop.tool_agent_loop`) drives
them, and what they do:

  * One interaction object per agent-loop worker serves many episodes at once, each
    under verl's request id. `start_interaction(request_id, name=..., seed=...)` (the
    row's `extra_info.interaction_kwargs`) builds the environment with
    `workbench.make_env(env_spec, env_config)` and resets it with `seed`.
  * After an assistant turn without a tool call, `generate_response(request_id,
    messages, **interaction_kwargs)` steps the environment with the last assistant
    message. It returns (episode over, observation, turn reward, info); verl appends the
    observation as a user message and records the turn reward in `turn_scores`.
  * A turn with a tool call goes to the tool instead (not an environment step):
    `create` / `execute` / `release` per call. `execute` runs our tool through a
    `ToolRegistry`, so the text is what workbench's own tool loop shows the model
    (including its error messages); the tool reward is 0.0.
  * Turn rewards are shaped with the `reward` config section (`RewardManager`): each is
    the change in the shaped score of the episode so far, so an episode's turn rewards
    add up to the score workbench gives it. With the default weights they are the
    environment's own rewards.
  * `compute_score` (verl's `reward.custom_reward_function`) returns the sum of
    `turn_scores` and `tool_rewards`, which verl's reward loop passes in `extra_info`.

verl 0.7.1 never calls `finalize_interaction`, so an episode's state stays until it is
finalized or until more than `max_live_episodes` (interaction config, default 4096)
episodes are open, when the oldest are dropped. `env.on_truncate` is not called.
"""
from __future__ import annotations

import asyncio
import copy
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any, Mapping
from uuid import uuid4

from workbench.environments.registry import make_env
from workbench.reward import RewardManager
from workbench.tools.builtin import normalize_step_output
from workbench.tools.registry import ToolRegistry

#: How to install verl without its GPU dependencies (the base classes, schemas and config loaders only).
VERL_INSTALL = ("pip install --no-deps verl==0.7.1 tensordict==0.10.0 'pyvers>=0.1,<0.2' && "
                "pip install hydra-core==1.3.2 pydantic ray")


def verl_tool_schema(tool: Any) -> dict[str, Any]:
    """Our tool's OpenAI function schema in the subset verl's `OpenAIFunctionToolSchema`
    accepts: each property gets one `type` string (the first non-null type of a list,
    "string" when the schema has none), `enum` values become strings, and keys verl has
    no field for (`items`, `default`, `additionalProperties`) are left out."""
    definition = tool.definition
    params = definition.parameters or {}
    properties: dict[str, Any] = {}
    for pname, pschema in (params.get("properties") or {}).items():
        ptype = pschema.get("type", "string")
        if isinstance(ptype, list):
            ptype = next((t for t in ptype if t != "null"), "string")
        prop: dict[str, Any] = {"type": str(ptype)}
        if pschema.get("description"):
            prop["description"] = str(pschema["description"])
        if "enum" in pschema:
            prop["enum"] = [str(v) for v in pschema["enum"]]
        properties[pname] = prop
    return {"type": "function",
            "function": {"name": definition.name, "description": definition.description or definition.name,
                         "parameters": {"type": "object", "properties": properties,
                                        "required": list(params.get("required") or [])}}}


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Mapping | None = None,
                  **kwargs: Any) -> float:
    """verl's custom reward function: the episode's turn rewards plus its tool rewards.

    verl's reward loop puts the agent loop's `turn_scores` (one per `generate_response`)
    and `tool_rewards` into `extra_info`; `solution_str` and `ground_truth` are not read.
    """
    extra_info = extra_info or {}
    if "turn_scores" not in extra_info:
        raise ValueError(
            f"extra_info of a {data_source!r} response has no 'turn_scores' (keys: {sorted(extra_info)}): "
            "run verl with the multi-turn tool agent loop (actor_rollout_ref.rollout.multi_turn.enable=true, "
            "agent name 'tool_agent') and its reward loop, which pass the interaction's turn rewards here")
    turn = [float(x) for x in (extra_info.get("turn_scores") if extra_info.get("turn_scores") is not None else [])]
    tools = [float(x) for x in (extra_info.get("tool_rewards") if extra_info.get("tool_rewards") is not None else [])]
    return float(sum(turn) + sum(tools))


def _last_assistant_text(messages: list[dict[str, Any]]) -> str:
    """The text of the last assistant message (text parts joined for list contents)."""
    for message in reversed(messages or []):
        if message.get("role") == "assistant":
            content = message.get("content") or ""
            if isinstance(content, list):
                content = "".join(p.get("text", "") for p in content if isinstance(p, Mapping))
            return str(content)
    raise ValueError("generate_response: messages hold no assistant message to use as the action")


@dataclass
class EpisodeState:
    """One open episode of `EnvInteraction`: its environment and what it returned."""

    env: Any
    """The environment (built by `make_env`, reset with the row's seed)."""
    seed: int | None
    """The seed it was reset with."""
    rewards: list[float] = field(default_factory=list)
    """Environment rewards, one per step."""
    infos: list[dict] = field(default_factory=list)
    """The `info` dict of each step."""
    done: bool = False
    """Whether the episode has ended."""


class EnvInteraction:
    """The interaction logic (verl-free). `WorkbenchInteraction` adds verl's `BaseInteraction`.

    Subclasses set `env_spec` (what `make_env` builds, an import path) and `env_config`
    (the `EnvironmentConfig` as a dict), and optionally `reward_config` (`RewardManager`
    weights). Interaction config keys: `name` (set by verl), `max_live_episodes`.
    """

    env_spec: str = ""
    env_config: Mapping[str, Any] = {}
    reward_config: Mapping[str, Any] = {}

    def __init__(self, config: dict[str, Any]):
        super().__init__(config)  # BaseInteraction: self.config, self.name
        if not self.env_spec:
            raise TypeError(f"{type(self).__name__} must set env_spec (an environment import path such as "
                            "'envs.guess_number:GuessNumberEnv'); export-verl writes it")
        self.max_live_episodes = int(config.get("max_live_episodes", 4096))
        if self.max_live_episodes < 1:
            raise ValueError(f"max_live_episodes must be >= 1, got {self.max_live_episodes}")
        self.shaping = RewardManager.from_config(dict(self.reward_config) or None)
        self.episodes: OrderedDict[str, EpisodeState] = OrderedDict()

    def make_env(self) -> Any:
        """A fresh environment from `env_spec` and a copy of `env_config`."""
        return make_env(self.env_spec, copy.deepcopy(dict(self.env_config)))

    def episode(self, instance_id: str) -> EpisodeState:
        """The open episode `instance_id` (KeyError saying why when there is none)."""
        if instance_id not in self.episodes:
            raise KeyError(f"no open episode {instance_id!r}: call start_interaction first (episodes are dropped "
                           f"by finalize_interaction, or oldest-first past max_live_episodes="
                           f"{self.max_live_episodes})")
        return self.episodes[instance_id]

    def shaped_score(self, state: EpisodeState) -> float:
        """The `RewardManager` score of the episode's steps so far."""
        trajectory = {"rewards": state.rewards, "infos": state.infos, "num_turns": len(state.rewards),
                      "success": any(bool((i or {}).get("success")) for i in state.infos)}
        return self.shaping.compute_trajectory_reward(trajectory, state.env)

    async def start_interaction(self, instance_id: str | None = None, seed: int | None = None,
                                **kwargs: Any) -> str:
        """Build the environment, reset it with `seed`, and return the instance id."""
        instance_id = instance_id or uuid4().hex
        env = self.make_env()
        seed = None if seed is None else int(seed)
        env.reset(seed=seed)
        self.episodes[instance_id] = EpisodeState(env=env, seed=seed)
        while len(self.episodes) > self.max_live_episodes:
            self.episodes.popitem(last=False)
        return instance_id

    async def generate_response(self, instance_id: str, messages: list[dict[str, Any]],
                                **kwargs: Any) -> tuple[bool, str, float, dict[str, Any]]:
        """Step the environment with the last assistant message.

        Returns (episode over, observation, turn reward, info), where the turn reward is
        the change in the shaped score and info holds `env_reward`, `success`,
        `invalid_action` and `step`.
        """
        state = self.episode(instance_id)
        if state.done:
            return True, "The episode is over.", 0.0, {"env_reward": 0.0, "success": False,
                                                       "invalid_action": False, "step": state.env.step_count}
        before = self.shaped_score(state)
        obs, reward, done, info = normalize_step_output(state.env.step(_last_assistant_text(messages)))
        state.rewards.append(float(reward))
        state.infos.append(dict(info or {}))
        state.done = bool(done) or bool(state.env.is_done())
        extra = {"env_reward": float(reward), "success": bool((info or {}).get("success", False)),
                 "invalid_action": bool((info or {}).get("invalid_action", False)),
                 "step": int(state.env.step_count)}
        return state.done, str(obs), self.shaped_score(state) - before, extra

    async def calculate_score(self, instance_id: str | None = None, **kwargs: Any) -> float:
        """The shaped score of episode `instance_id` so far (the sum of its turn rewards)."""
        if instance_id is None:
            raise TypeError("calculate_score needs the instance id that start_interaction returned")
        return self.shaped_score(self.episode(instance_id))

    async def finalize_interaction(self, instance_id: str | None = None, **kwargs: Any) -> None:
        """Drop episode `instance_id` (no-op when it is not open)."""
        if instance_id is not None:
            self.episodes.pop(instance_id, None)


class EnvTool:
    """The tool logic (verl-free). `WorkbenchTool` adds verl's `BaseTool`.

    Subclasses set `env_spec` and `env_config`; the tool is the one of
    `env.get_tools()` named like the verl tool schema's function (or config
    `tool_name` when verl passes no schema). Config keys: `type` (verl's, "native"),
    `tool_name`, `timeout` (seconds per call, default 10; null = no limit).
    """

    env_spec: str = ""
    env_config: Mapping[str, Any] = {}
    _schema_cls: Any = None  # verl's OpenAIFunctionToolSchema, set by _verl_classes
    _response_cls: Any = None  # verl's ToolResponse

    def __init__(self, config: dict[str, Any], tool_schema: Any = None):
        if not self.env_spec:
            raise TypeError(f"{type(self).__name__} must set env_spec (an environment import path); "
                            "export-verl writes it")
        name = tool_schema.function.name if tool_schema is not None else config.get("tool_name")
        tools = make_env(self.env_spec, copy.deepcopy(dict(self.env_config))).get_tools()
        by_name = {t.name: t for t in tools}
        if name not in by_name:
            raise ValueError(f"{self.env_spec} has no tool {name!r}; its tools: {sorted(by_name) or 'none'} "
                             "(name it in tools.yaml's tool_schema.function.name or config.tool_name)")
        self.tool = by_name[name]
        self.registry = ToolRegistry([self.tool], default_timeout=config.get("timeout", 10.0))
        if tool_schema is None:
            tool_schema = self._schema_cls.model_validate(verl_tool_schema(self.tool))
        super().__init__(config, tool_schema)  # BaseTool: self.config, self.tool_schema, self.name
        self.instances: dict[str, dict[str, Any]] = {}

    def get_openai_tool_schema(self) -> Any:
        """verl's schema object of this tool."""
        return self.tool_schema

    async def create(self, instance_id: str | None = None, **kwargs: Any) -> tuple[str, Any]:
        """Open an instance (verl passes the row's `tools_kwargs[name]["create_kwargs"]`)."""
        instance_id = instance_id or uuid4().hex
        self.instances[instance_id] = {"create_kwargs": dict(kwargs.get("create_kwargs") or {}), "calls": 0}
        return instance_id, self._response_cls()

    async def execute(self, instance_id: str, parameters: dict[str, Any], **kwargs: Any) -> tuple[Any, float, dict]:
        """Run the tool; returns (ToolResponse with its text, 0.0, metrics)."""
        outcome = await asyncio.to_thread(self.registry.execute, self.tool.name, parameters)
        if instance_id in self.instances:
            self.instances[instance_id]["calls"] += 1
        metrics = {"success": outcome.success, "error_type": outcome.error_type, "seconds": outcome.seconds}
        return self._response_cls(text=outcome.result), 0.0, metrics

    async def calc_reward(self, instance_id: str, **kwargs: Any) -> float:
        """0.0: our tools carry no reward (the environment's rewards come through the interaction)."""
        return 0.0

    async def release(self, instance_id: str, **kwargs: Any) -> None:
        """Forget the instance."""
        self.instances.pop(instance_id, None)


_BUILT: dict[str, type] = {}


def _verl_classes() -> dict[str, type]:
    """Build `WorkbenchInteraction` / `WorkbenchTool` on verl's base classes (once)."""
    if not _BUILT:
        try:
            from verl.interactions.base import BaseInteraction
            from verl.tools.base_tool import BaseTool
            from verl.tools.schemas import OpenAIFunctionToolSchema, ToolResponse
        except ImportError as exc:
            raise ImportError(f"WorkbenchInteraction / WorkbenchTool need verl with interactions (0.7.1; "
                              f"0.8 dropped them): {exc}. Install: {VERL_INSTALL}") from exc
        _BUILT["WorkbenchInteraction"] = type("WorkbenchInteraction", (EnvInteraction, BaseInteraction), {
            "__module__": __name__, "__doc__": "A workbench environment as a verl `BaseInteraction` "
                                               "(see `EnvInteraction` and the module docstring)."})
        _BUILT["WorkbenchTool"] = type("WorkbenchTool", (EnvTool, BaseTool), {
            "__module__": __name__, "_schema_cls": OpenAIFunctionToolSchema, "_response_cls": ToolResponse,
            "__doc__": "A tool of a workbench environment as a verl `BaseTool` (see `EnvTool`)."})
    return _BUILT


def __getattr__(name: str) -> Any:
    if name in ("WorkbenchInteraction", "WorkbenchTool"):
        cls = _verl_classes()[name]
        globals()[name] = cls
        return cls
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
