"""Strict action formats (`environment.strict_format`): only a reply that *is* the action
counts; anything else is a format error the model reads as an observation.

Per built-in parser and per example environment: the bare action is accepted, the same
action inside a sentence is refused with an observation, nothing crashes, and the lenient
mode (the default) still reads the sentence. Then the setting's paths: a real rollout
(scripted replies through the tiny model's tokenizer, `tests/doctor_policies.py`), the
`Trainer` built from a config, and a real `python -m workbench rollout
--environment.strict_format true` subprocess on the tiny model.
"""
from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings

from envs import EXPERTS, make_env
from tests.doctor_policies import count_up_from_4, expert, roll
from tests.test_parser_properties import check_result, hostile
from workbench.config import ConfigError, ConfigStore, EnvironmentConfig
from workbench.doctor.checks import run_checks
from workbench.doctor.findings import DoctorConfig, History
from workbench.environments.base import BaseEnvironment
from workbench.tools import MultiTurnManager
from workbench.tools.parser_base import outside_text
from workbench.tools.parsers import get_parser

REPO = Path(__file__).resolve().parents[1]
CALL = '{"tool": "guess", "arguments": {"n": 4}}'
HERMES = '<tool_call>{"name": "guess", "arguments": {"n": 4}}</tool_call>'

# -- parsers ---------------------------------------------------------------------------------
#: parser -> (replies that are the action, replies with the action inside other text)
PARSER_CASES = {
    "json": ([CALL, f"  {CALL}\n", '{"final_answer": "4"}'],
             [f"I will guess 4: {CALL}", f"{CALL} is my call", f"```json\n{CALL}\n```", f"{CALL} {CALL}",
              "You have 4 guesses left."]),
    "react": (["Action: guess\nAction Input: {\"n\": 4}", "Thought: halve it.\nAction: guess\nAction Input: 4",
               "Final Answer: 4", "  Thought: done\nFinal Answer: 4\n"],
              ["I think so.\nAction: guess\nAction Input: 4", "Action: guess\nAction Input: 4\nObservation: 4 is low",
               "Thought: x\nFinal Answer: 4\nObservation: correct", "You have 4 guesses left."]),
    "function_calling": ([HERMES, f"\n{HERMES}  "],
                         [f"Let me guess. {HERMES}", f"{HERMES} done", HERMES + HERMES]),
}


@pytest.mark.parametrize("name", list(PARSER_CASES))
def test_strict_parser_accepts_the_bare_action_and_refuses_it_inside_text(name):
    bare, wrapped = PARSER_CASES[name]
    strict, lenient = get_parser(name, strict=True), get_parser(name)
    assert strict.strict and not lenient.strict
    for text in bare:
        result = strict.parse(text)
        assert result.ok, (text, result.error)
        assert result.tool_calls or result.final_answer == "4"
        assert result.span is not None and not text[:result.span[0]].strip().startswith(("{", "<"))
    for text in wrapped:
        result = strict.parse(text)
        assert result.error is not None and result.error.startswith("strict format:"), (text, result)
        assert result.tool_calls == [] and result.final_answer is None  # a refused turn runs nothing
    # the lenient parser finds the action in the same replies (what strict mode takes away)
    found = [t for t in wrapped if lenient.parse(t).tool_calls or lenient.parse(t).final_answer == "4"]
    assert len(found) >= len(wrapped) - 1


@settings(max_examples=400, deadline=None, suppress_health_check=list(HealthCheck))
@given(hostile)
def test_strict_parsers_never_raise_and_accept_only_the_action_alone(text):
    for name in PARSER_CASES:
        strict, lenient = get_parser(name, strict=True), get_parser(name)
        result = strict.parse(text)
        check_result(result)
        if not result.ok:
            continue
        plain = lenient.parse(text)  # what strict accepts, lenient reads the same way
        assert plain.ok and [(c.name, c.arguments) for c in plain.tool_calls] == \
            [(c.name, c.arguments) for c in result.tool_calls] and plain.final_answer == result.final_answer
        if name == "json" or (name == "function_calling" and result.tool_calls):
            assert len(result.tool_calls) + (result.final_answer is not None) == 1
            assert outside_text(text, result.span) == ""  # nothing but whitespace around the action
        if name == "react":
            assert result.tool_calls or result.final_answer is not None
            assert not text[result.span[1]:].strip()  # nothing after the action or answer


