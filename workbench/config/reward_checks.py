"""The checks of the `reward` section's model-reward fields (judges and reward models), and
`judge_location`, the one reading of a judge's "where it runs" string, which the check and
`workbench.reward.sources` share.

    judge_location("http://127.0.0.1:8000/v1")       # ("server", "http://127.0.0.1:8000/v1")
    judge_location("hf:smollm2-135m-instruct")       # ("hf", "smollm2-135m-instruct")
    judge_location("vllm:/models/judge")             # ("vllm", "/models/judge")
    judge_location("my_judges:strict")               # ("function", "my_judges:strict")

`ConfigStore.validate` calls `check_model_rewards(config.reward)`.
"""
from __future__ import annotations

import math
import re
from typing import Any

from workbench.config.checks import DTYPES, MAX_REWARD_WEIGHT, ConfigError

#: Kinds of judge location: an OpenAI-compatible server by URL, an in-process engine, a function.
JUDGE_KINDS = ("server", "hf", "vllm", "function")
#: `reward.reward_model_kind` values.
REWARD_MODEL_KINDS = ("auto", "classifier", "yes_token")
_FUNCTION_RE = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_][\w.]*$")
#: Longest a judge may be given to answer one request (a day): longer waits overflow timers.
MAX_JUDGE_TIMEOUT_S = 24 * 3600.0


def judge_location(spec: str) -> tuple[str, str]:
    """(kind, target) of a judge's location string (module docstring); ValueError naming
    the forms when `spec` is none of them."""
    if not isinstance(spec, str) or not spec.strip():
        raise ValueError(f"a judge is named by a server URL (http://HOST:PORT/v1), hf:MODEL, vllm:MODEL or "
                         f"module:function, got {spec!r}")
    spec = spec.strip()
    low = spec.lower()
    if low.startswith(("http://", "https://")):
        if len(spec.split("://", 1)[1].strip("/")) == 0:
            raise ValueError(f"judge URL {spec!r} names no host; e.g. http://127.0.0.1:8000/v1")
        return "server", spec
    for kind in ("hf", "vllm"):
        if low.startswith(kind + ":"):
            target = spec[len(kind) + 1:].strip()
            if not target:
                raise ValueError(f"judge {spec!r} names no model; e.g. {kind}:smollm2-135m-instruct or "
                                 f"{kind}:/path/to/model")
            return kind, target
    if _FUNCTION_RE.match(spec):
        return "function", spec
    raise ValueError(f"judge {spec!r} is not a server URL (http://HOST:PORT/v1), hf:MODEL, vllm:MODEL or "
                     "module:function (a Python function from the judge's messages to its reply)")


def _number(name: str, value: Any, low: float, high: float, what: str) -> None:
    if not (isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
            and low <= value <= high):
        raise ConfigError(f"reward.{name} must be {what}, got {value!r}")


def _count(name: str, value: Any, least: int = 1) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < least:
        raise ConfigError(f"reward.{name} must be an integer >= {least}, got {value!r}")


def check_model_rewards(reward: Any) -> None:
    """Raise ConfigError naming the first bad model-reward field of a `reward` section."""
    for name in ("env_weight", "judge_weight", "group_judge_weight", "reward_model_weight"):
        _number(name, getattr(reward, name), -MAX_REWARD_WEIGHT, MAX_REWARD_WEIGHT,
                f"a number between {-MAX_REWARD_WEIGHT:g} and {MAX_REWARD_WEIGHT:g}")
    for name in ("judge", "group_judge"):
        spec = getattr(reward, name)
        if spec is not None:
            try:
                judge_location(spec)
            except ValueError as exc:
                raise ConfigError(f"reward.{name}: {exc}") from None
    if reward.reward_model is not None and not str(reward.reward_model).strip():
        raise ConfigError("reward.reward_model must name a model folder or hub id, or be null (off)")
    if not str(reward.judge_rubric).strip():
        raise ConfigError("reward.judge_rubric is empty: say in words what the judges should score")
    lo, hi = reward.judge_scale_min, reward.judge_scale_max
    if not (math.isfinite(lo) and math.isfinite(hi) and lo < hi):
        raise ConfigError(f"reward.judge_scale_min ({lo!r}) must be below reward.judge_scale_max ({hi!r})")
    _count("judge_max_tokens", reward.judge_max_tokens)
    _number("judge_temperature", reward.judge_temperature, 0.0, 2.0, "a temperature in [0, 2]")
    _number("judge_timeout_s", reward.judge_timeout_s, 1e-3, MAX_JUDGE_TIMEOUT_S,
            f"a number of seconds > 0 (at most {MAX_JUDGE_TIMEOUT_S:g})")
    _count("judge_retries", reward.judge_retries, least=0)
    _count("judge_concurrency", reward.judge_concurrency)
    if reward.judge_dtype not in ("auto",) + DTYPES:
        raise ConfigError(f"reward.judge_dtype must be one of {['auto', *DTYPES]}, got {reward.judge_dtype!r}")
    if reward.reward_model_kind not in REWARD_MODEL_KINDS:
        raise ConfigError(f"reward.reward_model_kind must be one of {list(REWARD_MODEL_KINDS)}, "
                          f"got {reward.reward_model_kind!r}")
    if not str(reward.reward_model_yes).strip():
        raise ConfigError("reward.reward_model_yes must be the answer whose probability is the score, e.g. Yes")
    _count("reward_model_batch_size", reward.reward_model_batch_size)
    _count("reward_model_max_tokens", reward.reward_model_max_tokens)


__all__ = ["JUDGE_KINDS", "REWARD_MODEL_KINDS", "check_model_rewards", "judge_location"]
