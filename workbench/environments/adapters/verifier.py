"""`VerifierEnvironment`: a question/answer dataset with a scoring function, as an environment.

    env = VerifierEnvironment(sample_fn, score_fn, attempts=1)
    env = VerifierEnvironment.from_reasoning_gym("chain_sum")   # = make_env("reasoning_gym:chain_sum")

    sample_fn(rng: random.Random) -> {"question": str, ...}      # anything else is kept for score_fn
    score_fn(answer: str | None, sample: dict) -> float          # 1.0 = right; partial credit allowed

An episode: `reset` draws a sample with `sample_fn(self.rng)` (so `reset(seed=s)` gives
the same question for the same `s`) and shows its question; each `step` extracts the
answer from the reply (`answer_fn`, default: the last `<answer>...</answer>`, else the
whole reply stripped) and scores it with `score_fn`.

  * success: score >= `success_threshold` (1.0); the episode ends.
  * otherwise, with attempts left: reward 0, the observation says the answer was wrong
    and how many attempts are left (the sample's answer is never shown).
  * on the last attempt the reward is that answer's score (partial credit counts), so
    an episode's total reward is the score of its final answer.
  * info: `score`, `success`, `answer` (what was extracted), `invalid_action` (no
    answer could be extracted, `answer_fn` returned None or "") and `action_span`, the
    [start, end] of the reply the answer came from (`answer_span`: the tag's inside for
    the default `answer_fn`; for another `answer_fn`, the last place its str answer
    occurs in the reply; absent when it does not occur).

`sample_fn` and `score_fn` may also be given as "module:function" import paths; the
config then records them (`params["sample_fn"]`, `params["score_fn"]`), so
`make_env("workbench.environments.adapters.verifier:VerifierEnvironment", config)` rebuilds the
environment, and a checkpoint says what it trained on. Functions given as objects are
recorded by import path when they have one (not lambdas, closures, bound methods or
functions defined in `__main__`).

reasoning-gym (`pip install reasoning-gym`, tested with 0.1.25): `from_reasoning_gym(name,
**dataset_kwargs)` builds the dataset once (seed 0 unless `seed` is given), samples an
index with `self.rng`, and scores with the dataset's own `score_answer`.
"""
from __future__ import annotations

import dataclasses
import inspect
import random
import re
from typing import Any, Callable, Mapping

from workbench.config import EnvironmentConfig
from workbench.environments.base import BaseEnvironment, StepResult, as_environment_config
from workbench.environments.global_rng import GlobalRNGScope
from workbench.utils.imports import import_object, import_path

SampleFn = Callable[[random.Random], Mapping[str, Any]]
ScoreFn = Callable[[Any, Mapping[str, Any]], float]

_ANSWER_RE = re.compile(r"<answer>\s?(.*?)\s?</answer>", re.DOTALL)

DEFAULT_PROMPT = ("Answer the question. Think briefly if you need to, then give only the final answer "
                  "between <answer> and </answer> tags.")


def extract_answer(reply: str) -> str:
    """The last `<answer>...</answer>` of `reply` (stripped), else the whole reply stripped."""
    found = _ANSWER_RE.findall(reply or "")
    return (found[-1] if found else (reply or "")).strip()


def answer_span(reply: str, answer: Any, answer_fn: Callable[[str], Any] = extract_answer) -> list[int] | None:
    """[start, end] of the characters of `reply` that `answer` was read from, or None."""
    reply = reply or ""
    if answer_fn is extract_answer:
        found = list(_ANSWER_RE.finditer(reply))
        start, end = (found[-1].start(1), found[-1].end(1)) if found else (0, len(reply))
        while start < end and reply[start].isspace():
            start += 1
        while end > start and reply[end - 1].isspace():
            end -= 1
        return [start, end]
    if isinstance(answer, str) and answer:
        at = reply.rfind(answer)
        return [at, at + len(answer)] if at >= 0 else None
    return None


def _function(fn: SampleFn | ScoreFn | str, role: str) -> tuple[Callable, str | None]:
    """(callable, import path or None) for a function or a "module:function" string."""
    if isinstance(fn, str):
        return import_object(fn), fn
    if not callable(fn):
        raise TypeError(f"VerifierEnvironment: {role} must be a function or a 'module:function' path, "
                        f"got {type(fn).__name__}")
    path = import_path(fn) if hasattr(fn, "__qualname__") and not inspect.ismethod(fn) else None
    if path and ("<" in path or path.startswith("__main__:")):
        path = None  # a lambda, a closure, a notebook function: not importable elsewhere
    return fn, path


