"""Request checks of the gateway that need no tokenizer: each bad field is a `RequestError`
(an OpenAI-style 400 naming the field), found before anything is tokenised or generated.

    body = parse_body(raw)                   # JSON object, at most MAX_DEPTH deep, valid Unicode
    check_choices(body)                      # n, logprobs, top_logprobs
    temperature = number(body, "temperature", 1.0, low=0.0, high=2.0)
    seed = check_seed(body)

What is refused, and why (each was a 500 `engine_error` or silently accepted):

- a body nested deeper than `MAX_DEPTH` (Python's JSON parser raises RecursionError near
  1,000 levels; the template and the tool-schema code recurse too);
- a string with a lone surrogate (`"\\ud800"` is valid JSON but not text: the tokenizer
  cannot encode it), named by its path, e.g. `messages[0].content`;
- `temperature` / `top_p` that are not finite (NaN, Infinity, 1e400) or out of OpenAI's
  range (temperature 0..2, top_p in (0, 1]);
- `seed` outside OpenAI's int64 range (torch refuses seeds of 2**64 and more);
- `n` other than the integer 1 (`true` is not an integer), `logprobs` not a boolean,
  `top_logprobs` other than 0 (any other integer, OpenAI's 1..20 included): the engines
  return the logprob of the sampled token only (see `workbench.engines.base.GenerationResult`), so alternatives
  cannot be listed, and a 400 says so rather than an empty list.
"""
from __future__ import annotations

import json
import math
from typing import Any

from workbench.gateway.render import RequestError

MAX_DEPTH = 100
"""Deepest nesting of objects and lists a request body may have."""

MAX_TOP_LOGPROBS = 20
"""OpenAI's upper bound of `top_logprobs`."""

SEED_RANGE = (-2 ** 63, 2 ** 63 - 1)
"""Seeds the gateway accepts (OpenAI's int64)."""


def parse_body(raw: bytes) -> dict[str, Any]:
    """The request body as a JSON object, checked for depth and Unicode (a RequestError otherwise)."""
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise RequestError(f"the request body is not valid JSON: {exc}", None, "invalid_json") from None
    except RecursionError:
        raise RequestError(f"the request body is nested too deeply to parse; at most {MAX_DEPTH} levels of "
                           "objects and lists are accepted", None, "invalid_json") from None
    if not isinstance(body, dict):
        raise RequestError("the request body must be a JSON object", None, "invalid_request")
    check_tree(body)
    return body


def _key_path(path: str, key: Any) -> str:
    return f"{path}.{key}" if path else str(key)


def check_tree(body: dict[str, Any]) -> None:
    """Raise a RequestError for a body nested deeper than MAX_DEPTH or holding a string (key or
    value) that is not valid Unicode (a lone surrogate); the error names the field's path.
    Iterative: a deep body cannot exhaust the stack here."""
    stack: list[tuple[Any, str, int]] = [(body, "", 1)]
    while stack:
        value, path, depth = stack.pop()
        if isinstance(value, str):
            _check_text(value, path)
            continue
        if not isinstance(value, (dict, list)):
            continue
        if depth > MAX_DEPTH:
            raise RequestError(f"{path or 'the request body'} is nested more than {MAX_DEPTH} levels deep",
                               path.split(".")[0].split("[")[0] or None, "invalid_request")
        if isinstance(value, dict):
            items = []
            for k, v in value.items():
                _check_text(k, f"a key of {path or 'the request body'}", path)
                items.append((v, _key_path(path, k), depth + 1))
        else:
            items = [(v, f"{path}[{i}]", depth + 1) for i, v in enumerate(value)]
        stack.extend(reversed(items))  # depth-first, in order: the first bad field is the one named


def _check_text(text: str, path: str, param: str | None = None) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:  # the message shows the character escaped (repr), never raw
        raise RequestError(f"{path} holds a lone surrogate ({text[exc.start]!r} at character {exc.start}), which "
                           "is not text: send valid UTF-8 (JSON escapes \\ud800-\\udfff only as pairs)",
                           (path if param is None else param) or None, "invalid_request") from None


def number(body: dict[str, Any], name: str, default: float, low: float, high: float,
           low_open: bool = False) -> float:
    """`body[name]` as a finite float in [low, high] ((low, high] with `low_open`), or `default`."""
    value = body.get(name)
    if value is None:
        return default
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise RequestError(f"{name} must be a number, got {value!r}", name)
    out = float(value)
    if not math.isfinite(out):
        raise RequestError(f"{name} must be a finite number, got {value!r}", name)
    if out > high or out < low or (low_open and out == low):
        where = f"({low:g}, {high:g}]" if low_open else f"[{low:g}, {high:g}]"
        raise RequestError(f"{name} must be in {where}, got {value!r}", name)
    return out


def check_seed(body: dict[str, Any]) -> int | None:
    """The request's `seed` (None when absent): an integer in OpenAI's int64 range."""
    seed = body.get("seed")
    if seed is None:
        return None
    if not isinstance(seed, int) or isinstance(seed, bool):
        raise RequestError(f"seed must be an integer, got {seed!r}", "seed")
    if not SEED_RANGE[0] <= seed <= SEED_RANGE[1]:
        raise RequestError(f"seed must be in [-2**63, 2**63 - 1], got {seed}", "seed")
    return seed


def check_choices(body: dict[str, Any], chat: bool = True) -> bool:
    """Check `n`, and for chat `logprobs` / `top_logprobs`; returns whether logprobs were asked."""
    n = body.get("n", 1)
    if not isinstance(n, int) or isinstance(n, bool):
        raise RequestError(f"n must be an integer, got {n!r}", "n")
    if n != 1:
        raise RequestError(f"n must be 1 (one choice per call), got {n!r}", "n", "unsupported_parameter")
    if not chat:
        return False
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise RequestError(f"logprobs must be true or false, got {logprobs!r}", "logprobs")
    top = body.get("top_logprobs")
    if top is not None:
        if not isinstance(top, int) or isinstance(top, bool) or top < 0:
            raise RequestError(f"top_logprobs must be 0 (the only value this gateway supports: its engines return "
                               f"the sampled token's logprob only), got {top!r}", "top_logprobs")
        if top > 0:
            raise RequestError(f"top_logprobs={top} is not supported: the gateway's engines return the logprob of "
                               "the sampled token only; send top_logprobs=0 or leave it out (logprobs=true still "
                               "gives each sampled token's logprob)", "top_logprobs", "unsupported_parameter")
    return bool(logprobs)


def user(body: dict[str, Any]) -> str | None:
    """The request's `user` field when it is a non-empty string (it names the episode)."""
    value = body.get("user")
    return value if isinstance(value, str) and value else None


__all__ = ["MAX_DEPTH", "MAX_TOP_LOGPROBS", "SEED_RANGE", "check_choices", "check_seed", "check_tree", "number",
           "parse_body", "user"]
