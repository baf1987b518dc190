"""OpenEnv actions that are not one string: real `create_app` servers on 127.0.0.1 with a
two-field action (direction: Literal[...], steps: int) and a non-string one (guess: int).

The adapter reads the action's schema from the server, says the format in the system prompt,
parses JSON replies (also in a code fence), turns a reply that does not validate into a
format error naming the field (the model's next observation, counted in
env/parse_error_rate, never an environment error), refuses at startup an action it cannot
fill, and with environment.constrained_decoding samples every reply under the schema."""
from __future__ import annotations

import socket
import threading
import time
from typing import Any, Literal, Optional

import pytest

pytest.importorskip("openenv.core.env_server.http_server")

from openenv.core.env_server.http_server import create_app  # noqa: E402
from openenv.core.env_server.interfaces import Environment  # noqa: E402
from openenv.core.env_server.types import Action, Observation, State  # noqa: E402

from workbench.config import ConfigError  # noqa: E402
from workbench.environments.registry import make_env  # noqa: E402
from workbench.rollout.rollout import Rollout  # noqa: E402


class MoveAction(Action):
    direction: Literal["up", "down", "left", "right"]
    steps: int


class NumberAction(Action):
    guess: int


class TextObservation(Observation):
    text: str = ""


class MoveEnv(Environment):
    """Walk from row 0 to row 2 (up is +1 row); 3 moves."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.row = State(), 0

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> TextObservation:
        self._state, self.row = State(episode_id=episode_id, step_count=0), 0
        return TextObservation(text="You are on row 0. Reach row 2.")

    def step(self, action: MoveAction, timeout_s: Optional[float] = None, **kwargs: Any) -> TextObservation:
        self._state.step_count += 1
        self.row += {"up": 1, "down": -1}.get(action.direction, 0) * action.steps
        won = self.row == 2
        return TextObservation(text=f"You are on row {self.row}.", done=won or self._state.step_count >= 3,
                               reward=1.0 if won else 0.0)

    @property
    def state(self) -> State:
        return self._state


class NumberEnv(Environment):
    """Guess the seed's number 1..9 in 3 tries."""

    SUPPORTS_CONCURRENT_SESSIONS = True

    def __init__(self):
        super().__init__()
        self._state, self.secret = State(), 1

    def reset(self, seed: Optional[int] = None, episode_id: Optional[str] = None, **kwargs: Any) -> TextObservation:
        self._state, self.secret = State(episode_id=episode_id, step_count=0), 1 + (seed or 0) % 9
        return TextObservation(text="Guess a number from 1 to 9.")

    def step(self, action: NumberAction, timeout_s: Optional[float] = None, **kwargs: Any) -> TextObservation:
        self._state.step_count += 1
        won = action.guess == self.secret
        hint = "Correct!" if won else ("Higher." if action.guess < self.secret else "Lower.")
        return TextObservation(text=hint, done=won or self._state.step_count >= 3, reward=1.0 if won else 0.0)

    @property
    def state(self) -> State:
        return self._state


def _serve(env_cls, action_cls):
    """`create_app(...)` under uvicorn on a thread, on a free port of 127.0.0.1."""
    import uvicorn

    app = create_app(env_cls, action_cls, TextObservation, max_concurrent_envs=16)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", lifespan="off"))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.01)
    return server, thread, f"http://127.0.0.1:{sock.getsockname()[1]}"


@pytest.fixture(scope="module")
def servers():
    move, number = _serve(MoveEnv, MoveAction), _serve(NumberEnv, NumberAction)
    yield move[2], number[2]
    for server, thread, _ in (move, number):
        server.should_exit = True
        thread.join(10)


