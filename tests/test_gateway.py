"""The OpenAI-compatible gateway: the real `openai` client drives a multi-turn calculator
agent against a real server on 127.0.0.1, and the assembled episodes hold exactly what the
engine sampled; a harness that re-tokenises history is flagged; a GRPO step trains on the
batch; bad requests get OpenAI's 400s; runaway harnesses are cut; only loopback is served."""
from __future__ import annotations

import json
import socket
import time
from pathlib import Path

import httpx
import pytest
import torch

openai = pytest.importorskip("openai")

from workbench.engines.hf import HFEngine  # noqa: E402
from workbench.gateway import Gateway, GatewayRollout, PromptBuilder  # noqa: E402
from workbench.models import load_model_and_tokenizer  # noqa: E402
from workbench.rollout.chat import check_token_alignment, encode  # noqa: E402

SYSTEM = "You are a calculator agent."
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]
TASKS = [{"question": "What is 2+3?", "expression": "2+3", "answer": 5},
         {"question": "What is 7*6?", "expression": "7*6", "answer": 42}]


def calculate(expression: str) -> str:
    if not set(expression) <= set("0123456789+-*/() "):
        return "error: only numbers and + - * / ( )"
    try:
        return str(eval(expression, {"__builtins__": {}}))  # noqa: S307 - checked characters only
    except Exception as exc:  # noqa: BLE001
        return f"error: {exc}"


def calculator_agent(base_url: str, episode_id: str, task: dict) -> float:
    """A plain openai-client agent loop with one tool."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
    for _ in range(4):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=40,
                                               temperature=task.get("temperature", 0.0))
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))
        if not message.tool_calls:
            break
        for call in message.tool_calls:
            args = json.loads(call.function.arguments)
            messages.append({"role": "tool", "tool_call_id": call.id, "content": calculate(args["expression"])})
    return 1.0 if (message.content or "").strip() == f"Answer: {task['answer']}" else 0.0


class RecordingEngine(HFEngine):
    """The hf engine, keeping every (prompt, result) it served: the test's own record of what
    the engine produced, independent of the gateway's."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.served: list[tuple[list[int], list[int], list[float]]] = []

    def _run_batch(self, prompts, params_list):
        results = super()._run_batch(prompts, params_list)
        self.served += [(list(p), list(r.token_ids), list(r.logprobs)) for p, r in zip(prompts, results)]
        return results


def _train_tool_use(model, tok) -> None:
    """Teach the tiny model the calculator conversation of TASKS[0] (call the tool, then answer
    with its result), so that greedy decoding writes real `<tool_call>` blocks the gateway must parse."""
    builder = PromptBuilder(tok)
    end = tok.convert_tokens_to_ids("<|im_end|>")
    seqs = []
    for task in TASKS[:1]:
        call_ids = encode(tok, '<tool_call>' + json.dumps({"name": "calculator", "arguments": {
            "expression": task["expression"]}}) + '</tool_call>') + [end]
        answer_ids = encode(tok, f"Answer: {task['answer']}") + [end]
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": task["question"]}]
        prompt0, _, _ = builder.prompt_ids(messages, TOOLS, [])
        reply = builder.reply(call_ids, [0.0] * len(call_ids), parse_tools=True)
        assert reply.tool_calls, reply
        messages += [{"role": "assistant", "content": reply.content, "tool_calls": reply.tool_calls},
                     {"role": "tool", "tool_call_id": reply.tool_calls[0]["id"],
                      "content": calculate(task["expression"])}]
        prompt1, _, reused = builder.prompt_ids(messages, TOOLS, [reply])
        assert reused == 1 and prompt1[:len(prompt0) + len(call_ids)] == prompt0 + call_ids
        ids = prompt1 + answer_ids
        mask = [0] * len(prompt0) + [1] * len(call_ids) + [0] * (len(prompt1) - len(prompt0) - len(call_ids)) \
            + [1] * len(answer_ids)
        seqs.append((torch.tensor([ids]), torch.tensor([mask[1:]], dtype=torch.float32)))
    opt = torch.optim.Adam(model.parameters(), lr=1e-2)
    model.train()
    for _ in range(80):
        for ids, mask in seqs:
            logits = model(ids).logits[:, :-1]  # (1, T-1, V)
            nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), ids[:, 1:], reduction="none")  # (1, T-1)
            loss = (nll * mask).sum() / mask.sum()
            opt.zero_grad()
            loss.backward()
            opt.step()
    model.eval()


