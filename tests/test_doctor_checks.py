"""Every run doctor check fires on a scripted policy that has the problem and stays quiet
on one that does not; batches come from a real `Rollout` on a real environment with
replies emitted through the tiny model's tokenizer (tests/doctor_policies.py)."""
from __future__ import annotations

import pytest
import torch

from tests.doctor_policies import count_up_from_4, expert, roll, roll_steps
from workbench.doctor.checks import CHECKS, run_checks
from workbench.doctor.findings import DoctorConfig, History
from workbench.rollout.chat import check_token_alignment

GUESS = {"low": 1, "high": 8, "max_steps": 4, "max_turns": 4}


@pytest.fixture(scope="module")
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


def check(name, batches, metrics=(), **cfg):
    """The named check's Finding on `batches` (steps 0, 1, ...), or None when it cannot judge."""
    h = History(metrics=list(metrics))
    for step, batch in enumerate(batches):
        h.add(batch, step)
    found = [f for f in run_checks(h, DoctorConfig(**cfg), [name])]
    return found[0] if found else None


def diverse(env, ep):
    words = ["I think", "Maybe", "Perhaps", "Let me try", "OK then"]
    k = ep.episode_id * 3 + ep.num_turns * 5 + (ep.env_seed or 0)
    return f"{words[k % 5]} {1 + k % 8}"


# -- reward hacking ------------------------------------------------------------------------
def test_incidental_span_names_the_counting_trick(tok):
    batch = roll(tok, "guess_number", count_up_from_4, **GUESS)
    f = check("parse-from-incidental-span", [batch])
    winners = [e.episode_id for e in batch if e.success]
    assert f.fired and f.value == 1.0 and len(winners) >= 4
    assert [e.episode_id for e in f.evidence] == winners[:3]
    ev = f.evidence[0]
    assert ev.text.startswith("You have ") and ev.text[ev.span[0]:ev.span[1]].isdigit()
    assert "parser" in f.message and "You have" in f.message


def test_incidental_span_quiet_when_the_reply_is_the_number(tok):
    f = check("parse-from-incidental-span", [roll(tok, "guess_number", expert("guess_number"), **GUESS)])
    assert not f.fired and f.value == 0.0


def _milestones_only(env, ep):
    move = expert("text_game")(env, ep)
    return "look" if move.startswith("attack") else move


def test_reward_without_success_on_progress_rewards(tok):
    look = lambda env, ep: "look"  # noqa: E731
    batches = roll_steps(tok, "text_game", [look, look, _milestones_only])
    f = check("reward-without-success", batches)
    assert f.fired and f.value == pytest.approx(0.4) and f.step == 2
    assert {e.episode_id for e in f.evidence} <= {e.episode_id for e in batches[-1]}


def test_reward_with_success_is_quiet(tok):
    look = lambda env, ep: "look"  # noqa: E731
    f = check("reward-without-success", roll_steps(tok, "text_game", [look, look, expert("text_game")]))
    assert not f.fired and f.value > 1.0


def _tool_then(answer):
    def reply(env, ep):
        if ep.num_turns == 0:
            return ('<tool_call>{"name": "calculator", "arguments": {"expression": "%s"}}</tool_call>'
                    % env.expression)
        return answer(ep)
    return reply


def test_tool_result_ignored(tok):
    batch = roll(tok, "arithmetic", _tool_then(lambda ep: "Answer: 999"), max_tokens=96, difficulty=1)
    f = check("tool-result-ignored", [batch])
    assert f.fired and f.value == 1.0
    assert f.evidence[0].turn == 1 and f.evidence[0].text == "Answer: 999"


def test_tool_result_used_is_quiet(tok):
    used = _tool_then(lambda ep: f"Answer: {ep.turns[0].tool_calls[0]['result']}")
    batch = roll(tok, "arithmetic", used, max_tokens=96, difficulty=1)
    f = check("tool-result-ignored", [batch])
    assert all(e.success for e in batch) and not f.fired and f.value == 0.0


# -- collapse --------------------------------------------------------------------------------
def test_template_collapse(tok):
    batches = roll_steps(tok, "guess_number", [diverse, diverse, lambda env, ep: "I pick 4."], **GUESS)
    f = check("template-collapse", batches)
    turns = sum(len(e.turns) for e in batches[-1])
    assert f.fired and f.value == pytest.approx(1 / turns) and "'I pick 4.'" in f.message
    assert all(e.text == "I pick 4." for e in f.evidence)


def test_template_collapse_quiet_without_a_drop(tok):
    f = check("template-collapse", roll_steps(tok, "guess_number", [diverse] * 3, **GUESS))
    assert not f.fired and f.value > 0.25


def test_template_collapse_needs_history(tok):
    assert check("template-collapse", [roll(tok, "guess_number", lambda env, ep: "I pick 4.", **GUESS)]) is None


