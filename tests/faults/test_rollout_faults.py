"""Rollout, environment and reward faults: one misbehaving episode never sinks the batch.

One test group per fault of the reliability issue:

1. an environment whose `reset`/`step` never returns (a loop of short sleeps, a busy
   loop) -> its episode ends with a timeout error after `environment.step_timeout`,
   the other episodes finish normally, and no thread is left behind (`Rollout` and
   `AsyncRollout`); a call blocked in C code is reported as a stuck daemon thread;
2. over-long observations (first and later) -> no episode exceeds `max_context_tokens`,
   the reason is recorded, token alignment still holds;
3. NaN / inf environment rewards -> `RewardError` naming the episode and turn;
4. rewards that overflow float32 -> `RewardError` naming the episode; a reward_fn that
   fails on one episode changes no episode's score; timed-out tool threads end.

The environments are real `BaseEnvironment` subclasses that misbehave; generation uses
the tiny test model. Hangs are released (a `threading.Event`) when a test ends, and
rollouts run on a runner thread joined with a time limit, so code without the timeouts
fails the test instead of hanging it.
"""
from __future__ import annotations

import math
import re
import threading
import time
from collections import Counter

import pytest

from envs import make_env
from workbench import ConfigStore, RewardError, Trainer
from workbench.environments.base import BaseEnvironment
from workbench.reward import rescore
from workbench.rollout import Rollout, check_token_alignment
from workbench.rollout.async_rollout import AsyncRollout
from workbench.tools import ToolRegistry

ROLLOUTS = {"sync": Rollout, "async": AsyncRollout}
STEP_TIMEOUT = 0.5


class Countdown(BaseEnvironment):
    """Say anything three times; reward `reward_value` per step (configurable misbehaviour).

    Config params: `hang` ("reset", "step" or None), `hang_kind` ("sleeps": a loop of
    1 ms sleeps, "busy": a pure busy loop, "c": one long `time.sleep` in C),
    `reward_value`, `first_obs_words` / `later_obs_words` (length of observations).
    A hang lasts until `release` is set (or `c_sleep` seconds for "c").
    """

    def __init__(self, config=None, release: threading.Event | None = None):
        super().__init__(config)
        self.release = release or threading.Event()

    def _hang(self, where: str) -> None:
        if self.params.get("hang") != where:
            return
        kind = self.params.get("hang_kind", "sleeps")
        if kind == "c":
            time.sleep(self.params["c_sleep"])
            return
        while not self.release.is_set():
            if kind == "sleeps":
                time.sleep(0.001)

    def reset(self) -> str:
        self._hang("reset")
        words = self.params.get("first_obs_words", 0)
        return "Say a number." + (" word" * words)

    def step(self, action: str):
        self._hang("step")
        words = self.params.get("later_obs_words", 0)
        done = self.step_count >= 2
        return "Again." + (" more" * words), self.params.get("reward_value", 1.0), done, {}


def make_countdown(release=None, **params) -> Countdown:
    # A dict config: `step_timeout` is an EnvironmentConfig field (code without it puts it
    # into params and ignores it, so there the hang is not cut short).
    return Countdown({"max_steps": 5, "step_timeout": STEP_TIMEOUT, **params}, release=release)


def run_bounded(rollout, seconds: float = 120.0, release: threading.Event | None = None):
    """`rollout.run()` on a runner thread; fails (after releasing any hang) if it takes too long."""
    box = {}

    def target():
        try:
            box["batch"] = rollout.run()
        except BaseException as exc:  # reported below
            box["error"] = exc

    runner = threading.Thread(target=target, daemon=True)
    runner.start()
    runner.join(seconds)
    if runner.is_alive():
        if release is not None:
            release.set()
        runner.join(30)
        pytest.fail(f"{type(rollout).__name__}.run() did not return within {seconds:g} s (a hung environment "
                    "held the whole batch)")
    if "error" in box:
        raise box["error"]
    return box["batch"]


def thread_names() -> list[str]:
    """Names of the live threads; tqdm's monitor is left out (it starts and exits on its own
    with progress bars, e.g. model loading, independent of the code under test)."""
    return sorted(t.name for t in threading.enumerate() if t.name != "tqdm_monitor")


def new_threads(baseline: list[str]) -> list[str]:
    """The live threads that were not in `baseline` (a thread an earlier test left may end
    meanwhile: only threads started since count)."""
    return sorted((Counter(thread_names()) - Counter(baseline)).elements())


