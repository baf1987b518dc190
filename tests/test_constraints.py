"""Constrained decoding (workbench/engines/constraints.py): every kind holds on the hf engine's
batched decode path, per request; the recorded logprobs are of the masked distribution; the
trainer scores constrained turns under the same masks, so its ratio and KL compare like with
like (a hand-computed two-token-vocabulary case, and a real rollout + update)."""
from __future__ import annotations

import json
import math
import re

import jsonschema
import pytest
import torch

from workbench.engines.base import SamplingParams
from workbench.engines.constraints import Constraint, ConstraintError, grammars_for, replay, unpack
from workbench.rollout import stop_token_ids
from workbench.tools.parsers import FunctionCallingParser
from workbench.training.constrained import AllowedTokens, allowed_tokens
from workbench.training.policy import forward_logprobs

SCHEMA = {"type": "object", "properties": {"direction": {"enum": ["up", "down"]}, "fast": {"type": "boolean"}},
          "required": ["direction", "fast"]}
TOOLS = [{"type": "function", "function": {"name": "move", "parameters": {
    "type": "object", "properties": {"steps": {"enum": [1, 2, 3]}}, "required": ["steps"]}}},
         {"type": "function", "function": {"name": "stop", "parameters": {"type": "object", "properties": {}}}}]


@pytest.fixture(scope="module")
def prompt(tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    chat = [{"role": "user", "content": "Which way? Answer in JSON."}]
    return list(tok(tok.apply_chat_template(chat, tokenize=False, add_generation_prompt=True),
                    add_special_tokens=False)["input_ids"])


def _text(tok, ids, stops):
    return tok.decode(ids[:-1] if ids and ids[-1] in stops else ids, skip_special_tokens=False)


def _check(kind: str, text: str) -> None:
    """Raise unless `text` follows the constraint of that kind (an independent check)."""
    if kind == "json_object":
        assert isinstance(json.loads(text), dict)
    elif kind == "json_schema":
        jsonschema.validate(json.loads(text), SCHEMA)
    elif kind == "regex":
        assert re.fullmatch(r"-?[0-9]{1,2}", text), text
    elif kind == "choice":
        assert text in ("up", "down", "left"), text
    else:
        parsed = FunctionCallingParser(strict=True).parse(text)
        assert parsed.error is None and len(parsed.tool_calls) == 1 and not parsed.content, (text, parsed)
        call = parsed.tool_calls[0]
        schema = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.name]
        jsonschema.validate(call.arguments, schema)


CONSTRAINTS = {
    "json_object": Constraint.json_object(),
    "json_schema": Constraint.json_schema(SCHEMA),
    "regex": Constraint.regex(r"-?[0-9]{1,2}"),
    "choice": Constraint.choice(["up", "down", "left"]),
    "tool_call": Constraint.tool_call(TOOLS),
}


@pytest.mark.parametrize("kind", [k for k in CONSTRAINTS if k != "json_object"])
def test_every_reply_follows_its_constraint(tiny_model_and_tokenizer, tiny_engine, prompt, kind):
    """The tiny random model never writes these formats unconstrained; under the constraint all
    16 sampled replies (and the greedy one) do, ending on the stop id."""
    _, tok = tiny_model_and_tokenizer
    stops = stop_token_ids(tok)
    c = CONSTRAINTS[kind]
    free = tiny_engine.generate_ids([prompt] * 4, SamplingParams(max_tokens=48, seed=0, stop_token_ids=stops))
    with pytest.raises(Exception):
        for r in free:
            _check(kind, _text(tok, r.token_ids, stops))
    for temperature in (1.0, 0.0):
        results = tiny_engine.generate_ids([prompt] * (16 if temperature else 1), SamplingParams(
            max_tokens=80, temperature=temperature, seed=3, stop_token_ids=stops, constraint=c))
        for r in results:
            assert r.finish_reason == "stop" and r.token_ids[-1] in stops, tok.decode(r.token_ids)
            _check(kind, _text(tok, r.token_ids, stops))


