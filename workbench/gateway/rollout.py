"""`GatewayRollout`: N copies of an external agent against the gateway, assembled into a batch.

    def agent(base_url, episode_id, task):          # any harness that speaks the OpenAI API
        client = openai.OpenAI(base_url=base_url, api_key="none")
        ...                                          # as many calls as it likes
        return reward                                # or None, with reward_fn

    rollout = GatewayRollout(trainer.engine, agent, tasks=["2+3", "7*6"], group_size=4, max_turns=6)
    batch = rollout.run()                            # TrajectoryBatch, token-exact
    trainer.score(batch); trainer.compute_advantages(batch); trainer.update(batch)

Each episode runs `agent(base_url, episode_id, task)` on its own thread, all at once (or
`concurrency` at a time), so their calls reach the engine together and share its batches.
`base_url` already names the episode (`/e/{episode_id}/v1`), so the agent needs no
header. Episodes with the same task form a group (`group_id` "task<i>", GRPO's group).

Reward: `reward_fn(episode, task)` when given, else the agent's return value (None or a
failed agent: 0.0, with a warning on the episode). It sits on the last turn's reward, so
`Trainer.score` without a reward_fn places it on the episode's last sampled token;
`episode.success` is reward > 0.

Fork: `rollout.fork(episode, turn, action="...", n=4)` runs the agent again on the
episode's task with its first `turn` replies replayed as recorded, the typed `action` (or
a fresh sample) at `turn`, and sampling after that (see `GatewayRollout.fork`).

Limits: `max_turns` calls per episode (the gateway refuses the next with a 400 and the
episode is marked truncated, "max_turns"); `episode_timeout` seconds per agent (the
episode is closed at the gateway, its agent thread unwound where Python allows
(`workbench.utils.timeouts`), and it is truncated, "time"). An agent that raises ends its own
episode (`episode.error`), never the batch.
"""
from __future__ import annotations

import itertools
import math
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Sequence

from workbench.engines.base import GenerationEngine
from workbench.gateway.assemble import assemble_episode
from workbench.gateway.server import Gateway, ScriptedReply
from workbench.rollout.chat import typed_action_ids
from workbench.rollout.configured import chat_settings
from workbench.rollout.fork import PREFIX_FIELDS, ReplayMismatch, first_difference, label_branches
from workbench.trajectory import Episode, TrajectoryBatch
from workbench.utils.timeouts import CallTimeout, call_with_timeout

Agent = Callable[[str, str, Any], Any]
GatewayRewardFn = Callable[[Episode, Any], float]

_AGENT_DIFFERS = ("The agent did not repeat what it sent when the episode was recorded, given the same replies "
                  "(it samples, reads a clock or outside state, or its task changed), so the episode cannot be "
                  "replayed to fork it.")


