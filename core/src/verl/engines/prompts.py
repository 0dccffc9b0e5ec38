"""Checks every rollout engine runs on its input batch before generating, and the per-row inputs a token-in
engine (vLLM, SGLang, TensorRT-LLM) derives from it: prompts without padding, sampler seeds, stop ids (shared by
all backends)."""

from __future__ import annotations

import contextlib
from typing import Any

import torch


def check_prompt_batch(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    response_length: int,
    max_model_len: int | None = None,
    context_name: str = "context",
) -> None:
    """Validate a rollout input batch (DESIGN §5 layout).

    Args:
        input_ids / attention_mask: ``(bs, prompt_len)``, left-padded.
        response_length: tokens to generate per row (>= 1).
        max_model_len: the model's context (e.g. ``max_position_embeddings``); ``None`` skips that check.
        context_name: what the limit is called in the message (``"max_position_embeddings"``, ``"max_model_len"``).

    Raises:
        ValueError: shapes differ or are not 2-D, ``response_length < 1``, a row with an all-zero mask
            (empty prompt), rows that are not left-padded, or the longest prompt + ``response_length``
            over ``max_model_len`` (each message names the rows / sizes and the fix).
    """
    if input_ids.shape != attention_mask.shape or input_ids.dim() != 2:
        raise ValueError(
            f"input_ids {tuple(input_ids.shape)} and attention_mask {tuple(attention_mask.shape)} must both be "
            "(bs, prompt_len)"
        )
    if response_length < 1:
        raise ValueError(f"rollout.response_length must be >= 1, got {response_length}")
    if input_ids.shape[0] == 0:
        return
    lengths = attention_mask.sum(-1)
    if bool((lengths == 0).any()):
        rows = torch.nonzero(lengths == 0).flatten().tolist()[:5]
        raise ValueError(f"prompt rows {rows} have an all-zero attention_mask (empty prompt)")
    if bool((attention_mask[:, -1] == 0).any()):
        rows = torch.nonzero(attention_mask[:, -1] == 0).flatten().tolist()[:5]
        raise ValueError(
            f"prompt rows {rows} are not left-padded (attention_mask[:, -1] == 0); pad prompts on the left "
            "(tokenizer.padding_side = 'left')"
        )
    if max_model_len is not None and int(lengths.max()) + response_length > max_model_len:
        raise ValueError(
            f"longest prompt ({int(lengths.max())} tokens) + rollout.response_length ({response_length}) exceeds the "
            f"model's {context_name} ({max_model_len}); lower data.max_prompt_length or response_length"
        )


# Per-row seeds from one seed: distinct, reproducible seeds for the n samples of a prompt (a shared seed would
# make them identical); engines take signed 64-bit seeds.
SEED_STRIDE = 1_000_003
SEED_MOD = 1 << 63


def strip_left_padding(input_ids: torch.Tensor, attention_mask: torch.Tensor) -> list[list[int]]:
    """Prompt token ids per row without padding, ``input_ids[i][attention_mask[i] == 1]``: what a token-in engine
    (vLLM, SGLang, TensorRT-LLM) is sent, the exact tokens the trainer built (nothing is re-tokenised).

    Args:
        input_ids: ``(bs, prompt_len)`` int64, left-padded.
        attention_mask: ``(bs, prompt_len)`` 0/1.

    Returns:
        ``bs`` lists of ints.
    """
    ids, mask = input_ids.cpu().tolist(), attention_mask.cpu().bool().tolist()
    return [
        [tok for tok, keep in zip(row, keep_row, strict=True) if keep] for row, keep_row in zip(ids, mask, strict=True)
    ]


def row_seeds(
    bs: int,
    sample_seed: torch.Tensor | None,
    call_seed: int | None,
    greedy: bool,
    *,
    engine_seed: int | None = None,
    offset: int = 0,
) -> list[int | None]:
    """Sampler seed of each row of a generation call.

    * greedy: ``None`` (no randomness);
    * ``sample_seed`` ``(bs,)`` given: ``sample_seed[i] mod 2**63`` (a row samples the same tokens whatever batch
      it is in, as with the ``hf`` engine);
    * else ``call_seed`` (``meta_info["seed"]``): ``(call_seed * 1_000_003 + i) mod 2**63``;
    * else, with ``engine_seed``: ``(engine_seed * 1_000_003 + offset + i) mod 2**63``, ``offset`` = rows the
      engine sampled before (for an engine without an engine-wide generator, where unseeded requests would all
      share one seed);
    * else ``None`` (the engine's own generator).

    Raises:
        ValueError: ``sample_seed`` not of shape ``(bs,)``.
    """
    if greedy:
        return [None] * bs
    if sample_seed is not None:
        if tuple(sample_seed.shape) != (bs,):
            raise ValueError(f"sample_seed must have shape ({bs},), got {tuple(sample_seed.shape)}")
        return [int(s) % SEED_MOD for s in sample_seed.tolist()]
    if call_seed is not None:
        return [(int(call_seed) * SEED_STRIDE + i) % SEED_MOD for i in range(bs)]
    if engine_seed is not None:
        return [(int(engine_seed) * SEED_STRIDE + int(offset) + i) % SEED_MOD for i in range(bs)]
    return [None] * bs


def eos_token_ids(tokenizer: Any, model_path: Any) -> list[int]:
    """Every id generation stops at: the tokenizer's ``eos_token_id``, then the model folder's
    ``generation_config.eos_token_id`` (an int or a list; SmolLM2 and Qwen list several), without repeats.

    A folder without a (readable) ``generation_config.json`` contributes nothing.
    """
    from transformers import GenerationConfig

    sources: list[Any] = [getattr(tokenizer, "eos_token_id", None)]
    with contextlib.suppress(OSError, ValueError):
        sources.append(GenerationConfig.from_pretrained(str(model_path)).eos_token_id)
    ids: list[int] = []
    for source in sources:
        for i in [source] if isinstance(source, int) else list(source or []):
            if int(i) not in ids:
                ids.append(int(i))
    return ids
