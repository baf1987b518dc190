"""Token-in/token-out: an episode's ids are exactly the rendered conversation.

For every environment x parser, rollouts with the tiny model (sampled, several seeds,
human tool-call turns mixed in) are checked three ways:

* `check_token_alignment(ep, tok).ok` and no warnings on the episode;
* independently of workbench: `tok.apply_chat_template(ep.messages)` decodes-equal to
  `tok.decode(ep.token_ids)` (string equality);
* re-encoding that text gives the same ids except inside a model turn (the model may
  sample a non-canonical tokenisation of its own text; we keep the sampled ids).

The same with the embedded SmolLM2 on two environments, and a broken (not
prefix-stable) chat template must be reported, not silently trained on.
"""
from __future__ import annotations

import copy
import json

import pytest

from envs import ENVIRONMENTS, EXPERTS, make_env
from workbench.engines.hf import HFEngine
from workbench.rollout import Rollout, TemplateError, check_token_alignment

PARSERS = [None, "json", "react", "function_calling"]


def _tool_call_text(parser: str | None, action: str) -> str:
    """A well-formed environment_step call in the parser's own format (plain text for None)."""
    args = {"action": action}
    if parser is None:
        return action
    if parser == "json":
        return json.dumps({"tool": "environment_step", "arguments": args})
    if parser == "react":
        return f"Thought: I will act.\nAction: environment_step\nAction Input: {json.dumps(args)}"
    if parser == "function_calling":
        return f"<tool_call>{json.dumps({'name': 'environment_step', 'arguments': args})}</tool_call>"
    raise ValueError(parser)


def _first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def assert_token_exact(ep, tok) -> dict:
    """All three views of one finished episode; returns a few facts for the caller."""
    assert ep.done, ep
    report = check_token_alignment(ep, tok)
    assert report.ok, f"{ep}: {report.message}"
    assert ep.warnings == [], ep.warnings
    # Independent view: render the final conversation with the tokenizer alone.
    rendered = tok.apply_chat_template(ep.messages, tokenize=False, add_generation_prompt=False)
    decoded = tok.decode(ep.token_ids, skip_special_tokens=False)
    if decoded != rendered:
        pos = next((i for i, (x, y) in enumerate(zip(decoded, rendered)) if x != y), min(len(decoded), len(rendered)))
        raise AssertionError(
            f"{ep}: decoded ids differ from the rendered conversation at char {pos}: "
            f"ids {decoded[max(0, pos - 40):pos + 40]!r} vs template {rendered[max(0, pos - 40):pos + 40]!r}"
        )
    # Full re-encode: any difference must start inside a turn the model sampled.
    full = list(tok(rendered, add_special_tokens=False)["input_ids"])
    diff = _first_difference(full, list(ep.token_ids))
    model_turns = [t for t in ep.turns if t.source == "model"]
    if diff is not None:
        owner = [t.index for t in model_turns if t.token_start <= diff < t.token_end]
        assert owner, (
            f"{ep}: re-encoding the conversation differs at token {diff}, outside every model turn "
            f"(model turns span {[(t.token_start, t.token_end) for t in model_turns]}); "
            f"ids {ep.token_ids[max(0, diff - 3):diff + 3]} vs re-encoded {full[max(0, diff - 3):diff + 3]}"
        )
    # Structure: the prompt, then per turn the action ids, then the glue, in order.
    assert ep.prompt_length > 0 and all(i == -1 for i in ep.turn_index[: ep.prompt_length])
    prev_end = ep.prompt_length
    for t in ep.turns:
        assert t.token_start >= prev_end and t.token_end > t.token_start
        assert set(ep.turn_index[t.token_start:t.token_end]) == {t.index}
        prev_end = t.token_end
    return {"reencode_diff": diff}


def _plain(env):
    env.action_parser = None  # "None/plain": the whole reply is the environment action
    return env


@pytest.mark.parametrize("parser", PARSERS, ids=lambda p: p or "plain")
@pytest.mark.parametrize("env_name", sorted(ENVIRONMENTS))
def test_tiny_model_rollouts_are_token_exact(tiny_engine, env_name, parser):
    tok = tiny_engine.tokenizer
    n_checked, n_tool_msgs, n_human = 0, 0, 0
    for sampling_seed in (0, 1, 2):
        envs = [_plain(make_env(env_name)) if parser is None else make_env(env_name) for _ in range(4)]
        rollout = Rollout(tiny_engine, envs, seeds=[0, 1, 2, 3], max_turns=3, max_tokens=12,
                          temperature=1.0, seed=sampling_seed, parser=parser)
        rollout.reset()
        # Episode 0 opens with a typed, well-formed call (so tool/observation messages
        # of every parser's format appear); episode 1 gets a typed plain action later.
        expert = EXPERTS[env_name](rollout.slots[0].env)
        rollout.step(human_actions={0: _tool_call_text(parser, expert)})
        if 1 in rollout.live:
            rollout.step(human_actions={1: EXPERTS[env_name](rollout.slots[1].env)})
        batch = rollout.run()
        assert len(batch) == 4
        for ep in batch:
            assert ep.error is None, ep.error
            assert_token_exact(ep, tok)
            n_checked += 1
            n_tool_msgs += sum(m["role"] == "tool" for m in ep.messages)
            n_human += sum(t.source == "human" for t in ep.turns)
            assert 1 <= ep.num_turns <= 3
    assert n_checked == 12
    assert n_human >= 3
    if parser is not None:
        assert n_tool_msgs >= 3, "the typed tool calls should have produced tool messages"


