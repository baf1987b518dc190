"""`check_env`: does an environment keep the `BaseEnvironment` contract?

Gymnasium-style: a list of small named checks, each a function `(env, seeds) ->
message or None` (None = passed). A failing check's message says what is wrong and
what to fix. `check_env` runs them all (a check that raises fails with the exception
in its message, it never stops the others) and raises `EnvCheckError` listing every
failure, or, with `warn=True`, emits one warning per failure instead.

    from workbench.environments.checker import check_env
    results = check_env(MyEnv())           # raises EnvCheckError if anything fails
    [r.name for r in results if r.passed]

Checks: reset_returns_str, reset_deterministic, step_returns_tuple, info_is_dict,
step_deterministic, done_stops_episode, max_steps_respected, prompt_prefix,
state_description, tools_valid, garbage_actions, global_rng (same seed, same episode
under any global `random`/`numpy.random` state, and the episode leaves those states
alone), and with `fresh_process=True` fresh_process (same episode in a new process).
"""
from __future__ import annotations

import numbers
import random
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

#: Actions used by the checks that need "some" actions: plausible replies for the
#: bundled environments plus junk.
PROBE_ACTIONS = ("1", "8", "up", "left", "crane", "take key", "Answer: 3", "hello", "", "@@@")
GARBAGE_ACTIONS = ("", "@@@", "x" * 10_000, "\x00\n\t{}[]()<tool_call>", "🙂" * 50)


@dataclass
class CheckResult:
    """Outcome of one named check: `message` says what to fix when `passed` is False."""

    name: str
    passed: bool
    message: str = ""

    def __str__(self) -> str:
        return f"[{'ok' if self.passed else 'FAIL'}] {self.name}" + (f": {self.message}" if self.message else "")


class EnvCheckError(AssertionError):
    """Raised by `check_env` when checks fail; `.results` holds every CheckResult."""

    def __init__(self, env_name: str, results: list[CheckResult]):
        self.results = results
        failed = [r for r in results if not r.passed]
        lines = [f"{env_name} failed {len(failed)} of {len(results)} environment checks:"]
        lines += [f"  - {r.name}: {r.message}" for r in failed]
        super().__init__("\n".join(lines))


def _name(env: Any) -> str:
    return type(env).__name__


