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

Failure isolation: an environment that raises ends its own episode (error recorded), and
so do a `get_prompt_prefix` that raises and an observation that is not valid UTF-8 text;
so does one whose `reset`/`step` overruns `step_timeout` (a `CallTimeout` error; the
call's thread is interrupted, see `workbench.utils.timeouts`). A malformed tool call becomes
an observation. An engine failure marks the episodes of that call and re-raises, with
every finished episode kept in `rollout.batch`.

Context budget: no episode grows past `max_context_tokens`. A first observation too
long for the budget is cut (its start kept, a visible "[... observation cut ...]" note
appended to it, the cut recorded in `episode.warnings`) so that a turn of `max_tokens`
still fits (or half the budget, if less); an episode whose opening prompt does not fit
even without the observation is refused (error, no tokens). An opening that fits is
never changed, even when it leaves less than `max_tokens` for the first turn. A later observation that
would overflow ends the episode as truncated ("context"), and a human action that
would overflow is rejected with a ValueError before anything changes. A text with more
characters than the tokens left can hold (`ChatRenderer.max_chars_per_token`) is judged
by its length and never tokenized whole, so a 10 MB observation is cut or ends its
episode as quickly as a short one.

Environments with room for a limited number of episodes at once (an OpenEnv server at
its session limit): a `reset` that raises `EnvironmentBusy` does not end the episode; it
waits (`rollout.waiting`) and is reset when one of this rollout's episodes has ended
(each ended episode's `env.end_episode()` is called, after `on_truncate`, to give its
place back). How the wait meets `step_timeout`: `workbench.rollout.waiting`. Episodes
that waited are counted in `rollout/queued_episodes`.

Chat templates: the tokenizer's template is probed when the rollout is built (one that cannot
express a conversation raises `TemplateError` before any episode starts); `history`,
`enable_thinking` and `tool_format` decide how each turn's prompt is made, how reasoning is
read and how tool calls look (`workbench.rollout.template`, `Episode.segments`).

Simplified: turns are synchronous (all live episodes generate, then all step their
environments).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence

from workbench.engines.base import EngineError, GenerationEngine, GenerationResult, SamplingParams
from workbench.engines.constraints import Constraint
from workbench.environments.registry import make_environment
from workbench.rollout.chat import ChatRenderer, check_token_alignment, invalid_text
from workbench.rollout.opening import NoRoom, OpeningBudget
from workbench.rollout.template import TOOL_FORMATS, say_once, tool_parser
from workbench.rollout.waiting import EnvironmentBusy, EpisodeQueue
from workbench.tools.manager import MultiTurnManager
from workbench.tools.registry import ToolRegistry
from workbench.trajectory import Episode, TrajectoryBatch, Turn
from workbench.utils.progress import EpisodeBar
from workbench.utils.timeouts import call_with_timeout, stuck_threads


DEFAULT_STEP_TIMEOUT = 60.0
"""Seconds per `env.reset`/`env.step` for environments without `config.step_timeout`."""

_FROM_ENV = object()  # step_timeout default: each environment's own config


def _env_step_timeout(env: Any) -> float | None:
    """`env.config.step_timeout` when the environment has one, else `DEFAULT_STEP_TIMEOUT`."""
    config = getattr(env, "config", None)
    return getattr(config, "step_timeout", DEFAULT_STEP_TIMEOUT) if config is not None else DEFAULT_STEP_TIMEOUT


@dataclass
class _Slot:
    """Live state of one episode."""

    episode: Episode
    env: Any
    manager: MultiTurnManager
    renderer: ChatRenderer
    """The rollout's renderer with this episode's template variables (its native `tools`)."""
    constraint: dict[str, Any] | None = None
    """The grammar of the turn being sampled (recorded on it)."""


