"""The per-episode LLM judge (`Judge`, the `reward.judge` setting): a rubric and one episode's
conversation in a prompt, a score and a reason read from the reply, as verifiers' JudgeRubric
and tinker-cookbook's rubric grader do.

    judge = Judge("http://127.0.0.1:8000/v1", rubric="1 if the assistant found the number")
    judge = Judge.from_config(config.reward)             # reward.judge and the judge_* settings
    judgments = judge.judge(batch.episodes)              # one Judgment per episode, in order
    judge.messages(episode)                              # the exact prompt it sends

The judge is told its scale (`reward.judge_scale_min`..`max`) and asked for a reason and a
last line `SCORE: x`; the score is mapped to 0..1. A judgment fails, and says why, when the
request fails (timeout, refused, a dead server), the reply has no score, or the score is
outside the scale: `Judgment.score` is then None, never 0. Requests go to the backend all at
once (`workbench.reward.backends`: concurrent HTTP requests, or one engine batch). With
`cache=True` a reply is kept by the exact request (judge model, prompt, max_tokens,
temperature, response format), so the same episode under the same rubric is judged once; a
failed one is not kept. With `json=True` (`reward.judge_json`) the judge is asked for
`{"reason": ..., "score": x}` under that JSON schema (`verdict_schema`: a reason of bounded
length, a score on the scale), which the server or the engine samples under. `ChatJudge` is what this judge and the group judge (`workbench.reward.group_judge`)
share: the backend, the settings, the cache and the reading of a reply.
"""
from __future__ import annotations

import copy
import hashlib
import json
import threading
from collections import OrderedDict
from typing import Any

from workbench.reward.backends import Completion, JudgeBackend, Messages, make_backend
from workbench.reward.judgments import Judgment, on_scale, parse_score, transcript

#: The default rubric (`reward.judge_rubric`'s default).
DEFAULT_RUBRIC = ("Score how well the assistant did the task the conversation sets: 1 for a complete, correct "
                  "success, 0 for a failure or no real attempt, a value between for partial progress. Judge what "
                  "the assistant did, not what it says about it.")
#: Replies kept per judge (least recently used ones are dropped first).
CACHE_SIZE = 4096
#: Longest reason (characters) a JSON verdict may hold (`reward.judge_json`); at most half the
#: reply's tokens (`reason_chars`), so a verdict always fits (a token is at least a character).
JSON_REASON_CHARS = 240


