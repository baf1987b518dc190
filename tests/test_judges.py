"""LLM judges as reward sources, with real parts: the workbench's gateway over a real model on
127.0.0.1 as the judge server, an engine in this process, and a scripted judge server
(tests/judge_server.py: a real HTTP server whose answers a test chooses) for the failures a
judge has: a timeout, a reply with no score, a score of 7 on a 0..1 scale, a server that dies
mid-step. Each failure is counted and named, never a reward of 0."""
from __future__ import annotations

import copy
import json
import re

import pytest

from envs import make_env
from tests.judge_server import JudgeServer
from workbench.engines.hf import HFEngine
from workbench.gateway.server import Gateway
from workbench.reward import (
    FunctionBackend, GroupJudge, Judge, ModelRewards, model_reward_summary, score_batch,
)
from workbench.rollout import Rollout


@pytest.fixture(scope="module")
def episodes(tiny_engine):
    """A real batch: 3 guess_number groups of 2 (the same seed per group), 2 turns each."""
    envs = [make_env("guess_number") for _ in range(6)]
    return Rollout(tiny_engine, envs, seeds=[1, 1, 2, 2, 3, 3], group_ids=["g1", "g1", "g2", "g2", "g3", "g3"],
                   max_turns=2, max_tokens=8, seed=0).run()


