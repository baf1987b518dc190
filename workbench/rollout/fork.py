"""Fork a recorded episode at any turn: replay its first turns, change one, sample on.

    branches = fork_episode(episode, turn=2, action="5", n=4, engine=engine, config=run_config)
    branches[0].forked_from       # {"turn": 2, "token_position": 187, "edit": "action", ...}
    [b.outcome for b in branches] # each branch's return

What happens, in order:

1. **Rebuild.** `n` fresh environments come from the prototype / factory given as
   `environment`, else the run's `config.environment` (`workbench.environments.registry.make_env(
   name, config.environment)`), else copies of the environment that played an episode
   still in memory; each is reset with the episode's `env_seed`, inside an
   ordinary `Rollout` with the run's parser, tools and limits (`run_settings`).
2. **Replay.** The recorded actions of turns < `turn` go through `Rollout.replay`: the
   same path a rollout takes (`MultiTurnManager`: parser, tool calls re-run, environment
   step), with the recorded ids appended as they are (token-in/token-out) together with
   their loss mask and sampling logprobs. After the reset and after every replayed turn,
   the observation, reward, done flag and the token ids so far must equal the recorded
   ones; the first difference raises `ReplayMismatch` naming the turn and showing both
   texts. A non-deterministic environment is caught here, never silently diverged from.
3. **Edit.** At `turn`, either `action` (typed text, tokenised like a human turn: loss
   mask 0, `Turn.source == "edited"`) or `observation` (the text the model sees after
   turn `turn - 1`, or the first observation when `turn == 0`; the environment keeps its
   own state, only the model's view changes). Neither: the turn is simply resampled.
4. **Continue.** The rollout runs on with `engine` (temperature from the config unless
   given; 0 is greedy) until every branch ends.

Every branch's tokens before `forked_from["token_position"]` equal the original's
(`token_ids`, `loss_mask`, `rollout_logprobs`); this is checked before returning.

Layer: `rollout` (imports engines, tools, environment registry, trajectory; nothing from
training), so `Trainer.fork` and `workbench.debug.fork` both call it.
Simplified: episodes of a dataset run (per-item prompts or params) are rebuilt from the
seed only; pass `environment=` built for that item.
"""
from __future__ import annotations

from typing import Any, Callable, Sequence

from workbench.engines.base import GenerationEngine
from workbench.environments.registry import make_env, make_environment
from workbench.rollout.configured import rollout_settings
from workbench.rollout.rollout import Rollout
from workbench.trajectory import Episode, TrajectoryBatch

__all__ = ["ReplayMismatch", "fork_episode", "replay", "run_settings", "environment_factory", "label_branches",
           "first_difference", "PREFIX_FIELDS"]


class ReplayMismatch(RuntimeError):
    """Replaying a recorded episode gave something else than what was recorded.

    Attributes: `turn` (0-based; -1 for the reset), `what` ("observation", "reward",
    "done", "tokens", ...), `recorded` and `replayed` (texts)."""

    #: What a mismatch means for an environment's episode (`cause` says it for other sources).
    ENVIRONMENT = ("The environment does not give the same result for the same seed and actions "
                   "(non-deterministic, or not the environment/config the run used), so the episode "
                   "cannot be rebuilt to fork it.")

    def __init__(self, episode: Episode, turn: int, what: str, recorded: Any, replayed: Any, note: str = "",
                 cause: str = ENVIRONMENT):
        self.turn, self.what, self.recorded, self.replayed = turn, what, recorded, replayed
        where = "the reset (first observation)" if turn < 0 else f"turn {turn}"
        super().__init__(
            f"replay of episode {episode.episode_id} (env {episode.env_name}, seed {episode.env_seed}) "
            f"differs at {where}: the {what}\n  recorded: {recorded!r}\n  replayed: {replayed!r}\n"
            f"{note}{cause}")


def environment_factory(config: Any = None, environment: Any = None, episode: Episode | None = None
                        ) -> Callable[[], Any]:
    """A zero-argument function making fresh environments: from `environment` (a factory,
    or a prototype that is deep-copied), else the run's `config.environment`, else a copy of
    the environment that played `episode` (`episode.environment`, set for episodes still in
    memory; every copy is reset with the episode's seed before use)."""
    if environment is None and config is None and episode is not None:
        environment = episode.environment
    if environment is not None:
        return lambda: make_environment(environment)
    if config is None:
        raise ValueError("fork needs the run's config (config.environment rebuilds the environment) "
                         "or environment= (a prototype or a factory); this episode has no environment attached "
                         "(it was loaded from a file)")
    return lambda: make_env(config.environment.name, config.environment)