def test_a_two_field_action_is_told_parsed_and_refused_by_field(servers):
    env = make_env(f"openenv:{servers[0]}")
    assert env.action_format.is_json and env.action_field is None
    env.reset(seed=0)
    prompt = env.get_prompt_prefix()
    assert '"direction": one of "up", "down", "left", "right"' in prompt and '"steps": an integer' in prompt
    assert '{"direction": "up", "steps": 1}' in prompt  # an example
    obs, reward, done, info = env.step('{"direction": "up", "steps": 1}')
    assert obs == "You are on row 1." and "parse_error" not in info
    obs, reward, done, info = env.step('Sure:\n```json\n{"direction": "up", "steps": 1}\n```')
    assert (obs, reward, done) == ("You are on row 2.", 1.0, True)
    env.reset(seed=1)
    for reply, error in [("go up twice", "the reply is not JSON"),
                         ('{"direction": "north", "steps": 1}', "field 'direction': 'north' is not one of"),
                         ('{"direction": "up"}', "field 'steps' is missing"),
                         ('{"direction": "up", "steps": "two"}', "field 'steps': 'two' is not of type 'integer'"),
                         ('{"direction": "up", "steps": 1, "speed": 3}', "'speed' was unexpected")]:
        obs, reward, done, info = env.step(reply)
        assert error in info["parse_error"] and info["invalid_action"] and not done, (reply, info)
        assert obs.startswith("That is not a valid action: ") and "Reply with one JSON object" in obs
    env.close()


def test_a_non_string_action_names_its_field(servers):
    env = make_env(f"openenv:{servers[1]}")
    env.reset(seed=6)  # secret 7
    obs, _, _, info = env.step("I guess 7.")
    assert info["parse_error"].startswith("field 'guess' needs an integer: the reply is not JSON")
    assert env.step("5")[0] == "Higher."  # a bare value fills the only field
    obs, reward, done, _ = env.step('{"guess": 7}')
    assert (obs, reward, done) == ("Correct!", 1.0, True)
    env.close()


def test_startup_refuses_an_action_the_adapter_cannot_fill(servers):
    with pytest.raises(ValueError, match="'steps' is an integer, not a string"):
        make_env(f"openenv:{servers[0]}", action_field="steps")
    with pytest.raises(ValueError, match=r"also requires \['steps'\] besides 'direction'"):
        make_env(f"openenv:{servers[0]}", action_field="direction")
    with pytest.raises(ValueError, match="has no such field"):
        make_env(f"openenv:{servers[1]}", action_field="message")


def test_a_rollout_counts_format_errors_and_ends_no_episode_in_an_environment_error(servers, tiny_engine):
    """The untrained tiny model writes no JSON: every turn is a format error the model reads,
    episodes run to max_turns, no environment error."""
    envs = [make_env(f"openenv:{servers[0]}") for _ in range(4)]
    batch = Rollout(tiny_engine, envs, seeds=[0, 0, 1, 1], max_turns=2, max_tokens=12, step_timeout=20).run()
    summary = batch.summary()
    assert summary["env/error_rate"] == 0.0 and summary["env/parse_error_rate"] == 1.0
    assert all(ep.num_turns == 2 and ep.environment_error is None for ep in batch)
    assert "Reply with one JSON object" in batch[0].messages[0]["content"]  # the system prompt
    for env in envs:
        env.close()


def test_constrained_decoding_samples_valid_actions_from_the_first_step(servers, tiny_engine):
    envs = [make_env(f"openenv:{url}", constrained_decoding=True) for url in servers for _ in range(2)]
    batch = Rollout(tiny_engine, envs, seeds=[0, 1, 2, 3], max_turns=2, max_tokens=40, step_timeout=20).run()
    assert batch.summary()["env/parse_error_rate"] == 0.0 and batch.summary()["env/error_rate"] == 0.0
    for ep in batch:
        assert ep.turns and all(t.parse_error is None and t.constraint["kind"] == "json_schema" for t in ep.turns)
    for env in envs:
        env.close()
    with pytest.raises(ConfigError, match="no format to constrain"):
        from tests.test_openenv import GuessAction, GuessEnv, GuessObservation  # noqa: F401 (one string field)

        make_env("openenv:tests.test_openenv:GuessEnv", constrained_decoding=True)
