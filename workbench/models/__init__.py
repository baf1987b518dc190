"""Model loading: hub ids, local folders, the embedded SmolLM2, and a tiny test model.

    loading.py  hub ids, local folders, the embedded SmolLM2 (GGUF -> safetensors once)
    tiny.py     a tiny Llama + byte-level BPE ChatML tokenizer for tests (~1 s); tiny Qwen3/Llama on a real tokenizer
"""
from workbench.models.loading import (
    cache_dir, embedded_model_path, load_model, load_model_and_tokenizer, load_tokenizer,
    resolve_model_path,
)
from workbench.models.tiny import build_family_model, build_tiny_model