def run_settings(config: Any = None, **overrides: Any) -> dict[str, Any]:
    """`Rollout` keyword arguments of a run, read from `config` where every rollout reads
    them (`workbench.rollout.configured.rollout_settings`); `overrides` that are not None win."""
    out = rollout_settings(config) if config is not None else {}
    out.update({k: v for k, v in overrides.items() if v is not None})
    return out


def _show_tokens(tokenizer: Any, ids: Sequence[int]) -> str:
    return tokenizer.decode(list(ids), skip_special_tokens=False)


def _check_tokens(episode: Episode, new: Episode, turn: int, end: int, tokenizer: Any) -> None:
    """The replayed ids (and masks, logprobs) must be the recorded ones up to `end`."""
    for name in ("token_ids", "loss_mask", "rollout_logprobs"):
        rec, got = getattr(episode, name)[:end], getattr(new, name)
        if rec != got:
            pos = next((i for i, (a, b) in enumerate(zip(rec, got)) if a != b), min(len(rec), len(got)))
            lo = max(0, pos - 8)
            if name == "token_ids":
                shown = (_show_tokens(tokenizer, rec[lo:pos + 8]), _show_tokens(tokenizer, got[lo:pos + 8]))
            else:
                shown = (rec[lo:pos + 8], got[lo:pos + 8])
            what = f"{name} from position {pos} ({len(rec)} recorded, {len(got)} replayed)"
            raise ReplayMismatch(episode, turn, what, *shown)


def replay(episode: Episode, turn: int, engine: GenerationEngine, *, n: int = 1, config: Any = None,
           environment: Any = None, parser: Any = None, tools: Sequence[Any] = (),
           check_alignment: bool = True, seed: int | None = 0, **overrides: Any) -> Rollout:
    """A `Rollout` of `n` episodes, each holding `episode`'s first `turn` turns rebuilt on a
    fresh environment (see the module docstring) and live, ready to `step`/`run`.

    Args:
        episode: the recorded episode (from a batch in memory or `TrajectoryBatch.load`).
        turn: turns to replay, 0..num_turns; the replayed turns must not have ended it.
        engine: the engine the rollout continues with (its tokenizer must be the run's).
        n: copies (branches) to build.
        config: the run's ConfigStore (environment, limits, temperature); see `run_settings`.
        environment: a prototype or factory instead of `config.environment`.
        parser, tools: as given to the run's Trainer (None: each environment's own parser).
        seed: base sampling seed of the continuation (None: fresh randomness).
        **overrides: `Rollout` settings that win over the config's (max_turns, max_tokens,
            temperature, top_p, top_k, max_context_tokens, step_timeout).

    Raises:
        ReplayMismatch: a replayed observation, reward, done flag or token differs.
        ValueError: `turn` is out of range or the episode had ended before it.
        RuntimeError: the environment's server has no room for `n` episodes at once
            (`EnvironmentBusy` at reset; the copies replay side by side).
    """
    if not 0 <= turn <= episode.num_turns:
        raise ValueError(f"turn must be in 0..{episode.num_turns} for an episode of {episode.num_turns} turns, "
                         f"got {turn}")
    if turn and episode.turns[turn - 1].done:
        raise ValueError(f"episode {episode.episode_id} ended at turn {turn - 1}; there is no turn {turn} to fork at "
                         f"(turns 0..{turn - 1} can be)")
    if turn == episode.num_turns and episode.done:
        raise ValueError(f"episode {episode.episode_id} ended after its last turn ({turn - 1}); replay turns "
                         f"0..{turn - 1}")
    if n < 1:
        raise ValueError(f"n must be >= 1, got {n}")
    make = environment_factory(config, environment, episode)
    settings = run_settings(config, **overrides)
    # The chat template is used as the episode was built (its history mode and template variables).
    settings["history"] = overrides.get("history") or episode.history
    if settings.get("enable_thinking") is None and "enable_thinking" in episode.template_kwargs:
        settings["enable_thinking"] = episode.template_kwargs["enable_thinking"]
    rollout = Rollout(engine, [make() for _ in range(n)], seeds=[episode.env_seed] * n,
                      group_ids=[f"fork:{episode.group_id or episode.episode_id}:t{turn}"] * n, seed=seed,
                      parser=parser, tools=tools, check_alignment=check_alignment, **settings)
    rollout.reset()
    if rollout.waiting:  # the copies replay side by side: each needs its own place on the server now
        reason = rollout.waiting_reason(rollout.waiting[0])
        for slot in rollout.slots:
            if callable(getattr(slot.env, "end_episode", None)):
                slot.env.end_episode()
        raise RuntimeError(f"replaying {n} copies of episode {episode.episode_id} needs {n} environments at once, "
                           f"but {len(rollout.waiting)} found no room: {reason}; fork fewer copies at a time (n) "
                           "or raise the server's limit")
    tok = rollout.tokenizer
    for slot in rollout.slots:
        new = slot.episode
        if new.error:
            raise ReplayMismatch(episode, -1, "reset", "a first observation", new.error)
        if new.states[:1] != episode.states[:1]:
            raise ReplayMismatch(episode, -1, "first observation", (episode.states or [""])[0],
                                 (new.states or [""])[0])
        end = episode.turns[0].token_start if episode.turns else episode.prompt_length
        _check_tokens(episode, new, -1, end, tok)
    for j in range(turn):
        rec = episode.turns[j]
        ids = episode.token_ids[rec.token_start:rec.token_end]
        lps = episode.rollout_logprobs[rec.token_start:rec.token_end]
        for i, slot in enumerate(rollout.slots):
            rollout.replay(i, ids, lps, rec.finish_reason)
            new = slot.episode
            got = new.turns[-1]
            got.source = rec.source  # a typed turn stays "human" / "edited"
            for what in ("action", "observation", "reward", "done", "env_error", "parse_error"):
                if getattr(got, what) != getattr(rec, what):
                    raise ReplayMismatch(episode, j, what, getattr(rec, what), getattr(got, what))
            if [c.get("result") for c in got.tool_calls] != [c.get("result") for c in rec.tool_calls]:
                raise ReplayMismatch(episode, j, "tool results", [c.get("result") for c in rec.tool_calls],
                                     [c.get("result") for c in got.tool_calls])
            if new.done:
                raise ReplayMismatch(episode, j, "episode state", "still running",
                                     f"ended ({new.error or new.truncation_reason})")
            end = episode.turns[j + 1].token_start if j + 1 < episode.num_turns else episode.num_tokens
            _check_tokens(episode, new, j, end, tok)
    rollout.turn_counter = turn  # the continuation's sampling seeds are those of turn `turn`
    return rollout