class GatewayRollout:
    """Runs an OpenAI-client agent `group_size` times per task and assembles the episodes.

    Args:
        engine: the policy's `GenerationEngine` (e.g. `trainer.engine`); ignored when `gateway` is given.
        agent: `agent(base_url, episode_id, task) -> reward or None`.
        tasks: one item per group, passed to the agent as it is.
        group_size: episodes per task.
        reward_fn: `fn(episode, task) -> float`; overrides the agent's return value.
        max_turns: model calls per episode.
        episode_timeout: seconds each agent may run (None: no limit).
        concurrency: agents running at once (None: all of them).
        max_tokens, temperature, max_context_tokens, seed: the gateway's defaults (see `Gateway`).
        gateway: a `Gateway` to use (started if needed, not stopped by `run`; its `max_turns` is set
            to this rollout's); None starts one per run with the settings above.
        config: a run's ConfigStore: its chat template settings (`inference.history`,
            `enable_thinking`, `tool_format`; `workbench.rollout.configured.chat_settings`) go
            to the gateway this rollout starts, so the agent's prompts are rendered as the run's
            own rollouts render theirs.
        history, enable_thinking, tool_format: those settings one by one (they win over `config`'s).
    """

    def __init__(self, engine: GenerationEngine | None, agent: Agent, tasks: Sequence[Any], group_size: int = 1,
                 reward_fn: GatewayRewardFn | None = None, max_turns: int = 8, episode_timeout: float | None = 120.0,
                 concurrency: int | None = None, max_tokens: int = 64, temperature: float = 1.0,
                 max_context_tokens: int = 2048, seed: int | None = 0, gateway: Gateway | None = None,
                 config: Any = None, history: str | None = None, enable_thinking: bool | None = None,
                 tool_format: str | None = None):
        if not tasks:
            raise ValueError("GatewayRollout needs at least one task")
        if group_size < 1 or max_turns < 1:
            raise ValueError(f"group_size and max_turns must be >= 1, got {group_size} and {max_turns}")
        if gateway is None and engine is None:
            raise ValueError("give an engine or a running gateway")
        self.agent, self.tasks, self.group_size = agent, list(tasks), group_size
        self.reward_fn, self.max_turns, self.episode_timeout = reward_fn, max_turns, episode_timeout
        self.concurrency = concurrency
        self.gateway = gateway
        self._own_gateway = gateway is None
        chat = chat_settings(config) if config is not None else {}
        chat.update({k: v for k, v in dict(history=history, enable_thinking=enable_thinking,
                                           tool_format=tool_format).items() if v is not None})
        self._gateway_args = dict(max_tokens=max_tokens, temperature=temperature, max_turns=max_turns,
                                  max_context_tokens=max_context_tokens, seed=seed, **chat)
        self.engine = engine if engine is not None else gateway.engine
        self.seconds = 0.0
        self._runs, self._forks = itertools.count(), itertools.count()  # the n-th run / fork of this rollout

    def run(self) -> TrajectoryBatch:
        """Run every agent, assemble its episode, and return the batch (`meta` has the counts)."""
        run = next(self._runs)
        jobs = [(i, t, task, f"r{run}-{i}") for i, (t, task) in
                enumerate((t, task) for t, task in enumerate(self.tasks) for _ in range(self.group_size))]
        return self._run_jobs(jobs, {})[0]

    def fork(self, episode: Episode, turn: int, action: str | None = None, n: int = 4) -> TrajectoryBatch:
        """`n` branches of one of this rollout's episodes, parting at turn `turn`.

        The agent runs again on the episode's task (`tasks[episode.env_seed]`). The gateway
        answers its first `turn` calls with the recorded replies, the ids and logprobs as
        sampled; each of those calls must send the recorded prompt, or the fork raises
        `ReplayMismatch` naming the call (an agent that does not repeat itself given the same
        replies). Call `turn` gets `action` (typed text: loss mask 0, `source == "edited"`;
        a `<tool_call>` in it is parsed like a sampled one) or a fresh sample; later calls are
        sampled as usual, each branch with its own seed. Every branch's tokens before the fork
        point equal the original's; `forked_from` and `meta["fork"]` say where they part, as for
        `workbench.rollout.fork_episode`. Rewards come as in `run`.

        Only an aligned episode can be forked (no `alignment:` warning): otherwise its calls'
        prompts are not its own prefixes and the replay could not be checked.
        """
        if not 0 <= turn < episode.num_turns:
            raise ValueError(f"turn must be in 0..{episode.num_turns - 1} for an episode of {episode.num_turns} "
                             f"turns, got {turn}")
        if n < 1:
            raise ValueError(f"n must be >= 1, got {n}")
        if any(w.startswith("alignment:") for w in episode.warnings):
            raise ValueError(f"episode {episode.episode_id} has an alignment warning: its harness re-sent history "
                             "that does not re-tokenize to the sampled ids, so a replay cannot be checked against "
                             "it; fork an episode without one")
        t_index = episode.env_seed
        if not (isinstance(t_index, int) and 0 <= t_index < len(self.tasks)) or episode.group_id != f"task{t_index}":
            raise ValueError(f"episode {episode.episode_id} (group {episode.group_id!r}, env_seed {t_index!r}) is not "
                             f"one of this rollout's: its episodes have group_id 'task<i>' and env_seed i, "
                             f"i < {len(self.tasks)}")
        def prompt(at: int) -> list[int]:  # the ids the call whose reply starts at `at` was sent
            return [episode.token_ids[p] for p in episode.sequence_indices(at)]

        script = [ScriptedReply(prompt(t.token_start), episode.token_ids[t.token_start:t.token_end],
                                episode.rollout_logprobs[t.token_start:t.token_end], t.finish_reason)
                  for t in episode.turns[:turn]]
        position = episode.turns[turn].token_start
        if action is not None:
            ids = typed_action_ids(self.engine.tokenizer, action)
            script.append(ScriptedReply(prompt(position), ids, [0.0] * len(ids), "stop", "edited"))
        run = next(self._forks)
        jobs = [(b, t_index, self.tasks[t_index], f"f{run}-e{episode.episode_id}-{b}") for b in range(n)]
        batch, mismatches = self._run_jobs(jobs, {job[3]: script for job in jobs})
        for (b, _, _, eid), branch in zip(jobs, batch):
            if mismatches.get(eid):
                call, at, recorded, sent = mismatches[eid]
                raise ReplayMismatch(episode, call, "prompt", recorded, sent,
                                     f"(branch {b}, from token {at} of call {call}'s prompt.) ", _AGENT_DIFFERS)
            for name in PREFIX_FIELDS:
                mine, theirs = getattr(episode, name)[:position], getattr(branch, name)[:position]
                at = first_difference(mine, theirs)
                if at is not None:
                    raise ReplayMismatch(episode, branch.turn_index[at] if at < len(branch.turn_index) else turn,
                                         name, mine[at:at + 8], theirs[at:at + 8],
                                         f"(branch {b}, from token {at}: it made {branch.num_turns} calls, error "
                                         f"{branch.error!r}.) ", _AGENT_DIFFERS)
        label_branches(batch, episode, turn, position, "action" if action is not None else None, action)
        return batch

    def _run_jobs(self, jobs: list[tuple[int, int, Any, str]], scripts: dict[str, list[ScriptedReply]]
                  ) -> tuple[TrajectoryBatch, dict[str, Any]]:
        """Play (index, task index, task, name) jobs, the episodes named in `scripts` with their
        first replies scripted; returns the batch and each scripted episode's replay mismatch
        (by name). A name seeds the episode's sampling; its gateway id adds a uuid."""
        gateway = self.gateway if self.gateway is not None else Gateway(self.engine, **self._gateway_args)
        gateway.max_turns = self.max_turns
        start = time.perf_counter()
        # Unique ids on the gateway (other rollouts may share it); sampling seeds from the
        # rollout's own names (the n-th run's i-th episode), so a run samples the same every time.
        names = {job[3]: f"{job[3]}-{uuid.uuid4().hex[:8]}" for job in jobs}
        jobs = [(i, t, task, names[key]) for i, t, task, key in jobs]
        try:
            gateway.start()
            for key, episode_id in names.items():
                gateway.seed_key(episode_id, key)
            for key, replies in scripts.items():
                gateway.script(names[key], replies)
            workers = self.concurrency or len(jobs)
            with ThreadPoolExecutor(max_workers=workers, thread_name_prefix="wb-agent") as pool:
                outcomes = list(pool.map(lambda job: self._play(gateway, job[3], job[2]), jobs))
            mismatches = {key: gateway.replay_mismatch(names[key]) for key in scripts}
            episodes = [self._episode(gateway, i, t, task, eid, outcome)
                        for (i, t, task, eid), outcome in zip(jobs, outcomes)]
        finally:
            if self._own_gateway:
                gateway.stop()
        self.seconds = time.perf_counter() - start
        batch = TrajectoryBatch(episodes)
        batch.meta.update({"rollout_seconds": self.seconds,
                           "generated_tokens": sum(ep.response_length for ep in episodes),
                           "gateway/calls": float(sum(ep.num_turns for ep in episodes)),
                           "gateway/misaligned_episodes": float(sum(
                               any(w.startswith("alignment:") for w in ep.warnings) for ep in episodes))})
        return batch, mismatches

    def _play(self, gateway: Gateway, episode_id: str, task: Any) -> tuple[Any, str | None, str | None]:
        """(agent's return value, error, truncation reason) of one episode."""
        url = gateway.episode_url(episode_id)
        try:
            value = call_with_timeout(lambda: self.agent(url, episode_id, task), self.episode_timeout,
                                      f"agent {getattr(self.agent, '__name__', 'agent')}")
            return value, None, gateway.cut_reason(episode_id)
        except CallTimeout:
            gateway.close_episode(episode_id)
            return None, None, "time"
        except Exception as exc:  # noqa: BLE001 - an agent's failure ends its own episode
            cut = gateway.cut_reason(episode_id)
            return None, (None if cut else f"agent raised {type(exc).__name__}: {exc}"), cut
        finally:
            gateway.close_episode(episode_id)

    def _episode(self, gateway: Gateway, index: int, task_index: int, task: Any, episode_id: str,
                 outcome: tuple[Any, str | None, str | None]) -> Episode:
        value, error, cut = outcome
        ep = assemble_episode(gateway.calls(episode_id), gateway.builder, episode_id=index,
                              group_id=f"task{task_index}", env_name=getattr(self.agent, "__name__", "agent"),
                              env_seed=task_index)
        ep.done, ep.error = True, error
        if cut:
            ep.truncated, ep.truncation_reason = True, cut
        if self.reward_fn is not None:
            reward = float(self.reward_fn(ep, task))
        elif isinstance(value, (int, float)) and not isinstance(value, bool):
            reward = float(value)
        else:
            reward = 0.0
            if error is None and cut is None:
                ep.warnings.append(f"reward: the agent returned {value!r}, not a number, and there is no "
                                   "reward_fn; the episode's reward is 0.0")
        if not math.isfinite(reward):
            raise ValueError(f"episode {index} (task {task_index}): reward {reward} is not finite")
        if ep.turns:
            ep.turns[-1].reward = reward
            ep.rewards[-1] = reward
            ep.turns[-1].info["success"] = reward > 0
        ep.success = reward > 0
        gateway.forget(episode_id)
        return ep

    def __repr__(self) -> str:
        return (f"GatewayRollout(agent={getattr(self.agent, '__name__', self.agent)!r}, tasks={len(self.tasks)}, "
                f"group_size={self.group_size}, max_turns={self.max_turns})")
