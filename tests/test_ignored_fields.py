"""Config fields and arguments that used to be ignored: `inference.stop` (hf and server
engines, and a rollout), `MultiTurnInferenceEngine(tool_manager=..., enable_tools=True)`,
`checkpoint.save_interval`'s documented meaning, and `reward_fn(trajectory, environment)`
getting the environment copy that played the episode.
"""
from __future__ import annotations

import json
import pickle
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from envs import make_env
from workbench import ConfigStore, Trainer
from workbench.engines import make_engine
from workbench.engines.base import GenerationEngine, GenerationResult, SamplingParams
from workbench.environments.base import BaseEnvironment
from workbench.rollout import Rollout
from workbench.rollout.chat import ChatRenderer
from workbench.trajectory import TrajectoryBatch


def _text(tok, ids):
    return tok.decode(ids, skip_special_tokens=True)


def _prompts(tok, n):
    r = ChatRenderer(tok)
    return [r.prompt_ids([{"role": "user", "content": f"question {i}: say something"}]) for i in range(n)]


def test_inference_stop_ends_hf_replies_at_the_first_stop_string(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    config = ConfigStore()
    config.inference.stop = ["e"]
    engine = make_engine(config.validate(), model, tok)
    plain = make_engine(ConfigStore(), model, tok)
    stop_ids = ChatRenderer(tok).stop_ids
    stopped = 0
    for i, prompt in enumerate(_prompts(tok, 8)):
        # one prompt per call, same seed: the same tokens are sampled until the reply stops
        params = SamplingParams(max_tokens=40, temperature=1.0, stop_token_ids=stop_ids, seed=100 + i)
        full = plain.generate_ids([prompt], params)[0]
        cut = engine.generate_ids([prompt], params)[0]
        n = len(cut.token_ids)
        assert cut.token_ids == full.token_ids[:n]  # kept exactly as sampled, nothing re-encoded
        assert cut.logprobs == pytest.approx(full.logprobs[:n], abs=1e-5)
        if "e" in _text(tok, full.token_ids):
            stopped += 1
            assert cut.finish_reason == "stop"
            assert "e" in _text(tok, cut.token_ids)  # the stop text is included ...
            assert "e" not in _text(tok, cut.token_ids[:-1])  # ... and completed by the last token
        else:
            assert cut.token_ids == full.token_ids and cut.finish_reason == full.finish_reason
    assert stopped >= 4, f"only {stopped} of 8 replies held an 'e'; the check proved little"
    assert engine.stop == ["e"] and plain.stop == []


def test_inference_stop_in_a_rollout_keeps_tokens_exact(tiny_model_and_tokenizer):
    model, tok = tiny_model_and_tokenizer
    config = ConfigStore()
    config.inference.stop = ["e"]
    engine = make_engine(config.validate(), model, tok)
    envs = [make_env("guess_number") for _ in range(4)]
    batch = Rollout(engine, envs, seeds=[0, 0, 1, 1], max_turns=2, max_tokens=24, seed=5).run()
    checked = 0
    for ep in batch:
        assert not [w for w in ep.warnings if "align" in w.lower()], ep.warnings
        for turn in ep.turns:
            ids = ep.token_ids[turn.token_start:turn.token_end]
            assert all(ep.loss_mask[turn.token_start:turn.token_end])
            if "e" in _text(tok, ids):
                checked += 1
                assert turn.finish_reason == "stop" and "e" not in _text(tok, ids[:-1])
    assert checked >= 2


class _CompletionsServer:
    """Answers /v1/completions with fixed token ids, ignoring any stop strings sent (as a
    server that does not support them would); records the request bodies."""

    def __init__(self, ids: list[int]):
        self.bodies: list[dict] = []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def do_GET(self):
                self._send({"data": [{"id": "tiny"}]})

            def do_POST(self):
                outer.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
                self._send({"choices": [{"token_ids": ids, "finish_reason": "length", "logprobs": {
                    "tokens": [f"token_id:{t}" for t in ids], "token_logprobs": [-0.5 - k for k in range(len(ids))]}}]})

            def _send(self, payload):
                data = json.dumps(payload).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def test_inference_stop_server_engine_sends_and_applies_it(tiny_model_and_tokenizer):
    _, tok = tiny_model_and_tokenizer
    ids = tok.encode("abc xyz done more", add_special_tokens=False)
    server = _CompletionsServer(ids)
    try:
        config = ConfigStore()
        config.inference.backend, config.inference.server_url = "server", server.url
        config.inference.stop = ["xyz"]
        engine = make_engine(config.validate(), None, tok)
        result = engine.generate_ids([[1, 2, 3]], SamplingParams(max_tokens=len(ids), temperature=0.0))[0]
    finally:
        server.close()
    body = server.bodies[-1]
    assert body["stop"] == ["xyz"] and body["include_stop_str_in_output"] is True
    n = len(result.token_ids)
    assert result.token_ids == ids[:n] and n < len(ids)
    assert result.logprobs == [-0.5 - k for k in range(n)]
    assert result.finish_reason == "stop"
    assert _text(tok, result.token_ids).rstrip().endswith("xyz") or "xyz" in _text(tok, result.token_ids)
    assert "xyz" not in _text(tok, result.token_ids[:-1])


class _ScriptedEngine(GenerationEngine):
    """Replies with fixed texts, one per call, encoded once (a stand-in for a model that
    calls a tool; the rollout's token bookkeeping is real)."""

    name = "scripted"

    def __init__(self, tokenizer, replies: list[str]):
        super().__init__(tokenizer)
        end = ChatRenderer(tokenizer).stop_ids[0]
        self.replies = [tokenizer.encode(r, add_special_tokens=False) + [end] for r in replies]
        self.calls = 0

    def generate_ids(self, prompts, params):
        ids = self.replies[min(self.calls, len(self.replies) - 1)]
        self.calls += 1
        return [GenerationResult(list(ids), [-1.0] * len(ids), "stop") for _ in prompts]


class _EchoEnv(BaseEnvironment):
    """Ends with reward 1 when the action is "done"."""

    def reset(self, seed=None):
        self.steps = 0
        return "Say done."

    def step(self, action):
        self.steps += 1
        ok = action.strip() == "done"
        return ("ok" if ok else "again"), float(ok), ok, {"success": ok}


def test_multi_turn_engine_uses_the_tool_managers_tools(tiny_model_and_tokenizer):
    from workbench.compat.inference import InferenceEngine, MultiTurnInferenceEngine
    from workbench.tools.manager import MultiTurnManager
    from workbench.tools.registry import ToolRegistry

    _, tok = tiny_model_and_tokenizer
    registry = ToolRegistry()

    @registry.register(name="my_tool")
    def my_tool(x: int) -> str:
        """Doubles x."""
        return f"doubled {2 * x}"

    manager = MultiTurnManager(registry, "json", _EchoEnv({"max_steps": 4}))
    engine = _ScriptedEngine(tok, ['{"tool": "my_tool", "arguments": {"x": 21}}', "done"])
    chat = MultiTurnInferenceEngine(InferenceEngine(engine), tool_manager=manager, enable_tools=True)
    episode = chat.run_episode(_EchoEnv({"max_steps": 4}), max_turns=3)
    call = episode.turns[0].tool_calls[0]
    assert call["name"] == "my_tool" and call["success"], call
    assert "doubled 42" in str(call["result"])
    assert "Unknown tool" not in episode.turns[0].observation
    assert episode.success and episode.turns[-1].action == "done"
    assert [t.definition.name for t in chat.tools()] == ["my_tool"]


def test_save_interval_is_documented_in_steps_against_the_seeds_epochs():
    import ast
    import inspect

    from workbench import config as config_module

    tree = ast.parse(inspect.getsource(config_module.CheckpointConfig))
    body = tree.body[0].body
    doc = next(body[i + 1].value.value for i, node in enumerate(body)
               if isinstance(node, ast.AnnAssign) and node.target.id == "save_interval")
    assert "training steps" in doc and "epoch" in doc and "num_iters_per_epoch" in doc, doc


class _StepCounter(BaseEnvironment):
    """Counts its own steps, so each copy's state says which episode it played."""

    def __init__(self, config=None):
        super().__init__(config or {"max_steps": 3})
        self.steps = 0

    def reset(self, seed=None):
        self.steps = 0
        return "Reply with a number."

    def step(self, action):
        self.steps += 1
        return "again", 0.25, self.steps >= 2, {}


def test_reward_fn_gets_the_environment_copy_that_played_the_episode(tiny_model_path, tmp_path):
    config = ConfigStore()
    config.model.model_name = str(tiny_model_path)
    config.inference.max_tokens, config.inference.max_turns = 6, 3
    config.training.batch_size, config.training.group_size, config.training.micro_batch_size = 4, 2, 2
    config.checkpoint.output_dir, config.checkpoint.save_interval = str(tmp_path / "ckpt"), 0
    proto = _StepCounter()
    seen = []

    def reward_fn(trajectory, environment):
        seen.append(environment)
        return float(environment.steps) + 0.5  # the prototype never stepped: it would give 0.5

    trainer = Trainer(config.validate(), environment=proto, reward_fn=reward_fn)
    batch = trainer.rollout()
    trainer.score(batch)
    assert all(env is not proto for env in seen)
    assert len({id(env) for env in seen}) == len(batch)  # one copy per episode
    assert [ep.score for ep in batch] == [ep.num_turns + 0.5 for ep in batch]
    assert [ep.environment for ep in batch] == seen
    # batches still pickle and save; the environment stays behind
    back = pickle.loads(pickle.dumps(batch))
    assert back[0].environment is None and back[0].token_ids == batch[0].token_ids
    loaded = TrajectoryBatch.load(batch.save(tmp_path / "b.jsonl"))
    assert loaded[0].environment is None and loaded[0].score == batch[0].score
    assert batch.select([1])[0].environment is seen[1]
    trainer.cleanup()


@pytest.mark.vllm
def test_inference_stop_ends_vllm_replies_like_hf(vllm_tiny_engine):
    engine = vllm_tiny_engine
    tok = engine.tokenizer
    stop_ids = ChatRenderer(tok).stop_ids
    prompts = _prompts(tok, 6)
    params = SamplingParams(max_tokens=40, temperature=1.0, stop_token_ids=stop_ids, seed=7)
    full = engine.generate_ids(prompts, params)
    engine.stop = ["e"]  # what make_engine sets from inference.stop
    try:
        cut = engine.generate_ids(prompts, params)
        submitted = [engine.submit(p, SamplingParams(**{**params.__dict__, "seed": 7 + i})).result()
                     for i, p in enumerate(prompts)]  # the continuous-batching path
    finally:
        engine.stop = []
    stopped = 0
    for f, c, s in zip(full, cut, submitted):
        n = len(c.token_ids)
        assert c.token_ids == f.token_ids[:n] and s.token_ids == c.token_ids
        assert c.logprobs == pytest.approx(f.logprobs[:n], abs=1e-4)
        if "e" in _text(tok, f.token_ids):
            stopped += 1
            assert c.finish_reason == "stop" and "e" in _text(tok, c.token_ids)
            assert "e" not in _text(tok, c.token_ids[:-1])
        else:
            assert c.token_ids == f.token_ids
    assert stopped >= 3


def test_create_inference_engine_rejects_unknown_config_keys(tiny_model_path):
    from workbench import create_inference_engine
    from workbench.config import ConfigError

    with pytest.raises(ConfigError, match=r"unknown config keys \['max_length', 'temprature'\]"):
        create_inference_engine(str(tiny_model_path), "hf", config={"temprature": 0.5, "max_length": 9})
    engine = create_inference_engine(str(tiny_model_path), "hf", config={"dtype": "float32", "device": "cpu"})
    assert engine.engine.name == "hf"
