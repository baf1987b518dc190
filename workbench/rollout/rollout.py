"""`Rollout`: N episodes advanced in lock-step, one batched generate call per turn.

    rollout = Rollout(engine, envs, seeds=[0, 0, 1, 1], max_turns=5)
    rollout.reset()
    rollout.step()                       # every live episode takes one turn
    rollout.step(human_actions={0: "8"}) # episode 0's action typed by a person
    batch = rollout.run()                # finish all episodes -> TrajectoryBatch

Each episode gets its own environment instance and a `MultiTurnManager` (parser,
tools, environment step, error capture). Token bookkeeping follows
`workbench.rollout.chat`: sampled ids appended as-is with mask 1 and their logprob,
everything else rendered as template deltas with mask 0. Human turns are mask 0.

Failure isolation: an environment that raises ends its own episode (error recorded);
a malformed tool call becomes an observation; an action that would overflow
`max_context_tokens` ends the episode as truncated ("context"). An engine failure
marks the episodes of that call and re-raises, with every finished episode kept in
`rollout.batch`.

Simplified: turns are synchronous (all live episodes generate, then all step their
environments). Environments here are fast Python; slow tool calls run with timeouts.
"""
from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any, Callable, Sequence

from workbench.engines.base import EngineError, GenerationEngine, GenerationResult, SamplingParams
from workbench.rollout.chat import ChatRenderer, check_token_alignment
from workbench.tools.manager import MultiTurnManager
from workbench.tools.registry import ToolRegistry
from workbench.trajectory import Episode, TrajectoryBatch, Turn


@dataclass
class _Slot:
    """Live state of one episode."""

    episode: Episode
    env: Any
    manager: MultiTurnManager