def reason_chars(max_tokens: int) -> int:
    """The longest reason a JSON verdict of `max_tokens` tokens may hold, in characters."""
    return max(8, min(JSON_REASON_CHARS, max_tokens // 2))


def verdict_schema(low: float, high: float, max_tokens: int = 128) -> dict[str, Any]:
    """The JSON verdict a judge is asked for with `json=True` (`reward.judge_json`): a reason of
    at most `reason_chars(max_tokens)` characters, then a score on the scale [low, high]."""
    return {"type": "object", "properties": {"reason": {"type": "string", "maxLength": reason_chars(max_tokens)},
                                             "score": {"type": "number", "minimum": low, "maximum": high}},
            "required": ["reason", "score"], "additionalProperties": False}


def _fmt(x: float) -> str:
    return f"{x:g}"


class ChatJudge:
    """A judge that sends chat messages to a backend (see the module docstring).

    Args:
        backend: where it runs: a URL, `hf:MODEL`, `vllm:MODEL`, `module:function`, a
            `GenerationEngine`, a function from messages to the reply, or a `JudgeBackend`.
        rubric: what to score, in words.
        scale: (lowest, highest) score the judge is told to give.
        max_tokens, temperature, timeout, retries, concurrency: the requests' settings.
        cache: keep replies by request.
        weight: the source's weight in the episode's score (recorded on each judgment).
        model: the model name sent to a server (None: its first listed model).
        dtype: an in-process judge model's dtype.
        headers: extra HTTP headers for a server (e.g. `X-Episode-Id` for the gateway).
        json: ask for a JSON verdict under a grammar (`response_format`, `reward.judge_json`).
    """

    source = "judge"

    def __init__(self, backend: Any, rubric: str = DEFAULT_RUBRIC, scale: tuple[float, float] = (0.0, 1.0),
                 max_tokens: int = 128, temperature: float = 0.0, timeout: float = 60.0, retries: int = 2,
                 concurrency: int = 16, cache: bool = True, weight: float = 1.0, model: str | None = None,
                 dtype: str = "auto", headers: dict[str, str] | None = None, json: bool = False):
        low, high = float(scale[0]), float(scale[1])
        if not low < high:
            raise ValueError(f"a judge's scale must go from a lower to a higher number, got {scale!r}")
        if not str(rubric).strip():
            raise ValueError("a judge needs a rubric: say in words what to score")
        self.spec = backend if isinstance(backend, str) else None
        self.backend: JudgeBackend = make_backend(backend, model=model, retries=retries, concurrency=concurrency,
                                                  dtype=dtype, headers=headers)
        self.rubric, self.scale = str(rubric), (low, high)
        self.max_tokens, self.temperature, self.timeout = int(max_tokens), float(temperature), float(timeout)
        self.weight = float(weight)
        self.use_cache = bool(cache)
        self.json = bool(json)
        self._cache: OrderedDict[str, Completion] = OrderedDict()
        self._lock = threading.Lock()
        self.requests = 0
        """Requests sent to the backend (cache hits not counted)."""
        self.cache_hits = 0
        """Requests answered from the cache."""

    @classmethod
    def from_config(cls, reward: Any, backend: Any = None, **overrides: Any) -> "ChatJudge":
        """This judge with a `reward` section's settings (`backend`: instead of the section's
        location, e.g. an engine object); `overrides` win (e.g. `rubric=` for a re-judge)."""
        where = backend if backend is not None else getattr(reward, cls.source)
        if where is None:
            raise ValueError(f"reward.{cls.source} is not set: name where the judge runs (a URL, hf:MODEL, ...)")
        settings = dict(rubric=reward.judge_rubric, scale=(reward.judge_scale_min, reward.judge_scale_max),
                        max_tokens=reward.judge_max_tokens, temperature=reward.judge_temperature,
                        timeout=reward.judge_timeout_s, retries=reward.judge_retries,
                        concurrency=reward.judge_concurrency, cache=reward.judge_cache,
                        weight=getattr(reward, f"{cls.source}_weight"), model=reward.judge_model,
                        dtype=reward.judge_dtype, json=reward.judge_json)
        settings.update(overrides)
        return cls(where, **settings)

    def with_rubric(self, rubric: str) -> "ChatJudge":
        """This judge with another rubric (the same backend, settings and cache: a prompt with the
        new rubric is another request, so nothing judged under the old one is reused)."""
        if not str(rubric).strip():
            raise ValueError("a judge needs a rubric: say in words what to score")
        other = copy.copy(self)
        other.rubric = str(rubric)
        return other

    @property
    def model(self) -> str:
        """The judge model's name as recorded on each judgment."""
        return self.backend.name

    def _scale_words(self) -> str:
        return f"from {_fmt(self.scale[0])} to {_fmt(self.scale[1])}"

    def response_format(self, n: int = 1) -> dict[str, Any] | None:
        """The `response_format` of a request (for `n` trajectories), or None without `json`."""
        if not self.json:
            return None
        return {"type": "json_schema", "json_schema": {"name": "verdict", "schema": verdict_schema(*self.scale, self.max_tokens)}}

    def _key(self, messages: Messages, max_tokens: int, response_format: Any) -> str:
        blob = json.dumps([self.backend.name, max_tokens, self.temperature, response_format, messages],
                          sort_keys=True, default=str)
        return hashlib.sha256(blob.encode()).hexdigest()

    def run(self, requests: list[Messages], max_tokens: int | None = None, use_cache: bool | None = None,
            response_format: dict[str, Any] | None = None) -> list[tuple[Completion, bool]]:
        """(completion, from the cache) per request; the ones not cached go to the backend at once."""
        max_tokens = self.max_tokens if max_tokens is None else max_tokens
        use_cache = self.use_cache if use_cache is None else use_cache
        keys = [self._key(m, max_tokens, response_format) for m in requests]
        out: list[tuple[Completion, bool] | None] = [None] * len(requests)
        todo = []
        with self._lock:
            for i, key in enumerate(keys):
                hit = self._cache.get(key) if use_cache else None
                if hit is not None:
                    self._cache.move_to_end(key)
                    out[i] = (hit, True)
                    self.cache_hits += 1
                else:
                    todo.append(i)
        done = self.backend.complete([requests[i] for i in todo], max_tokens, self.temperature, self.timeout,
                                     response_format) if todo else []
        self.requests += len(todo)
        for i, completion in zip(todo, done):
            out[i] = (completion, False)
        return out  # type: ignore[return-value]

    def keep(self, messages: Messages, completion: Completion, max_tokens: int | None = None,
             response_format: dict[str, Any] | None = None) -> None:
        """Cache a reply that gave every score it was asked for (a failed one is asked again)."""
        if not self.use_cache or completion.text is None:
            return
        key = self._key(messages, self.max_tokens if max_tokens is None else max_tokens, response_format)
        with self._lock:
            self._cache[key] = completion
            while len(self._cache) > CACHE_SIZE:
                self._cache.popitem(last=False)

    def verdict(self, value: float | None, reason: str, completion: Completion, cached: bool, messages: Messages,
                what: str = "the judge's reply") -> Judgment:
        """The `Judgment` of a score read from a reply (None: none was found)."""
        base = dict(source=self.source, model=self.model, prompt=json.dumps(messages, ensure_ascii=False),
                    seconds=completion.seconds, prompt_tokens=completion.prompt_tokens,
                    completion_tokens=completion.completion_tokens, cached=cached, weight=self.weight)
        if completion.text is None:
            return Judgment(error=completion.error or "the judge gave no reply", **base)
        if value is None:
            asked = "a JSON verdict" if self.json else "'SCORE: x'"
            return Judgment(reason=completion.text[:600], error=(
                f"{what} has no score (asked for {asked} with x {self._scale_words()}): "
                f"{completion.text.strip()[:160]!r}"), **base)
        mapped = on_scale(value, *self.scale)
        if mapped is None:
            return Judgment(raw_score=value, reason=reason, error=(
                f"{what} gave the score {_fmt(value)}, outside its scale {self._scale_words()}"), **base)
        return Judgment(score=mapped, raw_score=value, reason=reason, **base)

    def close(self) -> None:
        """Release the backend (an in-process judge's engine, a server backend's threads)."""
        self.backend.close()

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.model!r}, scale={self.scale}, weight={self.weight:g})"


