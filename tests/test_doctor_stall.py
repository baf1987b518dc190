"""The doctor sees a stall that wins its training batches (issue 44): a deterministic policy
whose groups are all won alike is spared as "solved" only when it wins the held-out games
too. Count-up guessing (what 1 SFT step teaches the embedded model: "4", then one up after
"too low") wins every secret of 1..8 but 8 in 4 guesses; its training batches here hold no 8
(as the stalled run's 2-secret batches rarely did), the held-out seeds 10000.. hold eight.

Batches come from a real `Rollout` on guess_number with replies emitted through the tiny
model's tokenizer (tests/doctor_policies.py); the experts' runs stay quiet."""
from __future__ import annotations

import pytest

from envs import EXPERTS
from tests.doctor_policies import count_up_bare, expert, roll, roll_steps
from workbench.config import ConfigStore
from workbench.debug.doctor import RunPlace, diagnose_parts, remedy_command
from workbench.doctor.checks import run_checks, solved
from workbench.doctor.findings import DoctorConfig, History, RunFacts
from workbench.doctor.held_out import gap_remedy

GUESS = {"low": 1, "high": 8, "max_steps": 4, "max_turns": 4, "strict_format": True}
#: Training seeds whose 4 secrets hold no 8 (7 3 1 4, 1 2 7 2, 6 7 7 1): batches count-up wins.
TRAIN_SEEDS = (0, 200, 300)
#: As the CLI evaluates: one greedy game per seed from 10000; 8 of these 32 secrets are 8.
HELD_OUT = {"groups": 32, "group_size": 1, "first_seed": 10_000}


@pytest.fixture(scope="module")
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


@pytest.fixture(scope="module")
def stalled(tok):
    train = [roll(tok, "guess_number", count_up_bare, groups=4, group_size=4, first_seed=s, **GUESS)
             for s in TRAIN_SEEDS]
    held = roll(tok, "guess_number", count_up_bare, **HELD_OUT, **GUESS)
    return train, held


def history(batches, held=None, held_step=None) -> History:
    h = History(held_out=held, held_out_step=held_step)
    for step, batch in enumerate(batches):
        h.add(batch, step)
    return h


def zero_variance(h: History, **cfg):
    return run_checks(h, DoctorConfig(**cfg), ["zero-variance-groups"])[0]


def test_the_scripted_stall_is_what_the_run_showed(stalled):
    train, held = stalled
    assert all(ep.success for b in train for ep in b)  # wins every training game...
    lost = [ep for ep in held if not ep.success]
    assert len(lost) == 8 and len(held) == 32  # ...and loses the held-out secret 8s
    assert all([t.action for t in ep.turns] == ["4", "5", "6", "7"] for ep in lost)
    assert all("The number was 8." in ep.turns[-1].observation for ep in lost)


def test_winning_the_batches_alone_is_still_solved_without_held_out_games(stalled):
    train, _ = stalled
    f = zero_variance(history(train))
    assert f.value == 1.0 and not f.fired  # every group flat, but nothing says the task is not solved


def test_a_stall_that_loses_held_out_games_is_named_with_them(stalled):
    train, held = stalled
    f = zero_variance(history(train, held, 3))
    assert f.fired and f.value == 1.0
    assert "wins 100% of its training batch at step 2 but only 75% of the 32 held-out games at step 3" in f.message
    ev = f.evidence[0]
    assert ev.source == "eval" and ev.step == 3 and ev.turn is None
    assert ev.text.startswith("played 4, 5, 6, 7; lost (...") and ev.text.endswith("The number was 8.)")
    assert "The number was 8." in ev.quote()  # the printed line shows which secret it loses
    assert {e.seed for e in f.evidence if e.source == "eval"} <= {ep.env_seed for ep in held if not ep.success}
    # the remedy adds more groups per step: half the batch's group size of 4, at the same batch size
    assert "larger entropy bonus" in f.advice and "smaller training.group_size" in f.advice
    assert f.remedy == {"training.dynamic_sampling": True, "training.group_size": 2}
    # the threshold is the one read: a held-out rate of 0.75 counts as solved at 0.7
    assert not zero_variance(history(train, held, 3), solved_success_rate=0.7).fired


