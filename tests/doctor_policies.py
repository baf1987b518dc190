"""Scripted policies for the run doctor's tests: a `GenerationEngine` whose replies a
Python function chooses from the episode's environment, emitted as token ids through
the real tokenizer into a real `Rollout` on a real environment (the policy is scripted;
the rollout, the environments, the parsers and the doctor are the real ones)."""
from __future__ import annotations

from typing import Any, Callable

from envs import EXPERTS, make_env
from workbench.engines.base import GenerationEngine, GenerationResult
from workbench.rollout.chat import ChatRenderer
from workbench.rollout.rollout import Rollout

ReplyFn = Callable[[Any, Any], str]  # (environment, episode) -> reply text


class ScriptedPolicy(GenerationEngine):
    """Replies `reply_fn(env, episode)` for each prompt; a reply longer than the turn's
    `max_tokens` is cut there with `finish_reason="length"`, like a model's."""

    name = "scripted"

    def __init__(self, tokenizer: Any, reply_fn: ReplyFn):
        super().__init__(tokenizer)
        self.reply_fn = reply_fn
        self.end = ChatRenderer(tokenizer).stop_ids[0]
        self.rollout: Rollout | None = None

    def generate_ids(self, prompts, params):
        slots = {id(s.episode.token_ids): s for s in self.rollout.slots}
        out = []
        for prompt in prompts:
            slot = slots[id(prompt)]  # the rollout passes each episode's own token list
            ids = self.tokenizer.encode(self.reply_fn(slot.env, slot.episode), add_special_tokens=False)
            if len(ids) >= params.max_tokens:
                ids, finish = ids[:params.max_tokens], "length"
            else:
                ids, finish = ids + [self.end], "stop"
            out.append(GenerationResult(ids, [-1.0] * len(ids), finish))
        return out


def roll(tokenizer: Any, env_name: str, reply_fn: ReplyFn, groups: int = 4, group_size: int = 2,
         first_seed: int = 0, max_tokens: int = 32, max_turns: int = 6, own_parsing: bool = False, **params: Any):
    """One batch of `groups` x `group_size` episodes of `env_name` played by `reply_fn`.
    `own_parsing=True` sends whole replies to the environment's own parser (no
    `action_parser`, e.g. arithmetic's calculator then runs inside `env.step`)."""
    engine = ScriptedPolicy(tokenizer, reply_fn)
    env = make_env(env_name, **params)
    if own_parsing:
        env.action_parser = None
    rollout = Rollout.from_env(engine, env, groups, group_size, first_seed=first_seed, max_turns=max_turns,
                               max_tokens=max_tokens, temperature=1.0, progress=False)
    engine.rollout = rollout
    return rollout.run()


def roll_steps(tokenizer: Any, env_name: str, policies: list[ReplyFn], **kwargs: Any) -> list:
    """One batch per policy (step 0, 1, ...), each on fresh seeds."""
    return [roll(tokenizer, env_name, fn, first_seed=100 * i, **kwargs) for i, fn in enumerate(policies)]


def expert(name: str) -> ReplyFn:
    """The environment's scripted expert (`envs.EXPERTS`) as a reply function."""
    return lambda env, episode: EXPERTS[name](env)


def count_up_from_4(env: Any, episode: Any) -> str:
    """The demo's learned trick on guess_number: "You have N guesses left, so" with N = 4, 5, 6, ...
    (the parser reads the first number of the reply)."""
    return f"You have {4 + episode.num_turns} guesses left, so"


def count_up_bare(env: Any, episode: Any) -> str:
    """What 1 SFT step teaches the embedded model on guess_number under the strict format (the
    seed-1 stall of issue 44): a bare "4" first, then one up after "too low", one down after
    "too high". Deterministic; it wins every secret it reaches in 4 guesses and never 8 of 1..8."""
    last = env.guesses[-1] if env.guesses else None
    if last is None:
        return "4"
    return str(last + 1 if env.secret > last else last - 1)