@pytest.fixture(scope="module")
def tool_engine(tiny_model_path):
    model, tok = load_model_and_tokenizer(str(tiny_model_path), dtype="float32", device="cpu")  # own copy
    _train_tool_use(model, tok)
    engine = RecordingEngine(model, tok)
    yield engine
    engine.close()


def _trained_segments(ep):
    """The episode's loss-mask-1 runs, each as (ids, logprobs)."""
    out, i, n = [], 0, ep.num_tokens
    while i < n:
        if ep.loss_mask[i]:
            j = i
            while j < n and ep.loss_mask[j]:
                j += 1
            out.append((ep.token_ids[i:j], ep.rollout_logprobs[i:j], i))
            i = j
        else:
            i += 1
    return out


def test_openai_agent_episodes_are_what_the_engine_sampled(tool_engine):
    tool_engine.served.clear()
    tasks = [dict(TASKS[0]), dict(TASKS[0], temperature=1.0)]  # greedy, and sampled
    rollout = GatewayRollout(tool_engine, calculator_agent, tasks, group_size=3, max_turns=4, max_tokens=40)
    batch = rollout.run()
    assert len(batch) == 6 and batch.meta["gateway/misaligned_episodes"] == 0
    served = {(tuple(p), tuple(ids), tuple(lps)) for p, ids, lps in tool_engine.served}
    prompts = {p for p, _, _ in served}
    for ep in batch:
        assert ep.error is None and not ep.warnings, (ep, ep.warnings)
        segments = _trained_segments(ep)
        assert len(segments) == ep.num_turns >= 1
        for turn, (ids, lps, start) in zip(ep.turns, segments):
            context = tuple(ep.token_ids[:start])
            assert context in prompts, "the model saw a prompt that is not this episode's prefix"
            assert (context, tuple(ids), tuple(lps)) in served  # token for token, logprob for logprob
            assert (turn.token_start, turn.token_end) == (start, start + len(ids))
        assert check_token_alignment(ep, tool_engine.tokenizer).ok
    greedy = [ep for ep in batch if ep.group_id == "task0"]
    for ep in greedy:  # the trained model calls the calculator, reads 5 and answers with it
        assert ep.num_turns == 2
        assert ep.turns[0].tool_calls[0]["name"] == "calculator"
        assert json.loads(ep.turns[0].tool_calls[0]["arguments"]) == {"expression": "2+3"}
        assert ep.turns[0].tool_calls[0]["result"] == "5" and ep.turns[0].observation == "5"
        assert ep.turns[1].action == "Answer: 5" and ep.outcome == 1.0 and ep.success
        assert ep.turns[1].info["reused_replies"] == 1  # the first reply went back in as sampled ids
    # a forward pass of the same weights over the assembled ids gives the recorded logprobs
    ep = greedy[0]
    model = tool_engine.model
    with torch.no_grad():
        logits = model(torch.tensor([ep.token_ids])).logits[0, :-1]  # (T-1, V)
    lp = torch.log_softmax(logits.float(), -1).gather(-1, torch.tensor(ep.token_ids[1:])[:, None])[:, 0]  # (T-1,)
    pos = [i for i, m in enumerate(ep.loss_mask) if m]
    assert torch.allclose(lp[[p - 1 for p in pos]], torch.tensor([ep.rollout_logprobs[p] for p in pos]), atol=1e-4)
    # the episodes open in the notebook views like any rollout's
    from workbench.widgets.conversation import render_episode_html
    from workbench.widgets.tokens import render_tokens_html

    html = render_episode_html(ep)
    assert "calculator" in html and "Answer: 5" in html
    tokens_html = render_tokens_html(batch, batch.episodes.index(ep), "rollout_logprobs", tool_engine.tokenizer)
    assert tokens_html.count("turn 1, trained") == ep.turns[1].token_end - ep.turns[1].token_start


