"""Third-party suites that use the global RNGs, and environments that report no success
(issue 50, item 7).

Many text suites seed Python's `random` and numpy's global state in `reset` and draw from it
in `step`. Wrapped with `GymTextEnvironment` they failed `check_env`'s global-RNG check, and
episodes stepped side by side in threads drew each other's numbers. An environment that never
reports success showed "success 0.00" in the console, the summary and the doctor: it is not 0,
it is not known.
"""
from __future__ import annotations

import math
import random
import string
import threading
import time

import gymnasium
import numpy as np
from gymnasium import spaces

from workbench.environments.adapters.gym import GymTextEnvironment
from workbench.environments.checker import check_env
from workbench.environments.global_rng import GlobalRNGScope
from workbench.trajectory import Episode, TrajectoryBatch, Turn, format_rate

CHARSET = string.ascii_letters + string.digits + " :!.,"


class GlobalRandomSuite(gymnasium.Env):
    """A suite written the common way: `reset` seeds the global RNGs, `step` draws from them
    (a pause between its two draws lets another thread run in between)."""

    metadata = {"render_modes": []}

    def __init__(self, pause: float = 0.0, report: str | None = None):
        self.observation_space = spaces.Text(max_length=64, charset=CHARSET)
        self.action_space = spaces.Text(max_length=64, charset=CHARSET)
        self.pause, self.report, self.turn = pause, report, 0

    def reset(self, *, seed=None, options=None):
        if seed is not None:
            random.seed(seed)
            np.random.seed(seed)
        self.turn = 0
        return f"number {random.randint(0, 999)}", {}

    def step(self, action):
        a = random.randint(0, 999)
        time.sleep(self.pause)
        b = int(np.random.randint(0, 999))
        self.turn += 1
        done = self.turn >= 3
        info = {} if self.report is None or not done else {self.report: a % 2 == 0}
        return f"numbers {a} {b}", float(a % 2), done, False, info


def _episode(env: GymTextEnvironment, seed: int) -> list[str]:
    env.seed(seed)
    out = [env.reset()]
    done = False
    while not done:
        obs, _, done, _ = env.step("go")
        out.append(obs)
    return out


def test_a_suite_that_seeds_and_draws_from_the_global_rngs_passes_check_env():
    results = {r.name: r for r in check_env(GymTextEnvironment(GlobalRandomSuite()))}
    assert results["global_rng"].passed, results["global_rng"].message
    assert all(r.passed for r in results.values()), [r for r in results.values() if not r.passed]


def test_the_callers_global_state_is_untouched_and_the_same_seed_gives_the_same_episode():
    random.seed(123)
    np.random.seed(123)
    expected_py, expected_np = random.random(), np.random.random()
    random.seed(123)
    np.random.seed(123)
    env = GymTextEnvironment(GlobalRandomSuite())
    first = _episode(env, 7)
    assert (random.random(), np.random.random()) == (expected_py, expected_np)  # as if nothing ran
    random.seed(999)  # whatever the caller's state, seed 7 plays the same episode
    assert _episode(GymTextEnvironment(GlobalRandomSuite()), 7) == first
    # the episode is the suite's own, as it plays unwrapped
    suite = GlobalRandomSuite()
    plain = [suite.reset(seed=7)[0]] + [suite.step("go")[0] for _ in range(3)]
    assert first == plain


def test_episodes_stepping_side_by_side_in_threads_never_mix_seeds():
    seeds = [0, 1, 2, 3, 4, 5]
    alone = {s: _episode(GymTextEnvironment(GlobalRandomSuite()), s) for s in seeds}
    together: dict[int, list[str]] = {}

    def play(seed: int) -> None:
        together[seed] = _episode(GymTextEnvironment(GlobalRandomSuite(pause=0.01)), seed)

    threads = [threading.Thread(target=play, args=(s,)) for s in seeds]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert together == alone


def test_the_scope_restores_the_outer_state_even_when_the_call_raises():
    scope = GlobalRNGScope(5)
    random.seed(1)
    state = random.getstate()
    try:
        with scope.active():
            random.random()
            raise RuntimeError("the suite crashed")
    except RuntimeError:
        pass
    assert random.getstate() == state


def test_success_comes_from_is_success_success_or_success_fn():
    def won(env: GymTextEnvironment) -> list[bool]:
        env.seed(3)
        env.reset()
        infos = [env.step("go")[3] for _ in range(3)]
        return [i["success"] for i in infos if "success" in i]

    suite_won = GlobalRandomSuite(report="is_success")
    assert won(GymTextEnvironment(suite_won)) in ([True], [False])
    assert won(GymTextEnvironment(GlobalRandomSuite(report="success"))) == won(GymTextEnvironment(suite_won))
    assert won(GymTextEnvironment(GlobalRandomSuite())) == []  # reports nothing: nothing invented
    fn = GymTextEnvironment(GlobalRandomSuite(), success_fn=lambda obs, r, term, trunc, info: term or None)
    assert won(fn) == [True]  # None on the first steps: not known there


def _batch(infos: list[dict]) -> TrajectoryBatch:
    eps = []
    for i, info in enumerate(infos):
        eps.append(Episode(episode_id=i, group_id=str(i), turns=[Turn(index=0, action="a", reward=0.0, done=True,
                                                                   info=dict(info))],
                           success=bool(info.get("success"))))
    return TrajectoryBatch(eps)


def test_an_environment_that_never_reports_success_has_no_success_rate():
    silent = _batch([{}, {}, {}])
    rate = silent.summary()["env/success_rate"]
    assert math.isnan(rate) and format_rate(rate) == "-"
    assert "success -" in repr(silent)
    reported = _batch([{"success": False}, {"success": True}, {"success": False}])
    assert reported.summary()["env/success_rate"] == 1 / 3 and format_rate(1 / 3) == "0.33"


def test_an_environment_that_says_it_reports_success_has_a_rate_even_when_no_step_mentioned_it():
    """guess_number says `info["success"]` on every scored step, but not on an invalid reply: a
    batch of invalid replies only has success rate 0 (its `reports_success` is True), not "-"."""
    from envs import make_env

    assert make_env("guess_number").reports_success is True
    batch = _batch([{"invalid_action": True}, {"invalid_action": True}])
    for ep in batch:
        ep.success_reported = True  # what the rollout records from the environment's reports_success
    assert batch.summary()["env/success_rate"] == 0.0
