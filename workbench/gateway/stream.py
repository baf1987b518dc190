"""`stream=true` for the gateway: a finished reply sent back as OpenAI's server-sent events.

    check_stream(body)                       # the request's stream / stream_options, or a RequestError
    chunks = response_chunks(response, include_usage=True)
    b"".join(sse_events(chunks))             # b'data: {...}\\n\\n' ... b'data: [DONE]\\n\\n'

The gateway generates a reply whole (calls share the engine's batches), then sends it the
way OpenAI streams one, so clients and harnesses that only speak streaming work unchanged:

- chat: a chunk with the role, one with the content (and the logprobs, when asked), one per
  tool call (its id, name and whole arguments), one with the finish reason, and, with
  `stream_options.include_usage`, a last chunk with no choices and the usage (every other
  chunk then carries `"usage": null`);
- completions: a chunk with the text, one with the finish reason, the usage chunk when asked;
- then `data: [DONE]`.

Joining the deltas gives exactly the message a `stream=false` call returns; what the gateway
records for the episode does not depend on `stream`. No token is sent before the reply is
done: streaming here is for compatibility, not for time to first token.
"""
from __future__ import annotations

import json
from typing import Any, Iterable, Iterator

from workbench.gateway.render import RequestError


def check_stream(body: dict[str, Any]) -> tuple[bool, bool]:
    """(stream, include_usage) of a request body; a RequestError names a malformed field."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise RequestError(f"stream must be true or false, got {stream!r}", "stream")
    options = body.get("stream_options")
    if options is None:
        return bool(stream), False
    if not stream:
        raise RequestError("stream_options is only allowed with stream=true", "stream_options")
    if not isinstance(options, dict) or set(options) - {"include_usage"}:
        raise RequestError(f"stream_options must be {{'include_usage': true|false}}, got {options!r}",
                           "stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise RequestError(f"stream_options.include_usage must be true or false, got {usage!r}",
                           "stream_options.include_usage")
    return True, usage


def _chunk(response: dict[str, Any], obj: str, choices: list[dict[str, Any]], include_usage: bool) -> dict[str, Any]:
    out = {"id": response["id"], "object": obj, "created": response["created"], "model": response["model"],
           "choices": choices}
    if include_usage:
        out["usage"] = None
    return out


def chat_chunks(response: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    """The `chat.completion.chunk` objects of one `chat.completion` response (one choice)."""
    choice = response["choices"][0]
    message = choice["message"]

    def delta(d: dict[str, Any], finish: str | None = None, logprobs: Any = None) -> dict[str, Any]:
        return _chunk(response, "chat.completion.chunk",
                      [{"index": 0, "delta": d, "logprobs": logprobs, "finish_reason": finish}], include_usage)

    out = [delta({"role": "assistant", "content": ""})]
    if message.get("reasoning_content") is not None:  # as vLLM's reasoning parsers stream it, before the content
        out.append(delta({"reasoning_content": message["reasoning_content"]}))
    if message.get("content") or choice.get("logprobs"):
        out.append(delta({"content": message.get("content") or ""}, logprobs=choice.get("logprobs")))
    for i, call in enumerate(message.get("tool_calls") or []):
        out.append(delta({"tool_calls": [{"index": i, "id": call["id"], "type": "function",
                                          "function": dict(call["function"])}]}))
    out.append(delta({}, finish=choice["finish_reason"]))
    if include_usage:
        out.append({**_chunk(response, "chat.completion.chunk", [], False), "usage": response["usage"]})
    return out


def completion_chunks(response: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    """The streamed `text_completion` objects of one completions response (one choice)."""
    choice = response["choices"][0]

    def part(text: str, finish: str | None) -> dict[str, Any]:
        return _chunk(response, "text_completion",
                      [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish}], include_usage)

    out = [part(choice["text"], None), part("", choice["finish_reason"])]
    if include_usage:
        out.append({**_chunk(response, "text_completion", [], False), "usage": response["usage"]})
    return out


def response_chunks(response: dict[str, Any], include_usage: bool = False) -> list[dict[str, Any]]:
    """The chunks of a chat or completions response, by its `object`."""
    if response.get("object") == "chat.completion":
        return chat_chunks(response, include_usage)
    if response.get("object") == "text_completion":
        return completion_chunks(response, include_usage)
    raise ValueError(f"no stream form for a response of object {response.get('object')!r}")


def sse_events(chunks: Iterable[dict[str, Any]]) -> Iterator[bytes]:
    """Each chunk as one `data: <json>` event, then `data: [DONE]`."""
    for c in chunks:
        yield b"data: " + json.dumps(c, separators=(",", ":")).encode() + b"\n\n"
    yield b"data: [DONE]\n\n"


__all__ = ["check_stream", "chat_chunks", "completion_chunks", "response_chunks", "sse_events"]