def test_diagnose_hands_the_latest_held_out_batch_to_the_training_checks(stalled, tok):
    train, held = stalled
    before = roll(tok, "guess_number", expert("guess_number"), **HELD_OUT, **GUESS)
    found = {f.name: f for f in diagnose_parts(history(train), [(0, before), (3, held)])}
    f = found["zero-variance-groups"]
    assert f.source == "train" and f.evidence[0].source == "eval" and f.evidence[0].step == 3
    # the held-out games lost after the expert-like start: the regression is named as well
    assert found["heldout-regression"].value == pytest.approx(8 / 32)
    # the latest evaluation decides: the same batches judged against the expert's games are solved
    assert "zero-variance-groups" not in {f.name for f in diagnose_parts(history(train), [(0, held), (3, before)])}


def test_the_solved_verdict_in_words(stalled):
    train, held = stalled
    h = history(train, held, 3)
    v = solved(h, DoctorConfig(), 1.0)
    assert (v.solved, v.gap, len(v.evidence)) == (False, True, 8)
    assert solved(h, DoctorConfig(), 0.5).solved is False and solved(h, DoctorConfig(), 0.5).gap is False
    assert solved(h, DoctorConfig(), None).solved is False
    # fewer held-out games than doctor.min_samples are no evidence either way
    small = history(train, held[:3], 3)
    assert solved(small, DoctorConfig(), 1.0).solved is True


@pytest.mark.parametrize("name", sorted(EXPERTS))
def test_experts_judged_with_their_held_out_games_stay_quiet(name, tok):
    settings = {"arithmetic": {"own_parsing": True, "max_tokens": 96}, "grid": {"max_turns": 12},
                "text_game": {"max_turns": 8}, "wordle": {"max_turns": 8}}.get(name, {})
    batches = roll_steps(tok, name, [expert(name)] * 4, **settings)
    train, held = batches[:3], batches[3]
    assert all(ep.success for ep in held)
    assert diagnose_parts(history(train), [(0, batches[0]), (3, held)]) == []


def test_the_gap_remedy_halves_the_runs_group_size_and_spares_groups_of_two(stalled):
    train, held = stalled
    h = history(train, held, 3)
    h.run = RunFacts(adv_estimator="grpo", group_relative=True, group_size=8)
    assert gap_remedy(h) == {"training.group_size": 4}  # the run's setting, not the batch's groups
    h.run = RunFacts(adv_estimator="grpo", group_relative=True, group_size=2)
    assert gap_remedy(h) == {}  # groups of 1 would give a group-relative estimator nothing
    h.run = RunFacts(adv_estimator="gae", group_relative=False, group_size=8)
    assert gap_remedy(h) == {}  # PPO with a critic has no groups to shrink
    # a stall that is not a gap (no held-out games) keeps the plain remedy
    f = zero_variance(history(train))
    assert "training.group_size" not in f.remedy


def test_the_gap_remedy_branches_from_before_the_entropy_fell(stalled, tmp_path):
    """The printed command starts the branch at the checkpoint before the first RL update (after
    a 1-step SFT warm-up: step 1; a policy that still explores), not at the newest one before
    the finding's step."""
    train, held = stalled
    h = History(held_out=held, held_out_step=4)
    for step, batch in enumerate(train, start=1):  # RL steps 1..3 after SFT step 0
        h.add(batch, step)
    f = zero_variance(h)
    assert f.fired and f.step == 3 and f.branch_step == 1
    config = ConfigStore()
    config.sft.steps = 1
    ckpts = [tmp_path / "run" / "checkpoints" / f"step_{s:06d}" for s in (1, 3)]
    place = RunPlace(tmp_path / "run", config, ckpts)
    command = remedy_command(f, place)
    assert f"--from {ckpts[0].resolve()} " in command and "--training.group_size 2" in command
    f.branch_step = None  # a finding without it branches from the newest kept checkpoint at or before its step
    assert f"--from {ckpts[1].resolve()} " in remedy_command(f, place)
    # no checkpoint at or before the first RL step: a fresh run of the config with the remedy
    f.branch_step = 1
    assert remedy_command(f, RunPlace(tmp_path / "run", config, ckpts[1:])).startswith(
        f"python -m workbench train --config {(tmp_path / 'run' / 'config.yaml').resolve()}")
    # without the gap there is no earlier start: the finding is not fired, nothing to branch for
    assert zero_variance(history(train)).branch_step is None
