"""`AsyncRollout`: slow environments stall nobody; episodes equal `Rollout`'s token for token.

The "slow" environment sleeps 1.0 s in one episode's first step. What is asserted is
*what happened during that step* (recorded timestamps of engine calls and rollout
events), never how long anything took: in the lock-step `Rollout` no generation runs
while the slow step is in progress; in `AsyncRollout` the other episodes keep
generating their next turns.

HF tests use the tiny model (session `tiny_model_and_tokenizer`); the vLLM ones
(marker `vllm`) reuse the session engine `vllm_tiny_engine`.
"""
from __future__ import annotations

import time
from concurrent.futures import Future

import pytest
import torch

from envs import make_env
from tests.numerics import FP32_LOGPROB_TOL
from workbench.engines.base import EngineError, GenerationEngine, SamplingParams
from workbench.engines.hf import HFEngine
from workbench.rollout import AsyncRollout, Rollout, check_token_alignment

SLOW_SECONDS = 1.0
ENV_NAMES = ["guess_number", "grid", "arithmetic", "text_game", "wordle", "guess_number"]


class TimedEngine(HFEngine):
    """HF engine that records every batched generate it runs (sync calls and batcher batches)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls: list[tuple[float, float, int, int]] = []  # (start, end, prompts, sampled tokens)

    def _generate(self, prompts, params, gen, *rest):
        start = time.perf_counter()
        results = super()._generate(prompts, params, gen, *rest)
        self.calls.append((start, time.perf_counter(), len(prompts), sum(len(r.token_ids) for r in results)))
        return results


class Delayed:
    """Wraps an environment; its first `slow_steps` steps sleep `delay` seconds. Records step times."""

    def __init__(self, env, delay: float = 0.0, slow_steps: int = 1):
        self.env, self.delay, self.slow_steps = env, delay, slow_steps
        self.step_times: list[tuple[float, float]] = []

    def reset(self, seed=None):
        return self.env.reset(seed=seed)

    def step(self, action):
        start = time.perf_counter()
        if self.delay and len(self.step_times) < self.slow_steps:
            time.sleep(self.delay)
        out = self.env.step(action)
        self.step_times.append((start, time.perf_counter()))
        return out

    def __getattr__(self, name):
        return getattr(self.env, name)


def _envs(slow: int | None = None, names=ENV_NAMES):
    return [Delayed(make_env(n), SLOW_SECONDS if i == slow else 0.0) for i, n in enumerate(names)]


def _comparable(ep) -> dict:
    d = ep.to_dict()
    d.pop("rollout_logprobs")
    return d


def assert_same_episodes(a, b, logprob_atol: float = FP32_LOGPROB_TOL):
    """The tiny engine is fp32; batch layouts round otherwise (tests/numerics.py)."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.token_ids == y.token_ids, f"episode {x.episode_id}: token ids differ"
        assert _comparable(x) == _comparable(y), f"episode {x.episode_id}: turns/messages differ"
        diff = max((abs(p - q) for p, q in zip(x.rollout_logprobs, y.rollout_logprobs)), default=0.0)
        assert diff <= logprob_atol, f"episode {x.episode_id}: rollout logprobs differ by {diff:.2e}"


def assert_token_exact(batch, tokenizer):
    for ep in batch:
        assert ep.done and not ep.warnings and ep.error is None, (ep.warnings, ep.error)
        report = check_token_alignment(ep, tokenizer)
        assert report.ok, report.message
        assert len(ep.token_ids) == len(ep.loss_mask) == len(ep.rollout_logprobs)
        for turn in ep.turns:  # sampled tokens are exactly the trained ones, with their logprobs
            s, e = turn.token_start, turn.token_end
            assert ep.loss_mask[s:e] == [1] * (e - s) and all(lp < 0 for lp in ep.rollout_logprobs[s:e])


def _during(t: float, window: tuple[float, float]) -> bool:
    return window[0] < t < window[1]


