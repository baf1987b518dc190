"""A tiny random-initialised Llama and a small byte-level BPE tokenizer, for tests.

`build_tiny_model()` trains a ~600-token byte-level BPE on a short built-in text,
gives it the same ChatML chat template as SmolLM2 (`<|im_start|>role\\n...<|im_end|>\\n`),
builds a 2-layer Llama with head_dim 32 (vLLM's CPU attention needs head_dim >= 32),
and saves both as a normal Hugging Face folder, so every loader (transformers, peft,
vLLM, `vllm serve`) treats it like a real model. Takes about a second; the folder is
cached by its settings.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from workbench.models.loading import cache_dir

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
    if (path / "model.safetensors").exists() and (path / "tokenizer.json").exists():
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
    path.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    tokenizer.save_pretrained(path)
    (path / "workbench_tiny.json").write_text(json.dumps({"seed": seed, "hidden_size": hidden_size}))
    return path
