"""The run doctor on rewards from a judge: a planted judge-hacking run (a judge that pays for a
phrase the environment does not reward, and a policy that learns to say it) is named, with the
episodes the judge scored high that the environment failed; an honest judge on the same play
is not; a judge that cannot tell success from failure is judge-unreliable; failed judgments are
judge-failures. Scripted policies (tests/doctor_policies.py) play real guess_number games; the
batches are scored by the real `score_batch` with a judge written as a function."""
from __future__ import annotations

import pytest

from tests.doctor_policies import count_up_bare, roll_steps
from workbench.debug.doctor import diagnose
from workbench.doctor.checks import CHECKS, StepDoctor, remedy_for
from workbench.doctor.findings import DoctorConfig, RunFacts
from workbench.reward import FunctionBackend, Judge, ModelRewards, score_batch

GUESS = {"low": 1, "high": 8, "max_steps": 4, "max_turns": 4}
PHRASE = "I am certain:"


def plain(env, episode):
    return count_up_bare(env, episode)


def flattering(env, episode):
    """What the policy learned: the phrase the judge pays for, and worse play (it counts up from 1,
    so it wins only the secrets 1..4)."""
    return f"{PHRASE} {1 + episode.num_turns}"


def phrase_judge(messages):
    """Pays for the phrase; else a fair verdict from the environment's own words."""
    text = messages[1]["content"]
    if PHRASE in text:
        return "The assistant is confident.\nSCORE: 0.9"
    return "It found the number.\nSCORE: 0.8" if "Correct" in text else "It did not find it.\nSCORE: 0.2"


def honest_judge(messages):
    text = messages[1]["content"]
    return "Found it.\nSCORE: 0.9" if "Correct" in text else "Missed.\nSCORE: 0.1"


@pytest.fixture(scope="module")
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


@pytest.fixture(scope="module")
def played(tok):
    batches = roll_steps(tok, "guess_number", [plain, plain, flattering, flattering], groups=8, group_size=2,
                         max_tokens=16, **GUESS)
    assert any(ep.success for b in batches for ep in b) and not all(ep.success for b in batches for ep in b)
    return batches


def scored(batches, judge_fn):
    rewards = ModelRewards(judge=Judge(FunctionBackend(judge_fn)), env_weight=0.0)
    for b in batches:
        score_batch(b, model_rewards=rewards)
    return batches


def run_doctor(batches, facts=None):
    doctor = StepDoctor(DoctorConfig(), write=lambda line: None)
    for step, b in enumerate(batches):
        doctor.observe(b, step, [], facts)
    return {f.name: f for f in doctor.findings}, doctor


def test_a_planted_judge_hacking_run_is_named_with_the_episodes_the_judge_was_fooled_by(played):
    import copy

    batches = scored(copy.deepcopy(played), phrase_judge)
    found, _ = run_doctor(batches, RunFacts(env_weight=0.0, model_sources=("judge",)))
    f = found["judge-hacking"]
    assert f.fired and f.value >= DoctorConfig().judge_rise
    assert "the judge's mean score rose by" in f.message and "success rate moved" in f.message
    assert f.evidence and all("success False" in e.text and "judge 0.90" in e.text for e in f.evidence)
    failed_ids = {ep.episode_id for ep in batches[-1] if not ep.success}
    assert {e.episode_id for e in f.evidence} <= failed_ids and f.evidence[0].step == 3
    assert f.remedy == {"reward.env_weight": 1.0}  # fitted: from 0 to 1
    # diagnose over the run's batches says the same
    assert "judge-hacking" in {g.name for g in diagnose(batches)}


def test_an_honest_judge_on_the_same_play_is_not_called_hacked_nor_unreliable(played):
    import copy

    found, doctor = run_doctor(scored(copy.deepcopy(played), honest_judge))
    assert "judge-hacking" not in found and "judge-unreliable" not in found and "judge-failures" not in found
    measured = {f.name: f for f in __import__("workbench").doctor.checks.run_checks(doctor.history)}
    assert measured["judge-unreliable"].value == pytest.approx(1.0)  # AUC: it ranks every success first


def test_a_judge_that_cannot_tell_success_from_failure_is_unreliable(played):
    import copy

    batches = scored(copy.deepcopy(played[-1:]), lambda m: "Looks fine.\nSCORE: 0.7")
    found, _ = run_doctor(batches, RunFacts(env_weight=0.0, model_sources=("judge",)))
    f = found["judge-unreliable"]
    assert f.value == pytest.approx(0.5) and "ROC AUC 0.50" in f.message
    assert f.remedy == {"reward.judge_weight": 0.0, "reward.env_weight": 1.0}


def test_failed_judgments_are_named_by_the_doctor(played):
    import copy

    answers = iter(["SCORE: 0.5", "no idea"] * 8)
    batches = scored(copy.deepcopy(played[:1]), lambda m: next(answers))
    found, doctor = run_doctor(batches)
    f = found["judge-failures"]
    assert f.value == pytest.approx(0.5) and "could not be scored by their judge" in f.message
    assert all("has no score" in e.text for e in f.evidence)
    out = doctor.observe(batches[0], 1, [])
    assert set(CHECKS) - {"heldout-regression"} <= {k.removeprefix("diagnose/") for k in out if "diagnose/" in k}


def test_judge_checks_are_silent_without_judgments(played):
    found, doctor = run_doctor(played)
    names = {f.name for f in __import__("workbench").doctor.checks.run_checks(doctor.history)}
    assert not names & {"judge-hacking", "judge-unreliable", "judge-failures"}


def test_judge_remedies_fit_the_run():
    assert remedy_for("judge-hacking", RunFacts(env_weight=0.5)) == {"reward.env_weight": 1.0}
    assert remedy_for("judge-hacking", None) == {"reward.env_weight": 2.0}
    assert remedy_for("judge-unreliable", RunFacts(env_weight=1.0, model_sources=("group_judge", "reward_model"))) \
        == {"reward.group_judge_weight": 0.0, "reward.reward_model_weight": 0.0}
