"""Rollout post-processing: masks, position ids and the output batch layout (DESIGN §5).

Every function here is pure tensor code so the padding rules (known failures K06, K07) can be
tested on hand-written inputs without a model.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


def compute_position_ids(attention_mask: torch.Tensor) -> torch.Tensor:
    """``clip(cumsum(attention_mask, -1) - 1, min=0)`` as int64, same shape as the mask.

    Left-padding slots get position 0, the first real token 0, then 1, 2, ... and the count
    continues through the response (K07). Source: verl ``verl/utils/model.py:compute_position_id_with_mask``.
    """
    return torch.clip(torch.cumsum(attention_mask.long(), dim=-1) - 1, min=0)


def response_mask_from_lengths(lengths: torch.Tensor, response_length: int) -> torch.Tensor:
    """``(bs, response_length)`` int64 mask with ``mask[i, t] = t < lengths[i]``.

    ``lengths`` (bs,) counts valid response tokens per row, EOS included.
    """
    steps = torch.arange(response_length, device=lengths.device)
    return (steps.unsqueeze(0) < lengths.unsqueeze(1)).long()


def get_response_mask(
    responses: torch.Tensor, eos_token_ids: int | Iterable[int], pad_token_id: int | None
) -> torch.Tensor:
    """Infer the response mask ``(bs, resp_len)`` int64 from right-padded response tokens alone.

    Rule (K06): a row is valid up to and including its first EOS token (any of ``eos_token_ids``);
    a row without EOS (stopped by length or a stop string) is valid up to its last non-pad token,
    so trailing pads are excluded. This stays correct when the pad id is itself an EOS id (K06c:
    eos {7, 8}, pad 8, ``[5, 8, 8, 8] -> [1, 1, 0, 0]``), unlike verl's ``get_response_mask``
    (``verl/utils/torch_functional.py``) which keeps every slot of a row without EOS.

    Ambiguity: a row without EOS whose genuine last tokens equal the pad id cannot be told apart
    from padding; the rollout engine therefore builds its mask from generated lengths
    (:func:`response_mask_from_lengths`) and this helper serves consumers that only have tokens.
    """
    if responses.dim() != 2:
        raise ValueError(f"responses must be (bs, resp_len), got shape {tuple(responses.shape)}")
    eos = torch.as_tensor(
        [eos_token_ids] if isinstance(eos_token_ids, int) else list(eos_token_ids),
        dtype=responses.dtype,
        device=responses.device,
    )
    resp_len = responses.shape[1]
    steps = torch.arange(resp_len, device=responses.device).expand_as(responses)
    is_eos = torch.isin(responses, eos)
    has_eos = is_eos.any(dim=1)
    first_eos = torch.where(is_eos, steps, resp_len).min(dim=1).values
    if pad_token_id is None:
        last_real = torch.full_like(first_eos, resp_len - 1)
    else:
        last_real = torch.where(responses != pad_token_id, steps, -1).max(dim=1).values
    end = torch.where(has_eos, first_eos, last_real)  # last valid index, -1 for an all-pad row
    return (steps <= end.unsqueeze(1)).long()


def build_rollout_batch(
    prompt_ids: torch.Tensor,
    prompt_mask: torch.Tensor,
    responses: torch.Tensor,
    lengths: torch.Tensor,
    pad_token_id: int,
    log_probs: torch.Tensor | None = None,
) -> dict[str, torch.Tensor]:
    """Assemble verl's rollout output keys from prompts and generated tokens.

    Args:
        prompt_ids: ``(bs, prompt_len)`` int64, left-padded.
        prompt_mask: ``(bs, prompt_len)`` 0/1.
        responses: ``(bs, resp_len)`` int64; slots at or after ``lengths`` are overwritten with the pad id.
        lengths: ``(bs,)`` valid response tokens per row (EOS included).
        pad_token_id: id written into response padding.
        log_probs: optional ``(bs, resp_len)``; zeroed on padding and returned as float32.

    Returns:
        ``prompts, responses, response_mask, input_ids, attention_mask, position_ids`` (int64;
        ``input_ids = [prompts | responses]``, ``attention_mask = [prompt_mask | response_mask]``,
        ``position_ids = clip(cumsum(attention_mask) - 1, 0)``) and ``rollout_log_probs`` when given.
    """
    resp_len = responses.shape[1]
    response_mask = response_mask_from_lengths(lengths.to(responses.device), resp_len)
    responses = responses.masked_fill(response_mask == 0, pad_token_id).long()
    attention_mask = torch.cat([prompt_mask.long(), response_mask], dim=1)
    out = {
        "prompts": prompt_ids.long(),
        "responses": responses,
        "response_mask": response_mask,
        "input_ids": torch.cat([prompt_ids.long(), responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": compute_position_ids(attention_mask),
    }
    if log_probs is not None:
        out["rollout_log_probs"] = log_probs.float().masked_fill(response_mask == 0, 0.0)
    return out