def assert_normal(ep, tok) -> None:
    assert ep.done and ep.error is None, ep
    assert ep.num_turns >= 1 and ep.response_length > 0, ep
    assert check_token_alignment(ep, tok).ok
    assert ep.warnings == [], ep.warnings


def warm_up(engine, cls) -> None:
    """One normal run so engine-owned threads (the async batcher) exist before a baseline."""
    cls(engine, [make_env("guess_number")], seeds=[0], max_turns=1, max_tokens=4).run()


# -- 1. hung environments ------------------------------------------------------------------

@pytest.mark.timeout(300)
@pytest.mark.parametrize("hang_kind", ["sleeps", "busy"])
@pytest.mark.parametrize("kind", ["sync", "async"])
def test_hung_reset_and_step_end_their_episodes_only(tiny_engine, kind, hang_kind):
    cls = ROLLOUTS[kind]
    warm_up(tiny_engine, cls)
    release = threading.Event()
    envs = [make_env("guess_number"), make_countdown(release, hang="reset", hang_kind=hang_kind),
            make_countdown(release, hang="step", hang_kind=hang_kind), make_countdown(release)]
    rollout = cls(tiny_engine, envs, seeds=[0, 1, 2, 3], max_turns=3, max_tokens=8)
    baseline = thread_names()
    start = time.perf_counter()
    try:
        batch = run_bounded(rollout, seconds=30, release=release)
    finally:
        release.set()
    seconds = time.perf_counter() - start
    tok = tiny_engine.tokenizer

    reset_ep, step_ep = batch[1], batch[2]
    assert reset_ep.done and reset_ep.num_tokens == 0 and reset_ep.num_turns == 0
    assert "Countdown.reset did not return within 0.5 s" in reset_ep.error
    assert "interrupted; its thread has ended" in reset_ep.error
    assert step_ep.done and step_ep.num_turns == 1
    assert "CallTimeout: Countdown.step did not return within 0.5 s" in step_ep.error
    assert step_ep.turns[0].env_error.startswith("CallTimeout")
    assert check_token_alignment(step_ep, tok).ok and step_ep.warnings == []
    for i in (0, 3):
        assert_normal(batch[i], tok)
    assert batch[3].num_turns == 3  # Countdown ends after its third step
    assert batch.meta["rollout/env_timeouts"] == 2 and "rollout/stuck_threads" not in batch.meta  # 0: not set
    # every timed-out call's thread has ended: no thread more than before the run
    assert new_threads(baseline) == []
    assert seconds < 30


@pytest.mark.timeout(120)
def test_call_blocked_in_c_is_reported_as_a_stuck_daemon_thread(tiny_engine):
    """The honest limit: a thread inside one long C call cannot be interrupted."""
    envs = [make_countdown(hang="step", hang_kind="c", c_sleep=4.0), make_countdown()]
    rollout = Rollout(tiny_engine, envs, seeds=[0, 1], max_turns=2, max_tokens=6)
    start = time.perf_counter()
    with pytest.warns(RuntimeWarning, match="could not be interrupted"):
        batch = run_bounded(rollout, seconds=60)
    assert time.perf_counter() - start < 3.5  # did not wait for the 4 s sleep
    assert "could not be interrupted (it is blocked inside C code)" in batch[0].error
    assert batch.meta["rollout/stuck_threads"] >= 1
    assert_normal(batch[1], tiny_engine.tokenizer)
    stuck = [t for t in threading.enumerate() if t.name == "wb-timed-Countdown.step"]
    assert stuck and all(t.daemon for t in stuck)
    for t in stuck:  # once the C call returns, the pending interrupt ends the thread
        t.join(10)
        assert not t.is_alive()


def test_step_timeout_comes_from_the_environment_config(tiny_engine):
    envs = [make_countdown(), make_env("guess_number"), Countdown({"step_timeout": None})]
    assert Rollout(tiny_engine, envs).step_timeouts == [STEP_TIMEOUT, 60.0, None]
    assert Rollout(tiny_engine, envs, step_timeout=2.5).step_timeouts == [2.5, 2.5, 2.5]
    with pytest.raises(ValueError, match="step_timeout must be a number of seconds >= 0 or None, got -1"):
        Rollout(tiny_engine, envs, step_timeout=-1)