def test_function_calling_strict_passes_plain_text_to_the_environment():
    # the function-calling format has no answer syntax of its own: a reply without a call is
    # content for the environment (a strict environment then wants its own action alone)
    result = get_parser("hermes", strict=True).parse("Answer: 14")
    assert result.ok and result.tool_calls == [] and result.content == "Answer: 14"


@pytest.mark.parametrize("name", list(PARSER_CASES))
def test_strict_instructions_say_nothing_else(name):
    strict, lenient = get_parser(name, strict=True), get_parser(name)
    text, plain = strict.format_instructions([]), lenient.format_instructions([])
    assert text != plain and re.search(r"nothing else|no other text", text)
    assert not re.search(r"nothing else|no other text", plain)
    assert strict.format_reminder([]) != lenient.format_reminder([])


# -- environments ----------------------------------------------------------------------------
def _state(env):
    """What a refused reply must leave unchanged."""
    return {"guess_number": lambda e: (list(e.guesses), e.lo, e.hi),
            "grid": lambda e: e.agent,
            "wordle": lambda e: list(e.history),
            "arithmetic": lambda e: list(e.calls),
            "text_game": lambda e: (e.room, list(e.inventory), e.door_open)}[env.NAME](env)


#: env -> (reply that is the action, the action inside a sentence, what lenient mode reads from it)
ENV_CASES = {
    "guess_number": ("4", "You have 4 guesses left.", lambda e, info: info["guess"] == 4),
    "grid": (" up\n", "I will go up now.", lambda e, info: info["move"] == "up"),
    "wordle": ("CRANE", "I think the word is CRANE", lambda e, info: info["guess"] == "crane"),
    "arithmetic": ("Answer: 14", "I believe the answer is 14", lambda e, info: "success" in info),
    "text_game": ("take key", "I take the key now.", lambda e, info: info["verb"] == "take"),
}


@pytest.mark.parametrize("name", list(ENV_CASES))
def test_strict_environment_accepts_the_bare_action(name):
    bare, _, read = ENV_CASES[name]
    env = make_env(name, strict_format=True)
    env.reset(seed=0)
    obs, reward, done, info = env.step(bare)
    assert "parse_error" not in info and not info.get("invalid_action"), obs
    assert not obs.startswith("Format error") and read(env, info)
    start, end = info["action_span"]
    assert bare[start:end] == bare.strip()  # the whole reply was the action


@pytest.mark.parametrize("name", list(ENV_CASES))
def test_strict_environment_refuses_the_action_inside_a_sentence(name):
    _, sentence, read = ENV_CASES[name]
    env = make_env(name, strict_format=True)
    env.reset(seed=0)
    before = _state(env)
    obs, reward, done, info = env.step(sentence)
    assert obs.startswith("Format error: ") and re.search(r"\bonly\b|alone|nothing else", obs), obs
    assert info["invalid_action"] is True and info["parse_error"].startswith("strict format: ")
    assert reward == env.params["invalid_reward"] and not done
    assert _state(env) == before  # no guess recorded, no move, no call
    assert env.step_count == 1  # the format error costs the turn
    env.step(EXPERTS[name](env))  # and the episode goes on
    # lenient (the default) reads the action out of the same sentence
    lenient = make_env(name)
    lenient.reset(seed=0)
    obs, reward, done, info = lenient.step(sentence)
    assert "parse_error" not in info and read(lenient, info)


def test_guess_number_format_error_costs_a_turn_not_a_guess():
    env = make_env("guess_number", strict_format=True, max_steps=3)
    env.reset(seed=0)
    env.step("You have 4 guesses left.")
    env.step("8.")
    assert env.guesses == [] and (env.lo, env.hi) == (1, 16)
    obs, reward, done, info = env.step("eight")  # the last of the 3 steps: the episode ends
    assert done and info["truncated"] and "Out of guesses" in obs and info["parse_error"]


def test_arithmetic_strict_takes_one_call_or_the_answer_alone():
    env = make_env("arithmetic", strict_format=True, max_steps=10)
    env.reset(seed=0)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'
    obs, _, _, info = env.step(call)
    assert obs == "calculator(2 + 3) = 5" and "parse_error" not in info
    for bad in (f"Let me compute. {call}", call + call, "14", "The answer is 14.", f"Answer: {env.answer}."):
        obs, reward, done, info = env.step(bad)
        assert info["parse_error"] and obs.startswith("Format error") and not done, bad
    assert len(env.calls) == 1
    obs, reward, done, info = env.step(f"answer: {env.answer}")
    assert done and info["success"]


