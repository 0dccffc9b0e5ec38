"""Sequence packing (``model.use_remove_padding``): a padded micro-batch as one row without padding.

verl's remove-padding path (anatomy §5.4, ``verl/workers/utils/padding.py``) packs the real tokens of
every sequence of a micro-batch into one ``(1, total_tokens)`` row with per-sequence restarting position
ids, runs the model once over it (flash-attention varlen keeps the sequences apart) and maps the
per-token outputs back to the padded ``(bs, response_len)`` layout. Padding then costs nothing: no
matmul, no attention, no LM-head row is spent on a pad token.

Here the sequences are kept apart by :mod:`verl.engines.attention` (one causal attention per sequence);
this module only builds the packed inputs and scatters results back.
"""

from __future__ import annotations

import attrs
import torch


@attrs.frozen(kw_only=True)
class PackedBatch:
    """The real tokens of a micro-batch, back to back.

    Attributes:
        input_ids: ``(1, total_tokens)`` int64, row after row, padding removed.
        position_ids: ``(1, total_tokens)`` int64, each sequence's own positions (restarting at its start).
        cu_seq_lens: ``(num_rows + 1,)`` int32, cumulative sequence lengths (flash-attention varlen layout).
        max_len: longest sequence (tokens).
        logit_index: ``(response_tokens,)`` int64, the packed positions whose logits score the response
            tokens (position ``t`` scores token ``t + 1``), ordered row by row.
        labels: ``(response_tokens,)`` int64, the response tokens those logits score.
        response_mask: ``(bs, response_len)`` bool, where each scored token sits in the padded layout.
    """

    input_ids: torch.Tensor
    position_ids: torch.Tensor
    cu_seq_lens: torch.Tensor
    max_len: int
    logit_index: torch.Tensor
    labels: torch.Tensor
    response_mask: torch.Tensor

    @property
    def num_tokens(self) -> int:
        return int(self.input_ids.shape[1])

    def unpack(self, values: torch.Tensor) -> torch.Tensor:
        """Scatter per-response-token ``values`` ``(response_tokens,)`` to ``(bs, response_len)``, 0 elsewhere."""
        out = values.new_zeros(self.response_mask.shape)
        return out.masked_scatter(self.response_mask, values)


def pack_batch(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, responses: torch.Tensor
) -> PackedBatch | None:
    """Pack a left-padded-prompt / right-padded-response micro-batch (DESIGN §5 layout).

    Args:
        input_ids, attention_mask, position_ids: ``(bs, prompt_len + response_len)``.
        responses: ``(bs, response_len)``; the last ``response_len`` columns of ``input_ids``.

    Returns:
        The :class:`PackedBatch`, or None when some row's real tokens are not one contiguous run, or a row
        with response tokens has no prompt token (its first response token would have no logit): the
        caller then runs the padded forward, which handles any layout.
    """
    bs, width = attention_mask.shape
    resp_len = responses.shape[1]
    mask = attention_mask.bool()
    counts = mask.sum(-1)
    if bs == 0 or int(counts.sum()) == 0:
        return None
    first = mask.long().argmax(-1)
    last = width - 1 - mask.flip(-1).long().argmax(-1)
    present = counts > 0
    if bool((present & (last - first + 1 != counts)).any()):
        return None
    resp_mask = mask[:, width - resp_len :]
    resp_counts = resp_mask.sum(-1)
    prompt_counts = counts - resp_counts
    if bool(((resp_counts > 0) & (prompt_counts < 1)).any()):
        return None
    cu = torch.zeros(bs + 1, dtype=torch.int32, device=input_ids.device)
    cu[1:] = torch.cumsum(counts, 0)
    # Response token j of row i sits at packed position cu[i] + prompt_i + j; its logit is one earlier.
    base = (cu[:-1].long() + prompt_counts - 1).unsqueeze(-1)
    grid = base + torch.arange(resp_len, device=input_ids.device).unsqueeze(0)
    return PackedBatch(
        input_ids=input_ids[mask].unsqueeze(0),
        position_ids=position_ids[mask].unsqueeze(0),
        cu_seq_lens=cu,
        max_len=int(counts.max()),
        logit_index=grid[resp_mask],
        labels=responses[resp_mask],
        response_mask=resp_mask,
    )


def packed_forward_kwargs(packed: PackedBatch) -> dict[str, object]:
    """Keyword arguments of a HF causal-LM forward over ``packed`` (flash-attention's varlen names)."""
    return {
        "input_ids": packed.input_ids,
        "position_ids": packed.position_ids,
        "cu_seq_lens_q": packed.cu_seq_lens,
        "cu_seq_lens_k": packed.cu_seq_lens,
        "max_length_q": packed.max_len,
        "max_length_k": packed.max_len,
    }


def packed_token_plan(seq_lens: torch.Tensor, max_token_len: int) -> list[list[int]]:
    """Micro-batches of whole rows whose *real* tokens sum to at most ``max_token_len`` (packed cost).

    First-fit decreasing: rows longest first, each into the first micro-batch with room, so the plan has
    few, full micro-batches (verl's ``rearrange_micro_batches`` balances by the same per-token cost).

    Args:
        seq_lens: ``(bs,)`` real tokens per row (prompt + response).
        max_token_len: token budget per micro-batch (``ppo_max_token_len_per_gpu``).

    Returns:
        Index lists covering every row exactly once.

    Raises:
        ValueError: a single row is longer than the budget (raise the budget).
    """
    lens = [int(x) for x in seq_lens.tolist()]
    if lens and max(lens) > max_token_len:
        raise ValueError(
            f"a sequence of {max(lens)} tokens exceeds the token budget max_token_len={max_token_len}; "
            "raise *_max_token_len_per_gpu to at least max_prompt_length + max_response_length"
        )
    bins: list[list[int]] = []
    loads: list[int] = []
    for i in sorted(range(len(lens)), key=lambda i: -lens[i]):
        for b, load in enumerate(loads):
            if load + lens[i] <= max_token_len:
                bins[b].append(i)
                loads[b] += lens[i]
                break
        else:
            bins.append([i])
            loads.append(lens[i])
    return bins