# -- 2. context budget -----------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["sync", "async"])
def test_no_episode_exceeds_the_context_budget(tiny_engine, kind):
    budget = 512
    envs = [make_env("guess_number"), make_countdown(first_obs_words=8000),
            make_countdown(later_obs_words=3000), make_countdown(first_obs_words=8000, later_obs_words=3000),
            make_countdown(later_obs_words=3000, max_steps=1)]
    rollout = ROLLOUTS[kind](tiny_engine, envs, seeds=[0, 1, 2, 3, 4], max_turns=3, max_tokens=16,
                             max_context_tokens=budget)
    batch = run_bounded(rollout)
    tok = tiny_engine.tokenizer
    for ep in batch:
        assert ep.num_tokens <= budget, (ep.episode_id, ep.num_tokens)
        assert check_token_alignment(ep, tok).ok, check_token_alignment(ep, tok).message
        assert ep.error is None
    # long first observation: cut, reason recorded, the model still acts
    for i in (1, 3):
        ep = batch[i]
        cut = [w for w in ep.warnings if w.startswith("context: first observation cut from 40,013 to ")]
        assert len(cut) == 1 and len(ep.warnings) == 1, ep.warnings
        assert ep.num_turns >= 1 and ep.response_length > 0
        assert "[... observation cut: 40,013 characters" in ep.messages[1]["content"]
        assert ep.messages[1]["content"].startswith("Say a number. word word")
    # the cut keeps room for one full turn (16 tokens here); the next observation then
    # does not fit, which ends the episode as "context" like any later overflow
    assert batch[1].turns[0].finish_reason in ("stop", "length")
    assert batch[1].truncation_reason in ("context", None)
    # long later observation: the episode ends as truncated "context" before it is appended
    for i in (2, 3):
        ep = batch[i]
        assert ep.truncated and ep.truncation_reason == "context" and ep.num_turns == 1
        assert " more more" not in tok.decode(ep.token_ids)
    # long observation after the last turn (max_steps=1): not appended, the turn closed, noted
    ep = batch[4]
    assert ep.num_turns == 1 and ep.truncation_reason == "max_steps" and ep.turns[0].done
    # (its size in tokens when it was tokenized, else in characters: more characters than the
    # tokens left can hold are not tokenized, see test_observation_size_faults.py)
    assert len(ep.warnings) == 1 and re.fullmatch(
        r"context: the observation after the last turn \((\d+ tokens|15,006 characters, over \d+ tokens)\) was "
        r"not appended; it would pass max_context_tokens=512", ep.warnings[0]), ep.warnings
    size = re.search(r"\((\d+) tokens\)", ep.warnings[0])
    assert size is None or int(size.group(1)) > 3000
    assert ep.turns[0].observation.startswith("Again. more more")  # kept with the turn
    assert batch.meta["rollout/context_cuts"] == 2


def test_opening_without_room_refuses_the_episode(tiny_engine):
    class LongPrompt(Countdown):
        def get_prompt_prefix(self) -> str:
            return "Rules:" + " rule" * 3000

    envs = [LongPrompt({"max_steps": 3}), make_env("guess_number")]
    batch = run_bounded(Rollout(tiny_engine, envs, seeds=[0, 1], max_turns=2, max_tokens=8, max_context_tokens=256))
    ep = batch[0]
    assert ep.done and ep.num_tokens == 0 and ep.num_turns == 0
    assert ep.error.startswith("context: the opening prompt takes ") and "max_context_tokens=256" in ep.error
    assert_normal(batch[1], tiny_engine.tokenizer)
    assert batch[1].num_tokens <= 256


def test_typed_action_longer_than_the_room_is_rejected(tiny_engine):
    rollout = Rollout(tiny_engine, [make_env("guess_number"), make_env("guess_number")], seeds=[0, 1],
                      max_turns=2, max_tokens=8, max_context_tokens=256).reset()
    before = [list(s.episode.token_ids) for s in rollout.slots]
    with pytest.raises(ValueError, match=r"episode 0 is \d+ tokens but only \d+ fit in max_context_tokens=256"):
        rollout.step(human_actions={0: "eight " * 400})
    assert [s.episode.token_ids for s in rollout.slots] == before  # nothing changed


# -- 3. non-finite environment rewards -------------------------------------------------------

def tiny_trainer(tiny_model_path, tmp_path) -> Trainer:
    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.checkpoint.output_dir = str(tmp_path / "ckpt")
    c.checkpoint.save_interval = 0
    return Trainer(c.validate(), environment=make_env("guess_number"))