@pytest.mark.parametrize("name", list(ENV_CASES))
def test_experts_play_strict_environments_without_a_format_error(name):
    for seed in range(3):
        env = make_env(name, strict_format=True)
        env.reset(seed=seed)
        done, infos = False, []
        while not done:
            _, _, done, info = env.step(EXPERTS[name](env))
            infos.append(info)
        assert not any("parse_error" in i for i in infos) and infos[-1].get("success"), (seed, infos)


@pytest.mark.parametrize("name", list(ENV_CASES))
def test_strict_prompt_says_nothing_else(name):
    strict, lenient = make_env(name, strict_format=True), make_env(name)
    assert strict.get_prompt_prefix() != lenient.get_prompt_prefix()
    assert re.search(r"nothing else|only", strict.get_prompt_prefix())


class _NoStrictMode(BaseEnvironment):
    def reset(self):
        return "go"

    def step(self, action):
        return "ok", 0.0, True, {}


def test_an_environment_without_a_strict_mode_refuses_the_setting():
    assert _NoStrictMode({"strict_format": False}).strict_format is False
    with pytest.raises(ConfigError, match=r"environment.strict_format is true but _NoStrictMode has no strict"):
        _NoStrictMode({"strict_format": True})
    with pytest.raises(ConfigError, match=r"environment.strict_format must be true or false, got 'false'"):
        make_env("guess_number", strict_format="false")


def test_config_validates_the_field():
    config = ConfigStore()
    assert config.environment.strict_format is False  # lenient by default: existing runs unchanged
    config.update("environment", {"strict_format": True})
    assert config.validate().environment.strict_format is True
    with pytest.raises(ConfigError, match=r"environment.strict_format must be true or false"):
        ConfigStore().update("environment", {"strict_format": "yes"}).validate()


# -- the turn loop -----------------------------------------------------------------------------
def test_manager_builds_the_environments_parser_strict_and_the_refusal_is_an_observation():
    env = make_env("arithmetic", strict_format=True)
    manager = MultiTurnManager(None, env.action_parser, env)
    assert manager.parser.strict and "no other text" in manager.system_prompt()
    manager.reset(seed=0)
    call = '<tool_call>{"name": "calculator", "arguments": {"expression": "2 + 3"}}</tool_call>'
    turn = manager.step(f"I will use the calculator: {call}")
    assert turn.parse_error.startswith("strict format:") and turn.info["invalid_action"]
    assert turn.tool_calls == [] and not turn.done
    assert turn.messages[-1]["role"] == "user"
    assert turn.messages[-1]["content"].startswith("Your last message could not be parsed: strict format:")
    turn = manager.step(call)
    assert turn.parse_error is None and turn.tool_calls[0].result == "5"
    # the environment's own format error is the turn's parse_error too
    turn = manager.step("I think it is 14")
    assert turn.parse_error.startswith("strict format:") and turn.observation.startswith("Format error")
    assert manager.episode_summary()["parse_errors"] == 2
    lenient = make_env("arithmetic")
    assert not MultiTurnManager(None, lenient.action_parser, lenient).parser.strict


def test_manager_refuses_a_lenient_parser_object_for_a_strict_environment():
    env = make_env("arithmetic", strict_format=True)
    with pytest.raises(ValueError, match=r"strict_format is true but the parser object given"):
        MultiTurnManager(None, get_parser("hermes"), env)
    assert MultiTurnManager(None, get_parser("hermes", strict=True), env).parser.strict


GUESS = {"low": 1, "high": 8, "max_steps": 4, "max_turns": 4}


@pytest.fixture(scope="module")
def tok(tiny_model_and_tokenizer):
    return tiny_model_and_tokenizer[1]


def _findings(batch):
    h = History()
    h.add(batch, 0)
    return {f.name: f for f in run_checks(h, DoctorConfig(), ["parse-from-incidental-span", "format-errors"])}


