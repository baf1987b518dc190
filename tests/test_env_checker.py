"""Tests for `workbench.environments.checker.check_env`: every bundled env passes, and each
kind of broken env is caught by the right named check with a message saying what
to fix."""
from __future__ import annotations

import itertools
import warnings

import numpy as np
import pytest

from envs import ENVIRONMENTS, make_env
from workbench.environments.base import BaseEnvironment
from workbench.environments.checker import CHECKS, CheckResult, EnvCheckError, check_env


@pytest.mark.parametrize("name", sorted(ENVIRONMENTS))
def test_bundled_envs_pass_every_check(name):
    results = check_env(make_env(name))
    assert [r.name for r in results] == [name for name, _ in CHECKS]
    assert all(isinstance(r, CheckResult) and r.passed for r in results), results


class GenericTestEnv(BaseEnvironment):
    """An env whose reset/step are injected, so each broken case is one line."""

    def __init__(self, reset_fn=None, step_fn=None, **kwargs):
        super().__init__({"max_steps": 3, **kwargs})
        self.reset_fn = reset_fn or (lambda env: "start")
        self.step_fn = step_fn or (lambda env, action: ("obs", 0.0, False, {}))

    def reset(self) -> str:
        return self.reset_fn(self)

    def step(self, action: str):
        return self.step_fn(self, action)

    def get_prompt_prefix(self) -> str:
        return "Reply with anything."


def failures(env) -> dict[str, str]:
    """{check name: message} of the failed checks (check_env must raise)."""
    with pytest.raises(EnvCheckError) as excinfo:
        check_env(env)
    failed = {r.name: r.message for r in excinfo.value.results if not r.passed}
    for name, message in failed.items():
        assert f"{name}: {message}" in str(excinfo.value)
    return failed


def test_generic_env_passes():
    assert all(r.passed for r in check_env(GenericTestEnv()))


def test_reset_returning_none_is_caught():
    failed = failures(GenericTestEnv(reset_fn=lambda env: None))
    assert "reset_returns_str" in failed
    assert "must return the first observation as str" in failed["reset_returns_str"]
    assert failed["step_returns_tuple"] == "not run: fix reset_returns_str first"


def test_step_returning_three_tuple_is_caught():
    failed = failures(GenericTestEnv(step_fn=lambda env, action: ("obs", 0.0, False)))
    assert set(failed) >= {"step_returns_tuple", "garbage_actions"}
    assert "(observation, reward, done, info)" in failed["step_returns_tuple"]
    assert "reset_returns_str" not in failed and "reset_deterministic" not in failed


def test_non_deterministic_reset_is_caught():
    counter = itertools.count()
    failed = failures(GenericTestEnv(reset_fn=lambda env: f"start {next(counter)}"))
    assert set(failed) == {"reset_deterministic", "step_deterministic"}
    assert "self.rng" in failed["reset_deterministic"]


def test_non_dict_info_and_bad_types_are_caught():
    failed = failures(GenericTestEnv(step_fn=lambda env, action: (None, "high", False, ["x"])))
    # The base class converts obs/reward for wrapped envs; "high" cannot become a float.
    assert "step_returns_tuple" in failed and "ValueError" in failed["step_returns_tuple"]


class RawEnv:
    """Not a BaseEnvironment: nothing enforces the contract, so the checks must."""

    max_steps = 3

    def reset(self, seed=None):
        return "start"

    def step(self, action):
        if action == "@@@":
            raise KeyError(action)
        return "obs", 0.0, False, "info"

    def get_prompt_prefix(self):
        return ""

    def get_state_description(self):
        return None

    def get_tools(self):
        return [object()]

    def is_done(self):
        return False


def test_raw_env_failures_name_what_to_fix():
    failed = failures(RawEnv())
    assert "info of type str" in failed["info_is_dict"]
    assert "no step returned done=True" in failed["done_stops_episode"]
    assert "without done=True" in failed["max_steps_respected"]
    assert "non-empty system prompt" in failed["prompt_prefix"]
    assert "NoneType" in failed["state_description"]
    assert ".definition nor execute()" in failed["tools_valid"]
    assert "instead of raising" in failed["garbage_actions"]


def test_done_not_recorded_is_caught():
    class ForgetfulEnv(RawEnv):
        def step(self, action):
            return "obs", 0.0, True, {}

    failed = failures(ForgetfulEnv())
    assert "set self._done = True" in failed["done_stops_episode"]