def batch_with_rewards(engine, rewards):
    envs = [make_countdown(reward_value=r) for r in rewards]
    return Rollout(engine, envs, seeds=list(range(len(envs))), max_turns=2, max_tokens=6).run()


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -float("inf")])
def test_non_finite_env_reward_is_rejected_naming_the_episode(tiny_engine, tiny_model_path, tmp_path, bad):
    trainer = tiny_trainer(tiny_model_path, tmp_path)
    batch = batch_with_rewards(tiny_engine, [1.0, bad, 1.0])
    assert all(ep.done and ep.error is None for ep in batch)
    with pytest.raises(RewardError, match=rf"environment reward {bad} at turn 0 of episode 1 \(group 'seed1'"):
        trainer.score(batch)
    assert [ep.score for ep in batch] == [None, None, None]
    assert "token_level_scores" not in batch.tensors
    with pytest.raises(RewardError, match="episode 1"):
        rescore(batch, None)
    assert [ep.score for ep in batch] == [None, None, None]
    # a reward_fn does not launder them: env rewards feed metrics and shaped rewards too
    with pytest.raises(RewardError, match="episode 1"):
        trainer.score(batch, reward_fn=lambda t: 0.5)
    assert [ep.score for ep in batch] == [None, None, None]
    fine = batch_with_rewards(tiny_engine, [1.0, 0.25])
    trainer.score(fine)
    assert [ep.score for ep in fine] == [2.0, 0.5]  # two steps each (max_turns=2)


# -- 4. overflowing rewards, atomic re-scoring, tool threads --------------------------------------

def test_reward_overflowing_float32_names_the_episode(tiny_engine, tiny_model_path, tmp_path):
    trainer = tiny_trainer(tiny_model_path, tmp_path)
    batch = batch_with_rewards(tiny_engine, [1.0, 1.0, 1e300])
    with pytest.raises(RewardError, match=r"environment reward 1e\+300 at turn 0 of episode 2 .*overflows float32"):
        trainer.score(batch)
    ok = batch_with_rewards(tiny_engine, [1.0, 1.0])
    with pytest.raises(RewardError, match=r"reward_fn returned 1e\+300 for episode 1, which overflows float32"):
        trainer.score(ok, reward_fn=lambda t: 1e300 if t.episode_id == 1 else 0.0)
    # in range one at a time, but their sum (the episode's return) is not
    big = batch_with_rewards(tiny_engine, [3e38])
    assert big[0].num_turns == 2 and math.isfinite(sum(big[0].rewards))
    with pytest.raises(RewardError, match=r"rewards of episode 0 .* sum to 6e\+38, which overflows float32"):
        trainer.score(big)


def test_failing_reward_fn_changes_no_score(tiny_engine, tiny_model_path, tmp_path):
    trainer = tiny_trainer(tiny_model_path, tmp_path)
    batch = batch_with_rewards(tiny_engine, [1.0] * 5)
    trainer.score(batch, reward_fn=lambda t: 1.0)
    assert [ep.score for ep in batch] == [1.0] * 5

    def fails_on_3(trajectory):
        if trajectory.episode_id == 3:
            raise KeyError("answer")
        return 2.0

    with pytest.raises(RewardError, match=r"reward_fn raised KeyError on episode 3 .*answer"):
        trainer.score(batch, reward_fn=fails_on_3)
    assert [ep.score for ep in batch] == [1.0] * 5
    with pytest.raises(RewardError, match="episode 3"):
        rescore(batch, fails_on_3)
    assert [ep.score for ep in batch] == [1.0] * 5
    trainer.score(batch, reward_fn=lambda t: 2.0)
    assert [ep.score for ep in batch] == [2.0] * 5


@pytest.mark.timeout(60)
@pytest.mark.parametrize("hang_kind", ["sleeps", "busy"])
def test_timed_out_tool_threads_end(hang_kind):
    release = threading.Event()

    def spin(x: int = 0) -> str:
        """Never returns until released.

        Args:
            x: ignored.
        """
        while not release.is_set():
            if hang_kind == "sleeps":
                time.sleep(0.001)
        return "released"

    registry = ToolRegistry(default_timeout=0.3)
    registry.register(spin)
    baseline = thread_names()
    try:
        for _ in range(3):
            outcome = registry.execute("spin", {"x": 1})
            assert not outcome.success and outcome.error_type == "timeout"
            assert outcome.result == "Tool 'spin' timed out after 0.3 s"
        assert registry.stats()["spin"]["timeouts"] == 3
        assert new_threads(baseline) == []  # no timed-out call left a thread behind
    finally:
        release.set()
