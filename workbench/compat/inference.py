"""The seeds' inference API, built on the token-level engines.

    engine = create_inference_engine(model_path="smollm2-135m-instruct", backend="hf")
    out = engine.generate(prompts=["What is 2+3?"], max_tokens=32, temperature=0.7, top_p=0.9)
    out.sequences        # ["2 + 3 = 5"]
    out.tokens           # np.ndarray (B, L) of sampled ids, right-padded with pad id

    chat = MultiTurnInferenceEngine(engine=engine, max_turns=5, system_prompt="...")
    chat.start_conversation("Hello"); reply = chat.step(max_tokens=64)
    episode = chat.run_episode(environment=env, initial_prompt="Play the game.", max_turns=5)

    BatchInferenceManager(engine, batch_size=32).generate_batch(prompts=[...], max_tokens=64)

All of it is batched and token-exact underneath: `generate` feeds raw prompt text to
the engine in one batch; `MultiTurnInferenceEngine` keeps the conversation as token
ids (model turns appended as sampled); `run_episode` is a one-episode `Rollout`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np
import torch

from workbench.engines.base import GenerationEngine, SamplingParams
from workbench.rollout.chat import ChatRenderer, encode
from workbench.rollout.rollout import Rollout
from workbench.trajectory import Episode


@dataclass
class GenerationOutput:
    """Result of `InferenceEngine.generate` (the seeds' `output`)."""

    sequences: list[str]
    """Decoded continuations (stop token removed)."""
    tokens: np.ndarray
    """Sampled ids, shape (B, L), right-padded with the pad id."""
    token_ids: list[list[int]] = field(default_factory=list)
    """Sampled ids per prompt, unpadded."""
    logprobs: list[list[float]] = field(default_factory=list)
    """Raw-model logprob of each sampled id."""
    finish_reasons: list[str] = field(default_factory=list)
    """"stop" or "length" per prompt."""


class InferenceEngine:
    """Text-in/text-out wrapper over a `GenerationEngine` (the seeds' engine object)."""

    def __init__(self, engine: GenerationEngine, model_path: str | None = None):
        self.engine = engine
        self.tokenizer = engine.tokenizer
        self.model_path = model_path
        self.renderer = ChatRenderer(self.tokenizer)
        self._scoring_model: Any = getattr(engine, "model", None)

    @property
    def backend(self) -> str:
        return self.engine.name

    def generate(self, prompts: Sequence[str], max_tokens: int = 256, temperature: float = 0.7,
                 top_p: float = 0.9, top_k: int = -1, seed: int | None = None,
                 max_new_tokens: int | None = None) -> GenerationOutput:
        """Sample a continuation of each raw-text prompt, all in one batch."""
        ids = [encode(self.tokenizer, p) for p in prompts]
        params = SamplingParams(max_tokens=max_new_tokens or max_tokens, temperature=temperature, top_p=top_p,
                                top_k=top_k, stop_token_ids=self.renderer.stop_ids, seed=seed)
        results = self.engine.generate_ids(ids, params)
        pad = self.tokenizer.pad_token_id or 0
        L = max((len(r.token_ids) for r in results), default=0)
        tokens = np.full((len(results), L), pad, dtype=np.int64)  # (B, L)
        for b, r in enumerate(results):
            tokens[b, : len(r.token_ids)] = r.token_ids
        return GenerationOutput(
            sequences=[self.renderer.action_text(r.token_ids) for r in results], tokens=tokens,
            token_ids=[r.token_ids for r in results], logprobs=[r.logprobs for r in results],
            finish_reasons=[r.finish_reason for r in results],
        )

    @torch.no_grad()
    def compute_log_probs(self, prompts: Sequence[str], responses: Sequence[str]) -> list[list[float]]:
        """Per-token logprobs of each response given its prompt, from a transformers forward."""
        model = self._scoring_model
        if model is None:
            from workbench.models.loading import load_model

            if self.model_path is None:
                raise ValueError("compute_log_probs needs the model path for non-hf backends")
            model = self._scoring_model = load_model(self.model_path)
        device = next(model.parameters()).device
        out = []
        for prompt, response in zip(prompts, responses):
            p_ids, r_ids = encode(self.tokenizer, prompt), encode(self.tokenizer, response)
            ids = torch.tensor([p_ids + r_ids], device=device)  # (1, T)
            logits = model(input_ids=ids).logits[0, len(p_ids) - 1:-1].float()  # (R, V)
            lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(r_ids, device=device)[:, None])
            out.append(lp.squeeze(-1).tolist())
        return out

    def close(self) -> None:
        self.engine.close()


