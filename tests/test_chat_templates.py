"""Chat templates with rules about roles, and templates that cannot express a conversation,
on the tiny model's tokenizer (`workbench.rollout.template`): the rules are met exactly,
the refusals come when the rollout is built and name the model, the rule and the fix."""
from __future__ import annotations

import copy

import pytest

from envs import make_env
from workbench.engines.hf import HFEngine
from workbench.rollout import Rollout, TemplateError, check_token_alignment
from workbench.rollout.template import resolve_history, template_profile

#: Gemma-like: no system role, user/assistant must alternate (so no tool role either).
STRICT = (
    "{% if messages[0]['role'] == 'system' %}{{ raise_exception('System role not supported') }}{% endif %}"
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
#: Phi-3-like: a closed conversation ends with the eos token instead of the generation prompt.
EOS_WHEN_CLOSED = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% else %}{{ eos_token }}{% endif %}"
)
NO_GENERATION_PROMPT = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endfor %}"
)
DROPS_REPLIES = (
    "{% for message in messages %}{% if message['role'] == 'assistant' %}{{ '<|im_start|>assistant\n<|im_end|>\n' }}"
    "{% else %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}{% endif %}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
CALL = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'


def _engine(tiny_model_and_tokenizer, template: str) -> HFEngine:
    model, tok = tiny_model_and_tokenizer
    tok = copy.deepcopy(tok)
    tok.chat_template = template
    return HFEngine(model, tok)


def test_a_template_without_system_or_tool_roles_that_insists_on_alternation(tiny_model_and_tokenizer):
    engine = _engine(tiny_model_and_tokenizer, STRICT)
    tok = engine.tokenizer
    profile = template_profile(tok)
    assert (profile.system_role, profile.tool_role, profile.alternating, profile.prefix_stable) == (
        False, False, True, True)
    rollout = Rollout(engine, [make_env("arithmetic") for _ in range(2)], seeds=[0, 1], max_turns=3, max_tokens=8)
    rollout.reset()
    rollout.step(human_actions={0: CALL, 1: CALL})
    for ep in rollout.run():
        assert ep.num_turns == 3 and not ep.warnings and check_token_alignment(ep, tok).ok, ep.warnings
        assert [m["role"] for m in ep.messages[:4]] == ["system", "user", "assistant", "tool"]  # kept as they were
        text = tok.decode(ep.token_ids)
        system, problem = ep.messages[0]["content"], ep.messages[1]["content"]
        assert text.startswith(f"<|im_start|>user\n{system}\n\n{problem}<|im_end|>\n")  # the system text opens it
        assert "<|im_start|>assistant\n" + CALL + "<|im_end|>\n<|im_start|>user\n5<|im_end|>" in text  # tool -> user
        assert "<|im_start|>system" not in text and "<|im_start|>tool" not in text


@pytest.mark.parametrize("history", ["sampled", "rendered"])
def test_a_template_that_closes_with_eos(tiny_model_and_tokenizer, history):
    """A finished conversation ends with eos, an open one with the generation prompt (Phi-3):
    both history settings end their episodes the way the template renders them."""
    engine = _engine(tiny_model_and_tokenizer, EOS_WHEN_CLOSED)
    assert not template_profile(engine.tokenizer).prefix_stable  # the eos is not there once the talk goes on
    rollout = Rollout(engine, [make_env("guess_number") for _ in range(2)], seeds=[0, 1], max_turns=2, max_tokens=6,
                      history=history)
    for ep in rollout.run():
        assert ep.num_turns == 2 and not ep.warnings and check_token_alignment(ep, engine.tokenizer).ok, ep.warnings
        if history == "sampled":  # the finished conversation's last tokens: the template's closing eos
            assert engine.tokenizer.decode(ep.token_ids).endswith("<|im_end|>\n" + engine.tokenizer.eos_token)


@pytest.mark.parametrize("template, rule", [
    (NO_GENERATION_PROMPT, "adds no generation prompt after the conversation"),
    (DROPS_REPLIES, "drops or repeats the assistant's reply in a conversation that ends with it"),
])
def test_a_template_that_cannot_express_a_conversation_is_refused_when_the_rollout_is_built(
        tiny_model_and_tokenizer, template, rule):
    engine = _engine(tiny_model_and_tokenizer, template)
    with pytest.raises(TemplateError, match=rf"^model .*tiny-llama.*: its chat template {rule}.*; use "):
        Rollout(engine, [make_env("guess_number")])


def test_history_settings_resolve_as_documented(tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    stable = template_profile(tok)
    assert resolve_history("auto", stable) == ("sampled", None)
    assert resolve_history("rendered", stable) == ("rendered", None)
    eos = copy.deepcopy(tok)
    eos.chat_template = EOS_WHEN_CLOSED
    choice, note = resolve_history("auto", template_profile(eos))
    assert choice == "rendered" and "not prefix-stable" in note and "inference.history=sampled" in note
    with pytest.raises(ValueError, match="inference.history must be one of auto, sampled, rendered"):
        resolve_history("as-is", stable)
