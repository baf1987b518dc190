"""The run doctor's `heldout-regression`: held-out games won at one evaluation and lost at a
later one, paired by environment seed. Batches come from a real `Rollout` on guess_number
(1..8, 4 guesses, strict format: the demo's task) with scripted policies emitting tokens
through the tiny model's tokenizer (tests/doctor_policies.py)."""
from __future__ import annotations

import pytest

from tests.doctor_policies import expert, roll
from workbench.config import ConfigError, ConfigStore
from workbench.debug.doctor import diagnose_parts
from workbench.doctor.checks import CHECKS, STEP_CHECKS, StepDoctor, run_checks
from workbench.doctor.findings import DoctorConfig, History

GUESS = {"low": 1, "high": 8, "max_steps": 4, "max_turns": 4, "strict_format": True}
SEEDS = 32  # the demo's held-out episodes: seeds 10_000 .. 10_031
#: The seeds among them whose secret is 8 (the environment draws random.Random(seed).randint(1, 8)).
SECRET_8 = [10004, 10005, 10012, 10016, 10019, 10021, 10022, 10025]


@pytest.fixture(scope="module")
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


def count_up_after_low(env, ep):
    """What the demo's GRPO policy learned: 4 first; after "too low" one more than the last
    guess (4, 5, 6, 7), after "too high" binary search. Loses only the secret 8."""
    if env.guesses and env.guesses[-1] < env.lo:  # the last guess was too low
        return str(env.guesses[-1] + 1)
    return expert("guess_number")(env, ep)


def out_of_range(env, ep):
    return "99"  # what the untrained model answers greedily: an invalid guess, never a win


def held_out(tok, policy):
    return roll(tok, "guess_number", policy, groups=SEEDS, group_size=1, first_seed=10_000, **GUESS)


@pytest.fixture(scope="module")
def batches(tok):
    return {"expert": held_out(tok, expert("guess_number")), "count_up": held_out(tok, count_up_after_low),
            "untrained": held_out(tok, out_of_range)}


def regression(batches, names, steps=None, **cfg):
    h = History(source="eval")
    for step, name in zip(steps or range(len(names)), names):
        h.add(batches[name], step)
    found = run_checks(h, DoctorConfig(**cfg), ["heldout-regression"])
    return found[0] if found else None


def secret_8_seeds(batch):
    """Seeds whose secret is 8, counted from the expert's games: binary search over 1..8
    reaches 8 only as 4, 6, 7, 8."""
    return sorted(e.env_seed for e in batch if [t.action.strip() for t in e.turns] == ["4", "6", "7", "8"])


def test_the_policies_play_as_described(batches):
    exp, up = batches["expert"], batches["count_up"]
    assert all(e.success for e in exp) and not any(e.success for e in batches["untrained"])
    eights = secret_8_seeds(exp)
    assert eights and [e.env_seed for e in up if not e.success] == eights
    assert eights == SECRET_8


def test_expert_then_count_up_fires_with_the_lost_share(batches):
    eights = SECRET_8
    f = regression(batches, ["expert", "count_up"], steps=[2, 8], max_evidence=SEEDS)
    assert f.fired and f.source == "eval" and f.step == 8 and f.severity == "warning"
    assert f.value == 8 / 32 and f.threshold == 0.1  # 8 secret-8 seeds lost of 32 won
    # the evidence is exactly the lost episodes, at the turn they part from the expert's (6 vs 5)
    assert sorted(e.seed for e in f.evidence) == eights
    assert all(e.step == 8 and e.turn == 1 and e.text.strip() == "5" and e.source == "eval" for e in f.evidence)
    by_seed = {e.env_seed: e.episode_id for e in batches["count_up"]}
    assert [e.episode_id for e in f.evidence] == [by_seed[s] for s in sorted(eights)]
    won = SEEDS - len(eights)
    assert (f"held-out success fell from 1.00 at step 2 to {won / SEEDS:.2f} at step 8: {len(eights)} of {SEEDS} "
            "games won at step 2 are lost at step 8") in f.message
    assert "all of them play 4, 5, 6, 7" in f.message
    assert "--from RUN/checkpoints/step_000002" in f.advice and "training.learning_rate" in f.advice
    assert f.remedy == {}  # no single setting is known to fix it
    assert "held-out episode" in f.line() and "[[5]]" in f.line()


def test_quiet_when_nothing_was_lost(batches):
    same = regression(batches, ["expert", "expert"])
    assert not same.fired and same.value == 0.0
    better = regression(batches, ["count_up", "expert"])  # gained the secret-8 games, lost none
    assert not better.fired and better.value == 0.0


def test_silent_after_an_untrained_model_that_won_nothing(batches):
    assert regression(batches, ["untrained", "expert"]) is None
    assert regression(batches, ["untrained", "count_up"]) is None


def test_compares_with_the_best_earlier_evaluation_not_the_previous(batches):
    f = regression(batches, ["untrained", "expert", "count_up", "count_up"])
    assert f.fired and "at step 1 to" in f.message and f.step == 3  # the previous one (step 2) lost as much


def test_the_threshold_is_the_one_in_the_config(batches):
    share = len(secret_8_seeds(batches["expert"])) / SEEDS
    above = regression(batches, ["expert", "count_up"], heldout_regression_share=min(1.0, share + 0.01))
    assert not above.fired and above.threshold == pytest.approx(min(1.0, share + 0.01))
    assert regression(batches, ["expert", "count_up"], heldout_regression_share=share).fired
    config = ConfigStore()
    config.doctor.heldout_regression_share = 1.5
    with pytest.raises(ConfigError, match="doctor.heldout_regression_share"):
        config.validate()


def test_held_out_only(batches):
    h = History()  # training steps: the check does not judge them
    for step, name in enumerate(["expert", "count_up"]):
        h.add(batches[name], step)
    assert not h.records and run_checks(h, DoctorConfig(), ["heldout-regression"]) == []
    doctor = StepDoctor(write=lambda line: None)
    metrics = doctor.observe(batches["expert"], 0, [])
    assert "diagnose/heldout-regression" not in metrics and "heldout-regression" in CHECKS
    assert len(STEP_CHECKS) == len(CHECKS) - 1


def test_diagnose_parts_reports_it_first_among_held_out_findings(batches):
    evals = [(0, batches["untrained"]), (2, batches["expert"]), (8, batches["count_up"])]
    findings = diagnose_parts(None, evals, DoctorConfig())
    assert findings and findings[0].name == "heldout-regression" and findings[0].source == "eval"
    assert findings[0].step == 8 and "at step 2 to" in findings[0].message
    assert diagnose_parts(None, evals[:2], DoctorConfig()) == []  # untrained -> expert: nothing to say
