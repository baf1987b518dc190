"""The gateway's request fields as people send them with the real `openai` client: structured
outputs (response_format json_object / json_schema strict), forced tool calls (tool_choice
"required", a named function), parallel_tool_calls=false, stop strings cut like OpenAI's, and
every field it cannot honour refused with a 400 naming it, never a silent 200. The replies
come from the tiny random model, which writes none of these formats by itself."""
from __future__ import annotations

import json
import re
from pathlib import Path

import httpx
import jsonschema
import pytest

openai = pytest.importorskip("openai")

from workbench.gateway import Gateway, GatewayRollout  # noqa: E402
from workbench.gateway.fields import CHAT_FIELDS, COMPLETION_FIELDS  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
TOOLS = [{"type": "function", "function": {"name": "move", "description": "Move on the grid.", "parameters": {
    "type": "object", "properties": {"direction": {"enum": ["up", "down", "left", "right"]}},
    "required": ["direction"], "additionalProperties": False}}},
         {"type": "function", "function": {"name": "look", "description": "Describe the cell.",
                                           "parameters": {"type": "object", "properties": {}}}}]
SCHEMA = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
          "required": ["answer", "sure"], "additionalProperties": False}
HI = [{"role": "user", "content": "Is the sky blue? Answer in JSON."}]


def _client(url: str) -> "openai.OpenAI":
    return openai.OpenAI(base_url=url, api_key="none", max_retries=0, timeout=120)


def test_response_format_json_schema_every_time(tiny_engine):
    with Gateway(tiny_engine, max_tokens=60) as gw:
        client = _client(gw.episode_url("ep-json"))
        for seed in range(4):
            reply = client.chat.completions.create(model="policy", messages=HI, seed=seed, response_format={
                "type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}})
            jsonschema.validate(json.loads(reply.choices[0].message.content), SCHEMA)
            assert reply.choices[0].finish_reason == "stop"
        assert [c.constraint["kind"] for c in gw.calls("ep-json")] == ["json_schema"] * 4
        free = client.chat.completions.create(model="policy", messages=HI, seed=0)
        with pytest.raises(json.JSONDecodeError):  # the model itself writes no JSON
            json.loads(free.choices[0].message.content)


@pytest.mark.slow
def test_response_format_json_object_on_the_embedded_model(embedded_engine):
    """Any JSON object: the key and string contents are the model's, so a model that closes
    its strings is needed (the tiny random one writes strings until the token limit)."""
    with Gateway(embedded_engine, max_tokens=96, temperature=0.7) as gw:
        client = _client(gw.episode_url("ep-obj"))
        question = [{"role": "user", "content": "What is the capital of France?"}]
        free = client.chat.completions.create(model="policy", messages=question, seed=0).choices[0].message.content
        with pytest.raises(json.JSONDecodeError):
            json.loads(free)
        for seed in range(3):
            reply = client.chat.completions.create(model="policy", messages=question, seed=seed,
                                                   response_format={"type": "json_object"})
            assert isinstance(json.loads(reply.choices[0].message.content), dict), reply.choices[0].message.content
        assert [c.constraint and c.constraint["kind"] for c in gw.calls("ep-obj")] == [None] + ["json_object"] * 3


def test_forced_tool_calls(tiny_engine, tiny_model_and_tokenizer):
    """tool_choice "required" with parallel_tool_calls=false: exactly one call, valid for its
    tool; a named function: one call of that function. "required" alone allows several calls:
    the reply follows the calls grammar token by token (the random model chains calls until the
    token limit, so the check is the grammar's replay over the recorded ids)."""
    from workbench.engines.constraints import Constraint, grammars_for, replay

    _, tok = tiny_model_and_tokenizer
    schemas = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}
    with Gateway(tiny_engine, max_tokens=80) as gw:
        client = _client(gw.episode_url("ep-tools"))
        for seed in range(4):
            one = client.chat.completions.create(model="policy", messages=HI, tools=TOOLS, tool_choice="required",
                                                 parallel_tool_calls=False, seed=seed)
            (call,) = one.choices[0].message.tool_calls
            assert one.choices[0].finish_reason == "tool_calls" and one.choices[0].message.content is None
            jsonschema.validate(json.loads(call.function.arguments), schemas[call.function.name])
            named = client.chat.completions.create(model="policy", messages=HI, tools=TOOLS, seed=seed,
                                                   tool_choice={"type": "function", "function": {"name": "move"}})
            (call,) = named.choices[0].message.tool_calls
            assert call.function.name == "move" and json.loads(call.function.arguments)["direction"] in (
                "up", "down", "left", "right")
            many = client.chat.completions.create(model="policy", messages=HI, tools=TOOLS, tool_choice="required",
                                                  seed=seed)
            record = gw.calls("ep-tools")[-1]
            spec = {k: v for k, v in record.constraint.items() if k != "stop_token_ids"}
            assert spec["parallel"] is True and (many.choices[0].message.content or "<tool_call>").startswith(
                "<tool_call>")
            assert replay(grammars_for(tok, len(tok)), Constraint.from_dict(spec), record.reply.token_ids,
                          record.constraint["stop_token_ids"])[1] is None
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="policy", messages=HI, tools=TOOLS,
                                           tool_choice={"type": "function", "function": {"name": "fly"}})
        assert err.value.body["param"] == "tool_choice" and "'fly'" in err.value.body["message"]
        with pytest.raises(openai.BadRequestError) as err:
            client.chat.completions.create(model="policy", messages=HI, tool_choice="required")
        assert err.value.body["param"] == "tool_choice"


