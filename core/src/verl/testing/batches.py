"""Ragged RL batches for engine tests: left-padded prompts and right-padded responses of given lengths."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from verl.protocol import DataProto

PAD_ID = 3


def ragged_rl_batch(
    prompt_lens: Sequence[int],
    response_lens: Sequence[int],
    prompt_len: int,
    response_len: int,
    generator: torch.Generator,
    meta_info: dict | None = None,
) -> DataProto:
    """A batch shaped as the rollout hands it to the training engines, with random token ids.

    Row ``i`` has ``prompt_lens[i]`` real prompt tokens at the right end of ``prompt_len`` columns and
    ``response_lens[i]`` real response tokens at the left end of ``response_len`` columns (0 is an empty
    response); pad slots hold token id 3 and mask 0. Token ids are drawn from ``generator`` (ids 4-99),
    row by row, prompt before response, so a caller drawing more tensors from the same generator
    afterwards (advantages, returns, old log-probs) gets reproducible values.

    Args:
        prompt_lens, response_lens: real lengths per row, equal length (the batch size).
        prompt_len, response_len: padded widths; every length must fit its width.
        generator: the source of the token ids.
        meta_info: the DataProto's meta_info.

    Returns:
        DataProto with int64 tensors ``prompts`` (batch, prompt_len), ``responses`` and ``response_mask``
        (batch, response_len), ``input_ids``, ``attention_mask`` and ``position_ids``
        (batch, prompt_len + response_len); position ids count real tokens from 0 (0 on left padding).

    Raises:
        ValueError: the two length lists differ in size, or a length does not fit its width.
    """
    if len(prompt_lens) != len(response_lens):
        raise ValueError(f"prompt_lens has {len(prompt_lens)} rows but response_lens has {len(response_lens)}")
    if any(not 0 <= p <= prompt_len for p in prompt_lens) or any(not 0 <= r <= response_len for r in response_lens):
        raise ValueError(f"lengths must fit the widths ({prompt_len}, {response_len}): {prompt_lens}, {response_lens}")
    bs = len(prompt_lens)
    prompts = torch.full((bs, prompt_len), PAD_ID)
    responses = torch.full((bs, response_len), PAD_ID)
    prompt_mask = torch.zeros(bs, prompt_len, dtype=torch.long)
    response_mask = torch.zeros(bs, response_len, dtype=torch.long)
    for i, (p, r) in enumerate(zip(prompt_lens, response_lens, strict=True)):
        prompts[i, prompt_len - p :] = torch.randint(4, 100, (p,), generator=generator)
        prompt_mask[i, prompt_len - p :] = 1
        responses[i, :r] = torch.randint(4, 100, (r,), generator=generator)
        response_mask[i, :r] = 1
    attention_mask = torch.cat([prompt_mask, response_mask], dim=1)
    return DataProto.from_dict(
        tensors={
            "prompts": prompts,
            "responses": responses,
            "input_ids": torch.cat([prompts, responses], dim=1),
            "attention_mask": attention_mask,
            "position_ids": (attention_mask.cumsum(-1) - 1).clamp(min=0),
            "response_mask": response_mask,
        },
        meta_info=meta_info,
    )
