"""The run doctor on honest runs: the scripted experts under the strict format, and a policy
that learns the strict format (sentences at first, the expert's bare guesses later, as a run
with an SFT warm-up goes) give no finding, in training and on the held-out batches
(before, after SFT, after RL). Before `DoctorConfig.whole_action_share`, length-drift fired
on the second (replies 0.12x the first steps' length: the bare number is the format). The
dishonest cases next to them still fire: a collapse onto one bare action, a shrink to a
reply that is no action, bare actions padded into sentences.

Replies come from scripted policies through a real `Rollout` on real environments with the
tiny model's tokenizer (tests/doctor_policies.py)."""
from __future__ import annotations

import random
from collections import Counter

import pytest

from envs import EXPERTS
from tests.doctor_policies import expert, roll_steps
from workbench.debug.doctor import diagnose, diagnose_parts
from workbench.doctor.checks import run_checks
from workbench.doctor.findings import DoctorConfig, History, is_whole_action

GUESS = {"low": 1, "high": 8, "max_steps": 4, "max_turns": 4, "groups": 8, "group_size": 2}
#: As tests/test_doctor_experts.py: arithmetic's expert needs its own parser and room for a call.
SETTINGS = {"arithmetic": {"own_parsing": True, "max_tokens": 96}, "grid": {"max_turns": 12},
            "text_game": {"max_turns": 8}, "wordle": {"max_turns": 8}}
WORDS = "well I think that the secret could be maybe perhaps my guess is probably number so let me try".split()


@pytest.fixture(scope="module")
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


def untrained(seed: int):
    """Sentences of varied words around a number, like the untrained model's replies."""
    rng = random.Random(seed)
    return lambda env, ep: " ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 10))) + f" {rng.randint(1, 8)}."


def history(batches) -> History:
    h = History()
    for step, batch in enumerate(batches):
        h.add(batch, step)
    return h


def measured(batches, **cfg) -> dict:
    return {f.name: f for f in run_checks(history(batches), DoctorConfig(**cfg))}


@pytest.mark.parametrize("name", sorted(EXPERTS))
def test_strict_experts_give_no_findings(name, tok):
    batches = roll_steps(tok, name, [expert(name)] * 3, strict_format=True, **SETTINGS.get(name, {}))
    assert all(e.success for b in batches for e in b)
    assert all(is_whole_action(t) for b in batches for e in b for t in e.turns if t.source == "model")
    assert diagnose(batches) == []
    assert diagnose_parts(None, [(0, batches[0]), (4, batches[1]), (8, batches[2])]) == []


@pytest.mark.parametrize("strict", [True, False])
def test_learning_the_bare_answer_gives_no_findings(tok, strict):
    e = expert("guess_number")
    batches = roll_steps(tok, "guess_number", [untrained(0), untrained(1), e, e], strict_format=strict, **GUESS)
    found = measured(batches)
    # What changed is real: replies 8-20x shorter, fewer distinct; it is the format, not a drift.
    assert found["length-drift"].value < 0.25 and not found["length-drift"].fired
    assert "changed form" in found["length-drift"].message
    assert found["template-collapse"].value < 0.25 and not found["template-collapse"].fired
    assert [f.name for f in found.values() if f.fired] == []
    # Held-out as train_and_report judges a run with an SFT warm-up: before, after SFT, after RL.
    assert diagnose_parts(None, [(0, batches[0]), (4, batches[2]), (8, batches[3])]) == []
    # With whole_action_share 0 every batch counts as bare: the old rule, which fires here.
    assert measured(batches, whole_action_share=0.0)["length-drift"].fired is True


def test_collapse_onto_one_bare_action_still_fires(tok):
    rng = random.Random(0)
    guess = lambda env, ep: str(rng.randint(1, 8))  # noqa: E731 - honest but weak: bare guesses
    batches = roll_steps(tok, "guess_number", [guess, guess, lambda env, ep: "4"], strict_format=True, **GUESS)
    f = measured(batches)["template-collapse"]
    assert f.fired and f.value == 1.0  # bare actions: the value is the most common reply's share


def test_a_converged_bare_action_policy_is_no_collapse(tok):
    """Binary search over 1..8 opens every game with the same guess: few distinct replies,
    by design (the false positive notebook 09's branch showed before bare_collapse_share)."""
    rng = random.Random(0)
    guess = lambda env, ep: str(rng.randint(1, 8))  # noqa: E731
    e = expert("guess_number")
    batches = roll_steps(tok, "guess_number", [guess, guess, e], strict_format=True, **GUESS)
    f = measured(batches)["template-collapse"]
    assert not f.fired and 0.2 < f.value < 0.8
    top, n = Counter(t.action.strip() for ep in batches[-1] for t in ep.turns if t.source == "model").most_common(1)[0]
    assert f.value == pytest.approx(n / sum(1 for ep in batches[-1] for t in ep.turns if t.source == "model"))
    # the settings are the ones read: a lower share (and any fall of the distinct share) fires
    assert measured(batches, bare_collapse_share=0.2, collapse_fraction=1.0)["template-collapse"].fired


def test_shrinking_to_a_reply_that_is_no_action_still_fires(tok):
    batches = roll_steps(tok, "guess_number", [untrained(0), untrained(1), lambda env, ep: "ok"], **GUESS)
    found = measured(batches)
    assert found["length-drift"].fired and found["length-drift"].value < 0.5
    assert "changed form" not in found["length-drift"].message


def test_bare_actions_padded_into_sentences_still_fire(tok):
    e = expert("guess_number")
    pad = lambda env, ep: "Well, after thinking about all the hints so far, I would like to guess " + e(env, ep)  # noqa: E731
    found = measured(roll_steps(tok, "guess_number", [e, e, pad], max_tokens=64, **GUESS))
    assert found["length-drift"].fired and found["length-drift"].value > 5