@pytest.fixture
def timed_engine(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    engine = TimedEngine(model, tok)
    yield engine
    engine.close()


def test_slow_env_step_does_not_stall_other_episodes_hf(timed_engine, tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    kwargs = dict(seeds=[0, 1, 2, 3], max_turns=3, max_tokens=8, temperature=0.0, seed=1)
    names = ["guess_number", "grid", "guess_number", "text_game"]

    # Lock-step: while episode 0's slow step runs, nothing is generated.
    sync_envs = _envs(slow=0, names=names)
    sync = Rollout(timed_engine, sync_envs, **kwargs).run()
    slow = sync_envs[0].step_times[0]
    assert slow[1] - slow[0] >= SLOW_SECONDS
    sync_tokens_during = sum(tokens for start, end, _, tokens in timed_engine.calls if _during(end, slow))
    assert sync_tokens_during == 0

    # Asynchronous: the other episodes keep generating during the slow step.
    timed_engine.calls.clear()
    async_envs = _envs(slow=0, names=names)
    rollout = AsyncRollout(timed_engine, async_envs, **kwargs)
    batch = rollout.run()
    slow = async_envs[0].step_times[0]
    generated = [e for e in rollout.timeline if e.kind == "generated" and _during(e.time, slow)]
    fast_turns = sorted((e.episode, e.turn) for e in generated)
    tokens_during = sum(tokens for start, end, _, tokens in timed_engine.calls if _during(end, slow))
    print(f"\nduring the {SLOW_SECONDS:.1f}s step of episode 0: sync generated {sync_tokens_during} tokens; "
          f"async generated {tokens_during} tokens in {len(generated)} turns {fast_turns}")
    assert generated and all(e.episode != 0 for e in generated)
    assert any(turn >= 1 for _, turn in fast_turns), "fast episodes did not get past their first turn"
    assert tokens_during > 0
    # Episode 0's turn 1 was requested only after its slow step; the others' before that step ended.
    submits = [(e.episode, e.turn, e.time) for e in rollout.timeline if e.kind == "submit" and e.turn == 1]
    assert all(t > slow[1] for ep, _, t in submits if ep == 0)
    assert all(t < slow[1] for ep, _, t in submits if ep != 0)

    # Same episodes as the lock-step run, token for token, and token-exact.
    assert_same_episodes(sync, batch)
    assert_token_exact(batch, tok)
    stats = timed_engine.stats()
    assert stats["batcher_batches"] >= 3 and stats["batcher_max_batch_size"] >= 2


@pytest.mark.parametrize("max_context_tokens", [2048, 230])
def test_async_equals_sync_greedy_token_for_token(tiny_engine, tiny_model_and_tokenizer, max_context_tokens):
    """Five environments (tools and parsers in arithmetic), full and tight context budgets."""
    _, tok = tiny_model_and_tokenizer
    kwargs = dict(seeds=list(range(len(ENV_NAMES))), max_turns=3, max_tokens=12, temperature=0.0, seed=3,
                  max_context_tokens=max_context_tokens)
    sync = Rollout(tiny_engine, [make_env(n) for n in ENV_NAMES], **kwargs).run()
    rollout = AsyncRollout(tiny_engine, [make_env(n) for n in ENV_NAMES], **kwargs)
    batch = rollout.run()
    assert_same_episodes(sync, batch)
    for ep in batch:
        assert check_token_alignment(ep, tok).ok and ep.num_tokens <= max_context_tokens
        assert all(w.startswith("context: ") for w in ep.warnings), ep.warnings  # budget notes only
    if max_context_tokens < 2048:
        assert {ep.truncation_reason for ep in batch} >= {"context"}
    assert sum(ep.num_turns for ep in batch) >= 6
    # every episode's events are in order: submit < generated < env_start < env_end
    for i in range(len(batch)):
        for turn in range(batch[i].num_turns):
            kinds = [e.kind for e in rollout.timeline if e.episode == i and e.turn == turn and e.kind != "done"]
            assert kinds == ["submit", "generated", "env_start", "env_end"], (i, turn, kinds)


def test_seeded_sampling_does_not_depend_on_batching(timed_engine):
    """Per-request seeds: a slow episode changes which requests share a batch, not the tokens."""
    kwargs = dict(seeds=[0, 0, 1, 1], max_turns=3, max_tokens=8, temperature=1.0, seed=5)
    names = ["guess_number", "guess_number", "grid", "grid"]
    first = AsyncRollout(timed_engine, _envs(names=names), **kwargs).run()
    plain_batches = [n for _, _, n, _ in timed_engine.calls]
    timed_engine.calls.clear()
    second = AsyncRollout(timed_engine, _envs(slow=1, names=names), **kwargs).run()
    slow_batches = [n for _, _, n, _ in timed_engine.calls]
    print(f"\nbatch sizes without a slow env {plain_batches}, with one {slow_batches}")
    assert_same_episodes(first, second)
    # GRPO groups: episodes sharing an environment seed still sample different answers
    assert first[0].token_ids != first[1].token_ids


class PlainEngine(GenerationEngine):
    """An engine with only `generate_ids` (like the server backend): uses the default `submit`."""

    name = "plain"

    def __init__(self, inner):
        super().__init__(inner.tokenizer)
        self.inner, self.calls = inner, 0

    def generate_ids(self, prompts, params):
        self.calls += 1
        return self.inner.generate_ids(prompts, params)


def test_default_submit_and_agenerate_ids(tiny_engine, tiny_model_and_tokenizer):
    import asyncio

    _, tok = tiny_model_and_tokenizer
    engine = PlainEngine(tiny_engine)
    kwargs = dict(seeds=[0, 1, 2], max_turns=2, max_tokens=8, temperature=0.0)
    names = ["guess_number", "grid", "text_game"]
    sync = Rollout(tiny_engine, [make_env(n) for n in names], **kwargs).run()
    batch = AsyncRollout(engine, [make_env(n) for n in names], **kwargs).run()
    assert_same_episodes(sync, batch)
    assert engine.calls == 6  # one single-prompt call per turn
    prompt = sync[0].token_ids[: sync[0].prompt_length]
    greedy = SamplingParams(max_tokens=6, temperature=0.0)
    for eng in (engine, tiny_engine):  # default submit, and the hf dynamic batcher
        got = asyncio.run(eng.agenerate_ids([prompt, prompt[:-1]], greedy))
        assert [r.token_ids for r in got] == [r.token_ids for r in tiny_engine.generate_ids([prompt, prompt[:-1]], greedy)]
    engine.close()


class FailingEngine(HFEngine):
    """Fails the `fail_at`-th submitted request."""

    def __init__(self, *args, fail_at: int, **kwargs):
        super().__init__(*args, **kwargs)
        self.fail_at, self.submitted = fail_at, 0

    def submit(self, prompt, params):
        self.submitted += 1
        if self.submitted == self.fail_at:
            fut = Future()
            fut.set_exception(RuntimeError("simulated backend crash"))
            return fut
        return super().submit(prompt, params)


def test_engine_failure_fails_that_episode_and_keeps_the_rest(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    engine = FailingEngine(model, tok, fail_at=6)  # 4 first turns, then the 2nd request of turn 1
    rollout = AsyncRollout(engine, [make_env("guess_number") for _ in range(4)], seeds=[0, 1, 2, 3],
                           max_turns=3, max_tokens=6, temperature=0.0)
    with pytest.raises(EngineError, match="simulated backend crash"):
        rollout.run()
    failed = [ep for ep in rollout.batch if ep.error]
    assert len(failed) == 1 and "engine failed" in failed[0].error
    assert check_token_alignment(failed[0], tok).ok  # closed cleanly at its last good turn
    assert all(ep.num_turns >= 1 for ep in rollout.batch)
    engine.close()


def test_trainer_async_rollout_flag(tiny_model_path, tmp_path):
    from workbench import ConfigStore, Trainer

    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.inference.max_tokens, c.inference.max_turns = 8, 2
    c.inference.async_rollout = True
    c.training.batch_size, c.training.group_size, c.training.micro_batch_size = 4, 2, 2
    c.checkpoint.output_dir, c.checkpoint.save_interval = str(tmp_path / "ckpt"), 0
    trainer = Trainer(c.validate(), environment=make_env("guess_number"))
    assert isinstance(trainer.make_rollout([0], 2), AsyncRollout)
    metrics = trainer.train_step()
    assert metrics["actor/skipped_updates"] == 0 and torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    assert all(check_token_alignment(ep, trainer.tokenizer).ok for ep in trainer.last_batch)
    trainer.engine.close()


# ---------------------------------------------------------------------------------------
# vLLM: requests join the running batch
# ---------------------------------------------------------------------------------------

@pytest.mark.vllm
def test_vllm_submit_joins_the_running_batch(vllm_tiny_engine, vllm_tiny_model_path):
    """A short request submitted while a long one is decoding finishes first: it was added
    to the running batch (continuous batching), it did not wait for the long one."""
    from workbench.models.loading import load_tokenizer

    engine = vllm_tiny_engine
    tok = load_tokenizer(str(vllm_tiny_model_path))
    prompt = list(tok.apply_chat_template([{"role": "user", "content": "Count to one hundred."}],
                                          add_generation_prompt=True, return_dict=False))
    steps0 = engine.stats()["engine_steps"]
    long = engine.submit(prompt, SamplingParams(max_tokens=300, temperature=1.0, seed=1))
    while engine.stats()["engine_steps"] < steps0 + 3 and not long.done():
        time.sleep(0.001)
    assert not long.done(), "the long request finished before the short one could be submitted"
    short = engine.submit(prompt[:-3], SamplingParams(max_tokens=4, temperature=1.0, seed=2))
    assert len(short.result(timeout=300).token_ids) == 4
    assert not long.done(), "the short request waited for the long one"
    assert len(long.result(timeout=300).token_ids) == 300
    assert engine.stats()["max_running_requests"] >= 2


@pytest.mark.vllm
def test_vllm_async_rollout_slow_env_and_equal_to_sync(vllm_tiny_engine, vllm_tiny_model_path):
    from workbench.models.loading import load_tokenizer

    engine = vllm_tiny_engine
    tok = load_tokenizer(str(vllm_tiny_model_path))
    names = ["guess_number", "grid", "text_game", "guess_number"]
    kwargs = dict(seeds=[0, 1, 2, 3], max_turns=3, max_tokens=8, temperature=0.0, seed=1)
    sync = Rollout(engine, _envs(slow=0, names=names), **kwargs).run()
    envs = _envs(slow=0, names=names)
    rollout = AsyncRollout(engine, envs, **kwargs)
    batch = rollout.run()
    slow = envs[0].step_times[0]
    generated = [e for e in rollout.timeline if e.kind == "generated" and _during(e.time, slow)]
    print(f"\nvLLM: during episode 0's {SLOW_SECONDS:.1f}s step the others generated "
          f"{sum(e.tokens for e in generated)} tokens in {len(generated)} turns")
    assert generated and all(e.episode != 0 for e in generated)
    assert any(e.turn >= 1 for e in generated)
    assert_same_episodes(sync, batch)
    assert_token_exact(batch, tok)


@pytest.mark.vllm
def test_vllm_seeded_requests_beyond_one_prefill_step(vllm_tiny_engine):
    """40 seeded prompts x 150 tokens exceed one engine step (4096 tokens). With chunked
    prefill vLLM rewinds seeded CPU generators and fails ("CPU Generator does not use
    offset"); the engine runs unchunked on CPU. Both entry points: a batch and submits."""
    prompts = [[(7 * i + j) % 500 + 5 for j in range(150)] for i in range(40)]
    params = SamplingParams(max_tokens=4, temperature=1.0, seed=1)
    batch = vllm_tiny_engine.generate_ids(prompts, params)
    assert all(r.finish_reason == "length" and len(r.token_ids) == 4 for r in batch)
    futures = [vllm_tiny_engine.submit(p, SamplingParams(max_tokens=4, temperature=1.0, seed=1 + i))
               for i, p in enumerate(prompts)]
    assert [f.result(timeout=300).token_ids for f in futures] == [r.token_ids for r in batch]