def test_a_reply_with_no_call_or_one_call_when_parallel_calls_are_off(tiny_model_and_tokenizer, tiny_engine, prompt):
    """`required=False` (text with at most one call): the grammar ends the reply after the first call."""
    _, tok = tiny_model_and_tokenizer
    stops = stop_token_ids(tok)
    text = "I will move.<tool_call>"
    ids = list(tok(text, add_special_tokens=False)["input_ids"])
    c = Constraint.tool_call(TOOLS, required=False)
    results = tiny_engine.generate_ids([prompt + ids] * 8, SamplingParams(max_tokens=40, seed=1, stop_token_ids=stops,
                                                                         constraint=c))
    g = grammars_for(tok, len(tok))
    for r in results:  # the prompt's "<tool_call>" is not part of the reply: the grammar sees only the reply
        reply = _text(tok, r.token_ids, stops)
        assert reply.count("<tool_call>") <= 1 and replay(g, c, r.token_ids, stops)[1] is None, reply


def test_rows_of_one_batch_keep_their_own_constraints(tiny_model_and_tokenizer, tiny_engine, prompt):
    """Per-request constraints through `submit` (the dynamic batcher puts them in one batch), and a
    free row's tokens are those it samples with no constrained row beside it."""
    _, tok = tiny_model_and_tokenizer
    stops = stop_token_ids(tok)
    kinds = ["json_schema", "regex", "choice", None]
    futures = [tiny_engine.submit(prompt, SamplingParams(max_tokens=40, seed=11, stop_token_ids=stops,
                                                         constraint=CONSTRAINTS[k] if k else None)) for k in kinds]
    results = [f.result(timeout=120) for f in futures]
    for k, r in zip(kinds[:3], results):
        _check(k, _text(tok, r.token_ids, stops))
    alone = tiny_engine.submit(prompt, SamplingParams(max_tokens=40, seed=11, stop_token_ids=stops)).result(timeout=120)
    assert results[3].token_ids == alone.token_ids
    assert results[3].logprobs == pytest.approx(alone.logprobs, abs=1e-5)


def test_recorded_logprobs_are_of_the_masked_distribution(tiny_model_and_tokenizer, tiny_engine, prompt):
    """Each recorded logprob equals log_softmax of a plain forward's logits with the disallowed ids
    (replayed from the grammar) at -inf, within 1e-4; the raw distribution's differ."""
    model, tok = tiny_model_and_tokenizer
    stops = stop_token_ids(tok)
    c = CONSTRAINTS["json_schema"]
    result = tiny_engine.generate_ids([prompt], SamplingParams(max_tokens=40, seed=5, stop_token_ids=stops,
                                                               constraint=c))[0]
    ids = result.token_ids
    packed, refused = replay(grammars_for(tok, model.config.vocab_size), c, ids, stops)
    assert refused is None and packed.shape[0] == len(ids)
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt + ids])).logits[0, len(prompt) - 1:-1].float()  # (n, V)
    allowed = unpack(packed, logits.shape[-1])  # (n, V)
    masked = torch.log_softmax(logits.masked_fill(~allowed, float("-inf")), -1)
    raw = torch.log_softmax(logits, -1)
    picked = torch.tensor(ids)[:, None]
    assert torch.tensor(result.logprobs) == pytest.approx(masked.gather(1, picked).squeeze(1), abs=1e-4)
    assert (raw.gather(1, picked).squeeze(1) - torch.tensor(result.logprobs)).abs().max() > 0.1
    forced = allowed.sum(-1) == 1  # positions where the grammar left one id: logprob 0
    assert forced.any() and torch.tensor(result.logprobs)[forced].abs().max() < 1e-6


