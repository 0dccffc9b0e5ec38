"""Checks every rollout engine runs on its input batch before generating (shared by all backends)."""

from __future__ import annotations

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