def test_strict_rollout_gives_the_counting_trick_nothing(tok):
    """The demo's exploit ("You have N guesses left, so") wins lenient episodes; with the
    strict format every such reply is a format error the model reads, and nothing crashes."""
    lenient = roll(tok, "guess_number", count_up_from_4, **GUESS)
    assert sum(e.success for e in lenient) >= 4 and _findings(lenient)["parse-from-incidental-span"].fired
    strict = roll(tok, "guess_number", count_up_from_4, strict_format=True, **GUESS)
    assert not any(e.success for e in strict) and not any(e.error for e in strict)
    for ep in strict:
        for turn in ep.turns:
            assert turn.parse_error == "strict format: the reply is not a bare number"
            assert turn.info["invalid_action"] and turn.observation.startswith("Format error")
        assert len(ep.turns) == 4  # every refused turn used one of the 4 steps
    summary = strict.summary()
    assert summary["env/parse_error_rate"] == 1.0 and summary["env/success_rate"] == 0.0
    found = _findings(strict)
    assert found["format-errors"].fired and found["format-errors"].value == 1.0
    assert "parse-from-incidental-span" not in found  # nothing was rewarded for a pulled-out number


def test_strict_rollout_with_the_expert_has_no_format_error(tok):
    batch = roll(tok, "guess_number", expert("guess_number"), strict_format=True, **GUESS)
    assert all(e.success for e in batch) and batch.summary()["env/parse_error_rate"] == 0.0
    assert not _findings(batch)["format-errors"].fired


def test_the_doctors_advice_names_the_setting(tok):
    f = _findings(roll(tok, "guess_number", count_up_from_4, **GUESS))["parse-from-incidental-span"]
    assert "environment.strict_format=true" in f.advice and "--environment.strict_format true" in f.advice
    config = ConfigStore()
    config.update("environment", {"strict_format": True})  # the setting it names exists and validates
    assert config.validate().environment.strict_format


# -- the paths from a config -------------------------------------------------------------------
def test_the_setting_reaches_the_trainers_environments(tiny_model_path, tmp_path):
    from workbench import Trainer

    config = ConfigStore()
    config.model.model_name = str(tiny_model_path)
    config.training.batch_size, config.training.group_size = 2, 2
    config.checkpoint.output_dir = str(tmp_path / "ckpt")
    config.update("environment", {"name": "guess_number", "strict_format": True})
    trainer = Trainer(config.validate())
    assert trainer.config.environment.strict_format is True  # recorded: a saved config rebuilds it
    rollout = trainer.make_rollout([0], 2)
    assert [e.strict_format for e in rollout.environments] == [True, True]
    rollout.reset()
    assert all(s.manager.parser is None for s in rollout.slots)  # plain-text env: the env judges
    rebuilt = make_env(trainer.config.environment.name, trainer.config.environment)
    rebuilt.reset(seed=0)
    assert rebuilt.strict_format and rebuilt.step("I guess 3")[3]["parse_error"]
    assert make_env("guess_number", EnvironmentConfig()).strict_format is False
    # an environment object built lenient, given with a strict config: warned about, naming both
    from workbench.environments.registry import ConfigOverrideWarning

    with pytest.warns(ConfigOverrideWarning, match=r"config.environment.strict_format is True but the environment "
                                                   r"object given to the trainer \(GuessNumberEnv\) has False"):
        trainer = Trainer(config, environment=make_env("guess_number"))
    assert trainer.config.environment.strict_format is False  # what runs is what the config records


def test_cli_flag_reaches_the_rollout(tiny_model_path, tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "workbench", "rollout", "--env", "guess_number", "--environment.strict_format",
            "true", "--model", str(tiny_model_path), "--device", "cpu", "--dtype", "float32", "--episodes", "2",
            "--max-turns", "2", "--max-tokens", "8", "--output", str(out)]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=600, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = (out / "rollout_guess_number.jsonl").read_text().splitlines()[1:]
    episodes = [json.loads(line) for line in lines]
    assert len(episodes) == 2
    refused = 0
    for ep in episodes:
        assert "Reply with the number only, nothing else." in ep["messages"][0]["content"]  # the strict prompt
        for turn in ep["turns"]:
            if re.fullmatch(r"-?\d+", turn["action"].strip()):
                assert turn["parse_error"] is None
            else:  # the random tiny model's replies are not bare numbers: refused, as an observation
                refused += 1
                assert turn["parse_error"] == "strict format: the reply is not a bare number"
                assert turn["observation"].startswith("Format error")
    assert refused >= 1
    bad = subprocess.run([*argv[:7], "maybe", *argv[8:]], capture_output=True, text=True, timeout=600, cwd=REPO)
    assert bad.returncode == 2 and "environment.strict_format must be true or false" in bad.stderr