def test_reencode_difference_is_detected_inside_model_turn(tiny_engine):
    """The random tiny model samples non-canonical tokenisations; the checks must notice."""
    tok = tiny_engine.tokenizer
    rollout = Rollout(tiny_engine, [make_env("guess_number") for _ in range(4)], seeds=[0, 1, 2, 3],
                      max_turns=2, max_tokens=16, seed=0)
    diffs = [assert_token_exact(ep, tok)["reencode_diff"] for ep in rollout.run()]
    assert any(d is not None for d in diffs), "expected at least one non-canonical sampled tokenisation"
    for ep, d in zip(rollout.batch, diffs):
        if d is not None:
            rep = check_token_alignment(ep, tok)
            assert rep.reencode_mismatch == d and rep.reencode_in_model_turn


@pytest.mark.slow
@pytest.mark.parametrize("temperature", [0.0, 1.0], ids=["greedy", "sampled"])
@pytest.mark.parametrize("env_name,parser", [("guess_number", None), ("arithmetic", "function_calling")])
def test_embedded_model_rollouts_are_token_exact(embedded_engine, env_name, parser, temperature):
    tok = embedded_engine.tokenizer
    rollout = Rollout(embedded_engine, [make_env(env_name) for _ in range(2)], seeds=[0, 1], max_turns=3,
                      max_tokens=16, temperature=temperature, seed=0, parser=parser)
    rollout.reset()
    if env_name == "arithmetic":  # a real calculator call, so a tool message is in the episode
        rollout.step(human_actions={0: EXPERTS[env_name](rollout.slots[0].env)})
    batch = rollout.run()
    for ep in batch:
        assert ep.error is None, ep.error
        assert_token_exact(ep, tok)
        assert any(t.source == "model" for t in ep.turns)
    if env_name == "arithmetic":
        assert any(m["role"] == "tool" for m in batch[0].messages)


# -- a chat template that is not prefix-stable must be reported ---------------------------

STRIP_EARLIER_ASSISTANT = (
    "{% for message in messages %}"
    "{% if message['role'] == 'assistant' and not loop.last %}"
    "{{ '<|im_start|>assistant\n<|im_end|>\n' }}"  # earlier assistant turns rendered empty
    "{% else %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
    "{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


@pytest.fixture
def broken_tokenizer(tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    broken = copy.deepcopy(tok)
    broken.chat_template = STRIP_EARLIER_ASSISTANT
    assert tok.chat_template != STRIP_EARLIER_ASSISTANT  # the shared tokenizer is untouched
    return broken


def test_a_template_that_drops_earlier_replies_is_refused_at_start_for_sampled_history(
        tiny_model_and_tokenizer, broken_tokenizer, capsys, monkeypatch):
    """Sampled history needs the text after each reply; a template that drops earlier replies
    has none, so the rollout refuses to start (naming the model, the rule and the fix); with
    history "auto" it runs "rendered" instead and says so once."""
    from workbench.rollout import template

    monkeypatch.setattr(template, "_SAID", set())  # said once per process: make this the first time
    model, _ = tiny_model_and_tokenizer
    engine = HFEngine(model, broken_tokenizer)
    envs = [make_env("guess_number") for _ in range(3)]
    with pytest.raises(TemplateError, match=r"model .*tiny-llama.*: its chat template drops an assistant turn's "
                                            r"content .* set inference.history to \"rendered\""):
        Rollout(engine, envs, seeds=[0, 1, 2], max_turns=3, max_tokens=8, history="sampled")
    rollout = Rollout(engine, envs, seeds=[0, 1, 2], max_turns=3, max_tokens=8)
    assert rollout.history == "rendered"
    assert 'inference.history "auto" -> "rendered"' in capsys.readouterr().err
    for ep in rollout.run():
        assert ep.history == "rendered" and ep.warnings == [], ep.warnings
        assert check_token_alignment(ep, broken_tokenizer).ok


def test_broken_template_alignment_report_has_position(tiny_engine, broken_tokenizer):
    """An episode built with a good template, checked against the broken one: a position."""
    rollout = Rollout(tiny_engine, [make_env("guess_number") for _ in range(3)], seeds=[0, 1, 2], max_turns=3, max_tokens=8)
    for ep in rollout.run():
        assert ep.num_turns >= 2
        good = check_token_alignment(ep, tiny_engine.tokenizer)
        bad = check_token_alignment(ep, broken_tokenizer)
        assert good.ok and not bad.ok
        first = ep.turns[0]
        # The first model turn is the first thing the broken template renders differently.
        assert bad.first_mismatch == first.token_start, (bad.first_mismatch, first.token_start, bad.message)
        assert "turn 0 content missing" in bad.message and f"position {first.token_start}" in bad.message


def test_misaligned_episode_gets_a_warning_not_a_crash(tiny_engine):
    """Corrupt one glue token after the fact: the check names the position."""
    rollout = Rollout(tiny_engine, [make_env("grid") for _ in range(3)], seeds=[0, 1, 2], max_turns=2, max_tokens=8)
    ep = rollout.run()[1]
    pos = ep.turns[0].token_end  # first glue token after the first action
    bad = copy.deepcopy(ep)
    bad.token_ids[pos] = (bad.token_ids[pos] + 1) % len(tiny_engine.tokenizer)
    rep = check_token_alignment(bad, tiny_engine.tokenizer)
    assert not rep.ok and rep.first_mismatch == pos
    assert f"token mismatch at position {pos}" in rep.message
