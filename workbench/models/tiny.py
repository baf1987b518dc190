"""A tiny random-initialised Llama and a small byte-level BPE tokenizer, for tests.

`build_tiny_model()` trains a ~600-token byte-level BPE on a short built-in text,
gives it the same ChatML chat template as SmolLM2 (`<|im_start|>role\\n...<|im_end|>\\n`),
builds a 2-layer Llama with head_dim 32 (vLLM's CPU attention needs head_dim >= 32),
and saves both as a normal Hugging Face folder, so every loader (transformers, peft,
vLLM, `vllm serve`) treats it like a real model. Takes about a second; the folder is
cached by its settings.

`build_family_model(tokenizer_dir, family)` does the same around a published tokenizer: a
tiny random-weight Qwen3 or Llama of that tokenizer's vocabulary, saved next to its
`tokenizer.json` and `tokenizer_config.json` (chat template as published, or another one
given), so rollouts, training and the gateway meet the family's real template and ids.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.models.loading import cache_dir, folder_complete, publish_folder, scratch_folder

#: The files whose presence marks a built tiny model's folder as complete.
MARKS = ("model.safetensors", "tokenizer.json")

CHATML_TEMPLATE = (
    "{% for message in messages %}"
    "{% if loop.first and messages[0]['role'] != 'system' %}"
    "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]

_CORPUS = """
You are a helpful assistant. Guess the number between 1 and 16. Reply with a single number.
Higher. Lower. Correct! You win. The answer is 42. Answer: 7. Use the calculator tool.
<tool_call>{"name": "calculator", "arguments": {"expression": "3 * (4 + 5)"}}</tool_call>
Thought: I should move up. Action: environment_step Action Input: {"action": "up"}
The grid is 4 by 4. Move up, down, left or right. You reached the goal. You bumped into a wall.
Take the key, open the door, go north, attack the troll. Score: 1.0, Inventory: ['item']
crane slate audio: green yellow grey letters. Welcome to the game! You are in a room.
0 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 + - * / ( ) = ? ! , . : ; " ' { } [ ] _ # @
The quick brown fox jumps over the lazy dog. What is 2+3? 2 + 3 = 5.
"""


def _build_tokenizer(vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator([_CORPUS] * 4, trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token="<|im_start|>",
        eos_token="<|im_end|>",
        pad_token="<|im_end|>",
        unk_token="<|endoftext|>",
    )
    fast.chat_template = CHATML_TEMPLATE
    return fast


def build_tiny_model(
    hidden_size: int = 64,
    num_layers: int = 2,
    num_heads: int = 2,
    vocab_size: int = 600,
    seed: int = 0,
    root: Path | None = None,
) -> Path:
    """Build (or reuse) a tiny Llama + tokenizer folder and return its path."""
    from transformers import LlamaConfig, LlamaForCausalLM

    head_dim = hidden_size // num_heads
    if head_dim < 32:
        raise ValueError(f"head_dim = hidden_size / num_heads must be >= 32 (vLLM CPU), got {head_dim}")
    name = f"tiny-llama-v2-h{hidden_size}-l{num_layers}-a{num_heads}-v{vocab_size}-s{seed}"
    path = (root or cache_dir()) / name
    if folder_complete(path, MARKS):
        return path
    tokenizer = _build_tokenizer(vocab_size)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=hidden_size * 2,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_heads,
        max_position_embeddings=4096,
        tie_word_embeddings=False,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config)
    # A wider output head than the default init, so the random model's next-token
    # distribution is uneven (some tokens likely, like a real LM) rather than uniform.
    with torch.no_grad():
        model.lm_head.weight.normal_(0.0, 0.3)
    tmp = scratch_folder(path)
    model.save_pretrained(tmp, safe_serialization=True)
    tokenizer.save_pretrained(tmp)
    (tmp / "workbench_tiny.json").write_text(json.dumps({"seed": seed, "hidden_size": hidden_size}))
    publish_folder(tmp, path, MARKS)
    return path


#: Architectures `build_family_model` makes, with the published vocabulary size of each family.
FAMILIES = {"qwen3": ("Qwen3Config", 151936), "llama": ("LlamaConfig", 128256)}


def build_family_model(tokenizer_dir: str | Path, family: str, chat_template: str | None = None,
                       hidden_size: int = 64, num_layers: int = 2, seed: int = 0,
                       root: Path | None = None) -> Path:
    """Build (or reuse) a tiny random `family` model ("qwen3" or "llama") on the tokenizer in
    `tokenizer_dir` (its tokenizer.json + tokenizer_config.json) and return the folder.

    The vocabulary is the family's published size (at least the tokenizer's length), the
    embeddings tied, two heads of 32 dimensions. `chat_template` replaces the tokenizer's
    own (e.g. a family's tool-calling template); None keeps the one in tokenizer_config.json.
    """
    import hashlib

    import transformers

    tokenizer_dir = Path(tokenizer_dir)
    missing = [n for n in ("tokenizer.json", "tokenizer_config.json") if not (tokenizer_dir / n).is_file()]
    if missing:
        raise FileNotFoundError(f"{tokenizer_dir} lacks {', '.join(missing)}")
    if family not in FAMILIES:
        raise ValueError(f"family must be one of {sorted(FAMILIES)}, got {family!r}")
    cfg_json = json.loads((tokenizer_dir / "tokenizer_config.json").read_text())
    if chat_template is not None:
        cfg_json["chat_template"] = chat_template
    tag = hashlib.sha1(json.dumps(cfg_json, sort_keys=True).encode()
                       + str((tokenizer_dir / "tokenizer.json").stat().st_size).encode()).hexdigest()[:10]
    path = (root or cache_dir()) / f"tiny-{family}-h{hidden_size}-l{num_layers}-s{seed}-{tag}"
    if folder_complete(path, MARKS):
        return path
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tmp = scratch_folder(path)
    (tmp / "tokenizer.json").write_bytes((tokenizer_dir / "tokenizer.json").read_bytes())
    (tmp / "tokenizer_config.json").write_text(json.dumps(cfg_json, indent=1))
    tok = AutoTokenizer.from_pretrained(str(tmp))
    config_cls, vocab = FAMILIES[family]
    eos = tok.convert_tokens_to_ids(tok.eos_token) if tok.eos_token else 0
    config = getattr(transformers, config_cls)(
        vocab_size=max(vocab, len(tok)), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers, num_attention_heads=hidden_size // 32, num_key_value_heads=hidden_size // 32,
        head_dim=32, max_position_embeddings=4096, tie_word_embeddings=True, eos_token_id=eos,
        bos_token_id=tok.bos_token_id, pad_token_id=tok.pad_token_id if tok.pad_token_id is not None else eos,
    )
    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(config)
    model.save_pretrained(tmp, safe_serialization=True)
    publish_folder(tmp, path, MARKS)
    return path