class Rollout:
    """Batched, stepwise multi-turn rollout over several environment instances.

    Args:
        engine: a `GenerationEngine` (hf, vllm, server).
        environments: one environment instance per episode.
        seeds: environment seed per episode (episodes sharing a seed form a GRPO group).
        group_ids: explicit group id per episode; defaults to "seed<seed>".
        max_turns: model turns per episode.
        max_tokens, temperature, top_p, top_k: sampling settings per turn.
        max_context_tokens: per-episode token budget.
        seed: base sampling seed (None = fresh randomness).
        parser: action parser name or object for all episodes; None uses each
            environment's `action_parser` (plain text when that is None too).
        tools: extra tools available in every episode.
        check_alignment: verify token alignment when each episode finishes.
        initial_prompt: text put before each environment's first observation in
            the opening user message (the seeds' `initial_prompt`).
    """

    def __init__(
        self,
        engine: GenerationEngine,
        environments: Sequence[Any],
        seeds: Sequence[int | None] | None = None,
        group_ids: Sequence[str] | None = None,
        max_turns: int = 5,
        max_tokens: int = 64,
        temperature: float = 1.0,
        top_p: float = 1.0,
        top_k: int = -1,
        max_context_tokens: int = 2048,
        seed: int | None = 0,
        parser: Any = None,
        tools: Sequence[Any] = (),
        check_alignment: bool = True,
        initial_prompt: str | None = None,
    ):
        if not environments:
            raise ValueError("Rollout needs at least one environment")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        n = len(environments)
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.renderer = ChatRenderer(self.tokenizer)
        self.environments = list(environments)
        self.seeds = list(seeds) if seeds is not None else [None] * n
        if len(self.seeds) != n:
            raise ValueError(f"{n} environments but {len(self.seeds)} seeds")
        self.group_ids = list(group_ids) if group_ids is not None else [f"seed{s}" if s is not None else f"ep{i}" for i, s in enumerate(self.seeds)]
        self.max_turns = max_turns
        self.sampling = dict(max_tokens=max_tokens, temperature=temperature, top_p=top_p, top_k=top_k)
        self.max_context_tokens = max_context_tokens
        # Room kept free for the end-of-turn glue (e.g. "<|im_end|>\n") that closes a turn
        # cut short by the budget, so a truncated episode still fits max_context_tokens.
        self.close_reserve = len(self.renderer.delta_ids([{"role": "assistant", "content": ""}], [], [],
                                                         add_generation_prompt=False))
        self.seed = seed
        self.parser = parser
        self.tools = list(tools)
        self.check_alignment = check_alignment
        self.initial_prompt = initial_prompt
        self.slots: list[_Slot] = []
        self.turn_counter = 0

    # -- construction helpers ----------------------------------------------------------
    @classmethod
    def from_env(cls, engine: GenerationEngine, env: Any | Callable[[], Any], num_groups: int,
                 group_size: int = 1, first_seed: int = 0, **kwargs: Any) -> "Rollout":
        """`num_groups` seeds x `group_size` episodes, from a factory or a prototype env (deep-copied)."""
        make = env if callable(env) and not hasattr(env, "step") else (lambda: copy.deepcopy(env))
        seeds = [first_seed + g for g in range(num_groups) for _ in range(group_size)]
        return cls(engine, [make() for _ in seeds], seeds=seeds, **kwargs)

    # -- episode lifecycle -------------------------------------------------------------
    def reset(self) -> "Rollout":
        """Reset every environment and render each episode's opening prompt."""
        self.slots = []
        self.turn_counter = 0
        for i, env in enumerate(self.environments):
            ep = Episode(episode_id=i, group_id=self.group_ids[i], env_name=type(env).__name__, env_seed=self.seeds[i])
            registry = ToolRegistry()
            for tool in self.tools:
                registry.register(tool)
            parser = self.parser if self.parser is not None else getattr(env, "action_parser", None)
            manager = MultiTurnManager(registry, parser, env, max_turns=self.max_turns)
            slot = _Slot(ep, env, manager)
            self.slots.append(slot)
            try:
                obs = manager.reset(seed=self.seeds[i])
            except Exception as exc:  # a crashing reset ends this episode only
                self._fail(slot, f"environment reset raised {type(exc).__name__}: {exc}")
                continue
            opening = obs or ""
            if self.initial_prompt:
                opening = f"{self.initial_prompt}\n\n{opening}" if opening else self.initial_prompt
            ep.messages = [{"role": "system", "content": manager.system_prompt()},
                           {"role": "user", "content": opening}]
            ids = self.renderer.prompt_ids(ep.messages)
            ep.append_tokens(ids, trained=False, logprobs=None, turn=-1)
            ep.prompt_length = len(ids)
            ep.states.append(obs or "")
            if len(ids) >= self.max_context_tokens:
                self._truncate(slot, "context")
        return self

    @property
    def live(self) -> list[int]:
        """Indices of episodes that have not ended."""
        return [i for i, s in enumerate(self.slots) if not s.episode.done]

    @property
    def batch(self) -> TrajectoryBatch:
        """All episodes so far (finished or not) as a batch."""
        return TrajectoryBatch([s.episode for s in self.slots])

    def step(self, human_actions: dict[int, str] | None = None) -> list[int]:
        """Advance every live episode by one turn; returns the indices advanced.

        Args:
            human_actions: {episode index: text} for turns typed by a person; those
                turns are appended with loss mask 0. All other live episodes are
                sampled together in one batched engine call.
        """
        if not self.slots:
            self.reset()
        human_actions = dict(human_actions or {})
        for i in human_actions:
            if i not in self.live:
                raise ValueError(f"episode {i} is not live; live episodes: {self.live}")
        advanced = []
        for i, text in human_actions.items():
            slot = self.slots[i]
            ids = self.renderer.human_action_ids(text)
            self._apply_action(slot, ids, None, "human")
            advanced.append(i)
        model_idx = [i for i in self.live if i not in human_actions]
        for i, result in self._generate(model_idx):
            self._apply_action(self.slots[i], result.token_ids, result.logprobs, result.finish_reason)
            advanced.append(i)
        self.turn_counter += 1
        return sorted(advanced)

    def run(self, max_steps: int | None = None) -> TrajectoryBatch:
        """Step until every episode has ended (or `max_steps` steps); return the batch."""
        if not self.slots:
            self.reset()
        steps = 0
        while self.live and (max_steps is None or steps < max_steps):
            self.step()
            steps += 1
        return self.batch

    def suggest(self, index: int) -> str:
        """The model's proposed next action for episode `index`, without taking it."""
        slot = self.slots[index]
        if slot.episode.done:
            raise ValueError(f"episode {index} has ended")
        params = SamplingParams(stop_token_ids=self.renderer.stop_ids, seed=None, **self.sampling)
        result = self.engine.generate_ids([slot.episode.token_ids], params)[0]
        return self.renderer.action_text(result.token_ids)

    # -- internals ----------------------------------------------------------------------
    def _turn_budget(self, slot: _Slot) -> int | None:
        """Tokens the slot's next turn may sample: `max_tokens`, cut to the context room
        left after the closing tokens. None, with the episode truncated, when no room is left."""
        remaining = self.max_context_tokens - self.close_reserve - slot.episode.num_tokens
        if remaining < 1:
            self._truncate(slot, "context")
            return None
        return min(self.sampling["max_tokens"], remaining)

    def _turn_params(self, budget: int, seed: int | None) -> SamplingParams:
        """Sampling settings of one turn with `budget` tokens; `seed` is the turn's base
        seed (None: unseeded), made distinct per budget."""
        return SamplingParams(stop_token_ids=self.renderer.stop_ids, seed=None if seed is None else seed + budget,
                              **{**self.sampling, "max_tokens": budget})

    def _generate(self, indices: list[int]) -> list[tuple[int, GenerationResult]]:
        """One engine call per distinct token budget (usually exactly one call)."""
        by_budget: dict[int, list[int]] = {}
        for i in indices:
            budget = self._turn_budget(self.slots[i])
            if budget is not None:
                by_budget.setdefault(budget, []).append(i)
        out = []
        for budget, idx in sorted(by_budget.items(), reverse=True):
            base = None if self.seed is None else self.seed * 100_003 + self.turn_counter * 101
            params = self._turn_params(budget, base)
            try:
                results = self.engine.generate_ids([self.slots[i].episode.token_ids for i in idx], params)
            except Exception as exc:
                for i in idx:
                    self._fail(self.slots[i], f"{self.engine.name} engine failed: {type(exc).__name__}: {exc}")
                raise EngineError(
                    f"{self.engine.name} backend failed during turn {self.turn_counter}: {exc}. "
                    f"{sum(s.episode.done and s.episode.error is None for s in self.slots)} finished episodes "
                    "are kept in rollout.batch"
                ) from exc
            out.extend(zip(idx, results))
        return out

    def _apply_action(self, slot: _Slot, ids: list[int], logprobs: list[float] | None, finish: str) -> None:
        ep = slot.episode
        k = len(ep.turns)
        trained = finish != "human"
        start = ep.num_tokens
        ep.append_tokens(ids, trained=trained, logprobs=logprobs if trained else None, turn=k)
        text = self.renderer.action_text(ids) if trained else self.tokenizer.decode(ids[:-1], skip_special_tokens=False)
        ep.messages.append({"role": "assistant", "content": text})
        try:
            tr = slot.manager.step(text)
        except Exception as exc:  # the manager catches env errors; this is a last resort
            turn = Turn(index=k, action=text, source="human" if not trained else "model",
                        token_start=start, token_end=start + len(ids), finish_reason=finish,
                        env_error=f"{type(exc).__name__}: {exc}")
            ep.turns.append(turn)
            self._fail(slot, f"turn {k} raised {type(exc).__name__}: {exc}", closing_ids=ids)
            return
        turn = Turn(
            index=k, action=text, source="model" if trained else "human", observation=tr.observation,
            reward=float(tr.reward), done=bool(tr.done), info=dict(tr.info),
            tool_calls=[{"name": c.name, "arguments": c.arguments, "success": c.success, "result": c.result}
                        for c in tr.tool_calls],
            parse_error=tr.parse_error, env_error=tr.env_error, token_start=start,
            token_end=start + len(ids), finish_reason=finish, messages=list(tr.messages),
        )
        ep.turns.append(turn)
        ep.actions.append(text)
        ep.rewards.append(turn.reward)
        ep.dones.append(turn.done)
        ep.infos.append(turn.info)
        ep.success = ep.success or bool(turn.info.get("success"))
        done = turn.done
        if tr.env_error:
            ep.error = f"environment error: {tr.env_error}"
        elif done and turn.info.get("truncated"):
            ep.truncated = True
            ep.truncation_reason = "max_turns" if len(ep.turns) >= self.max_turns else "max_steps"
        delta = self.renderer.delta_ids(ep.messages, ids, tr.messages, add_generation_prompt=not done)
        if not done and ep.num_tokens + len(delta) >= self.max_context_tokens:
            # The observation does not fit: close the turn and end the episode.
            self._truncate(slot, "context", closing_ids=ids)
            return
        ep.messages.extend(tr.messages)
        ep.append_tokens(delta, trained=False, logprobs=None, turn=k)
        if not done:
            ep.states.append(tr.observation)
        else:
            self._finish(slot)

    def _truncate(self, slot: _Slot, reason: str, closing_ids: list[int] | None = None) -> None:
        ep = slot.episode
        ep.truncated, ep.truncation_reason = True, reason
        self._close(slot, closing_ids)
        self._finish(slot)

    def _fail(self, slot: _Slot, error: str, closing_ids: list[int] | None = None) -> None:
        ep = slot.episode
        ep.error = error
        if ep.token_ids:
            self._close(slot, closing_ids)
        self._finish(slot)

    def _close(self, slot: _Slot, closing_ids: list[int] | None) -> None:
        """Append the end-of-turn glue so the token list is a complete conversation."""
        ep = slot.episode
        if closing_ids is not None and ep.messages and ep.messages[-1]["role"] == "assistant":
            delta = self.renderer.delta_ids(ep.messages, closing_ids, [], add_generation_prompt=False)
            ep.append_tokens(delta, trained=False, logprobs=None, turn=len(ep.turns) - 1)
        elif ep.messages and ep.messages[-1]["role"] != "assistant" and ep.num_tokens:
            # Ended before its next turn: drop the open generation prompt, so the ids are the
            # finished conversation (what the alignment check renders for a done episode).
            gen = self.renderer.generation_prompt_ids(ep.messages)
            if gen and ep.token_ids[-len(gen):] == gen:
                for name in ("token_ids", "loss_mask", "rollout_logprobs", "turn_index"):
                    del getattr(ep, name)[-len(gen):]
                ep.prompt_length = min(ep.prompt_length, ep.num_tokens)

    def _finish(self, slot: _Slot) -> None:
        ep = slot.episode
        ep.done = True
        if self.check_alignment and ep.token_ids and ep.messages:
            report = check_token_alignment(ep, self.tokenizer)
            if not report.ok:
                ep.warnings.append(report.message)