def test_raw_env_bad_observation_type():
    class IntObsEnv(RawEnv):
        def step(self, action):
            return 1, True, "no", {}

    failed = failures(IntObsEnv())
    message = failed["step_returns_tuple"]
    assert "observation is int" in message and "reward is bool" in message and "done is str" in message
    assert failed["info_is_dict"] == "not run: fix step_returns_tuple first"


def test_warn_mode_returns_results_and_warns():
    env = GenericTestEnv(reset_fn=lambda env: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        results = check_env(env, warn=True)
    assert not results[0].passed and any("reset_returns_str" in str(w.message) for w in caught)
    assert str(results[0]).startswith("[FAIL] reset_returns_str")


# -- global RNG use ---------------------------------------------------------------------
class NumpySecretEnv(BaseEnvironment):
    """Guess a secret digit drawn from the global numpy RNG (the bug the check is for)."""

    def reset(self) -> str:
        import numpy as np

        self.secret = int(np.random.randint(0, 10))
        return "Guess a digit."

    def step(self, action: str):
        right = action.strip() == str(self.secret)
        return ("Right." if right else f"No, it was {self.secret}."), float(right), True, {"success": right}


class HashSecretEnv(BaseEnvironment):
    """Deterministic in one process, but hash() of a str changes between processes."""

    def reset(self) -> str:
        self.secret = hash(f"secret-{self.rng.random()}") % 1_000_003  # two processes agree w.p. ~1e-6
        return "Guess a digit."

    def step(self, action: str):
        return f"It was {self.secret}.", 0.0, True, {}


class ReseedingTextArenaEnv(BaseEnvironment):
    """The straightforward TextArena wrapper: TextArena reseeds and draws from the global `random`."""

    def __init__(self, config=None):
        import textarena

        super().__init__(config)
        self.game = textarena.make("GuessTheNumber-v0-raw")  # no wrappers

    def reset(self) -> str:
        self.game.reset(num_players=1, seed=self.rng.getrandbits(31))
        return str(self.game.get_observation()[1])

    def step(self, action: str):
        done, info = self.game.step(action)
        return str(self.game.get_observation()[1]), 0.0, done, dict(info)


def test_numpy_global_rng_env_fails_global_rng_check():
    import numpy as np

    np.random.seed(7)
    expected = np.random.random()
    np.random.seed(7)
    failed = failures(NumpySecretEnv({"max_steps": 2}))
    assert "global_rng" in failed  # (step_deterministic catches this one too, unless by luck)
    assert "different episodes after the global random / numpy.random RNGs were reseeded" in failed["global_rng"]
    assert "np.random.default_rng(self.rng.getrandbits(64))" in failed["global_rng"]
    assert np.random.random() == expected  # the check restored the caller's numpy state


def test_library_reseeding_the_global_random_fails_and_the_adapter_passes():
    pytest.importorskip("textarena")
    from workbench.environments.adapters.textarena import TextArenaEnvironment

    failed = failures(ReseedingTextArenaEnv({"max_steps": 4}))
    assert set(failed) == {"global_rng"}  # reproducible, so only this check sees it
    assert "changed the global random / numpy.random state" in failed["global_rng"]
    assert all(r.passed for r in check_env(TextArenaEnvironment("GuessTheNumber-v0")))


def test_reasoning_gym_task_that_reseeds_numpy_runs_in_its_own_global_state():
    """pool_matrix calls np.random.seed(...) per item: the adapter runs it under its own
    global random/numpy state (workbench.environments.global_rng), so it no longer touches the
    process's and passes; a plain environment that does the same is still caught (above)."""
    pytest.importorskip("reasoning_gym")
    from workbench.environments.adapters.verifier import VerifierEnvironment

    np.random.seed(5)
    before = np.random.get_state(legacy=True)[1].tolist()
    results = check_env(VerifierEnvironment.from_reasoning_gym("pool_matrix"))
    assert all(r.passed for r in results), [r for r in results if not r.passed]
    assert np.random.get_state(legacy=True)[1].tolist() == before


def test_fresh_process_check_catches_per_process_state(monkeypatch):
    monkeypatch.setenv("PYTHONHASHSEED", "random")
    env = HashSecretEnv({"max_steps": 2})
    assert all(r.passed for r in check_env(env))  # in one process it looks deterministic
    with pytest.raises(EnvCheckError) as excinfo:
        check_env(env, seeds=(0,), fresh_process=True)
    failed = {r.name: r.message for r in excinfo.value.results if not r.passed}
    assert set(failed) == {"fresh_process"} and "hash() of str" in failed["fresh_process"]
    results = check_env(make_env("guess_number"), seeds=(0,), fresh_process=True)
    assert results[-1].name == "fresh_process" and results[-1].passed