def create_inference_engine(model_path: str, backend: str = "hf", config: dict[str, Any] | None = None) -> InferenceEngine:
    """Build a text engine for `backend` ("hf", "vllm", "sglang", "server").

    `config` keys: dtype, device, max_model_len, tensor_parallel_size,
    gpu_memory_utilization, server_url, server_kind, stop (stop strings every reply
    ends at, as `inference.stop`), vllm_dtype; any other key is a ConfigError. `dtype` and `device` default to
    "auto" (CUDA and bfloat16 when there is a GPU, else CPU and float32); for "vllm",
    `dtype` (or `vllm_dtype`) is the engine's dtype.
    """
    from workbench.config import ConfigError, ConfigStore
    from workbench.engines import make_engine
    from workbench.models.loading import load_model, load_tokenizer

    config = dict(config or {})
    store = ConfigStore()
    store.model.model_name = model_path
    dtype = config.pop("dtype", "auto")
    store.model.dtype = dtype if backend == "hf" else "auto"
    store.model.device = config.pop("device", "auto")
    store.model.tensor_parallel_size = config.pop("tensor_parallel_size", 1)
    store.inference.backend = backend
    if "max_model_len" in config:
        store.inference.max_context_tokens = config.pop("max_model_len")
    for key in ("gpu_memory_utilization", "server_url", "server_kind", "stop"):
        if key in config:
            setattr(store.inference, key, config.pop(key))
    vllm_dtype = config.pop("vllm_dtype", dtype)
    if backend == "vllm":
        store.inference.vllm_dtype = vllm_dtype
    if config:
        raise ConfigError(
            f"create_inference_engine: unknown config keys {sorted(config)}; valid: ['device', 'dtype', "
            "'gpu_memory_utilization', 'max_model_len', 'server_kind', 'server_url', 'stop', "
            "'tensor_parallel_size', 'vllm_dtype']")
    store.validate()
    if backend == "hf":
        store.model.resolved_device()  # an unusable device fails here, before anything loads
    tokenizer = load_tokenizer(model_path)
    model = load_model(model_path, store.model.dtype, store.model.device) if backend == "hf" else None
    return InferenceEngine(make_engine(store, model, tokenizer, model_path), model_path)