def _error(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"


def _run_episode(env: Any, seed: int, actions: Sequence[str], limit: int) -> list[tuple]:
    """Reset with `seed`, play `actions` in a cycle until done or `limit` steps."""
    transcript: list[tuple] = [("reset", env.reset(seed=seed))]
    for i in range(limit):
        obs, reward, done, info = env.step(actions[i % len(actions)])
        transcript.append((obs, float(reward), bool(done), sorted(map(str, info))))
        if done:
            break
    return transcript


def _limit(env: Any) -> int:
    return max(int(getattr(env, "max_steps", 20) or 20), 1)


# -- the checks: each returns None (passed) or a message saying what to fix ---------
def check_reset_returns_str(env: Any, seeds: Sequence[int]) -> str | None:
    """reset(seed=...) returns the first observation as a str."""
    obs = env.reset(seed=seeds[0])
    if not isinstance(obs, str):
        return f"reset() returned {type(obs).__name__}; return the first observation as a str."
    return None


def check_reset_deterministic(env: Any, seeds: Sequence[int]) -> str | None:
    """reset with the same seed twice gives the same observation."""
    for seed in seeds:
        first, second = env.reset(seed=seed), env.reset(seed=seed)
        if first != second:
            return (f"reset(seed={seed}) gave different observations ({first!r:.60} vs {second!r:.60}); "
                    "draw all randomness from self.rng (reseeded by reset(seed=...)), not the global "
                    "random module, numpy or time.")
    return None


def check_step_returns_tuple(env: Any, seeds: Sequence[int]) -> str | None:
    """step returns (str, float-like, bool, info)."""
    env.reset(seed=seeds[0])
    result = env.step(PROBE_ACTIONS[0])
    if not isinstance(result, tuple) or len(result) != 4:
        got = f"a {len(result)}-tuple" if isinstance(result, tuple) else type(result).__name__
        return f"step() returned {got}; return (observation: str, reward: float, done: bool, info: dict)."
    obs, reward, done, _ = result
    problems = []
    if not isinstance(obs, str):
        problems.append(f"observation is {type(obs).__name__}, make it a str")
    if not isinstance(reward, numbers.Real) or isinstance(reward, bool):
        problems.append(f"reward is {type(reward).__name__}, make it a float")
    if not (isinstance(done, (bool, numbers.Integral)) or type(done).__name__ == "bool_"):
        problems.append(f"done is {type(done).__name__}, make it a bool")
    return "step(): " + "; ".join(problems) + "." if problems else None


def check_info_is_dict(env: Any, seeds: Sequence[int]) -> str | None:
    """step's info is a dict."""
    env.reset(seed=seeds[0])
    for action in PROBE_ACTIONS[:3]:
        _, _, done, info = env.step(action)
        if not isinstance(info, dict):
            return f"step() returned info of type {type(info).__name__}; return a dict (may be empty)."
        if done:
            break
    return None


def check_step_deterministic(env: Any, seeds: Sequence[int]) -> str | None:
    """same seed + same actions -> same transcript."""
    for seed in seeds:
        first = _run_episode(env, seed, PROBE_ACTIONS, _limit(env))
        second = _run_episode(env, seed, PROBE_ACTIONS, _limit(env))
        if first != second:
            turn = next((i for i, (a, b) in enumerate(zip(first, second)) if a != b),
                        min(len(first), len(second)))
            where = "the reset observation" if turn == 0 else f"step {turn}"
            return (f"same seed ({seed}) and same actions gave different transcripts from {where} on; "
                    "step() must depend only on the state and self.rng.")
    return None


def check_done_stops_episode(env: Any, seeds: Sequence[int]) -> str | None:
    """an episode ends, and after done step raises or is_done() is True."""
    transcript = _run_episode(env, seeds[0], PROBE_ACTIONS, _limit(env) + 1)
    if not transcript[-1][2]:
        return (f"no step returned done=True within max_steps + 1 = {_limit(env) + 1} steps; return "
                "done=True when the episode ends (BaseEnvironment also ends it at max_steps).")
    if callable(getattr(env, "is_done", None)) and env.is_done():
        return None
    try:
        env.step(PROBE_ACTIONS[0])
    except Exception:  # the base class raises on stepping a finished episode
        return None
    return ("after done=True, is_done() is False and step() still runs; set self._done = True when the "
            "episode ends (BaseEnvironment then refuses further steps).")


def check_max_steps_respected(env: Any, seeds: Sequence[int]) -> str | None:
    """random actions end the episode within max_steps."""
    limit = _limit(env)
    rng = random.Random(seeds[0])
    for seed in seeds:
        env.reset(seed=seed)
        for step in range(1, limit + 1):
            _, _, done, _ = env.step(rng.choice(PROBE_ACTIONS))
            if done:
                break
        else:
            return (f"random actions ran {limit} steps (max_steps) without done=True; end the episode at "
                    "max_steps (BaseEnvironment does this unless step() is not wrapped or bypassed).")
    return None


def check_prompt_prefix(env: Any, seeds: Sequence[int]) -> str | None:
    """get_prompt_prefix returns a non-empty str."""
    prompt = env.get_prompt_prefix()
    if not isinstance(prompt, str) or not prompt.strip():
        return (f"get_prompt_prefix() returned {prompt!r}; return a non-empty system prompt that says "
                "what the task is and exactly what to reply.")
    return None


def check_state_description(env: Any, seeds: Sequence[int]) -> str | None:
    """get_state_description returns a str."""
    env.reset(seed=seeds[0])
    state = env.get_state_description()
    if not isinstance(state, str):
        return f"get_state_description() returned {type(state).__name__}; return the current state as a str."
    return None


def check_tools_valid(env: Any, seeds: Sequence[int]) -> str | None:
    """get_tools returns a list of tools (.definition or execute)."""
    tools = env.get_tools()
    if not isinstance(tools, list):
        return f"get_tools() returned {type(tools).__name__}; return a list of tools ([] for none)."
    for i, tool in enumerate(tools):
        if not (hasattr(tool, "definition") or callable(getattr(tool, "execute", None))):
            return (f"get_tools()[{i}] ({type(tool).__name__}) has neither .definition nor execute(); "
                    "use a workbench.tools.Tool (e.g. Tool.from_function(fn)).")
    return None


def check_garbage_actions(env: Any, seeds: Sequence[int]) -> str | None:
    """step survives '', '@@@', a 10k-char string and odd characters."""
    for action in GARBAGE_ACTIONS:
        env.reset(seed=seeds[0])
        try:
            env.step(action)
        except Exception as exc:
            return (f"step({action!r:.30}) raised {_error(exc)}; parse model text leniently and answer "
                    "unusable actions with a hint (info['invalid_action'] = True) instead of raising.")
    return None


def _global_rng_state() -> tuple:
    """The global `random` and `numpy.random` states (numpy's as a comparable tuple)."""
    import numpy as np

    kind, keys, pos, has_gauss, gauss = np.random.get_state(legacy=True)
    return random.getstate(), (kind, tuple(keys.tolist()), pos, has_gauss, gauss)


def _set_global_rng_state(state: tuple) -> None:
    import numpy as np

    py_state, (kind, keys, pos, has_gauss, gauss) = state
    random.setstate(py_state)
    np.random.set_state((kind, np.array(keys, dtype=np.uint32), pos, has_gauss, gauss))


def _seed_global_rngs(seed: int) -> None:
    import numpy as np

    random.seed(seed)
    np.random.seed(seed)


def check_global_rng(env: Any, seeds: Sequence[int]) -> str | None:
    """the same seed gives the same episode whatever the global random/numpy state is,
    and an episode neither draws from nor reseeds the global RNGs. (An env that is not
    reproducible even under one global state is left to step_deterministic.)"""
    saved = _global_rng_state()
    try:
        transcripts, touched = [], False
        for global_seed in (12345, 12345, 54321):
            _seed_global_rngs(global_seed)
            before = _global_rng_state()
            transcripts.append(_run_episode(env, seeds[0], PROBE_ACTIONS, _limit(env)))
            touched = touched or _global_rng_state() != before
    finally:
        _set_global_rng_state(saved)
    fix = ("draw all randomness from self.rng (reseeded by reset(seed=...)); for numpy use "
           "np.random.default_rng(self.rng.getrandbits(64)) in reset; a wrapped library that uses the global "
           "RNG must run with its own saved state (see BaseEnvironment's docstring on seeding).")
    if transcripts[0] != transcripts[1]:
        return None  # not reproducible even under one global state: step_deterministic reports it
    if transcripts[0] != transcripts[2]:
        return (f"reset(seed={seeds[0]}) and the same actions gave different episodes after the global random "
                "/ numpy.random RNGs were reseeded: the environment draws from them, so episodes of one GRPO "
                "group (same seed) differ and runs do not reproduce; " + fix)
    if touched:
        return ("an episode changed the global random / numpy.random state (it draws from or reseeds the global "
                "RNG): results then depend on what else runs in the process, and it changes other code's "
                "random stream; " + fix)
    return None


def _episode_in_child(env: Any, seed: int, limit: int) -> list[tuple]:  # runs in a fresh process
    return _run_episode(env, seed, PROBE_ACTIONS, limit)


def check_fresh_process(env: Any, seeds: Sequence[int]) -> str | None:
    """a fresh Python process (new hash seed, unseeded global RNGs) plays the same episode
    for the same seed (opt-in: `check_env(..., fresh_process=True)`, it starts a process)."""
    import concurrent.futures
    import multiprocessing
    import pickle

    try:
        pickle.dumps(env)
    except Exception as exc:
        return (f"cannot send the environment to a fresh process ({_error(exc)}); make it picklable "
                "(module-level class, no lambdas or open handles in its attributes) or skip this check.")
    here = _run_episode(env, seeds[0], PROBE_ACTIONS, _limit(env))
    ctx = multiprocessing.get_context("spawn")
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=ctx) as pool:
        there = pool.submit(_episode_in_child, env, seeds[0], _limit(env)).result(timeout=300)
    if here != there:
        return (f"reset(seed={seeds[0]}) and the same actions gave a different episode in a fresh process: the "
                "environment depends on per-process state (hash() of str, which PYTHONHASHSEED randomises; the "
                "unseeded global RNG; time; set iteration order). Draw from self.rng and avoid hash()/set order.")
    return None