def _edit_observation(rollout: Rollout, index: int, turn: int, text: str) -> None:
    """Replace what episode `index` shows the model after turn `turn - 1` (the first
    observation when `turn == 0`) with `text`; the environment's own state is unchanged."""
    ep, renderer = rollout.slots[index].episode, rollout.slots[index].renderer
    room = rollout.max_context_tokens - rollout.close_reserve - 1
    rendered = rollout.history == "rendered" and turn > 0
    if turn == 0:
        messages = [dict(m) for m in ep.messages[:2]]
        messages[-1]["content"] = text
        ids = renderer.prompt_ids(messages)
        keep = 0
    else:
        last = ep.turns[turn - 1]
        old = last.messages
        messages = ep.messages[:len(ep.messages) - len(old)]
        new_msgs = [{**old[0], "content": text}] if len(old) == 1 else [{"role": "user", "content": text}]
        keep = last.token_end
        if rendered:  # the next turn's prompt rendered whole (`Rollout._next_prompt`)
            ids = renderer.prompt_ids(messages + new_msgs)
        else:
            ids = renderer.delta_ids(messages, ep.token_ids[last.token_start:keep], new_msgs,
                                     add_generation_prompt=True)
        messages = messages + new_msgs
    before = [ep.token_ids[p] for p in ep.sequence_indices(keep)]  # the sequence the new ids follow
    shared = len(before)
    if rendered:
        at = first_difference(ids, before)
        shared = min(len(ids) if at is None else at, len(ids) - 1)
        ids = ids[shared:]
    if shared + len(ids) > room:
        raise ValueError(f"the edited observation takes the episode to {shared + len(ids)} tokens; "
                         f"max_context_tokens={rollout.max_context_tokens} leaves {room}: shorten it")
    ep.truncate_tokens(keep)
    if turn == 0:
        ep.prompt_length = len(ids)
    else:
        last.observation, last.messages = text, new_msgs
    if rendered:
        ep.start_sequence(shared)
    ep.append_tokens(ids, trained=False, logprobs=None, turn=turn - 1)
    ep.messages = messages
    ep.states[-1] = text