def test_no_parallel_calls_means_at_most_one(tiny_engine, tiny_model_and_tokenizer):
    """tool_choice "auto" with parallel_tool_calls=false: the reply may be text, but once it
    opens a call, that call ends the reply. The prompt is a completion request that starts
    the reply with text and an open tag, so the grammar's dispatch is exercised."""
    with Gateway(tiny_engine, max_tokens=80) as gw:
        client = _client(gw.episode_url("ep-one"))
        for seed in range(4):
            reply = client.chat.completions.create(model="policy", messages=HI, tools=TOOLS, seed=seed,
                                                   parallel_tool_calls=False)
            message = reply.choices[0].message
            assert len(message.tool_calls or []) <= 1
        (first, *_) = gw.calls("ep-one")
        assert first.constraint["kind"] == "tool_call" and first.constraint["required"] is False


def test_stop_strings_end_the_returned_text_before_them_and_ids_stay_as_sampled(tiny_engine, tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    with Gateway(tiny_engine, max_tokens=24, temperature=0.0) as gw:
        client = _client(gw.episode_url("ep-stop"))
        free = client.chat.completions.create(model="policy", messages=HI).choices[0].message.content
        stop = free[6:8]  # two characters from inside the free reply
        at = free.index(stop)
        cut = client.chat.completions.create(model="policy", messages=HI, stop=[stop])
        assert cut.choices[0].message.content == free[:at] and cut.choices[0].finish_reason == "stop"
        record = gw.calls("ep-stop")[1]
        assert stop in tok.decode(record.reply.token_ids)  # the ids run up to the token that completed it
        assert record.reply.token_ids == gw.calls("ep-stop")[0].reply.token_ids[:len(record.reply.token_ids)]
        text = client.completions.create(model="policy", prompt="Is the sky blue?", max_tokens=24, temperature=0.0)
        stop = text.choices[0].text[4:6]
        cut = client.completions.create(model="policy", prompt="Is the sky blue?", max_tokens=24, temperature=0.0,
                                        stop=stop)
        assert cut.choices[0].text == text.choices[0].text[:text.choices[0].text.index(stop)]


@pytest.mark.parametrize("field,value", [
    ("frequency_penalty", 0.5), ("presence_penalty", -1.0), ("logit_bias", {"5": 10}), ("store", True),
    ("reasoning_effort", "high"), ("verbosity", "low"), ("functions", [{"name": "f"}]), ("made_up_field", 1),
    ("metadata", {"k": "v"}), ("modalities", ["text", "audio"]),
])
def test_a_field_the_gateway_cannot_honour_is_a_400_naming_it(tiny_engine, field, value):
    with Gateway(tiny_engine, max_tokens=4) as gw:
        with pytest.raises(openai.BadRequestError) as err:
            _client(gw.base_url).chat.completions.create(model="policy", messages=HI, extra_body={field: value})
        assert err.value.body["param"] == field and field in err.value.body["message"]


def test_neutral_values_and_max_completion_tokens(tiny_engine):
    with Gateway(tiny_engine, max_tokens=4) as gw:
        client = _client(gw.base_url)
        ok = client.chat.completions.create(model="policy", messages=HI, frequency_penalty=0, presence_penalty=0.0,
                                            logit_bias={}, store=False, max_completion_tokens=3, top_p=1.0,
                                            extra_body={"top_k": 5, "prompt_cache_key": "k"})
        assert ok.usage.completion_tokens <= 3
        for bad in (0, -1, "4"):
            with pytest.raises(openai.BadRequestError) as err:
                client.chat.completions.create(model="policy", messages=HI, max_completion_tokens=bad)
            assert err.value.body["param"] == "max_completion_tokens" and "max_completion_tokens" in \
                err.value.body["message"]
        r = httpx.post(f"{gw.base_url}/completions", json={"prompt": "hi", "suffix": "!", "max_tokens": 2})
        assert r.status_code == 400 and r.json()["error"]["param"] == "suffix"
        r = httpx.post(f"{gw.base_url}/chat/completions", json={"messages": HI, "response_format": {"type": "xml"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "response_format.type"
        r = httpx.post(f"{gw.base_url}/chat/completions", json={"messages": HI, "structured_outputs": {"regex": "[0-9"}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "structured_outputs", r.json()
        assert "not a valid grammar" in r.json()["error"]["message"]


def test_vllm_structured_outputs_extension(tiny_engine):
    with Gateway(tiny_engine, max_tokens=8) as gw:
        client = _client(gw.base_url)
        reply = client.chat.completions.create(model="policy", messages=HI, extra_body={
            "structured_outputs": {"regex": "[0-9]{2}"}})
        assert re.fullmatch("[0-9]{2}", reply.choices[0].message.content)
        text = client.completions.create(model="policy", prompt="Pick:", extra_body={
            "structured_outputs": {"choice": ["red", "green"]}})
        assert text.choices[0].text in ("red", "green")


def test_the_readme_table_lists_every_field_as_the_gateway_treats_it():
    readme = (ROOT / "docs" / "bring_your_agent.md").read_text()
    section = readme.split("<!-- gateway-fields -->")[1]
    rows = {}
    for line in section.splitlines():
        m = re.match(r"\| `([a-z_]+)` \| ([^|]+) \| ([^|]+) \|", line)
        if m:
            rows[m.group(1)] = (m.group(2).strip(), m.group(3).strip())
        elif rows and not line.startswith("|"):
            break
    want = {name: (CHAT_FIELDS.get(name, ("unknown",))[0], COMPLETION_FIELDS.get(name, ("unknown",))[0])
            for name in {**CHAT_FIELDS, **COMPLETION_FIELDS}}
    assert rows == want


def json_agent(base_url: str, episode_id: str, task: dict) -> float:
    client = _client(base_url)
    reply = client.chat.completions.create(model="policy", messages=HI, temperature=1.0, response_format={
        "type": "json_schema", "json_schema": {"name": "verdict", "schema": SCHEMA, "strict": True}})
    return 1.0 if json.loads(reply.choices[0].message.content)["answer"] == "yes" else 0.0


def test_constrained_gateway_episodes_train_on_the_masked_distribution(tiny_model_path, tmp_path):
    """Episodes of an agent that asks for a JSON schema: token-exact, their turns record the
    grammar, and the trainer's logprobs of the sampled tokens equal the engine's (masked) ones."""
    from envs import make_env
    from workbench import ConfigStore, Trainer

    c = ConfigStore()
    c.model.model_name, c.model.lora_rank = str(tiny_model_path), 4
    c.model.dtype = "float32"  # the masked logprobs are compared at fp32's tolerance (1e-4)
    c.training.batch_size = c.training.group_size = 4
    c.checkpoint.output_dir, c.checkpoint.save_interval = str(tmp_path / "ckpt"), 0
    trainer = Trainer(c.validate(), environment=make_env("guess_number"))
    batch = GatewayRollout(trainer.engine, json_agent, [{}], group_size=4, max_turns=1, seed=3, max_tokens=60).run()
    assert [ep.warnings for ep in batch] == [[]] * 4
    assert all(ep.turns[0].constraint["kind"] == "json_schema" for ep in batch)
    trainer.compute_advantages(trainer.score(batch))
    m = batch.loss_mask.bool()
    assert (batch.old_logprobs[m] - batch.rollout_logprobs[m]).abs().max() < 1e-4
    assert trainer.update(batch)["actor/rollout_logprob_diff"] < 1e-4
