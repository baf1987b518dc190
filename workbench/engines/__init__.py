"""Generation backends behind one interface: token ids in, ids + logprobs out.

    base.py            the engine contract: token ids in, ids + raw logprobs out; stop strings
    hf.py              batched sampling with a KV cache over a transformers model (one host read per decode step)
    decode_step.py     a Llama-family decode step as plain tensor code (fused q/k/v, gate/up; LoRA as peft runs it)
    decode_threads.py  the CPU thread mode of decode steps (per row bucket) and of prefills (per size), timed
    packed_matmul.py   MKL's packed fp32 weights for the decode step's skinny products, per row bucket
    onednn_weights.py  bf16 decode weights packed once for oneDNN's matmul (one copy for every row count)
    kv_cache.py        the hf engine's cache bookkeeping: finished rows dropped, prefix cache per conversation
    model_hooks.py     attention implementations swapped into transformers' forward (GQA, packed), the LM head's input
    sampling.py        temperature / top-k / top-p draws from per-row seeded uniforms, on the device
    merged.py          a merged decoding copy of a LoRA policy, re-merged when weights change
    batching.py        dynamic batcher that merges concurrent requests for the hf engine
    weights.py         LoRA/full weight extraction for weight sync
    vllm_engine.py     in-process vLLM: weight sync (full and LoRA), prefix caching
    server.py          a running vLLM (OpenAI API) or SGLang (/generate) server; replies checked

`make_engine(config, model, tokenizer)` picks the backend named in
`config.inference.backend`; vLLM and the HTTP server backend are imported only
when asked for, so the HF path needs neither installed.
"""
from __future__ import annotations

from typing import Any

from workbench.engines.base import EngineError, GenerationEngine, GenerationResult, SamplingParams, StopStrings
from workbench.engines.hf import HFEngine


def make_engine(config: Any, model: Any, tokenizer: Any, model_path: str | None = None) -> GenerationEngine:
    """The engine for `config.inference.backend` ("hf", "vllm", "sglang", "server").

    Args:
        config: a ConfigStore.
        model: the policy module (the hf engine samples from it directly; vllm
            receives its weights through `sync_weights`, or keeps the checkpoint's
            weights when it is None).
        tokenizer: the policy's tokenizer.
        model_path: folder the vllm engine loads its initial weights from.

    The engine's `stop` is set to `config.inference.stop`: every reply ends at its first
    stop string (`workbench.engines.base.StopStrings`).
    """
    engine = _make_engine(config, model, tokenizer, model_path)
    engine.stop = list(config.inference.stop)  # every call of the engine honours inference.stop
    return engine


def hf_engine(config: Any, model: Any, tokenizer: Any) -> HFEngine:
    """The hf engine with the config's settings for it (`inference.enable_prefix_caching`,
    `inference.prefix_cache_mb`, `inference.max_batch_size`, `inference.cuda_graphs`,
    `inference.packed_decode`, `inference.cpu_kernels`); `config` None: the engine's defaults."""
    if config is None:
        return HFEngine(model, tokenizer)
    inf = config.inference
    return HFEngine(model, tokenizer, max_batch_size=inf.max_batch_size, prefix_cache=inf.enable_prefix_caching,
                    prefix_cache_mb=inf.prefix_cache_mb, cuda_graphs=inf.cuda_graphs,
                    packed_decode=inf.packed_decode, cpu_kernels=inf.cpu_kernels)


def _make_engine(config: Any, model: Any, tokenizer: Any, model_path: str | None) -> GenerationEngine:
    inf = config.inference
    if inf.backend == "hf":
        return hf_engine(config, model, tokenizer)
    if inf.backend == "vllm":
        from workbench.config import resolve_device
        from workbench.engines.vllm_engine import VLLMEngine
        from workbench.models.loading import resolve_model_path

        dtype = inf.vllm_dtype
        if dtype == "auto":  # vLLM runs on the accelerator when there is one, whatever model.device says
            dtype = "bfloat16" if resolve_device("auto").type == "cuda" else "float32"  # see inference.vllm_dtype
        engine = VLLMEngine(
            resolve_model_path(model_path or config.model.path), tokenizer, dtype=dtype,
            enable_prefix_caching=inf.enable_prefix_caching, gpu_memory_utilization=inf.gpu_memory_utilization,
            max_model_len=inf.max_context_tokens, tensor_parallel_size=config.model.tensor_parallel_size,
            enable_sleep_mode=inf.enable_sleep_mode, seed=inf.seed or 0,
        )
        if model is not None:  # None (e.g. create_inference_engine): serve the checkpoint as loaded
            engine.sync_weights(model)  # LoRA adapters or fine-tuned weights may already differ
        return engine
    if inf.backend in ("server", "sglang"):
        from workbench.engines.server import ServerEngine

        kind = "sglang" if inf.backend == "sglang" else inf.server_kind
        return ServerEngine(inf.server_url, tokenizer, kind=kind, timeout=inf.request_timeout,
                            max_retries=inf.max_retries)
    raise EngineError(f"unknown inference.backend {inf.backend!r}; use hf, vllm, sglang or server")


__all__ = ["EngineError", "GenerationEngine", "GenerationResult", "HFEngine", "SamplingParams", "StopStrings",
           "hf_engine", "make_engine"]