def fork_episode(episode: Episode, turn: int, engine: GenerationEngine, *, action: str | None = None,
                 observation: str | None = None, n: int = 4, config: Any = None, environment: Any = None,
                 parser: Any = None, tools: Sequence[Any] = (), temperature: float | None = None,
                 seed: int | None = 0, **overrides: Any) -> TrajectoryBatch:
    """`n` branches of `episode` from turn `turn` (see the module docstring).

    Args:
        episode, engine, config, environment, parser, tools, seed, overrides: as for `replay`.
        turn: the turn where the branches part, 0..num_turns-1.
        action: text typed in place of turn `turn`'s action (loss mask 0, source "edited").
        observation: text the model sees in place of the observation after turn `turn - 1`
            (the first observation for turn 0). At most one of action / observation.
        n: branches.
        temperature: sampling temperature of the continuation (default: the config's; 0 is greedy).

    Returns:
        A `TrajectoryBatch` of the `n` branches, each ended, with `forked_from` set and the
        batch's `meta["fork"]` saying where they part. Rewards are the environment's
        (`episode.outcome` is their sum until the batch is scored).
    """
    if action is not None and observation is not None:
        raise ValueError("give action= or observation=, not both")
    if not 0 <= turn < episode.num_turns:
        raise ValueError(f"turn must be in 0..{episode.num_turns - 1} for an episode of {episode.num_turns} turns, "
                         f"got {turn}")
    stop = getattr(engine, "stop", None)
    if config is not None and stop is not None:
        engine.stop = list(config.inference.stop)  # the run's stop strings, for this call only
    try:
        rollout = replay(episode, turn, engine, n=n, config=config, environment=environment, parser=parser,
                         tools=tools, seed=seed, temperature=temperature, **overrides)
        if action is not None:
            rollout.step(human_actions={i: action for i in range(n)})
            for slot in rollout.slots:
                slot.episode.turns[turn].source = "edited"
            position = episode.turns[turn].token_start
        elif observation is not None:
            for i in range(n):
                _edit_observation(rollout, i, turn, observation)
            if turn:
                position = episode.turns[turn - 1].token_end
            else:
                new = rollout.slots[0].episode.token_ids
                position = next((p for p, (a, b) in enumerate(zip(new, episode.token_ids)) if a != b),
                                min(len(new), episode.prompt_length))
        else:
            position = episode.turns[turn].token_start
        batch = rollout.run()
    finally:
        if stop is not None:
            engine.stop = stop
    for i, branch in enumerate(batch):
        for name in PREFIX_FIELDS:
            if getattr(branch, name)[:position] != getattr(episode, name)[:position]:
                raise RuntimeError(f"branch {i}: {name} before the fork point {position} differ from the original's")
    edit = "action" if action is not None else ("observation" if observation is not None else None)
    label_branches(batch, episode, turn, position, edit, action if action is not None else observation)
    return batch


#: The per-token lists every branch shares with the original episode before the fork point.
PREFIX_FIELDS = ("token_ids", "loss_mask", "rollout_logprobs")


def label_branches(batch: TrajectoryBatch, episode: Episode, turn: int, position: int, edit: str | None,
                   text: str | None) -> None:
    """Number the branches 0..n-1 and record where they part from `episode`: each branch's
    `forked_from` and the batch's `meta["fork"]` (the same dict, plus `n`)."""
    where = {"episode_id": episode.episode_id, "group_id": episode.group_id, "env_seed": episode.env_seed,
             "turn": turn, "token_position": position, "edit": edit, "text": text,
             "original_outcome": episode.outcome}
    for i, branch in enumerate(batch):
        branch.episode_id = i
        branch.forked_from = dict(where)
    batch.meta["fork"] = {**where, "n": len(batch)}


def first_difference(a: Sequence[Any], b: Sequence[Any]) -> int | None:
    """The first index where `a` and `b` differ (the shorter one's length when it is a
    prefix of the other); None when they are equal."""
    at = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    return None if at == len(a) == len(b) else at