def retokenizing_agent(base_url: str, episode_id: str, task: dict) -> float:
    """A harness that keeps its history as text and sends it to /v1/completions: each reply is
    decoded and the whole conversation tokenised again by the gateway."""
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    text = f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{task['question']}<|im_end|>\n<|im_start|>assistant\n"
    for _ in range(3):
        out = client.completions.create(model="policy", prompt=text, max_tokens=8, temperature=1.0,
                                        stop=["<|im_end|>"])
        text += out.choices[0].text + "<|im_end|>\n<|im_start|>user\nGo on.<|im_end|>\n<|im_start|>assistant\n"
    return 0.0


def test_a_harness_that_retokenizes_history_trips_the_alignment_warning(tiny_engine):
    rollout = GatewayRollout(tiny_engine, retokenizing_agent, TASKS, group_size=2, max_turns=3, seed=3)
    gateway = Gateway(tiny_engine, max_turns=3, seed=3).start()
    recorded: dict[int, list] = {}  # episode index -> the gateway's raw call records, kept before they go
    forget = gateway.forget

    def keep(episode_id: str) -> None:
        recorded[int(episode_id.split("-")[1])] = gateway.calls(episode_id)  # "r<run>-<index>-<uuid>"
        forget(episode_id)

    gateway.forget = keep
    try:
        rollout.gateway = gateway
        batch = rollout.run()
    finally:
        gateway.stop()
    flagged = 0
    for ep in batch:
        assert ep.num_turns == 3
        # what the check must find, computed here from the raw records: does each later
        # prompt start with the previous prompt + the ids sampled for it?
        warned = [w for w in ep.warnings if w.startswith("alignment:")]
        calls = recorded[ep.episode_id]
        expected_break = any(
            now.prompt_ids[: len(before.prompt_ids) + len(before.reply.token_ids)]
            != before.prompt_ids + list(before.reply.token_ids)
            for before, now in zip(calls, calls[1:]))
        assert bool(warned) == expected_break, (ep.warnings, expected_break)
        if warned:
            assert "token mismatch at position" in warned[0]
        flagged += bool(warned)
    assert flagged >= 1, "the random tiny model should sample a non-canonical tokenisation in some episode"
    assert batch.meta["gateway/misaligned_episodes"] == flagged


def _tiny_config(tiny_model_path: Path, tmp_path: Path):
    from workbench import ConfigStore

    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.training.batch_size = 4
    c.training.group_size = 4
    c.training.micro_batch_size = 4
    c.training.learning_rate = 1e-2
    c.checkpoint.output_dir = str(tmp_path / "ckpt")
    c.checkpoint.save_interval = 0
    return c.validate()


def chatty_agent(base_url: str, episode_id: str, task: dict) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "user", "content": task["question"]}]
    for _ in range(2):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=8)
        messages.append(reply.choices[0].message.model_dump(exclude_none=True))
        messages.append({"role": "user", "content": "Go on."})
    return float(sum(ch.isdigit() or ch == " " for ch in (reply.choices[0].message.content or "")))


def test_a_seeded_gateway_rollout_samples_the_same_on_every_run(tiny_engine):
    """Episode ids on the gateway are unique (a uuid), but the sampling seeds come from the
    rollout's own names: a new GatewayRollout with the same seed samples the same batch, and
    the next run of one rollout samples a new one."""
    def ids(batch):
        return [ep.token_ids for ep in batch]

    first = GatewayRollout(tiny_engine, chatty_agent, TASKS, group_size=2, max_turns=2, seed=11)
    a, b = first.run(), first.run()
    again = GatewayRollout(tiny_engine, chatty_agent, TASKS, group_size=2, max_turns=2, seed=11)
    assert ids(again.run()) == ids(a) and ids(again.run()) == ids(b)
    assert ids(a) != ids(b)  # a second run is a new sample
    assert ids(GatewayRollout(tiny_engine, chatty_agent, TASKS, group_size=2, max_turns=2, seed=12).run()) != ids(a)


