"""Micro-batch planning for training engines: fixed size or a token budget.

A plan is a list of row-index lists covering every row exactly once; outputs computed per
micro-batch are put back in the original row order with :func:`restore_order`. With a
token budget (verl's ``use_dynamic_bsz`` + ``*_max_token_len_per_gpu``) the cost of a
micro-batch is what a padded forward pays: ``rows * width``, where the width after
trimming the padding shared by all rows (:func:`trim_padding`) is the longest prompt plus
the longest response. Rows are sorted by length first so
similar lengths share a micro-batch, which keeps that padded cost close to the real token
count. Mirrors the intent of ``verl/utils/seqlen_balancing.py:rearrange_micro_batches``.
"""

from __future__ import annotations

from typing import Any

import torch


def fixed_size_plan(num_rows: int, micro_batch_size: int) -> list[list[int]]:
    """Consecutive micro-batches of ``micro_batch_size`` rows (the last may be shorter).

    Raises:
        ValueError: if ``micro_batch_size < 1``.
    """
    if micro_batch_size is None or micro_batch_size < 1:
        raise ValueError(f"micro-batch size must be >= 1, got {micro_batch_size!r}")
    return [list(range(i, min(i + micro_batch_size, num_rows))) for i in range(0, num_rows, micro_batch_size)]


def token_budget_plan(
    seq_lens: torch.Tensor, max_token_len: int, *, response_lens: torch.Tensor | None = None
) -> list[list[int]]:
    """Group rows so each micro-batch's padded cost ``rows * width`` is ``<= max_token_len``.

    Args:
        seq_lens: ``(bs,)`` int, real tokens per row (prompt + response).
        max_token_len: the token budget per micro-batch (``ppo_max_token_len_per_gpu``).
        response_lens: ``(bs,)`` int, real response tokens per row. With it, the width of a
            micro-batch is what :func:`trim_padding` leaves: the longest prompt plus the longest
            response (prompts are left-padded, responses right-padded). Without it, the width is
            the longest row.

    Returns:
        Index lists; rows sorted longest-first inside the plan, every row exactly once.

    Raises:
        ValueError: if a single row is longer than the budget (raise the budget).
    """
    lens = [int(x) for x in seq_lens.tolist()]
    resp = [int(x) for x in response_lens.tolist()] if response_lens is not None else [0] * len(lens)
    prompt = [total - r for total, r in zip(lens, resp, strict=True)]
    if lens and max(lens) > max_token_len:
        raise ValueError(
            f"a sequence of {max(lens)} tokens exceeds the token budget max_token_len={max_token_len}; "
            "raise *_max_token_len_per_gpu to at least max_prompt_length + max_response_length"
        )
    order = sorted(range(len(lens)), key=lambda i: -lens[i])
    plan: list[list[int]] = []
    current: list[int] = []
    max_p = max_r = 0
    for i in order:
        new_p, new_r = max(max_p, prompt[i]), max(max_r, resp[i])
        if current and (new_p + new_r) * (len(current) + 1) > max_token_len:
            plan.append(current)
            current, new_p, new_r = [], prompt[i], resp[i]
        current.append(i)
        max_p, max_r = new_p, new_r
    if current:
        plan.append(current)
    return plan


def restore_order(plan: list[list[int]], outputs: list[torch.Tensor]) -> torch.Tensor:
    """Concatenate per-micro-batch ``outputs`` (dim 0) and undo the plan's row permutation."""
    flat = torch.cat(outputs, dim=0)
    index = torch.tensor([i for group in plan for i in group], dtype=torch.long)
    result = torch.empty_like(flat)
    result[index] = flat
    return result


def trim_padding(
    input_ids: torch.Tensor, attention_mask: torch.Tensor, position_ids: torch.Tensor, response_len: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, int, int]:
    """Drop the left-pad columns and right-pad columns that every row of a micro-batch shares.

    Exact: those columns are masked for every row, so removing them changes no logit at a
    real position (positions are precomputed from the full mask).

    Args:
        input_ids, attention_mask, position_ids: ``(bs, prompt_len + response_len)``.
        response_len: width of the response part.

    Returns:
        ``(input_ids, attention_mask, position_ids, left, kept_response_len)`` where ``left``
        is the number of prompt columns dropped and ``kept_response_len`` the response width
        that remains (right-trimmed responses must be padded back by the caller).
    """
    total = attention_mask.shape[1]
    prompt_len = total - response_len
    col_has_token = attention_mask.bool().any(dim=0)
    prompt_cols = col_has_token[:prompt_len]
    # Keep at least the last prompt column: it produces the logit of the first response token.
    left = int(prompt_cols.long().argmax()) if bool(prompt_cols.any()) else prompt_len - 1
    resp_cols = col_has_token[prompt_len:]
    kept_resp = int(resp_cols.nonzero().max()) + 1 if bool(resp_cols.any()) else 0
    end = prompt_len + kept_resp
    return (
        input_ids[:, left:end],
        attention_mask[:, left:end],
        position_ids[:, left:end],
        left,
        kept_resp,
    )


def mini_batch_schedule(
    num_rows: int, settings: Any, *, global_step: int, old_log_prob_source: str | None = None
) -> list[torch.Tensor]:
    """Row indices of each optimizer step of one ``train_batch`` call: ``ppo_epochs`` passes over the batch in
    mini-batches of ``settings.mini_batch_size`` rows, reshuffled per epoch when ``settings.shuffle``.

    The shuffle is seeded by ``data_loader_seed + 1_000_003 * global_step + epoch``, so every engine (and every
    rank) following this schedule visits the rows in the same order (verl: ``ppo_epochs`` x ``shuffle`` in
    ``dp_actor.update_policy``).

    Args:
        num_rows: rows of the batch.
        settings: an :class:`~verl.engines.reference.training.EngineSettings` (``mini_batch_size``, ``ppo_epochs``,
            ``shuffle``, ``data_loader_seed``).
        global_step: training steps done so far (``train_batch`` calls).
        old_log_prob_source: the batch's ``meta_info["old_log_prob_source"]``; ``"on_policy"`` (the update reuses
            the forward's own log-probs as old ones) needs exactly one optimizer step.

    Returns:
        one int64 index tensor per optimizer step, in order.

    Raises:
        ValueError: rows not divisible into mini-batches, or on-policy reuse with more than one step.
    """
    mini = min(int(settings.mini_batch_size), num_rows)
    if mini < 1 or num_rows % mini:
        raise ValueError(f"batch of {num_rows} rows is not divisible into mini-batches of {mini} rows")
    epochs = int(settings.ppo_epochs)
    if old_log_prob_source == "on_policy" and (epochs != 1 or mini != num_rows):
        raise ValueError(
            f"on-policy log-prob reuse needs one optimizer step per batch, but this update takes "
            f"{epochs} epoch(s) of {num_rows // mini} mini-batch(es): set "
            "actor_rollout_ref.actor.reuse_on_policy_log_prob=false or ppo_mini_batch_size=train_batch_size"
        )
    steps: list[torch.Tensor] = []
    for epoch in range(epochs):
        order = torch.arange(num_rows)
        if settings.shuffle:
            gen = torch.Generator().manual_seed(int(settings.data_loader_seed) + 1_000_003 * global_step + epoch)
            order = torch.randperm(num_rows, generator=gen)
        steps.extend(order[start : start + mini] for start in range(0, num_rows, mini))
    return steps