def test_repetition_to_limit(tok):
    batch = roll(tok, "arithmetic", lambda env, ep: "Answer: 12 " * 30, max_tokens=24, difficulty=1)
    f = check("repetition-to-limit", [batch])
    assert f.fired and f.value == 1.0 and all(t.finish_reason == "length" for e in batch for t in e.turns)
    ev = f.evidence[0]
    assert ev.text[ev.span[0]:ev.span[1]].count("Answer: 12") >= 3


def test_repetition_quiet_when_replies_stop(tok):
    f = check("repetition-to-limit", [roll(tok, "arithmetic", lambda env, ep: "Answer: 12", max_tokens=24)])
    assert not f.fired and f.value == 0.0


def _verbose(env, ep):
    return "Well, after thinking about all the hints so far, I would like to guess " + expert("guess_number")(env, ep)


def test_length_drift(tok):
    e = expert("guess_number")
    f = check("length-drift", roll_steps(tok, "guess_number", [e, e, _verbose], max_tokens=64, **GUESS))
    assert f.fired and f.value > 5


def test_length_drift_quiet(tok):
    e = expert("guess_number")
    f = check("length-drift", roll_steps(tok, "guess_number", [e, e, e], **GUESS))
    assert not f.fired and 0.5 < f.value < 2


def test_length_drift_quiet_when_replies_shrink_to_the_bare_action(tok):
    """Sentences at first, then the expert's bare numbers (the strict format learned): the
    length falls to a fraction, and every reply is the action alone, so nothing fires; a shrink
    to replies that are not the action ("Hmm") still fires."""
    e = expert("guess_number")
    shrunk = check("length-drift", roll_steps(tok, "guess_number", [_verbose, _verbose, e], max_tokens=64, **GUESS))
    assert not shrunk.fired and "not compared: the replies changed form" in shrunk.message
    hmm = lambda env, ep: "Hmm"  # noqa: E731
    f = check("length-drift", roll_steps(tok, "guess_number", [_verbose, _verbose, hmm], max_tokens=64, **GUESS))
    assert f.value < 0.5 and f.fired


def test_truncation_surge(tok):
    e = expert("guess_number")
    babble = lambda env, ep: "I am thinking very hard about which number to choose here " * 3  # noqa: E731
    f = check("truncation-surge", roll_steps(tok, "guess_number", [e, e, babble], max_tokens=16, **GUESS))
    assert f.fired and f.value == 1.0 and len(f.evidence) == 3


def test_truncation_quiet(tok):
    e = expert("guess_number")
    f = check("truncation-surge", roll_steps(tok, "guess_number", [e, e, e], max_tokens=16, **GUESS))
    assert not f.fired and f.value == 0.0


def test_entropy_collapse_from_recorded_metrics(tok):
    batches = roll_steps(tok, "guess_number", [diverse, diverse, lambda env, ep: "I pick 4."], **GUESS)
    rows = [{"step": 0, "actor/entropy": 2.0}, {"step": 1, "actor/entropy": 1.8}, {"step": 2, "actor/entropy": 0.05}]
    f = check("entropy-collapse", batches, rows)
    assert f.fired and f.value == pytest.approx(0.05 / 1.9) and f.step == 2
    assert f.evidence and f.evidence[0].text == "I pick 4."
    steady = [dict(r, **{"actor/entropy": 1.9}) for r in rows]
    assert not check("entropy-collapse", batches, steady).fired
    # the same fall at a step that wins 95% of its games is convergence, at 50% a collapse
    won = [dict(r, **{"env/success_rate": 0.95 if r["step"] == 2 else 0.5}) for r in rows]
    f = check("entropy-collapse", batches, won)
    assert not f.fired and f.value == pytest.approx(0.05 / 1.9) and "converged" in f.message
    stuck = [dict(r, **{"env/success_rate": 0.5}) for r in rows]
    assert check("entropy-collapse", batches, stuck).fired


def test_kl_spike_from_recorded_metrics(tok):
    batches = roll_steps(tok, "guess_number", [diverse] * 2, **GUESS)
    rows = [{"step": s, "kl/mean": v} for s, v in enumerate([0.01, 0.012, 0.011, 0.5, 0.02])]
    f = check("kl-spike", batches, rows)
    assert f.fired and f.step == 3 and f.value == 0.5
    flat = [{"step": s, "kl/mean": 0.01 + 0.001 * s} for s in range(5)]
    assert not check("kl-spike", batches, flat).fired
    assert check("kl-spike", batches, []) is None