def test_one_grpo_step_trains_on_gateway_episodes(tiny_model_path, tmp_path):
    from envs import make_env
    from workbench import Trainer

    trainer = Trainer(_tiny_config(tiny_model_path, tmp_path), environment=make_env("guess_number"))
    batch = GatewayRollout(trainer.engine, chatty_agent, [TASKS[0]], group_size=4, max_turns=2, seed=11).run()
    assert [ep.num_turns for ep in batch] == [2, 2, 2, 2] and [ep.warnings for ep in batch] == [[]] * 4
    trainer.score(batch)
    assert [ep.score for ep in batch] == [ep.rewards[-1] for ep in batch]
    assert len({ep.score for ep in batch}) > 1, "the group needs different rewards for GRPO to learn"
    trainer.compute_advantages(batch)
    adv = batch.advantages * batch.loss_mask  # (B, T)
    assert adv.abs().sum() > 0
    before = {k: v.clone() for k, v in trainer.policy.trainable_state_dict().items()}
    metrics = trainer.update(batch)
    assert all(torch.isfinite(torch.tensor(v)) for k, v in metrics.items() if isinstance(v, float))
    after = trainer.policy.trainable_state_dict()
    assert any(not torch.equal(before[k], after[k]) for k in before)


def test_malformed_requests_get_openai_style_400s(tiny_engine):
    with Gateway(tiny_engine, max_tokens=4) as gateway:
        url = gateway.base_url
        bad = {
            "not json": b"{nope",
            "messages missing": {"model": "policy"},
            "empty messages": {"messages": []},
            "bad role": {"messages": [{"role": "wizard", "content": "hi"}]},
            "image part": {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]},
            "n=2": {"messages": [{"role": "user", "content": "hi"}], "n": 2},
            "n=2 streamed": {"messages": [{"role": "user", "content": "hi"}], "n": 2, "stream": True},
            "stream not a bool": {"messages": [{"role": "user", "content": "hi"}], "stream": "yes"},
            "stream_options alone": {"messages": [{"role": "user", "content": "hi"}],
                                     "stream_options": {"include_usage": True}},
            "stream_options bad": {"messages": [{"role": "user", "content": "hi"}], "stream": True,
                                   "stream_options": {"include_usage": "yes"}},
            "bad tools": {"messages": [{"role": "user", "content": "hi"}], "tools": [{"type": "function"}]},
            "max_tokens 0": {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 0},
            "temperature text": {"messages": [{"role": "user", "content": "hi"}], "temperature": "hot"},
            "body a list": [1, 2],
        }
        for name, body in bad.items():
            kwargs = {"content": body} if isinstance(body, bytes) else {"json": body}
            r = httpx.post(f"{url}/chat/completions", timeout=30, **kwargs)
            assert r.status_code == 400, name
            err = r.json()["error"]
            assert set(err) >= {"message", "type", "code"} and err["type"] == "invalid_request_error", name
            assert err["message"], name
        for body in ({"prompt": ""}, {"prompt": [10**9]}, {"prompt": ["a", "b"]}):
            r = httpx.post(f"{url}/completions", json=body, timeout=30)
            assert r.status_code == 400 and r.json()["error"]["param"] == "prompt"
        r = httpx.post(f"{url}/nowhere", json={}, timeout=30)
        assert r.status_code == 404 and r.json()["error"]["code"] == "not_found"
        # the openai client sees them as its own BadRequestError, with our message
        client = openai.OpenAI(base_url=url, api_key="none", max_retries=0)
        with pytest.raises(openai.BadRequestError, match="role must be one of"):
            client.chat.completions.create(model="policy", messages=[{"role": "wizard", "content": "hi"}])
        ok = client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}],
                                            user="ep-ok")
        assert ok.choices[0].message.role == "assistant" and ok.usage.completion_tokens <= 4
        assert len(gateway.calls("ep-ok")) == 1  # the `user` field names the episode


