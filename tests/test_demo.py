"""`make demo` (workbench.cli.demo) on the tiny model, WORKBENCH_SMOKE counts, and the CLI rule
that an environment's prompt states the budget the rollout really allows."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from workbench.cli import build_config, main, parse_args
from workbench.cli.demo import (GUESS_TURNS, PAST_SFT, RL_LEARNING_RATE, RL_LEARNING_RATE_AFTER_SFT, SFT_LEARNING_RATE, counts,
                                demo_config, guessing_summary, learned_line, part_two, showcase_index, side_by_side)
from workbench.trajectory import Episode, TrajectoryBatch, Turn


@pytest.fixture()
def smoke(monkeypatch):
    monkeypatch.setenv("WORKBENCH_SMOKE", "1")


def test_demo_runs_end_to_end_on_the_tiny_model(tmp_path, tiny_model_path, smoke, capsys):
    assert main(["demo", "--model", str(tiny_model_path), "--output", str(tmp_path), "--device", "cpu"]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.strip()]
    assert lines[-1].startswith("Next: `make lab` opens notebooks/01_quickstart.ipynb")
    assert lines[-2].startswith("GRPO past SFT: `make demo-rl` (`python -m workbench demo --past-sft`)")
    evals = json.loads((tmp_path / "train" / "evals.json").read_text())
    assert [e["step"] for e in evals] == [0, 1, 3]  # before, after the SFT step, after 2 GRPO steps
    summary_line = next(line for line in lines if line.startswith("held-out success:"))
    assert (f"{evals[0]['eval/success_rate']:.2f} before training -> {evals[1]['eval/success_rate']:.2f} "
            f"after 1 SFT step -> {evals[2]['eval/success_rate']:.2f} after 2 GRPO steps") in summary_line
    learned = next(line for line in lines if line.startswith("what it learned:"))
    assert learned.endswith(f"wins {round(evals[2]['eval/success_rate'] * 4)} of 4 unseen games")
    assert any(line.startswith("doctor: ") for line in lines)
    # one doctor verdict at the end (the runner's findings table is not printed again before it)
    assert sum(line.startswith("doctor: no findings") for line in lines) <= 1
    transcript = (tmp_path / "train" / "transcript.md").read_text()
    assert "## Held-out episode, seed 1000" in transcript and "before: model" in transcript
    # the prompt the model saw states the 4 guesses the rollout allows
    assert f"You have {GUESS_TURNS} guesses" in transcript or "Guess my secret number from 1 to 8" in transcript
    assert (tmp_path / "train" / "reward_curve.png").stat().st_size > 1000
    assert (tmp_path / "rollout" / "summary.md").exists()
    # a second demo in the same folder trains again (no resume from the first one's checkpoint)
    assert main(["demo", "--model", str(tiny_model_path), "--output", str(tmp_path), "--device", "cpu"]) == 0
    assert [e["step"] for e in json.loads((tmp_path / "train" / "evals.json").read_text())] == [0, 1, 3]


@pytest.mark.parametrize("flag,value", [("--device", "cpu"), ("--dtype", "float16")])
def test_demo_config_takes_device_and_dtype(flag, value, tmp_path):
    args = parse_args(["demo", "--output", str(tmp_path), flag, value])
    cfg = demo_config(args, tmp_path)
    field = "device" if flag == "--device" else "dtype"
    assert getattr(cfg.model, field) == value
    assert cfg.environment.max_steps == cfg.inference.max_turns == GUESS_TURNS
    assert cfg.checkpoint.resume is False
    # the remedies the demo trains with: the strict format and the SFT warm-up on the expert
    assert cfg.environment.strict_format is True and cfg.sft.steps == counts()["sft_steps"] >= 1
    assert cfg.sft.episodes == counts()["sft_episodes"] and cfg.sft.learning_rate == SFT_LEARNING_RATE


def test_demo_takes_config_flags_for_its_training_part(tmp_path):
    args = parse_args(["demo", "--output", str(tmp_path), "--training.max_staleness", "1", "--training.seed", "3",
                       "--training.num_iters_per_epoch", "5", "--sft.steps", "0"])
    cfg = demo_config(args, tmp_path)
    assert (cfg.training.max_staleness, cfg.training.seed, cfg.sft.steps) == (1, 3, 0)
    assert cfg.checkpoint.save_interval == 5  # the one checkpoint lands on the run's last step
    assert "max_staleness 1" in part_two(cfg, 4) and "SFT" not in part_two(cfg, 4)
    given = demo_config(parse_args(["demo", "--checkpoint.save_interval", "2"]), tmp_path)
    assert given.checkpoint.save_interval == 2


def test_the_readme_lenient_demo_command_gives_the_lenient_run(tmp_path):
    # docs/debugging.md: the demo as it trained until 2026-11-25
    cfg = demo_config(parse_args(["demo", "--output", str(tmp_path), "--environment.strict_format", "false",
                                  "--sft.steps", "0", "--training.num_iters_per_epoch", "8"]), tmp_path)
    assert cfg.environment.strict_format is False and cfg.sft.steps == 0
    assert cfg.training.num_epochs * cfg.training.num_iters_per_epoch == 8 == cfg.checkpoint.save_interval
    readme = (Path(__file__).resolve().parents[1] / "docs" / "debugging.md").read_text()
    assert ("python -m workbench demo --output /tmp/demo1 --environment.strict_format false --sft.steps 0 "
            "--training.num_iters_per_epoch 8") in readme


def test_demo_config_without_remedies_is_plain_grpo(tmp_path):
    args = parse_args(["demo", "--output", str(tmp_path)])
    with_remedies, plain = demo_config(args, tmp_path), demo_config(args, tmp_path, remedies=False)
    assert plain.environment.strict_format is False and plain.sft.steps == 0 and plain.sft.learning_rate is None
    # the GRPO part is the same, at the learning benchmark's rate without the warm-up
    assert plain.training.learning_rate == RL_LEARNING_RATE and with_remedies.training.learning_rate == \
        RL_LEARNING_RATE_AFTER_SFT < RL_LEARNING_RATE
    plain.training.learning_rate = with_remedies.training.learning_rate
    assert plain.training == with_remedies.training
    assert plain.checkpoint.save_interval == counts()["steps"]


def _episode(seed: int, actions: list[str], observations: list[str], success: bool, reward: float) -> Episode:
    turns = [Turn(index=i, action=a, observation=o) for i, (a, o) in enumerate(zip(actions, observations))]
    ep = Episode(env_seed=seed, turns=turns, messages=[{"role": "user", "content": "Guess | now"}])
    ep.success, ep.score = success, reward  # the scored outcome
    return ep


def test_side_by_side_shows_both_episodes_turn_by_turn():
    before = _episode(10003, ["10", "11", "12", "13"], ["10 is out of range"] * 4, False, -0.4)
    after = _episode(10003, ["7", "4"], ["7 is too high. Guess lower.", "Correct! The number was 4."], True, 1.0)
    text = side_by_side(before, after, "1 SFT + 6 GRPO steps")
    rows = text.splitlines()
    assert rows[0] == "## Held-out episode, seed 10003: before and after 1 SFT + 6 GRPO steps"
    assert "Prompt: Guess \\| now" in text  # a | in text cannot break the table
    assert rows[6] == "| 0 | 10 | 10 is out of range | 7 | 7 is too high. Guess lower. |"
    assert rows[7] == "| 1 | 11 | 10 is out of range | 4 | Correct! The number was 4. |"
    assert rows[9] == "| 3 | 13 | 10 is out of range |   |   |"
    assert rows[10] == "| result | success False, return -0.40 | | success True, return +1.00 | |"


def test_guessing_summary_counts_bare_replies_and_guesses_that_follow_the_feedback():
    won = _episode(1, ["4", " 6 ", "5"], ["4 is too low. Guess higher.", "6 is too high. Guess lower.",
                                          "Correct! The number was 5."], True, 1.0)
    # 3 follows "too high" with a higher guess (not followed); the sentence is no bare reply and
    # breaks the chain, so 2 after it is no follow-up
    lost = _episode(2, ["4", "5", "I guess 3", "2"], ["4 is too high. Guess lower.", "5 is too high. Guess lower.",
                                                      "Reply with the number only.", "2 is too low. Guess higher."],
                    False, -0.4)
    counts = guessing_summary(TrajectoryBatch([won, lost]))
    assert counts == {"replies": 7, "bare": 6, "follow_ups": 3, "followed": 2, "won": 1, "games": 2}
    assert learned_line(TrajectoryBatch([won, lost])) == (
        "what it learned: 86% of its replies are a bare number, after \"too low\" it guesses higher and after "
        "\"too high\" lower in 2 of 3 follow-up guesses, and it wins 1 of 2 unseen games")


def test_showcase_prefers_an_episode_won_only_after_training():
    lost = _episode(1, ["1"], ["no"], False, 0.0)
    won = _episode(2, ["2"], ["yes"], True, 1.0)
    before = TrajectoryBatch([lost, lost, won])
    assert showcase_index(before, TrajectoryBatch([lost, won, won])) == 1
    assert showcase_index(before, TrajectoryBatch([lost, lost, lost])) == 2  # return changed
    assert showcase_index(before, before) == 0


def test_cli_quick_runs_give_the_environment_the_turn_budget(tmp_path):
    cfg = build_config(parse_args(["train", "--max-turns", "3", "--output", str(tmp_path)]))
    assert cfg.environment.max_steps == 3
    cfg = build_config(parse_args(["train", "--max-turns", "3", "--env-param", "max_steps=2",
                                   "--env-param", "high=32", "--output", str(tmp_path)]))
    assert cfg.environment.max_steps == 2 and cfg.environment.params == {"high": 32}
    (tmp_path / "run.yaml").write_text("environment:\n  max_steps: 9\n")
    cfg = build_config(parse_args(["train", "--config", str(tmp_path / "run.yaml"), "--max-turns", "3"]))
    assert cfg.environment.max_steps == 9  # a --config file's value stays


def test_past_sft_is_the_demo_with_one_sft_step_and_four_secrets_a_step(tmp_path, monkeypatch):
    """`make demo-rl`: the settings of benchmarks/rl_past_sft.py's `both_g4` variant on top of
    the demo's full counts (not the test suite's cut-down ones); the user's own flags still
    come last."""
    monkeypatch.delenv("WORKBENCH_SMOKE", raising=False)
    cfg = demo_config(parse_args(["demo", "--past-sft", "--output", str(tmp_path)]), tmp_path)
    assert (cfg.sft.steps, cfg.training.group_size, cfg.training.batch_size) == (1, 4, 16)
    assert cfg.training.entropy_coeff == 0.01 and cfg.training.dynamic_sampling is True
    assert cfg.training.num_iters_per_epoch == PAST_SFT["training.num_iters_per_epoch"] == 24
    assert cfg.training.learning_rate == RL_LEARNING_RATE_AFTER_SFT
    assert cfg.checkpoint.save_interval == 25  # the one checkpoint at the end
    assert "1 SFT step on 16 games" in part_two(cfg, 32) and "24 LoRA GRPO steps (16 episodes in groups of 4)" in \
        part_two(cfg, 32)
    mine = demo_config(parse_args(["demo", "--past-sft", "--training.group_size", "2"]), tmp_path)
    assert mine.training.group_size == 2 and mine.sft.steps == 1
    plain = demo_config(parse_args(["demo"]), tmp_path)
    assert (plain.sft.steps, plain.training.group_size) == (2, 8)


def test_the_demo_points_to_past_sft_and_past_sft_does_not(tmp_path, tiny_model_path, smoke, capsys):
    assert main(["demo", "--model", str(tiny_model_path), "--output", str(tmp_path / "a"), "--device", "cpu",
                 "--past-sft"]) == 0
    printed = capsys.readouterr().out
    assert "1 SFT step on 2 games of a scripted expert" in printed and "groups of 4" in printed
    assert "make demo-rl" not in printed
    evals = json.loads((tmp_path / "a" / "train" / "evals.json").read_text())
    assert [e["step"] for e in evals] == [0, 1, 3]  # the test suite's counts keep their 2 GRPO steps