#: Checks that say nothing useful when a basic check failed; they are reported as
#: failed with "not run: fix <basic check> first" instead of repeating its error.
NEEDS_RESET = ("reset_deterministic", "step_returns_tuple", "info_is_dict", "step_deterministic",
               "done_stops_episode", "max_steps_respected", "state_description", "garbage_actions",
               "global_rng", "fresh_process")
NEEDS_STEP = ("info_is_dict", "step_deterministic", "done_stops_episode", "max_steps_respected",
              "garbage_actions", "global_rng", "fresh_process")

#: The checks in the order they run: (name, function).
CHECKS: list[tuple[str, Callable[[Any, Sequence[int]], str | None]]] = [
    ("reset_returns_str", check_reset_returns_str),
    ("reset_deterministic", check_reset_deterministic),
    ("step_returns_tuple", check_step_returns_tuple),
    ("info_is_dict", check_info_is_dict),
    ("step_deterministic", check_step_deterministic),
    ("done_stops_episode", check_done_stops_episode),
    ("max_steps_respected", check_max_steps_respected),
    ("prompt_prefix", check_prompt_prefix),
    ("state_description", check_state_description),
    ("tools_valid", check_tools_valid),
    ("garbage_actions", check_garbage_actions),
    ("global_rng", check_global_rng),
]