def test_bad_constraints_are_refused_with_their_reason(tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    with pytest.raises(ConstraintError, match="regex constraint needs a non-empty pattern"):
        Constraint.regex("")
    with pytest.raises(ConstraintError, match="no tool is named 'jump'"):
        Constraint.tool_call(TOOLS, name="jump")
    with pytest.raises(ConstraintError, match="cannot compile the regex constraint"):
        grammars_for(tok, len(tok)).compiled(Constraint.regex("[0-9"))
    assert Constraint.from_dict(json.loads(json.dumps(CONSTRAINTS["tool_call"].to_dict()))) == CONSTRAINTS["tool_call"]


# -- training: the same masked distribution -----------------------------------------------------

def _two_token_model():
    """A real (random) Llama with a vocabulary of two ids."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=2, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                      num_attention_heads=1, num_key_value_heads=1, max_position_embeddings=16)
    return LlamaForCausalLM(cfg).eval()


def test_two_token_vocabulary_by_hand():
    """Ids [0, 1, 1, 0], tokens 1..3 trained. Position 1 allows id 1 only (mask 0b10), position 2
    is free, position 3 allows both (0b11). By hand from the raw logits z: logp_1 = 0 (the only
    allowed id), entropy 0 and no gradient; logp_2 = logp_3 = z_t - log(e^z0 + e^z1). Then for a
    changed policy the masked ratio at position 1 is exactly 1 and its k1 KL 0, where the raw
    ratio is not."""
    model = _two_token_model()
    ids = torch.tensor([[0, 1, 1, 0]])
    attn, loss_mask = torch.ones_like(ids), torch.tensor([[0.0, 1.0, 1.0, 1.0]])
    allowed = AllowedTokens(index=torch.tensor([[-1, 0, -1, 1]]),
                            masks=torch.tensor([[0b10], [0b11]], dtype=torch.int32), vocab_size=2)
    with torch.no_grad():
        z = model(input_ids=ids).logits[0].tolist()  # (4, 2): row t predicts token t+1

    def by_hand(t: int) -> float:
        z0, z1 = z[t - 1]
        return z[t - 1][ids[0, t]] - math.log(math.exp(z0) + math.exp(z1))

    for pack in (True, False):
        logp, ent = forward_logprobs(model, ids, attn, with_entropy=True, loss_mask=loss_mask, pack=pack,
                                     allowed=allowed)
        assert logp[0, 1].item() == 0.0 and ent[0, 1].item() == 0.0
        assert logp[0, 2].item() == pytest.approx(by_hand(2), abs=1e-6)
        assert logp[0, 3].item() == pytest.approx(by_hand(3), abs=1e-6)
        p = math.exp(by_hand(3))
        assert ent[0, 3].item() == pytest.approx(-(p * math.log(p) + (1 - p) * math.log(1 - p)), abs=1e-6)
    logp, _ = forward_logprobs(model, ids, attn, loss_mask=loss_mask, allowed=allowed)
    grads = torch.autograd.grad(logp[0, 1], [q for q in model.parameters()], allow_unused=True)
    assert all(g is None or g.abs().max() == 0 for g in grads)

    from workbench import algo

    old = logp.detach()
    with torch.no_grad():  # another policy
        for q in model.parameters():
            q.add_(0.3 * torch.randn_like(q))
    new_masked, _ = forward_logprobs(model, ids, attn, loss_mask=loss_mask, allowed=allowed)
    new_raw, _ = forward_logprobs(model, ids, attn, loss_mask=loss_mask)
    assert torch.exp(new_masked - old)[0, 1].item() == 1.0
    assert algo.kl_penalty(new_masked, old, "kl")[0, 1].item() == 0.0
    assert abs(torch.exp(new_raw - old)[0, 1].item() - 1.0) > 1e-3


@pytest.fixture(scope="module")
def constrained_trainer(tiny_model_path, tmp_path_factory):
    from workbench import ConfigStore, Trainer

    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.model.dtype = "float32"  # engine and trainer logprobs compared at fp32's tolerance (1e-4)
    c.update("environment", {"name": "guess_number", "strict_format": True, "constrained_decoding": True})
    c.training.batch_size, c.training.group_size = 4, 2
    c.inference.max_tokens, c.inference.max_turns = 8, 3
    c.checkpoint.output_dir, c.checkpoint.save_interval = str(tmp_path_factory.mktemp("ck")), 0
    return Trainer(c.validate())


def test_a_constrained_rollout_trains_on_the_distribution_that_sampled_it(constrained_trainer):
    """guess_number, strict format under its grammar, on the untrained tiny model: every reply is a
    bare number from the first turn (no format error); the trainer's old logprobs of those
    tokens equal the engine's within 1e-4 (masked), the raw ones do not; the update runs with
    ratio 1 and rollout/trainer logprob diff ~0."""
    from workbench.training.policy import batch_logprobs

    trainer = constrained_trainer
    batch = trainer.compute_advantages(trainer.score(trainer.rollout()))
    turns = [t for ep in batch for t in ep.turns]
    assert turns and all(re.fullmatch(r"[0-9]{1,2}", t.action) and t.parse_error is None for t in turns)
    assert all(t.constraint["kind"] == "regex" for t in turns)
    m = batch.loss_mask.bool()
    assert (batch.old_logprobs[m] - batch.rollout_logprobs[m]).abs().max() < 1e-4
    raw = batch_logprobs(trainer.policy.model, batch.input_ids, batch.attention_mask, [e.num_tokens for e in batch],
                         4, False, batch.loss_mask)
    assert (raw[m] - batch.rollout_logprobs[m]).abs().max() > 0.1
    assert allowed_tokens(batch, trainer.tokenizer, trainer.policy.model.config.vocab_size) is not None
    metrics = trainer.update(batch)
    assert metrics["actor/ppo_kl"] == pytest.approx(0.0, abs=1e-6)
    assert metrics["actor/rollout_logprob_diff"] < 1e-4


def test_the_setting_is_refused_by_an_environment_without_an_action_grammar():
    from envs import make_env
    from workbench.config import ConfigError

    with pytest.raises(ConfigError, match="has no action grammar"):
        make_env("text_game", {"constrained_decoding": True})


@pytest.mark.slow
def test_the_untrained_embedded_model_answers_bare_numbers_from_the_first_step(embedded_engine):
    """The demo's game (1..8, strict format), 8 episodes at temperature 1: without the grammar
    the untrained SmolLM2 writes sentences (format errors); with environment.constrained_decoding
    every reply is a bare number and no turn is refused."""
    from envs import make_env
    from workbench.rollout import Rollout

    def play(constrained: bool):
        envs = [make_env("guess_number", strict_format=True, constrained_decoding=constrained, low=1, high=8,
                         max_steps=4) for _ in range(8)]
        return Rollout(embedded_engine, envs, seeds=list(range(8)), max_turns=2, max_tokens=8, temperature=1.0).run()

    free, constrained = play(False), play(True)
    assert free.summary()["env/parse_error_rate"] > 0.5
    turns = [t for ep in constrained for t in ep.turns]
    assert len(turns) >= 8 and all(re.fullmatch(r"[0-9]", t.action) and t.parse_error is None for t in turns)
    assert constrained.summary()["env/parse_error_rate"] == 0.0


def test_a_replayed_turn_records_its_grammar_like_a_sampled_one(tiny_engine):
    """Forks rebuild an episode's first turns with `Rollout.replay`: a replayed model turn of a
    constrained environment records the grammar too, so the trainer masks it as it was sampled."""
    from envs import make_env
    from workbench.rollout import Rollout

    def rollout():
        env = make_env("guess_number", strict_format=True, constrained_decoding=True, low=1, high=8, max_steps=4)
        return Rollout(tiny_engine, [env], seeds=[3], max_turns=2, max_tokens=6)

    original = rollout().run()[0]
    again = rollout().reset()
    first = original.turns[0]
    again.replay(0, original.token_ids[first.token_start:first.token_end],
                 original.rollout_logprobs[first.token_start:first.token_end], first.finish_reason)
    assert again.slots[0].episode.turns[0].constraint == first.constraint and first.constraint["kind"] == "regex"


# -- each family's tool-call text ---------------------------------------------------------------

@pytest.mark.parametrize("fmt", ["function_calling", "llama3_json", "mistral"])
def test_tool_calls_are_written_as_the_familys_parser_reads_them(tiny_model_and_tokenizer, tiny_engine, prompt,
                                                                 fmt):
    """The gateway writes a required call in its model's format (Hermes `<tool_call>`, Llama 3.x
    `{"name", "parameters"}`, Mistral `[TOOL_CALLS][...]`): every reply sampled under the
    grammar is read back by that family's parser as one call valid for its tool's schema."""
    from workbench.tools.parsers import get_parser

    _, tok = tiny_model_and_tokenizer
    stops = stop_token_ids(tok)
    c = Constraint("tool_call", tools=Constraint.tool_call(TOOLS).tools, required=True, tool_call_format=fmt)
    assert Constraint.from_dict(json.loads(json.dumps(c.to_dict()))) == c
    results = tiny_engine.generate_ids([prompt] * 8, SamplingParams(max_tokens=80, seed=5, stop_token_ids=stops,
                                                                    constraint=c))
    parser = get_parser(fmt, strict=True)
    for r in results:
        text = _text(tok, r.token_ids, stops)
        parsed = parser.parse(text)
        assert r.finish_reason == "stop" and parsed.error is None and len(parsed.tool_calls) == 1, (text, parsed)
        call = parsed.tool_calls[0]
        jsonschema.validate(call.arguments, {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}[call.name])
    with pytest.raises(ConstraintError, match="tool_call_format must be one of"):
        Constraint("tool_call", tools=c.tools, tool_call_format="xml")
    # a trajectory recorded before the format was a field (it held the Hermes tags) reads back as Hermes
    old = {**Constraint.tool_call(TOOLS).to_dict(), "tool_call_tags": ["<tool_call>", "</tool_call>"]}
    del old["tool_call_format"]
    assert Constraint.from_dict(old).tool_call_format == "function_calling"
