"""The judge audit on batches with a verifiable signal (real guess_number games played by scripted
policies, tests/doctor_policies.py), with judges written as functions whose flaws are known: an
honest one passes; a constant one is at chance; one that pays for length, one that prefers the
first trajectory of a group, and one that answers at random are each caught by their measure.
Then the command line on a real run folder, what the views show of a judged episode, and the
reward tuner's re-judge with an edited rubric."""
from __future__ import annotations

import copy
import json
import random
import re

import pytest

from tests.doctor_policies import count_up_bare, roll
from workbench.doctor.findings import DoctorConfig
from workbench.reward import FunctionBackend, GroupJudge, Judge, ModelRewards, audit_judge, score_batch

GUESS = {"low": 1, "high": 8, "max_steps": 4, "max_turns": 4}


def wordy(env, episode):
    """count_up_bare's moves, some wrapped in words (so reply lengths differ within an outcome)."""
    move = count_up_bare(env, episode)
    return move if (env.secret + episode.num_turns) % 2 else f"My guess this time is {move}"


def honest_judge(messages):
    text = messages[-1]["content"]
    return "Found it.\nSCORE: 0.9" if "Correct" in text else "Missed.\nSCORE: 0.1"


def length_judge(messages):
    assistant = re.findall(r"\[assistant\]\n(.*)", messages[-1]["content"])
    mean = sum(len(a) for a in assistant) / max(len(assistant), 1)
    return f"Long is good.\nSCORE: {min(1.0, mean / 25):.3f}"


def first_is_best(messages):
    n = messages[-1]["content"].count("=== Trajectory")
    return "\n".join(f"{k}: {0.9 if k == 1 else 0.2} - position {k}" for k in range(1, n + 1))


def coin_judge(messages):
    return f"SCORE: {random.random():.3f}"


@pytest.fixture(scope="module")
def games(tiny_model_and_tokenizer):
    batch = roll(tiny_model_and_tokenizer[1], "guess_number", wordy, groups=16, group_size=2, first_seed=0,
                 max_tokens=16, **GUESS)
    outcomes = [ep.success for ep in batch]
    assert 0 < sum(outcomes) < len(outcomes)  # a verifiable signal: successes and failures both
    return batch


def test_an_honest_judge_is_fit_to_train_on(games):
    audit = audit_judge(games, Judge(FunctionBackend(honest_judge)))
    assert (audit.accuracy, audit.roc_auc, audit.self_consistency) == (1.0, 1.0, 1.0)
    assert audit.rank_correlation > 0.5 and audit.failed_share == 0.0
    assert audit.fit, audit.text()
    assert audit.text().endswith("verdict: fit to train on (every measured number meets its doctor.judge_* threshold)")
    assert "position bias not measured: a per-episode judge sees one episode at a time" in audit.notes
    assert len(audit.rows) == len(games) and audit.with_outcome == len(games)


def test_a_constant_judge_is_at_chance_and_unfit(games):
    audit = audit_judge(games, Judge(FunctionBackend(lambda m: "Looks fine.\nSCORE: 0.8")))
    assert audit.roc_auc == 0.5 and not audit.fit
    assert any("roc_auc 0.50 < doctor.judge_min_auc 0.7" in m for m in audit.missed)
    assert any("gave every episode the same score" in n for n in audit.notes)


def test_length_bias_is_measured_within_an_outcome(games):
    audit = audit_judge(games, Judge(FunctionBackend(length_judge)))
    assert audit.length_correlation > 0.8
    assert any(m.startswith("length_correlation") for m in audit.missed)
    honest = audit_judge(games, Judge(FunctionBackend(honest_judge)))
    assert not any(m.startswith("length_correlation") for m in honest.missed)  # constant within each outcome


def test_position_bias_of_a_group_judge(games):
    biased = audit_judge(games, GroupJudge(FunctionBackend(first_is_best)))
    assert biased.position_consistency < 0.7 and any(m.startswith("position_consistency") for m in biased.missed)

    def blind(messages):  # scores each trajectory by its own words: the order cannot matter
        parts = re.split(r"=== Trajectory (\d+) ===\n", messages[-1]["content"])[1:]
        return "\n".join(f"{k}: {0.9 if 'Correct' in body else 0.1} - x" for k, body in zip(parts[::2], parts[1::2]))

    fair = audit_judge(games, GroupJudge(FunctionBackend(blind)))
    assert fair.position_consistency == 1.0 and fair.roc_auc == 1.0 and fair.fit, fair.text()


def test_a_judge_that_answers_at_random_is_inconsistent(games):
    random.seed(0)
    audit = audit_judge(games, Judge(FunctionBackend(coin_judge)))
    assert abs(audit.self_consistency) < 0.5
    assert any(m.startswith("self_consistency") for m in audit.missed)
    strict = DoctorConfig(judge_min_self_consistency=0.0, judge_min_auc=0.0, judge_min_accuracy=0.0,
                          judge_min_rank_correlation=-1.0, judge_max_length_correlation=1.0)
    assert audit_judge(games, Judge(FunctionBackend(coin_judge)), strict).fit  # thresholds are settings