def test_engine_trainer_gap_from_real_updates(tiny_model_path, tmp_path):
    """A trainer whose weights moved between sampling and the update (what a missed weight
    sync looks like) fires engine-trainer-gap, with the step's episodes as evidence; a
    normal step, where the engine sampled the trainer's own weights, does not."""
    from envs import make_env
    from tests.test_trainer import tiny_config
    from workbench import Trainer

    config = tiny_config(tiny_model_path, tmp_path)
    config.model.dtype = "float32"
    trainer = Trainer(config, environment=make_env("guess_number"))
    rows = []
    for step, stale in enumerate([False, True]):
        batch = trainer.score(trainer.rollout())
        if stale:
            with torch.no_grad():
                for name, p in trainer.policy.model.named_parameters():
                    if "lora_B" in name:
                        p.normal_(std=0.5, generator=torch.Generator().manual_seed(0))
        trainer.compute_advantages(batch)
        rows.append({"step": step, **trainer.update(batch)})
        h = History(metrics=list(rows))
        h.add(batch, step)
        f = run_checks(h, DoctorConfig(), ["engine-trainer-gap"])[0]
        assert f.value == pytest.approx(max(r["actor/rollout_logprob_diff"] for r in rows))
        if not stale:
            assert not f.fired and f.value < 1e-4  # fp32: rounding only
        else:
            assert f.fired and f.step == 1 and f.value > 0.1 and f.evidence
            assert {e.episode_id for e in f.evidence} <= {ep.episode_id for ep in batch}
    assert run_checks(History(metrics=[{"step": 0}]), DoctorConfig(), ["engine-trainer-gap"]) == []

# -- dead signal ---------------------------------------------------------------------------------
def test_zero_variance_groups(tok):
    batch = roll(tok, "guess_number", lambda env, ep: "99", **GUESS)
    f = check("zero-variance-groups", [batch])
    assert f.fired and f.value == 1.0 and [e.episode_id for e in f.evidence] == [0, 2, 4]


def test_zero_variance_quiet_when_groups_differ(tok):
    half = lambda env, ep: expert("guess_number")(env, ep) if ep.episode_id % 2 == 0 else "99"  # noqa: E731
    f = check("zero-variance-groups", [roll(tok, "guess_number", half, **GUESS)])
    assert not f.fired and f.value == 0.0


def test_format_errors(tok):
    batch = roll(tok, "grid", lambda env, ep: "hello there", max_turns=3)
    f = check("format-errors", [batch])
    assert f.fired and f.value == 1.0 and f.evidence[0].text == "hello there"
    assert not check("format-errors", [roll(tok, "grid", expert("grid"))]).fired


def test_tokenization_mismatch(tok):
    batch = roll(tok, "guess_number", expert("guess_number"), **GUESS)
    assert not check("tokenization-mismatch", [batch]).fired
    ep = batch[1]
    at = ep.turns[0].token_end + 2  # a token of the first observation
    ep.token_ids[at] = (ep.token_ids[at] + 1) % 200
    report = check_token_alignment(ep, tok)
    assert not report.ok
    ep.warnings.append(report.message)  # what the rollout does with a failed alignment check
    f = check("tokenization-mismatch", [batch])
    assert f.fired and f.severity == "error" and f.value == 1 / len(batch)
    assert f.evidence[0].episode_id == 1 and "mismatch" in f.evidence[0].text


def test_every_check_is_documented_and_configurable():
    fields = DoctorConfig.__dataclass_fields__
    for name, fn in CHECKS.items():
        assert fn.__doc__ and len(fn.__doc__) > 40, name
    assert all(f.type for f in fields.values()) and len(fields) >= 15


def test_repeated_tail_finds_the_arithmetic_benchmarks_loop():
    from workbench.doctor.checks import _repeated_tail

    # benchmarks/results/learning_arithmetic.md: the trained model's reply, cut at max_tokens
    reply = "Answer: 6\nassistant: Answer: 6\nassistant: Answer: 6\nassistant: Answer: 6\nassistant:"
    assert _repeated_tail(reply, 3, 64) == [0, len(reply)]
    assert _repeated_tail("The number is between 1 and 8 so I will guess", 3, 64) is None
    assert _repeated_tail("I guess 7!!!", 3, 64) is None  # too short to be a loop


# -- remedies ------------------------------------------------------------------------------
def test_every_remedy_is_a_valid_change_of_the_config():
    from workbench.config import ConfigStore
    from workbench.doctor.checks import REMEDIES

    for name, overrides in REMEDIES.items():
        assert name in CHECKS, name
        config, default = ConfigStore(), ConfigStore()
        for key, value in overrides.items():
            section, field = key.split(".")
            assert hasattr(getattr(config, section), field), key
            assert getattr(getattr(default, section), field) != value, f"{key}: the remedy must change something"
            setattr(getattr(config, section), field, value)
        config.validate()


def test_a_finding_names_its_remedy_and_the_remedy_removes_it(tok):
    from workbench.debug.doctor import findings_table

    f = check("parse-from-incidental-span", [roll(tok, "guess_number", count_up_from_4, **GUESS)])
    assert f.fired and f.remedy == {"environment.strict_format": True}
    assert f.remedy_flags() == "--environment.strict_format true"
    assert ("try: python -m workbench train --from RUN/checkpoints/step_N --steps N --output NEW "
            "--environment.strict_format true") in findings_table([f])
    strict = roll(tok, "guess_number", count_up_from_4, strict_format=True, **GUESS)  # the same policy, remedied
    after = check("parse-from-incidental-span", [strict])
    assert after is None or not after.fired
    assert not any(e.success for e in strict)  # the trick no longer wins
    assert check("tokenization-mismatch", [strict]).remedy == {}  # a bug to fix, not a setting