def _joined(stream) -> dict:
    """What a streaming client puts together from the chunks: content, tool calls by index,
    the finish reason, the logprobs and the usage chunk."""
    out = {"content": "", "tool_calls": {}, "finish": None, "logprobs": [], "usage": None, "roles": []}
    for chunk in stream:
        if chunk.usage is not None:
            assert chunk.choices == []
            out["usage"] = chunk.usage.model_dump()
        for choice in chunk.choices:
            d = choice.delta
            out["roles"] += [d.role] if d.role else []
            out["content"] += d.content or ""
            for call in d.tool_calls or []:
                slot = out["tool_calls"].setdefault(call.index, {"id": "", "name": "", "arguments": ""})
                slot["id"] += call.id or ""
                slot["name"] += call.function.name or ""
                slot["arguments"] += call.function.arguments or ""
            if choice.logprobs and choice.logprobs.content:
                out["logprobs"] += [(t.token, t.logprob) for t in choice.logprobs.content]
            out["finish"] = choice.finish_reason or out["finish"]
    return out


def test_streaming_clients_get_the_reply_of_a_plain_call_as_chunks(tool_engine):
    """stream=true: the openai client's chunks join into exactly the message stream=false
    returns (tool calls, content, finish reason, logprobs, usage), on both turns of the
    calculator conversation and on /v1/completions; the recorded calls are the same."""
    with Gateway(tool_engine, max_tokens=40) as gateway:
        client = openai.OpenAI(base_url=gateway.base_url, api_key="none", max_retries=0, timeout=120)
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": TASKS[0]["question"]}]
        for turn in range(2):
            ask = dict(model="policy", messages=messages, tools=TOOLS, max_tokens=40, temperature=0.0, seed=5,
                       logprobs=True)
            plain = client.chat.completions.create(**ask, user=f"plain-{turn}")
            streamed = _joined(client.chat.completions.create(**ask, user=f"streamed-{turn}", stream=True,
                                                              stream_options={"include_usage": True}))
            message = plain.choices[0].message
            assert streamed["roles"] == ["assistant"] and streamed["content"] == (message.content or "")
            calls = [{"name": c.function.name, "arguments": c.function.arguments} for c in message.tool_calls or []]
            joined = [streamed["tool_calls"][i] for i in sorted(streamed["tool_calls"])]
            assert [{k: c[k] for k in ("name", "arguments")} for c in joined] == calls
            assert all(c["id"].startswith("call_") for c in joined)  # ids are fresh per call, as OpenAI's are
            assert streamed["finish"] == plain.choices[0].finish_reason
            assert streamed["usage"] == plain.usage.model_dump()
            a, b = gateway.calls(f"plain-{turn}")[0], gateway.calls(f"streamed-{turn}")[0]
            assert (a.prompt_ids, a.reply.token_ids) == (b.prompt_ids, b.reply.token_ids)
            # the streamed logprobs are the ones recorded for that call; the two calls agree to float
            # noise (the second may prefill from the engine's prefix cache)
            assert [lp for _, lp in streamed["logprobs"]] == b.reply.logprobs
            assert [t for t, _ in streamed["logprobs"]] == [t.token for t in plain.choices[0].logprobs.content]
            assert b.reply.logprobs == pytest.approx(a.reply.logprobs, abs=1e-5)
            if turn == 0:  # the trained model calls the calculator; its result goes back for turn 1
                assert streamed["finish"] == "tool_calls" and calls[0]["name"] == "calculator"
                messages += [message.model_dump(exclude_none=True),
                             {"role": "tool", "tool_call_id": message.tool_calls[0].id, "content": "5"}]
            else:
                assert streamed["content"] == "Answer: 5" and streamed["finish"] == "stop"
        # the openai SDK's own stream helper assembles the same final message
        with client.chat.completions.stream(model="policy", messages=messages, tools=TOOLS, max_tokens=40,
                                            temperature=0.0, seed=5) as helper:
            final = helper.get_final_completion()
        assert final.choices[0].message.content == "Answer: 5"
        # /v1/completions: the chunks' text joins into the plain call's text
        prompt = f"<|im_start|>user\n{TASKS[1]['question']}<|im_end|>\n<|im_start|>assistant\n"
        plain = client.completions.create(model="policy", prompt=prompt, max_tokens=12, temperature=1.0, seed=9)
        parts = list(client.completions.create(model="policy", prompt=prompt, max_tokens=12, temperature=1.0,
                                               seed=9, stream=True))
        assert "".join(p.choices[0].text for p in parts) == plain.choices[0].text
        assert parts[-1].choices[0].finish_reason == plain.choices[0].finish_reason
        # on the wire: server-sent events, each a JSON chunk, ending with [DONE]
        with httpx.stream("POST", f"{gateway.base_url}/chat/completions", timeout=60, json={
                "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4, "stream": True}) as r:
            assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
            body = r.read().decode()
        events = [e for e in body.split("\n\n") if e]
        assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
        chunks = [json.loads(e[len("data: "):]) for e in events[:-1]]
        assert {c["object"] for c in chunks} == {"chat.completion.chunk"} and len({c["id"] for c in chunks}) == 1
        assert chunks[-1]["choices"][0]["finish_reason"] in ("stop", "length")


def test_fork_a_gateway_episode_at_any_turn(tool_engine):
    """An external agent's episode forks like our own rollout's: the agent runs again, its
    first turns answered as recorded (each prompt checked), the fork turn typed or resampled,
    the rest sampled; tokens before the fork equal the original's."""
    from workbench.debug import ReplayMismatch, fork

    rollout = GatewayRollout(tool_engine, calculator_agent, [TASKS[0]], group_size=1, max_turns=4, max_tokens=40)
    original = rollout.run()[0]
    assert original.num_turns == 2 and original.success and original.turns[1].action == "Answer: 5"

    def check_prefix(branches, position):
        for b in branches:
            for name in ("token_ids", "loss_mask", "rollout_logprobs"):
                assert getattr(b, name)[:position] == getattr(original, name)[:position], name
            assert b.forked_from["token_position"] == position and b.forked_from["original_outcome"] == 1.0

    # turn 1 typed: a wrong answer; the agent scores it 0
    tool_engine.served.clear()
    wrong = fork(original, 1, action="Answer: 6", n=2, engine=rollout)
    check_prefix(wrong, original.turns[1].token_start)
    assert not tool_engine.served  # nothing sampled: turn 0 replayed, turn 1 typed, and the agent stops
    for b in wrong:
        assert [t.source for t in b.turns] == ["model", "edited"] and b.turns[1].action == "Answer: 6"
        assert b.outcome == 0.0 and not b.success and b.forked_from["edit"] == "action"
        t1 = b.turns[1]
        assert set(b.loss_mask[t1.token_start:t1.token_end]) == {0}  # typed text is not trained on
        assert b.token_ids[t1.token_start:t1.token_end] == encode(tool_engine.tokenizer, "Answer: 6") + [
            tool_engine.tokenizer.eos_token_id]
    # turn 0 typed as a tool call of another expression: the agent runs it, the model answers after it
    call = '<tool_call>' + json.dumps({"name": "calculator", "arguments": {"expression": "7*6"}}) + '</tool_call>'
    other = rollout.fork(original, 0, action=call, n=1)[0]
    check_prefix([other], original.turns[0].token_start)
    assert other.turns[0].source == "edited" and other.turns[0].tool_calls[0]["result"] == "42"
    assert other.turns[1].source == "model" and set(other.loss_mask[other.turns[1].token_start:
                                                                     other.turns[1].token_end]) == {1}
    served = {(tuple(p), tuple(ids)) for p, ids, _ in tool_engine.served}
    t1 = other.turns[1]
    assert (tuple(other.token_ids[:t1.token_start]), tuple(other.token_ids[t1.token_start:t1.token_end])) in served
    # resampled at turn 1 (no edit): sampled by the engine, trained on
    again = rollout.fork(original, 1, n=2)
    check_prefix(again, original.turns[1].token_start)
    assert all(b.turns[1].source == "model" and b.forked_from["edit"] is None for b in again)
    assert again.meta["fork"]["n"] == 2 and again.meta["fork"]["turn"] == 1

    # an agent that asks something else on the replay: named, not silently diverged from
    asked = []

    def forgetful_agent(base_url, episode_id, task):
        asked.append(episode_id)
        question = TASKS[0]["question"] if len(asked) == 1 else "What is 2+4?"
        return calculator_agent(base_url, episode_id, dict(task, question=question))

    drifting = GatewayRollout(tool_engine, forgetful_agent, [TASKS[0]], max_turns=4, max_tokens=40)
    first = drifting.run()[0]
    named = r"(?s)differs at turn 0: the prompt.*token \d+ of call 0.*did not repeat what it sent"
    with pytest.raises(ReplayMismatch, match=named):
        drifting.fork(first, 1, action="Answer: 5", n=1)
    # what cannot be forked says why
    with pytest.raises(ValueError, match="turn must be in 0..1"):
        rollout.fork(original, 2)
    with pytest.raises(ValueError, match="gateway episode takes turn, action and n"):
        fork(original, 1, observation="x", engine=rollout)
    stranger = original.__class__.from_dict(original.to_dict())
    stranger.group_id = "task7"
    with pytest.raises(ValueError, match="not one of this rollout's"):
        rollout.fork(stranger, 1)
    stranger = original.__class__.from_dict(original.to_dict())
    stranger.warnings = ["alignment: call 1's prompt does not start with ..."]
    with pytest.raises(ValueError, match="alignment warning"):
        rollout.fork(stranger, 1)


def endless_agent(base_url: str, episode_id: str, task: dict) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    messages = [{"role": "user", "content": "hi"}]
    while True:  # never ends its episode by itself
        reply = client.chat.completions.create(model="policy", messages=messages, max_tokens=4)
        messages += [reply.choices[0].message.model_dump(exclude_none=True), {"role": "user", "content": "more"}]


def slow_agent(base_url: str, episode_id: str, task: dict) -> float:
    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0)
    client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "hi"}], max_tokens=4)
    while True:
        time.sleep(0.01)  # thinks forever after its first call