def check_env(env: Any, seeds: Sequence[int] = (0, 1), warn: bool = False,
              fresh_process: bool = False) -> list[CheckResult]:
    """Run every check in `CHECKS` on `env` and return their results.

    Args:
        env: an environment instance (a `BaseEnvironment` or anything with its API).
        seeds: seeds used for the reset/step checks (at least one).
        warn: on failures, emit a `UserWarning` per failure instead of raising.
        fresh_process: also run `check_fresh_process` (one episode in a spawned Python
            process, a few seconds; the env must be picklable).

    The global `random` and `numpy.random` states are restored afterwards, so checking
    an environment that draws from them does not change the caller's random streams.

    Raises:
        EnvCheckError: when a check fails (and `warn` is False); the message lists
            each failed check with what to fix.
    """
    seeds = tuple(seeds) or (0,)
    results: list[CheckResult] = []
    passed: dict[str, bool] = {}
    checks = CHECKS + ([("fresh_process", check_fresh_process)] if fresh_process else [])
    saved_rngs = _global_rng_state()  # an env under test may draw from them; the caller's stay as they were
    for name, check in checks:
        needs = (["reset_returns_str"] if name in NEEDS_RESET else []) + (
            ["step_returns_tuple"] if name in NEEDS_STEP else [])
        blocked = [p for p in needs if not passed.get(p, True)]
        if blocked:
            message: str | None = f"not run: fix {blocked[0]} first"
        else:
            try:
                message = check(env, seeds)
            except Exception as exc:
                message = f"raised {_error(exc)}"
        passed[name] = message is None
        results.append(CheckResult(name, message is None, message or ""))
    _set_global_rng_state(saved_rngs)
    failed = [r for r in results if not r.passed]
    if failed:
        if not warn:
            raise EnvCheckError(_name(env), results)
        for r in failed:
            warnings.warn(f"{_name(env)} check {r.name} failed: {r.message}", UserWarning, stacklevel=2)
    return results
