"""Recorded gateway calls to one token-exact `Episode`.

    episode = assemble_episode(gateway.calls("ep-0"), tokenizer, builder)

Call k's prompt should start with everything before it: call k-1's prompt followed by
the ids call k-1 sampled. Then the episode is

    call 0 prompt (mask 0) | sampled 0 (mask 1) | prompt 1 after that prefix (mask 0) | sampled 1 (mask 1) | ...

and the trained tokens are exactly the sampled ids with their engine logprobs, in order. A
call answered with typed text (`CallRecord.source == "edited"`, a fork's edit) is a turn
with `source == "edited"` and loss mask 0, as a typed turn of our own rollout is.
When a prompt does not start that way, nothing is re-tokenised to hide it: the ids of
that prompt after the longest prefix it shares with the episode's current sequence are
appended as they were sent, as a new sequence that follows that shared prefix
(`Episode.segments`), so the call's sampled ids are trained in exactly the context they
were sampled in. Under "rendered" history (the builder renders every prompt whole) that
is how each call's prompt is expected to look. Under "sampled" history it means the
harness re-sent history that does not re-tokenize to the sampled ids, edited a reply or
dropped messages, and the episode gets a warning naming the call and the first differing
position, in the words `check_token_alignment` uses for our own rollout ("token mismatch
at position N: ...").
"""
from __future__ import annotations

from typing import Any

from workbench.gateway.render import PromptBuilder
from workbench.rollout.chat import reasoning_token_count
from workbench.tools.reasoning import split_reasoning
from workbench.gateway.server import CallRecord
from workbench.trajectory import Episode, Turn


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) <= len(b) else len(b)


def _show(tokenizer: Any, tok: int | None) -> str:
    return "<end>" if tok is None else f"{tok} ({tokenizer.decode([tok], skip_special_tokens=False)!r})"


def _new_messages(prev: CallRecord | None, call: CallRecord) -> list[dict[str, Any]]:
    """The messages of `call` after the previous call's messages and its reply."""
    if prev is None:
        return list(call.messages)
    return list(call.messages[len(prev.messages) + 1:])


def assemble_episode(calls: list[CallRecord], builder: PromptBuilder, episode_id: int = 0, group_id: str = "",
                     env_name: str = "gateway", env_seed: int | None = None) -> Episode:
    """One `Episode` from an episode's recorded calls (see the module docstring).

    Turn k is call k: its action is the reply text, its tool calls the OpenAI tool calls
    returned, its observation the messages the harness sent after that reply (tool
    results, user turns), its token span the sampled ids. Rewards are left at 0; the
    caller sets the outcome (`GatewayRollout` does).
    """
    tok = builder.tokenizer
    ep = Episode(episode_id=episode_id, group_id=group_id, env_name=env_name, env_seed=env_seed,
                 history=builder.history, template_kwargs=dict(builder.template_kwargs))
    if calls and calls[0].tools and builder.native_tools:
        ep.template_kwargs["tools"] = list(calls[0].tools)
    prev: CallRecord | None = None
    for k, call in enumerate(calls):
        if k == 0:
            ep.append_tokens(call.prompt_ids, trained=False, logprobs=None, turn=-1)
            ep.prompt_length = len(call.prompt_ids)
            ep.messages = [dict(m) for m in call.messages]
            ep.states.append(_observation(call.messages[-1:]) if call.messages else tok.decode(call.prompt_ids))
        else:
            context = ep.context_ids()
            p = _first_difference(context, call.prompt_ids)
            start = len(context) if p is None else min(p, len(call.prompt_ids) - 1)  # a sequence opens with prompt
            if p is not None and builder.history != "rendered":
                have = context[p] if p < len(context) else None
                sent = call.prompt_ids[p] if p < len(call.prompt_ids) else None
                ep.warnings.append(
                    f"alignment: call {k}'s prompt does not start with the episode's ids so far (call {k - 1}'s "
                    f"prompt + sampled ids): token mismatch at position {p}: episode has {_show(tok, have)}, "
                    f"prompt has {_show(tok, sent)} (lengths {len(ep.token_ids)} vs {len(call.prompt_ids)}); the "
                    "harness re-sent history that does not re-tokenize to the sampled ids. Its prompt from "
                    f"position {p} on is appended as sent, after that shared prefix, so turn {k} trains in the "
                    "context it was sampled in, which is not the history the earlier turns were sampled in")
            ep.start_sequence(start)
            delta = call.prompt_ids[start:]
            ep.append_tokens(delta, trained=False, logprobs=None, turn=k - 1)
            new = _new_messages(prev, call) if call.messages else []
            ep.turns[-1].messages = new
            ep.turns[-1].observation = _observation(new) if call.messages else tok.decode(delta)
            ep.messages = [dict(m) for m in call.messages] if call.messages else ep.messages
            ep.states.append(ep.turns[-1].observation)
        reply = call.reply
        start = ep.num_tokens
        edited = call.source == "edited"  # typed in place of a reply (a fork's edit): not trained on
        ep.append_tokens(reply.token_ids, trained=not edited, logprobs=None if edited else reply.logprobs, turn=k)
        turn = Turn(index=k, action=reply.text, source="edited" if edited else "model", token_start=start,
                    token_end=ep.num_tokens,
                    finish_reason=call.finish_reason, parse_error=reply.parse_error,
                    tool_calls=[{"name": c["function"]["name"], "arguments": c["function"]["arguments"],
                                 "success": None, "result": None, "id": c["id"]} for c in reply.tool_calls],
                    info={"route": call.route, "reused_replies": call.reused_replies, "seconds": call.seconds},
                    constraint=None if edited else call.constraint)
        if reply.reasoning is not None or reply.reasoning_cut:
            turn.reasoning_cut = reply.reasoning_cut
            text = tok.decode(reply.token_ids, skip_special_tokens=False)
            split = split_reasoning(text, builder.profile.reasoning, builder.profile.opens_reasoning)
            turn.reasoning_tokens = reasoning_token_count(tok, reply.token_ids, builder.stop_ids, split.offset,
                                                          split.cut)
        ep.turns.append(turn)
        ep.actions.append(reply.text)
        ep.rewards.append(0.0)
        ep.dones.append(False)
        ep.infos.append(turn.info)
        ep.messages.append({"role": "assistant", "content": reply.text})
        prev = call
    if calls:
        last = calls[-1]
        if last.messages and builder.history != "rendered":  # close the last turn with the template's glue, as `Rollout` does
            glue = builder.closing_ids(ep.messages[:-1], last.tools, last.reply)
            ep.append_tokens(glue, trained=False, logprobs=None, turn=len(calls) - 1)
        ep.dones[-1] = ep.turns[-1].done = True
    ep.done = True
    _fill_tool_results(ep)
    return ep


def _observation(messages: list[dict[str, Any]]) -> str:
    return "\n".join(str(m.get("content") or "") for m in messages if m.get("role") != "assistant")


def _fill_tool_results(ep: Episode) -> None:
    """A tool call's result is the content of the tool message that answers it (when the harness sent one)."""
    results = {m.get("tool_call_id"): m.get("content") for t in ep.turns for m in t.messages if m.get("role") == "tool"}
    for t in ep.turns:
        for c in t.tool_calls:
            if c["id"] in results:
                c["result"], c["success"] = results[c["id"]], True