@pytest.fixture(scope="module")
def gateway(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    with Gateway(HFEngine(model, tok), model_name="tiny-judge", max_context_tokens=4096) as gw:
        yield gw


def test_a_judge_by_url_scores_every_episode_and_records_its_exact_prompt(episodes, gateway):
    judge = Judge(gateway.base_url, json=True, max_tokens=128, headers={"X-Episode-Id": "judge-a"})
    judgments = judge.judge(episodes.episodes)
    assert len(judgments) == len(episodes)
    for ep, j in zip(episodes, judgments):
        assert j.error is None and 0.0 <= j.score <= 1.0 and j.raw_score == j.score
        assert j.model == "tiny-judge"  # the server's own name (GET /v1/models)
        assert json.loads(j.prompt) == judge.messages(ep)
        assert j.prompt_tokens > 0 and j.completion_tokens > 0
    calls = gateway.calls("judge-a")  # what the server was sent, recorded by the server
    assert len(calls) == len(episodes)
    assert sorted(json.dumps(c.messages) for c in calls) == sorted(json.dumps(judge.messages(ep)) for ep in episodes)
    # The same episodes again: answered from the cache, nothing sent.
    again = judge.judge(episodes.episodes)
    assert all(j.cached for j in again) and [j.score for j in again] == [j.score for j in judgments]
    assert len(gateway.calls("judge-a")) == len(episodes)
    # Without the cache: sent again, and a greedy judge says the same.
    fresh = judge.judge(episodes.episodes, use_cache=False)
    assert not any(j.cached for j in fresh) and [j.score for j in fresh] == [j.score for j in judgments]


def test_the_group_judge_sends_the_common_opening_once(episodes, gateway):
    judge = GroupJudge(gateway.base_url, json=True, max_tokens=96, headers={"X-Episode-Id": "judge-g"})
    judgments = judge.judge(episodes.episodes)
    assert all(j.error is None and 0 <= j.score <= 1 for j in judgments)
    calls = gateway.calls("judge-g")
    assert len(calls) == 3  # one request per group
    group = [ep for ep in episodes if ep.group_id == "g2"]
    opening = group[0].messages[1]["content"]  # the environment's first observation, the same in both
    assert group[1].messages[1]["content"] == opening
    sent = next(c for c in calls if c.messages == judge.messages(group)).messages
    text = sent[1]["content"]
    assert text.count(opening) == 1  # the common prefix, once
    assert text.count("=== Trajectory") == 2
    for ep in group:  # each trajectory's own turns are there
        for m in ep.messages[2:]:
            assert m["content"].strip() in text
    # tokens counted once per request: on the group's first episode
    firsts = [j for j, ep in zip(judgments, episodes) if ep is group[0]]
    seconds = [j for j, ep in zip(judgments, episodes) if ep is group[1]]
    assert firsts[0].prompt_tokens > 0 and seconds[0].prompt_tokens == 0
    assert {j.position for j in judgments} == {1, 2}


def _order_blind_judge(messages):
    """A deterministic judge that reads each trajectory on its own: 1 - turns/4 for each, so its
    verdict cannot depend on where a trajectory sits in the prompt."""
    text = messages[1]["content"]
    parts = re.split(r"=== Trajectory (\d+) ===\n", text)[1:]
    lines = []
    for k, body in zip(parts[::2], parts[1::2]):
        turns = body.count("[assistant]")
        lines.append(f"{k}: {1 - turns / 4:g} - {turns} replies")
    return "\n".join(lines)


def test_shuffling_a_group_changes_no_score_for_an_order_blind_judge(episodes):
    ragged = copy.deepcopy(list(episodes))
    ragged[0].messages = ragged[0].messages[:3]  # trajectories of different lengths, so scores differ
    judge = GroupJudge(FunctionBackend(_order_blind_judge))
    groups = [[ep for ep in ragged if ep.group_id == g] for g in ("g1", "g2", "g3")]
    base = judge.judge_groups(groups, order_seed=None)
    positions = set()
    for seed in (1, 2, 3, 4):
        shuffled = judge.judge_groups(groups, order_seed=seed)
        assert [[j.score for j in g] for g in shuffled] == [[j.score for j in g] for g in base]
        positions |= {tuple(j.position for j in g) for g in shuffled}
    assert (2, 1) in positions  # some group was shown the other way round
    assert base[0][0].score == pytest.approx(1 - 1 / 4) and base[0][1].score == pytest.approx(1 - 2 / 4)


def test_a_judge_in_this_process_judges_the_batch_in_one_engine_call(episodes, tiny_engine):
    calls = []
    real = tiny_engine.generate_ids

    def counting(prompts, params):
        calls.append(len(prompts))
        return real(prompts, params)

    tiny_engine.generate_ids = counting
    try:
        judgments = Judge(tiny_engine, json=True, max_tokens=128).judge(episodes.episodes)
    finally:
        del tiny_engine.generate_ids
    assert calls == [len(episodes)]
    assert all(j.error is None and 0 <= j.score <= 1 and j.prompt_tokens > 0 for j in judgments)


# -- failures: counted and named --------------------------------------------------------------
def test_timeout_no_score_and_a_score_off_the_scale_each_fail_their_judgment(episodes):
    with JudgeServer(lambda b: "SCORE: 0.5", delay=lambda b: 1.0) as slow:
        out = Judge(slow.url, timeout=0.3, retries=0).judge(episodes.episodes[:2])
    assert all(j.score is None and "no answer within reward.judge_timeout_s=0.3" in j.error for j in out)
    with JudgeServer(lambda b: "The assistant tried its best.") as vague:
        out = Judge(vague.url).judge(episodes.episodes[:2])
    assert all(j.score is None and "has no score" in j.error for j in out)
    with JudgeServer(lambda b: "Excellent.\nSCORE: 7") as generous:
        out = Judge(generous.url).judge(episodes.episodes[:2])
    assert all(j.score is None and j.raw_score == 7 and "outside its scale from 0 to 1" in j.error for j in out)
    with JudgeServer(lambda b: "Good.\nSCORE: 7") as ten:
        out = Judge(ten.url, scale=(0, 10)).judge(episodes.episodes[:1])
    assert out[0].score == pytest.approx(0.7) and out[0].raw_score == 7


def test_a_judge_server_that_dies_mid_step_fails_only_the_judgments_it_did_not_answer(episodes):
    with JudgeServer(lambda b: "fine\nSCORE: 1", die_after=2) as dying:
        out = Judge(dying.url, concurrency=1, retries=1, timeout=5).judge(episodes.episodes)
    assert [j.score for j in out[:2]] == [1.0, 1.0]
    assert all(j.score is None and "tried 2 times" in j.error for j in out[2:])


def _config(tiny_model_path, tmp_path, **reward):
    from workbench import ConfigStore

    c = ConfigStore()
    c.model.model_name = str(tiny_model_path)
    c.model.lora_rank = 4
    c.inference.max_tokens = 6
    c.inference.max_turns = 2
    c.training.batch_size = 4
    c.training.group_size = 2
    c.training.micro_batch_size = 2
    c.training.progress = False
    c.checkpoint.output_dir = str(tmp_path / "run")
    c.checkpoint.save_interval = 0
    c.update("reward", reward)
    return c.validate()


def test_a_training_step_leaves_out_the_episodes_its_judge_could_not_score(tiny_model_path, tmp_path):
    from workbench import Trainer

    answers = iter(["good\nSCORE: 0.9", "SCORE: 7", "no verdict", "bad\nSCORE: 0.1"])
    with JudgeServer(lambda b: next(answers)) as server:
        c = _config(tiny_model_path, tmp_path, judge=server.url, judge_concurrency=1, env_weight=0.0)
        trainer = Trainer(c, environment=make_env("guess_number"))
        try:
            metrics = trainer.train_step()
            batch = trainer.last_batch
        finally:
            trainer.close()
    assert metrics["reward/judge_failed"] == 2.0
    failed = [i for i, ep in enumerate(batch) if ep.reward_error]
    assert len(failed) == 2 and set(failed) <= set(batch.untrained_rows())
    for i in failed:
        assert batch[i].score is None
        assert float(batch.token_level_scores[i].abs().sum()) == 0.0
        assert float(batch.advantages[i].abs().sum()) == 0.0
    kept = [ep for ep in batch if not ep.reward_error]
    assert sorted(ep.score for ep in kept) == pytest.approx([0.1, 0.9])  # env_weight 0: the judge's score alone
    assert metrics["reward/judge_score_mean"] == pytest.approx(0.5)
    assert metrics["reward/mean"] == pytest.approx(0.5)  # over the scored episodes only
    from workbench.training.update import failed_episodes_line

    assert "2 of 4 episodes could not be scored by their judge and are left out of the update" in \
        failed_episodes_line(batch)
    errors = " ".join(batch[i].reward_error for i in failed)
    assert "outside its scale" in errors and "has no score" in errors


def test_scores_combine_by_weight_and_sit_on_the_last_policy_token(episodes):
    judge = Judge(FunctionBackend(lambda m: "ok\nSCORE: 0.25"), weight=2.0)
    batch = copy.deepcopy(episodes)
    score_batch(batch, model_rewards=ModelRewards(judge=judge, env_weight=0.5))
    for b, ep in enumerate(batch):
        assert ep.env_score == pytest.approx(ep.total_reward)
        assert ep.score == pytest.approx(0.5 * ep.total_reward + 2.0 * 0.25)
        assert sum(batch.token_values(b, "token_level_scores")) == pytest.approx(ep.score, abs=1e-5)
        last = max(i for i, m in enumerate(ep.loss_mask) if m)
        assert batch.token_values(b, "token_level_scores")[last] == pytest.approx(
            0.5 * ep.turns[-1].reward + 0.5, abs=1e-5)
        (j,) = ep.judgments
        assert j["source"] == "judge" and j["score"] == 0.25 and j["weight"] == 2.0 and j["reason"] == "ok"
    summary = model_reward_summary(batch)
    assert summary["reward/judge_failed"] == 0 and summary["reward/judge/score_mean"] == pytest.approx(0.25)
    assert summary["reward/model_score_mean"] == pytest.approx(0.5)
    # Scoring again without a model reward clears what the judges said.
    score_batch(batch)
    assert all(ep.judgments == [] and ep.env_score is None and ep.score == ep.total_reward for ep in batch)


def test_judge_settings_are_checked_with_one_line_errors():
    from workbench import ConfigStore
    from workbench.config import ConfigError

    for field, value, words in [("judge", "nowhere", "is not a server URL"), ("judge_scale_max", -1.0, "below"),
                                ("judge_timeout_s", 0.0, "seconds > 0"), ("reward_model_kind", "x", "one of"),
                                ("group_judge", "hf:", "names no model"), ("judge_dtype", "int8", "one of")]:
        c = ConfigStore()
        setattr(c.reward, field, value)
        with pytest.raises(ConfigError, match=words) as exc:
            c.validate()
        assert "\n" not in str(exc.value)


def test_export_to_verl_refuses_a_judge_it_cannot_carry(tmp_path):
    from workbench import ConfigStore
    from workbench.compat.verl_export import export_verl
    from workbench.config import ConfigError

    c = ConfigStore()
    c.reward.judge = "http://127.0.0.1:8000/v1"
    with pytest.raises(ConfigError, match=r"reward.judge cannot be exported: the folder's reward function"):
        export_verl(c.validate(), tmp_path / "out")
    assert not (tmp_path / "out").exists()