class Judge(ChatJudge):
    """The per-episode judge (see the module docstring and `ChatJudge` for the arguments)."""

    source = "judge"

    def messages(self, episode: Any) -> Messages:
        """The exact chat messages sent to the judge for `episode`."""
        scale = self._scale_words()
        if self.json:
            form, ask = (f'Reply with a JSON object {{"reason": "<one sentence>", "score": x}}, where x is a '
                         f"number {scale}."), f'Your verdict as JSON {{"reason": ..., "score": x}} ({scale}):'
        else:
            form, ask = (f"Reply with one or two sentences of reasons, then a last line `SCORE: x`, where x is a "
                         f"number {scale}."), f"Your reasons, then the last line `SCORE: x` ({scale}):"
        system = ("You are a careful, strict judge of a conversation between an AI assistant and a user or an "
                  f"environment. {self.rubric}\n{form}")
        user = f"The conversation:\n\n{transcript(episode.messages)}\n\n{ask}"
        return [{"role": "system", "content": system}, {"role": "user", "content": user}]

    def judge(self, episodes: list[Any], use_cache: bool | None = None) -> list[Judgment]:
        """One `Judgment` per episode, in order (requests sent together)."""
        requests = [self.messages(ep) for ep in episodes]
        fmt = self.response_format()
        out = []
        for messages, (completion, cached) in zip(requests, self.run(requests, use_cache=use_cache,
                                                                     response_format=fmt)):
            parsed = parse_score(completion.text) if completion.text is not None else None
            j = self.verdict(parsed[0] if parsed else None, parsed[1] if parsed else "", completion, cached, messages)
            if not j.failed and not cached:
                self.keep(messages, completion, response_format=fmt)
            out.append(j)
        return out


__all__ = ["CACHE_SIZE", "ChatJudge", "DEFAULT_RUBRIC", "Judge"]