class Rollout(EpisodeQueue, OpeningBudget):
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
        step_timeout: seconds each `env.reset`/`env.step` may take before its episode
            ends with a timeout error (None: no limit). Default: each environment's
            `config.step_timeout` (`EnvironmentConfig`, 60 s), else 60 s.
        progress: a `tqdm.auto` bar over ended episodes during `run()`: True, False, or
            None for automatic (`workbench.utils.progress.progress_enabled`); its label
            is `self.progress_desc`, and `self.progress_leave=False` clears it when done.
        history: "auto", "sampled" or "rendered": how earlier turns are shown to the model
            (module docstring; `self.history` is what "auto" resolved to).
        enable_thinking: passed to the chat template as `enable_thinking` (Qwen3's switch);
            None passes nothing (the template's default). A template without the switch
            refuses a value.
        tool_format: "auto", "prompt", "hermes", "llama3_json" or "mistral" (module docstring).

    Raises:
        TemplateError: the tokenizer's chat template cannot express the conversation (the
            message names the model, the rule and the setting that fixes it).
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
        step_timeout: Any = _FROM_ENV,
        progress: bool | None = None,
        history: str = "auto",
        enable_thinking: bool | None = None,
        tool_format: str = "auto",
    ):
        if not environments:
            raise ValueError("Rollout needs at least one environment")
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        n = len(environments)
        self.engine = engine
        self.progress, self.progress_desc, self.progress_leave = progress, "rollout", True
        self.tokenizer = engine.tokenizer
        if tool_format not in TOOL_FORMATS:
            raise ValueError(f"tool_format must be one of {', '.join(TOOL_FORMATS)}, got {tool_format!r}")
        self.tool_format = tool_format
        self.template_kwargs = {} if enable_thinking is None else {"enable_thinking": bool(enable_thinking)}
        self.renderer = ChatRenderer(self.tokenizer, self.template_kwargs, history)
        say_once(self.renderer.history_note)
        self.history = self.renderer.history
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
        self.close_reserve = len(self.renderer.delta_ids(
            [{"role": "user", "content": "x"}, {"role": "assistant", "content": ""}], [], [], add_generation_prompt=False))
        self.seed = seed
        self.parser = parser
        self.tools = list(tools)
        self.check_alignment = check_alignment
        self.initial_prompt = initial_prompt
        self.step_timeouts = [_env_step_timeout(env) if step_timeout is _FROM_ENV else step_timeout
                              for env in self.environments]
        for t in self.step_timeouts:
            if t is not None and not (isinstance(t, (int, float)) and t >= 0):
                raise ValueError(f"step_timeout must be a number of seconds >= 0 or None, got {t!r}")
        # Tokens a cut first observation leaves for the first turn (see `_opening`).
        self.first_turn_room = min(max_tokens, max(1, (max_context_tokens - self.close_reserve) // 2))
        self.slots: list[_Slot] = []
        self._clear_queue()  # no episode waits for room (workbench.rollout.waiting)
        self.turn_counter = 0

    # -- construction helpers ----------------------------------------------------------
    @classmethod
    def from_env(cls, engine: GenerationEngine, env: Any | Callable[[], Any], num_groups: int,
                 group_size: int = 1, first_seed: int = 0, **kwargs: Any) -> "Rollout":
        """`num_groups` seeds x `group_size` episodes, from a factory or a prototype env (deep-copied)."""
        seeds = [first_seed + g for g in range(num_groups) for _ in range(group_size)]
        return cls(engine, [make_environment(env) for _ in seeds], seeds=seeds, **kwargs)

    # -- episode lifecycle -------------------------------------------------------------
    def reset(self) -> "Rollout":
        """Reset every environment and render each episode's opening prompt (episodes whose
        environment has no room yet wait in `self.waiting`; see the module docstring)."""
        self.slots = []
        self._clear_queue()
        self.turn_counter = 0
        for i, env in enumerate(self.environments):
            ep = Episode(episode_id=i, group_id=self.group_ids[i], env_name=type(env).__name__, env_seed=self.seeds[i])
            ep.environment = env  # the copy that plays it (reward_fn gets it; not saved or pickled)
            ep.success_reported = True if getattr(env, "reports_success", None) is True else None
            registry = ToolRegistry()
            for tool in self.tools:
                registry.register(tool)
            parser = self.parser if self.parser is not None else getattr(env, "action_parser", None)
            parser, native = tool_parser(parser, type(env).__name__, self.tool_format, self.renderer.profile)
            profile = self.renderer.profile
            manager = MultiTurnManager(registry, parser, env, max_turns=self.max_turns,
                                       step_timeout=self.step_timeouts[i], reasoning=profile.reasoning,
                                       reasoning_opened=profile.opens_reasoning, native_tools=native)
            ep.history = self.history
            ep.template_kwargs = {**self.template_kwargs, **({"tools": manager.tool_schemas()} if native else {})}
            self.slots.append(_Slot(ep, env, manager, self.renderer.with_kwargs(ep.template_kwargs)))
        for i in range(len(self.slots)):
            self._start(i)
        return self

    def _renderer_of(self, ep: Episode) -> ChatRenderer:
        """The renderer of the slot playing `ep` (the rollout's before `reset`)."""
        i = ep.episode_id
        return self.slots[i].renderer if i < len(self.slots) and self.slots[i].episode is ep else self.renderer

    def _start(self, i: int) -> bool:
        """Reset episode `i`'s environment and render its opening; False when the
        environment has no room yet (the episode is put in `self.waiting`)."""
        slot = self.slots[i]
        ep, env, manager = slot.episode, slot.env, slot.manager
        try:
            obs = manager.reset(seed=self.seeds[i])
        except EnvironmentBusy as exc:  # no room on the environment's server yet: wait
            self._wait(i, exc)
            return False
        except Exception as exc:  # a crashing reset ends this episode only
            self._fail(slot, f"environment reset raised {type(exc).__name__}: {exc}")
            return True
        try:
            system = manager.system_prompt()
        except Exception as exc:  # a crashing get_prompt_prefix ends this episode only
            self._fail(slot, f"{type(env).__name__}.get_prompt_prefix (the system prompt) raised "
                             f"{type(exc).__name__}: {exc}")
            return True
        bad = invalid_text(obs, "the first observation (reset)") or invalid_text(system, "the system prompt")
        if bad:
            self._fail(slot, bad)
            return True
        try:
            seen, ep.messages, ids = self._opening(system, obs or "", ep)
        except NoRoom as exc:
            self._fail(slot, str(exc))
            return True
        ep.append_tokens(ids, trained=False, logprobs=None, turn=-1)
        ep.prompt_length = len(ids)
        ep.states.append(seen)
        return True

    def fault_metrics(self) -> dict[str, float]:
        """`rollout/env_timeouts`: episodes ended by a `step_timeout` overrun;
        `rollout/stuck_threads`: timed-out calls (any rollout) whose threads could not be
        interrupted and are still running; `rollout/context_cuts`: first observations cut;
        `rollout/queued_episodes`: episodes that waited for room on their environment's
        server before they started (or ended). `run()` copies the non-zero ones into the
        batch's `meta`."""
        eps = [s.episode for s in self.slots]
        return {
            "rollout/env_timeouts": float(sum(1 for e in eps if e.error and "CallTimeout" in e.error)),
            "rollout/stuck_threads": float(len(stuck_threads())),
            "rollout/context_cuts": float(sum(1 for e in eps if any(w.startswith("context: first observation cut")
                                                                     for w in e.warnings))),
            "rollout/queued_episodes": float(len(self.queued)),
        }

    @property
    def live(self) -> list[int]:
        """Indices of episodes that have started and not ended (not those in `self.waiting`)."""
        waiting = set(self.waiting)
        return [i for i, s in enumerate(self.slots) if not s.episode.done and i not in waiting]

    @property
    def batch(self) -> TrajectoryBatch:
        """All episodes so far (finished or not) as a batch."""
        return TrajectoryBatch([s.episode for s in self.slots])

    def step(self, human_actions: dict[int, str] | None = None) -> list[int]:
        """Advance every live episode by one turn; returns the indices advanced. Waiting
        episodes that find room now are reset first and take this turn too.

        Args:
            human_actions: {episode index: text} for turns typed by a person; those
                turns are appended with loss mask 0. All other live episodes are
                sampled together in one batched engine call.
        """
        if not self.slots:
            self.reset()
        self.admit_waiting()
        human_actions = dict(human_actions or {})
        human_ids = {}
        for i, text in human_actions.items():
            if i not in self.live:
                raise ValueError(f"episode {i} is not live; live episodes: {self.live}")
            human_ids[i] = self.renderer.human_action_ids(text)
            room = self.max_context_tokens - self.close_reserve - self.slots[i].episode.context_length
            if len(human_ids[i]) > room:
                raise ValueError(f"the action typed for episode {i} is {len(human_ids[i])} tokens but only {room} "
                                 f"fit in max_context_tokens={self.max_context_tokens}; type a shorter action")
        advanced = []
        for i, ids in human_ids.items():
            self._apply_action(self.slots[i], ids, None, "human")
            advanced.append(i)
        model_idx = [i for i in self.live if i not in human_actions]
        for i, result in self._generate(model_idx):
            if result.finish_reason == "error":  # no usable turn: end the episode, never step an empty action
                self._fail(self.slots[i], f"{self.engine.name} engine: {result.error or 'generation failed'}")
            else:
                self._apply_action(self.slots[i], result.token_ids, result.logprobs, result.finish_reason)
            advanced.append(i)
        self.turn_counter += 1
        return sorted(advanced)

    def replay(self, index: int, ids: list[int], logprobs: list[float] | None, finish_reason: str) -> None:
        """Append a recorded action to live episode `index` exactly as recorded and step its
        environment with it, as `step` does with a new one: `ids` as they were (sampled ids,
        or a typed turn's ids when `finish_reason` is "human": loss mask 0), with their
        sampling `logprobs` for a model turn. `workbench.rollout.fork` rebuilds an episode's
        first turns with it."""
        if index not in self.live:
            raise ValueError(f"episode {index} is not live; live episodes: {self.live}")
        human = finish_reason == "human"
        if not human:  # the grammar the turn was sampled under, recorded on it as on a sampled turn
            self._constraint_of(self.slots[index])
        self._apply_action(self.slots[index], list(ids), None if human else list(logprobs or []), finish_reason)

    def run(self, max_steps: int | None = None) -> TrajectoryBatch:
        """Step until every episode has ended (or `max_steps` steps); return the batch."""
        if not self.slots:
            self.reset()
        steps = 0
        with EpisodeBar(self.slots, self.progress, self.progress_desc, self.progress_leave) as bar:
            while (self.live or self.waiting) and (max_steps is None or steps < max_steps):
                self.step()
                steps += 1
                bar.refresh()
        batch = self.batch
        batch.meta.update({k: v for k, v in self.fault_metrics().items() if v})
        return batch

    def suggest(self, index: int) -> str:
        """The model's proposed next action for episode `index`, without taking it."""
        slot = self.slots[index]
        if slot.episode.done:
            raise ValueError(f"episode {index} has ended")
        params = SamplingParams(stop_token_ids=self.renderer.stop_ids, seed=None, **self.sampling)
        result = self.engine.generate_ids([slot.episode.context_ids()], params)[0]
        return self.renderer.action_text(result.token_ids)

    # -- internals ----------------------------------------------------------------------
    def _turn_budget(self, slot: _Slot) -> int | None:
        """Tokens the slot's next turn may sample: `max_tokens`, cut to the context room
        left after the closing tokens. None, with the episode truncated, when no room is left."""
        remaining = self.max_context_tokens - self.close_reserve - slot.episode.context_length
        if remaining < 1:
            self._truncate(slot, "context")
            return None
        return min(self.sampling["max_tokens"], remaining)

    def _turn_params(self, budget: int, seed: int | None, constraint: Constraint | None = None) -> SamplingParams:
        """Sampling settings of one turn with `budget` tokens; `seed` is the turn's base
        seed (None: unseeded), made distinct per budget; `constraint`: its grammar."""
        return SamplingParams(stop_token_ids=self.renderer.stop_ids, seed=None if seed is None else seed + budget,
                              constraint=constraint, **{**self.sampling, "max_tokens": budget})

    def _constraint_of(self, slot: _Slot) -> Constraint | None:
        """The grammar of the slot's next turn: its environment's `action_constraint()` when the
        environment constrains decoding (`environment.constrained_decoding`), else None. Kept
        on the slot, so the turn records it."""
        constraint = slot.env.action_constraint() if getattr(slot.env, "constrained_decoding", False) else None
        slot.constraint = None if constraint is None else {**constraint.to_dict(),
                                                            "stop_token_ids": list(self.renderer.stop_ids)}
        return constraint

    def _generate(self, indices: list[int]) -> list[tuple[int, GenerationResult]]:
        """One engine call per distinct token budget (usually exactly one call)."""
        by_budget: dict[tuple[int, str], list[int]] = {}  # (budget, constraint) -> episodes
        grammar: dict[str, Constraint | None] = {"": None}
        for i in indices:
            budget = self._turn_budget(self.slots[i])
            if budget is None:
                continue
            try:
                constraint = self._constraint_of(self.slots[i])
            except Exception as exc:  # a failing action_constraint ends this episode only
                self._fail(self.slots[i], f"{type(self.slots[i].env).__name__}.action_constraint raised "
                                          f"{type(exc).__name__}: {exc}")
                continue
            key = constraint.key() if constraint is not None else ""
            grammar[key] = constraint
            by_budget.setdefault((budget, key), []).append(i)
        out = []
        for (budget, key), idx in sorted(by_budget.items(), reverse=True):
            base = None if self.seed is None else self.seed * 100_003 + self.turn_counter * 101
            params = self._turn_params(budget, base, grammar[key])
            # every row on its episode's last possible turn: no later call extends its KV
            params.keep_kv = any(len(self.slots[i].episode.turns) + 1 < self.max_turns for i in idx)
            try:
                results = self.engine.generate_ids([self.slots[i].episode.context_ids() for i in idx], params)
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
        text = slot.renderer.action_text(ids) if trained else self.tokenizer.decode(ids[:-1], skip_special_tokens=False)
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
            constraint=slot.constraint if trained else None,
            reasoning_cut=tr.reasoning_cut,
            reasoning_tokens=(slot.renderer.reasoning_tokens(ids, tr.answer_start, tr.reasoning_cut)
                              if tr.reasoning is not None else 0),
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
            self._settle(slot, ep.truncation_reason)
        bad = next((invalid_text(m.get("content"), f"the observation after turn {k}") for m in tr.messages
                    if invalid_text(m.get("content"), "")), None)
        if bad:
            self._fail(slot, bad, closing_ids=ids)
            return
        # An observation with more characters than the tokens left can hold is not tokenized
        # at all (a 10 MB one took minutes and gigabytes): it cannot fit.
        room = self.max_context_tokens - (0 if self.history == "rendered" else ep.context_length)
        chars = sum(len(m["content"]) for m in tr.messages if isinstance(m.get("content"), str))
        too_long = chars > room and chars > slot.renderer.max_chars_per_token() * room
        if self.history == "rendered":
            self._next_prompt(slot, tr.messages, tr.observation, done, too_long)
            return
        delta = None if too_long else slot.renderer.delta_ids(ep.messages, ids, tr.messages,
                                                                 add_generation_prompt=not done)
        if not done and (delta is None or ep.context_length + len(delta) >= self.max_context_tokens):
            # The observation does not fit: close the turn and end the episode.
            self._truncate(slot, "context", closing_ids=ids)
            return
        if done and (delta is None or ep.context_length + len(delta) > self.max_context_tokens):
            # The episode ends here anyway: close the turn without its last observation (kept
            # in `turn.observation` / `turn.messages`, where no token budget applies).
            size = f"{len(delta)} tokens" if delta is not None else f"{chars:,} characters, over {room} tokens"
            ep.warnings.append(f"context: the observation after the last turn ({size}) was not "
                               f"appended; it would pass max_context_tokens={self.max_context_tokens}")
            self._close(slot, ids)
            self._finish(slot)
            return
        ep.messages.extend(tr.messages)
        ep.append_tokens(delta, trained=False, logprobs=None, turn=k)
        if not done:
            ep.states.append(tr.observation)
        else:
            self._finish(slot)

    def _next_prompt(self, slot: _Slot, messages: list[dict[str, Any]], observation: str, done: bool,
                     too_long: bool) -> None:
        """"rendered" history after a turn: the next turn's prompt is the template's render of
        the conversation so far; its ids after the prefix it shares with the current sequence
        are appended as a new sequence (at least one of them, so a sequence never starts with
        a sampled token). A finished episode keeps its last observation in the messages only."""
        ep = slot.episode
        k = len(ep.turns) - 1
        if done:
            ep.messages.extend(messages)
            self._finish(slot)
            return
        prompt = None if too_long else slot.renderer.prompt_ids(ep.messages + list(messages))
        if prompt is None or len(prompt) >= self.max_context_tokens - self.close_reserve:
            self._truncate(slot, "context", closing_ids=ep.token_ids[ep.turns[-1].token_start:ep.turns[-1].token_end])
            return
        current = ep.context_ids()
        shared = next((j for j, (a, b) in enumerate(zip(prompt, current)) if a != b), min(len(prompt), len(current)))
        shared = min(shared, len(prompt) - 1)
        ep.messages.extend(messages)
        ep.start_sequence(shared)
        ep.append_tokens(prompt[shared:], trained=False, logprobs=None, turn=k)
        ep.states.append(observation)

    def _settle(self, slot: _Slot, reason: str) -> None:
        """Ask the environment for the reward an episode cut by `reason` has earned
        (`BaseEnvironment.on_truncate`, called once per episode) and add it to the last
        turn; a failing hook becomes a warning on the episode."""
        ep, settle = slot.episode, getattr(slot.env, "settle", None)
        if not ep.turns or settle is None:
            return
        try:
            value = call_with_timeout(lambda: settle(reason), self.step_timeouts[slot.episode.episode_id],
                                      f"{type(slot.env).__name__}.on_truncate")
        except Exception as exc:  # noqa: BLE001 - the episode ends either way
            ep.warnings.append(f"on_truncate({reason!r}) raised {type(exc).__name__}: {exc}")
            return
        if value:
            last = ep.turns[-1]
            last.reward += value
            last.info["settled_reward"] = last.info.get("settled_reward", 0.0) + value
            ep.rewards[-1] = last.reward

    def _truncate(self, slot: _Slot, reason: str, closing_ids: list[int] | None = None) -> None:
        ep = slot.episode
        ep.truncated, ep.truncation_reason = True, reason
        self._settle(slot, reason)
        self._close(slot, closing_ids)
        self._finish(slot)

    def _fail(self, slot: _Slot, error: str, closing_ids: list[int] | None = None) -> None:
        """End the episode with `error` (its tokens closed into a complete conversation)."""
        ep = slot.episode
        ep.error = error
        if ep.token_ids:
            self._close(slot, closing_ids)
        self._finish(slot)

    def _close(self, slot: _Slot, closing_ids: list[int] | None) -> None:
        """Append the end-of-turn glue so the token list is a complete conversation (a
        "rendered" episode ends after its last turn's ids)."""
        ep, renderer = slot.episode, slot.renderer
        if not ep.messages or not ep.num_tokens:
            return
        last = max((j for j, m in enumerate(ep.messages) if m["role"] == "assistant"), default=None)
        if self.history == "rendered":
            if ep.turns and last != len(ep.messages) - 1:  # the next turn's prompt, never sampled after
                ep.truncate_tokens(ep.turns[-1].token_end)
            return
        if closing_ids is not None and last == len(ep.messages) - 1:
            delta = renderer.delta_ids(ep.messages, closing_ids, [], add_generation_prompt=False)
            ep.append_tokens(delta, trained=False, logprobs=None, turn=len(ep.turns) - 1)
        elif last is None:
            # Ended before its first turn: the opening without the generation prompt.
            ep.truncate_tokens(0)
            ep.append_tokens(renderer.prompt_ids(ep.messages, add_generation_prompt=False), trained=False,
                             logprobs=None, turn=-1)
            ep.prompt_length = ep.num_tokens
        elif last != len(ep.messages) - 1 and ep.turns:
            # Ended before its next turn: the last delta again, without the generation prompt, so the
            # ids are the finished conversation (what the alignment check renders for a done episode).
            turn = ep.turns[-1]
            ids = ep.token_ids[turn.token_start:turn.token_end]
            delta = renderer.delta_ids(ep.messages[:last + 1], ids, ep.messages[last + 1:], add_generation_prompt=False)
            ep.truncate_tokens(turn.token_end)
            ep.append_tokens(delta, trained=False, logprobs=None, turn=len(ep.turns) - 1)

    def _finish(self, slot: _Slot) -> None:
        ep = slot.episode
        ep.done = True
        self._episode_ended(slot)
        if self.check_alignment and ep.token_ids and ep.messages:
            report = check_token_alignment(ep, self.tokenizer)
            if not report.ok:
                ep.warnings.append(report.message)
