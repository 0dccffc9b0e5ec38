"""Tiny, download-free HF models and tokenizers for fast tests.

The tokenizer is character level (every printable ASCII character is one token) and
carries a ChatML chat template like SmolLM2-Instruct's, so dataset, rollout and reward
code paths run exactly as with the real model. The model is a ``LlamaForCausalLM`` (the
SmolLM2 architecture) with a few layers and a small hidden size, built from a config
with a fixed seed, so two calls give bit-identical weights.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)

# Ids 0..3 are special, matching SmolLM2's layout (<|endoftext|>=0, <|im_start|>=1, <|im_end|>=2).
SPECIAL_TOKENS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<pad>"]
EOS_TOKEN = "<|im_end|>"
PAD_TOKEN = "<pad>"


def make_tiny_tokenizer() -> Any:
    """Return a character-level ``PreTrainedTokenizerFast`` with a ChatML chat template.

    Vocabulary: 4 special tokens (ids 0-3: ``<|endoftext|>``, ``<|im_start|>``,
    ``<|im_end|>`` = EOS, ``<pad>`` = PAD) followed by ``string.printable`` characters,
    so ``len(tokenizer) == 104``. ``decode`` joins characters without separators, so
    ``decode(encode(s)) == s`` for printable ASCII ``s``.
    """
    from tokenizers import Tokenizer, decoders, models
    from transformers import PreTrainedTokenizerFast

    chars = list(dict.fromkeys(string.printable))
    vocab = {tok: i for i, tok in enumerate(SPECIAL_TOKENS + chars)}
    # BPE with no merges splits text into single characters; unknown chars fall back to <|endoftext|>.
    backend = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<|endoftext|>"))
    backend.decoder = decoders.Fuse()
    tok = PreTrainedTokenizerFast(
        tokenizer_object=backend,
        bos_token=None,
        eos_token=EOS_TOKEN,
        pad_token=PAD_TOKEN,
        unk_token="<|endoftext|>",
        additional_special_tokens=["<|im_start|>"],
    )
    tok.chat_template = CHAT_TEMPLATE
    tok.padding_side = "left"
    return tok


def make_tiny_model(vocab_size: int = 104, *, num_layers: int = 2, hidden_size: int = 32, seed: int = 0) -> Any:
    """Return a randomly initialised tiny ``LlamaForCausalLM`` in float32 (eval mode).

    Args:
        vocab_size: rows of the embedding; match the tokenizer (104 for :func:`make_tiny_tokenizer`).
        num_layers: decoder layers.
        hidden_size: model width; heads = 4, key/value heads = 2, MLP width = 2 * hidden_size.
        seed: torch seed for the initialisation; equal seeds give bit-identical weights.
    """
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=1024,
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=2,
        pad_token_id=3,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(config)
    return model.eval()


def save_tiny_model(path: str | Path, *, num_layers: int = 2, hidden_size: int = 32, seed: int = 0) -> Path:
    """Write a tiny model + tokenizer as a HF folder at ``path`` (loadable with ``from_pretrained``).

    Returns the folder path. This is how engine and trainer tests get a "model path".
    """
    path = Path(path)
    tok = make_tiny_tokenizer()
    model = make_tiny_model(len(tok), num_layers=num_layers, hidden_size=hidden_size, seed=seed)
    model.generation_config.eos_token_id = tok.eos_token_id
    model.generation_config.pad_token_id = tok.pad_token_id
    model.save_pretrained(path)
    tok.save_pretrained(path)
    return path