class MultiTurnInferenceEngine:
    """A conversation (or an environment episode) kept as token ids.

    With `enable_tools=True`, `tool_manager` (a `MultiTurnManager`, or a `ToolRegistry`)
    supplies the tools and action parser of `run_episode`: its tools are offered in the
    episode (all but its `EnvironmentStepTool`, which `run_episode` binds to the
    environment it is given) and model output is parsed with its parser. `step()`
    stays plain chat (no tools are called there).
    """

    def __init__(self, engine: InferenceEngine, max_turns: int = 5, system_prompt: str | None = None,
                 tool_manager: Any = None, enable_tools: bool = False):
        self.engine = engine
        self.max_turns = max_turns
        self.system_prompt = system_prompt
        self.tool_manager = tool_manager if enable_tools else None
        self.renderer = engine.renderer
        self.messages: list[dict[str, Any]] = []
        self.token_ids: list[int] = []
        self._last_action: list[int] = []

    def start_conversation(self, initial_prompt: str) -> None:
        """Begin a conversation with one user message."""
        self.messages = ([{"role": "system", "content": self.system_prompt}] if self.system_prompt else [])
        self.messages.append({"role": "user", "content": initial_prompt})
        self.token_ids = self.renderer.prompt_ids(self.messages)
        self._last_action = []

    def add_user_message(self, content: str, role: str = "user") -> None:
        """Append a user (or tool) message after the last model reply."""
        if not self.messages or self.messages[-1]["role"] != "assistant":
            raise ValueError("add_user_message follows a model reply; call step() first")
        msg = {"role": role, "content": content}
        self.token_ids += self.renderer.delta_ids(self.messages, self._last_action, [msg], add_generation_prompt=True)
        self.messages.append(msg)

    def step(self, max_tokens: int = 256, temperature: float = 0.7, top_p: float = 0.9,
             seed: int | None = None) -> str:
        """Generate the next assistant reply and append it (token-exact)."""
        if not self.messages or self.messages[-1]["role"] == "assistant":
            raise ValueError("step() needs a user message to answer; call start_conversation or add_user_message")
        params = SamplingParams(max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                                stop_token_ids=self.renderer.stop_ids, seed=seed)
        result = self.engine.engine.generate_ids([self.token_ids], params)[0]
        self.token_ids += result.token_ids
        self._last_action = result.token_ids
        text = self.renderer.action_text(result.token_ids)
        self.messages.append({"role": "assistant", "content": text})
        return text

    def run_episode(self, environment: Any, initial_prompt: str | None = None, max_turns: int | None = None,
                    max_tokens: int = 64, temperature: float = 0.7, top_p: float = 0.9,
                    seed: int | None = None) -> Episode:
        """Play one episode in `environment`; returns the token-exact `Episode`."""
        rollout = Rollout(self.engine.engine, [environment], seeds=[seed], max_turns=max_turns or self.max_turns,
                          max_tokens=max_tokens, temperature=temperature, top_p=top_p,
                          seed=seed, initial_prompt=initial_prompt,
                          parser=getattr(self.tool_manager, "parser", None), tools=self.tools())
        return rollout.run()[0]

    def tools(self) -> list[Any]:
        """The tools `run_episode` offers: those of `tool_manager` (when tools are enabled)
        but its environment-step tool, which the episode binds to its own environment."""
        from workbench.tools.builtin import EnvironmentStepTool

        if self.tool_manager is None:
            return []
        registry = getattr(self.tool_manager, "registry", self.tool_manager)
        return [t for t in registry.tools() if not isinstance(t, EnvironmentStepTool)]


class BatchInferenceManager:
    """Generate for many prompts in fixed-size batches."""

    def __init__(self, engine: InferenceEngine, batch_size: int = 32):
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.engine = engine
        self.batch_size = batch_size

    def generate_batch(self, prompts: Sequence[str], max_tokens: int = 256, **kwargs: Any) -> GenerationOutput:
        """`engine.generate` over `prompts`, `batch_size` at a time, outputs concatenated."""
        parts = [self.engine.generate(list(prompts[i:i + self.batch_size]), max_tokens=max_tokens, **kwargs)
                 for i in range(0, len(prompts), self.batch_size)]
        token_ids = [t for p in parts for t in p.token_ids]
        pad = self.engine.tokenizer.pad_token_id or 0
        L = max((len(t) for t in token_ids), default=0)
        tokens = np.full((len(token_ids), L), pad, dtype=np.int64)  # (B, L)
        for b, t in enumerate(token_ids):
            tokens[b, : len(t)] = t
        return GenerationOutput(
            sequences=[s for p in parts for s in p.sequences], tokens=tokens, token_ids=token_ids,
            logprobs=[lp for p in parts for lp in p.logprobs],
            finish_reasons=[f for p in parts for f in p.finish_reasons],
        )