class VerifierEnvironment(BaseEnvironment):
    """Questions from `sample_fn`, answers scored by `score_fn` (see the module docstring).

    Args:
        sample_fn: `fn(rng) -> {"question": str, ...}`, or its "module:function" path.
        score_fn: `fn(answer, sample) -> float`, or its "module:function" path.
        attempts: answers allowed per question (>= 1); the episode's `max_steps`.
        config: `EnvironmentConfig` or dict (`system_prompt` overrides the default).
        answer_fn: reply text -> answer (default `extract_answer`).
        success_threshold: a score at or above this is a success and ends the episode.
    """

    #: Every scored step says `info["success"]`.
    reports_success = True

    def __init__(self, sample_fn: SampleFn | str, score_fn: ScoreFn | str, attempts: int = 1,
                 config: EnvironmentConfig | Mapping[str, Any] | None = None,
                 answer_fn: Callable[[str], Any] = extract_answer, success_threshold: float = 1.0):
        if not isinstance(attempts, int) or isinstance(attempts, bool) or attempts < 1:
            raise ValueError(f"VerifierEnvironment: attempts must be an int >= 1, got {attempts!r}")
        self.sample_fn, sample_path = _function(sample_fn, "sample_fn")
        self.score_fn, score_path = _function(score_fn, "score_fn")
        data = dict(config) if isinstance(config, Mapping) else (
            dataclasses.asdict(config) if isinstance(config, EnvironmentConfig) else {})
        if data.get("name") in (None, EnvironmentConfig.name):  # the default says nothing about us
            data["name"] = import_path(type(self))
        params = dict(data.get("params") or {})
        params["attempts"] = attempts
        for key, path in (("sample_fn", sample_path), ("score_fn", score_path)):
            if path is not None:
                params[key] = path
            else:
                params.pop(key, None)
        super().__init__({**data, "max_steps": attempts, "params": params})
        self.attempts = attempts
        self.answer_fn = answer_fn
        self.success_threshold = float(success_threshold)
        self.sample: Mapping[str, Any] = {}
        self._rng_scope = GlobalRNGScope(0)  # what sample_fn/score_fn see as random/numpy's global state

    @classmethod
    def from_config(cls, config: EnvironmentConfig | Mapping[str, Any]) -> "VerifierEnvironment":
        """Rebuild from a recorded config: `params["sample_fn"]` / `["score_fn"]` import paths."""
        cfg = as_environment_config(config)
        missing = [k for k in ("sample_fn", "score_fn") if not isinstance(cfg.params.get(k), str)]
        if missing:
            raise ValueError(f"VerifierEnvironment.from_config needs params {missing} as 'module:function' "
                             "import paths; construct VerifierEnvironment(sample_fn, score_fn) directly instead")
        return cls(cfg.params["sample_fn"], cfg.params["score_fn"], int(cfg.params.get("attempts", 1)), cfg)

    @classmethod
    def from_reasoning_gym(cls, dataset: str, attempts: int = 1,
                           config: EnvironmentConfig | Mapping[str, Any] | None = None,
                           **dataset_kwargs: Any) -> "VerifierEnvironment":
        """A reasoning-gym task: `reasoning_gym.create_dataset(dataset, **dataset_kwargs)`,
        scored by the dataset's `score_answer`.

        `config["params"]` are dataset settings too: `params["seed"]` is the *dataset's*
        seed (default 0, so every process builds the same dataset; the episode seed is
        `config.seed` / `reset(seed=...)`), `size` defaults to the dataset's own, and
        `attempts` is ours.
        """
        try:
            import reasoning_gym
        except ImportError as exc:
            raise ImportError("reasoning_gym:<task> needs the reasoning-gym package: pip install "
                              "reasoning-gym (tested with 0.1.25)") from exc
        cfg = as_environment_config(config)
        settings = {**cfg.params, **dataset_kwargs}
        attempts = int(settings.pop("attempts", attempts))
        settings.setdefault("seed", 0)
        known = sorted(reasoning_gym.factory.DATASETS)
        if dataset not in known:
            import difflib

            close = difflib.get_close_matches(dataset, known, n=5)
            raise ValueError(f"reasoning-gym has no dataset {dataset!r}; "
                             + (f"did you mean {close}?" if close else f"available: {known}"))
        try:
            data = reasoning_gym.create_dataset(dataset, **settings)
        except TypeError as exc:
            raise ValueError(f"reasoning_gym:{dataset}: bad dataset setting ({exc}); the settings are the "
                             f"fields of its config class") from exc

        def sample(rng: random.Random) -> Mapping[str, Any]:
            return data[rng.randrange(len(data))]

        env = cls(sample, data.score_answer, attempts,
                  {"name": f"reasoning_gym:{dataset}", "seed": cfg.seed, "system_prompt": cfg.system_prompt,
                   "params": settings})
        env.dataset = data
        return env

    # -- episode -----------------------------------------------------------------------
    def reset(self) -> str:
        """Draw a sample with `sample_fn(self.rng)` and return its question."""
        with self._rng_scope.active():  # third-party sampling code runs under its own global state
            sample = self.sample_fn(self.rng)
        if not isinstance(sample, Mapping) or not isinstance(sample.get("question"), str):
            raise TypeError(f"VerifierEnvironment: sample_fn must return a mapping with a 'question' str, "
                            f"got {type(sample).__name__}: {str(sample)[:80]}")
        self.sample = sample
        return sample["question"]

    def step(self, action: str) -> StepResult:
        """Score one answer; see the module docstring for rewards and info."""
        answer = self.answer_fn(action)
        with self._rng_scope.active():
            score = float(self.score_fn(answer, self.sample))
        success = score >= self.success_threshold
        left = self.attempts - self.step_count - 1
        info: dict[str, Any] = {"score": score, "success": success, "answer": answer,
                                "invalid_action": answer is None or answer == ""}
        span = answer_span(action, answer, self.answer_fn)
        if span is not None and not info["invalid_action"]:
            info["action_span"] = span
        if success:
            return "Correct.", score, True, info
        if left > 0:
            return (f"That is not right. Try again ({left} attempt{'s' if left > 1 else ''} left).",
                    0.0, False, info)
        return "That is not right.", score, True, info

    def get_prompt_prefix(self) -> str:
        """`config.system_prompt`, else: answer between <answer> tags."""
        return self.config.system_prompt or DEFAULT_PROMPT

    def __repr__(self) -> str:
        return f"VerifierEnvironment({self.config.name!r}, attempts={self.attempts})"