# -- recorded in the run folder, audited from the command line --------------------------------
def judge_fn(messages):
    """A module:function judge for the CLI (see `reward.judge`)."""
    return "It replied.\nSCORE: 0.5"


@pytest.fixture(scope="module")
def judged_run(tiny_model_path, tmp_path_factory):
    from envs import make_env
    from workbench import ConfigStore, Trainer

    out = tmp_path_factory.mktemp("judged") / "run"
    c = ConfigStore()
    c.model.model_name, c.model.lora_rank = str(tiny_model_path), 4
    c.inference.max_tokens, c.inference.max_turns = 6, 2
    c.training.batch_size, c.training.group_size, c.training.micro_batch_size = 4, 2, 2
    c.training.progress, c.training.log_dir = False, str(out)
    c.checkpoint.output_dir, c.checkpoint.save_interval = str(out / "checkpoints"), 0
    c.reward.judge = "tests.test_judge_audit:judge_fn"
    trainer = Trainer(c.validate(), environment=make_env("guess_number"))
    try:
        trainer.fit(steps=1)
    finally:
        trainer.close()
    return out


def test_every_judgment_is_kept_in_the_run_folder(judged_run):
    from workbench import load_run

    run = load_run(judged_run)
    batch = run.batch()
    for ep in batch:
        (j,) = ep.judgments
        assert j["model"] == "tests.test_judge_audit:judge_fn" and j["score"] == 0.5 and j["reason"] == "It replied."
        assert json.loads(j["prompt"])[1]["content"].startswith("The conversation:")
        assert ep.env_score == ep.total_reward and ep.score == pytest.approx(ep.total_reward + 0.5)
    last = run.metrics.iloc[-1]
    assert last["reward/judge_failed"] == 0 and last["reward/judge_score_mean"] == 0.5


def test_audit_judge_command(judged_run, capsys, tmp_path):
    from workbench.cli import main

    out = tmp_path / "audit.json"
    rc = main(["audit-judge", str(judged_run), "--judge", "tests.test_judge_audit:judge_fn", "--out", str(out)])
    printed = capsys.readouterr().out
    assert rc == 1 and "verdict: NOT fit to train on" in printed  # the tiny model wins no game: nothing to agree on
    assert "all successes or all failures" in printed
    assert json.loads(out.read_text())["model"] == "tests.test_judge_audit:judge_fn"
    assert main(["audit-judge", str(judged_run), "--judge", "http://127.0.0.1:9/v1", "--reward.judge_retries",
                 "0"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error: every judgment of http://127.0.0.1:9/v1 failed") and err.count("\n") == 1
    assert main(["audit-judge", str(tmp_path / "nowhere"), "--judge", "tests.test_judge_audit:judge_fn"]) == 2
    assert main(["audit-judge", str(judged_run), "--judge", "not a judge"]) == 2
    assert capsys.readouterr().err.count("\n") == 2  # one line each


# -- the views ---------------------------------------------------------------------------------
def test_a_judged_episode_shows_its_judgment_beside_its_env_reward(games):
    from workbench.widgets import JudgeAuditView, render_episode_html

    batch = copy.deepcopy(games)
    score_batch(batch, model_rewards=ModelRewards(judge=Judge(FunctionBackend(honest_judge))))
    html = render_episode_html(batch[0])
    assert "env reward" in html and ("judge 0.9<" in html or "judge 0.1<" in html)
    assert "what the judges said" in html and "the exact judge prompt" in html
    assert ("Found it." in html) or ("Missed." in html)
    view = JudgeAuditView(batch, Judge(FunctionBackend(honest_judge)))
    assert view.audit.fit and "fit to train on" in view.html and "ROC AUC 1.00" in view.html


def test_the_reward_tuner_rejudges_with_an_edited_rubric_and_lists_rank_changes(games):
    from workbench import ConfigStore
    from workbench.widgets import RewardTuner

    def rubric_judge(messages):  # reads its rubric: "long" pays for words, else for success
        if "long" in messages[0]["content"]:
            return length_judge(messages)
        return honest_judge(messages)

    judge = Judge(FunctionBackend(rubric_judge), rubric="1 if the assistant found the number")
    batch = copy.deepcopy(games)
    config = ConfigStore()
    config.reward.env_weight = 0.0
    score_batch(batch, reward=config.reward, model_rewards=ModelRewards(judge=judge, env_weight=0.0))
    tuner = RewardTuner(batch, config=config, judge=judge)
    assert tuner.table["judge"].tolist() == [ep.judgments[0]["score"] for ep in batch]
    assert tuner.table["score_after"].tolist() == pytest.approx(tuner.table["score_before"].tolist())
    table = tuner.rejudge("1 for long, wordy replies")
    assert (table["rank_change"] != 0).any()
    assert table["judge_before"].tolist() == [ep.judgments[0]["score"] for ep in batch]
    assert "changed rank" in tuner._rejudged.value


def test_an_audit_whose_every_judgment_failed_says_so(games):
    audit = audit_judge(games, Judge(FunctionBackend(lambda m: "no verdict here")), repeat=False)
    assert audit.failed_share == 1.0 and not audit.fit
    assert any(n.startswith("nothing measured: every judgment failed; first: the judge's reply has no score")
               for n in audit.notes)