def test_harnesses_that_never_end_are_cut(tiny_engine):
    batch = GatewayRollout(tiny_engine, endless_agent, [{}], group_size=2, max_turns=3).run()
    for ep in batch:
        assert ep.num_turns == 3 and ep.truncated and ep.truncation_reason == "max_turns" and ep.error is None
    start = time.monotonic()
    batch = GatewayRollout(tiny_engine, slow_agent, [{}], group_size=2, max_turns=3, episode_timeout=2.0).run()
    assert time.monotonic() - start < 20
    for ep in batch:
        assert ep.num_turns == 1 and ep.truncated and ep.truncation_reason == "time"


def test_sixteen_agents_share_batches(tiny_model_path):
    model, tok = load_model_and_tokenizer(str(tiny_model_path), dtype="float32", device="cpu")
    engine = HFEngine(model, tok)
    try:
        batch = GatewayRollout(engine, chatty_agent, [TASKS[0]], group_size=16, max_turns=2).run()
        stats = engine.stats()
    finally:
        engine.close()
    assert len(batch) == 16 and stats["batcher_requests"] == 32
    assert stats["batcher_max_batch_size"] >= 8 and stats["batcher_batches"] <= 16


def test_serves_loopback_only(tiny_engine):
    with Gateway(tiny_engine) as gateway:
        sock = gateway._server.servers[0].sockets[0]
        assert sock.getsockname()[0] == "127.0.0.1"
        assert httpx.get(f"{gateway.base_url}/models", timeout=10).json()["data"][0]["id"] == "policy"
        try:
            own = {a[4][0] for a in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)}
        except OSError:
            own = set()
        for address in own - {"127.0.0.1"}:
            if address.startswith("127."):
                continue
            with pytest.raises(OSError):
                socket.create_connection((address, gateway.port), timeout=2).close()


TOOL_TEMPLATE = (
    "{%- if tools %}<|im_start|>system\n{% if messages[0]['role'] == 'system' %}{{ messages[0]['content'] }}\n"
    "{% endif %}Tools:{% for t in tools %} {{ t['function']['name'] }}{% endfor %}<|im_end|>\n{% endif -%}"
    "{%- for m in messages %}{% if not (tools and m['role'] == 'system') %}<|im_start|>{{ m['role'] }}\n"
    "{{ m['content'] }}{% for c in m.get('tool_calls') or [] %}<tool_call>{{ c['function'] | tojson }}</tool_call>"
    "{% endfor %}<|im_end|>\n{% endif %}{% endfor -%}"
    "{%- if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def test_a_template_that_renders_tools_gets_them_and_replies_go_back_as_sampled(tiny_model_and_tokenizer):
    import copy

    _, tok = tiny_model_and_tokenizer
    tok = copy.deepcopy(tok)
    tok.chat_template = TOOL_TEMPLATE
    builder = PromptBuilder(tok)
    assert builder.native_tools
    messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": "What is 2+3?"}]
    prompt0, _, _ = builder.prompt_ids(messages, TOOLS, [])
    assert tok.decode(prompt0).startswith(f"<|im_start|>system\n{SYSTEM}\nTools: calculator<|im_end|>")
    end = tok.convert_tokens_to_ids("<|im_end|>")
    # sampled ids that are not the canonical tokenisation of their text: re-encoding would change them
    text = '<tool_call>{"name": "calculator", "arguments": {"expression": "2+3"}}</tool_call>'
    sampled = [i for ch in text for i in encode(tok, ch)] + [end]  # one id per character
    assert sampled[:-1] != encode(tok, text)
    reply = builder.reply(sampled, [-0.5] * len(sampled), parse_tools=True)
    assert reply.content is None and reply.tool_calls[0]["function"]["name"] == "calculator"
    sent = {"role": "assistant", "content": None, "tool_calls": [
        {"id": reply.tool_calls[0]["id"], "type": "function", "function": {
            "name": "calculator", "arguments": '{"expression":"2+3"}'}}]}  # re-serialised JSON still matches
    messages += [sent, {"role": "tool", "tool_call_id": reply.tool_calls[0]["id"], "content": "5"}]
    prompt1, _, reused = builder.prompt_ids(messages, TOOLS, [reply])
    assert reused == 1 and prompt1[:len(prompt0) + len(sampled)] == prompt0 + sampled
    # a reply the gateway never gave is rendered by the template as the harness wrote it
    edited = dict(sent, tool_calls=[dict(sent["tool_calls"][0], function={"name": "calculator",
                                                                           "arguments": '{"expression": "3+2"}'})])
    prompt2, _, reused = builder.prompt_ids(messages[:2] + [edited] + messages[3:], TOOLS, [reply])
    assert reused == 0 and prompt2[:len(prompt0)] == prompt0
    assert '"arguments": {"expression": "3+2"}' in tok.decode(prompt2)  # arguments as an object, for the template


@pytest.mark.vllm
def test_the_vllm_engine_serves_the_gateway_token_exactly(vllm_tiny_engine):
    batch = GatewayRollout(vllm_tiny_engine, chatty_agent, [TASKS[0]], group_size=4, max_turns=2, seed=5).run()
    tok = vllm_tiny_engine.tokenizer
    for ep in batch:
        assert ep.num_turns == 2 and ep.warnings == [] and ep.error is None
        assert ep.turns[1].info["reused_replies"] == 1
        assert check_token_alignment(ep, tok).ok
        trained = [lp for lp, m in zip(ep.rollout_logprobs, ep.loss_mask) if m]
        assert len(trained) == ep.response_length > 0 and all(lp <= 0 for lp in trained)
