"""Group bookkeeping shared by the outcome-advantage estimators (see verl.algorithms.advantage).

Rows are grouped by ``index`` (the uid column); statistics use only *valid* rows (at least one mask slot)
and are computed in float64 (K01-K03).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np
import torch


def check_2d(name: str, t: torch.Tensor, like: torch.Tensor | None = None) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be (batch, response_len), got shape {tuple(t.shape)}")
    if like is not None and t.shape != like.shape:
        raise ValueError(f"{name} shape {tuple(t.shape)} != token_level_rewards shape {tuple(like.shape)}")


def float_rewards(token_level_rewards: torch.Tensor) -> torch.Tensor:
    """Integer or bool rewards promoted to float32; floating rewards returned unchanged.

    Advantages are fractional (e.g. ±0.7071 for scores [1, 0]), so computing them in an integer dtype
    would silently truncate them to 0; every estimator therefore calls this first.
    """
    if token_level_rewards.is_floating_point() or token_level_rewards.is_complex():
        return token_level_rewards
    return token_level_rewards.to(torch.float32)


def mask_f(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return mask.to(dtype)


def group_ids(index: Any, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
    """Map arbitrary hashable group ids to 0..G-1 in order of first appearance."""
    if index is None:
        raise ValueError("index (one group id per row, the 'uid' column) is required by this estimator")
    items = index.tolist() if hasattr(index, "tolist") else list(index)
    if len(items) != batch_size:
        raise ValueError(f"index has {len(items)} entries but the batch has {batch_size} rows")
    try:
        codes = {key: code for code, key in enumerate(dict.fromkeys(items))}
    except TypeError as err:
        raise TypeError(f"index entries must be hashable group ids (str/int), got {type(items[0]).__name__}") from err
    # np.fromiter + from_numpy: torch.tensor(list) costs about as much as the factorising itself
    inv = np.fromiter(map(codes.__getitem__, items), dtype=np.int64, count=len(items))
    return torch.from_numpy(inv).to(device), len(codes)


class Groups:
    """Per-row view of per-group statistics over the *valid* rows (rows with at least one mask slot)."""

    def __init__(self, scores: torch.Tensor, valid: torch.Tensor, index: Any) -> None:
        device = scores.device
        self.gid, g = group_ids(index, scores.shape[0], device)
        w = valid.to(torch.float64)
        zeros = torch.zeros(g, dtype=torch.float64, device=device)
        self.size_all = zeros.index_add(0, self.gid, torch.ones_like(w))[self.gid]
        cnt = zeros.index_add(0, self.gid, w)
        mean = zeros.index_add(0, self.gid, scores * w) / cnt.clamp(min=1)
        dev2 = ((scores - mean[self.gid]) * w) ** 2
        var = zeros.index_add(0, self.gid, dev2) / (cnt - 1).clamp(min=1)
        var = torch.where(cnt > 1, var, torch.zeros_like(var))
        neg_inf = torch.full_like(zeros, -torch.inf)
        hi = neg_inf.scatter_reduce(0, self.gid, torch.where(valid, scores, -torch.inf), "amax")
        lo = (-neg_inf).scatter_reduce(0, self.gid, torch.where(valid, scores, torch.inf), "amin")
        self.count = cnt[self.gid]
        self.mean = mean[self.gid]
        self.std = var.sqrt()[self.gid]
        self.all_equal = (hi == lo)[self.gid]
        self.n_groups = g


class OutcomeRows(NamedTuple):
    """An outcome estimator's checked inputs and per-row scores (see :func:`outcome_rows`)."""

    rewards: torch.Tensor  # (batch, response_len), floating (integer/bool rewards promoted to float32)
    mask: torch.Tensor  # (batch, response_len), the rewards' dtype
    mask_is_copy: bool  # ``mask`` is this call's own conversion: broadcast() may write into it
    scores: torch.Tensor  # (batch,) float64, sum(rewards * mask) per row
    valid: torch.Tensor  # (batch,) bool, the row's mask sums to non-zero


# Rows per block of the CPU pass: about this many bytes of each (rows, response_len) operand per torch thread,
# so that a block's converted mask and product are still in each core's L2 cache when the next op reads them.
# Measured at 1024 x 1024 on a 2-core AVX-512 Xeon (GRPO, ms; whole-tensor ops 1.77 / 1.10): per-thread 64 KB
# 1.90 / 1.92, 128 KB 1.61 / 1.94, 256 KB 1.53 / 1.03, 1 MB 1.84 / 1.06 with 1 / 2 threads.
_BLOCK_BYTES_PER_THREAD = 256 << 10


def outcome_rows(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> OutcomeRows:
    """Checked inputs and masked per-row scores for an outcome estimator (K01-K03).

    ``rewards`` go through :func:`float_rewards`; ``mask`` is ``response_mask`` in the rewards' dtype (converted
    once, and reused by :func:`broadcast`: an int64 or bool mask promoted inside each product costs more than one
    conversion plus same-dtype products); ``score = sum(rewards * mask)`` per row (verl's), the product and the
    row sum in the rewards' dtype (exact for a 0/1 mask), returned as float64; ``valid`` = the row's mask sums to
    a non-zero value (masks are non-negative weights). A row whose sum is not finite (a NaN or inf reward at a
    masked-out position times 0) is summed again over its valid positions only, so nothing outside the mask
    leaks in.

    On a CPU the conversion, product and row sums run block by block (about 256 KB of rows per thread, one reused
    product buffer): each block's converted mask is read back from cache, and no full-size temporary is
    allocated (its page faults cost about as much as the product). Same per-element products, same row sums:
    bit-identical to the whole-tensor ops.

    Raises:
        ValueError: either tensor is not (batch, response_len), or their shapes differ.
    """
    rewards = float_rewards(token_level_rewards)
    check_2d("token_level_rewards", rewards)
    check_2d("response_mask", response_mask, rewards)
    convert = response_mask.dtype != rewards.dtype
    block_bytes = _BLOCK_BYTES_PER_THREAD * torch.get_num_threads()
    if rewards.device.type == "cpu" and rewards.numel() * rewards.element_size() > 2 * block_bytes:
        mask, sums, counts = _blocked_rows(rewards, response_mask, convert, block_bytes)
    else:
        mask = response_mask.to(rewards.dtype)  # the tensor itself when it already has that dtype
        sums, counts = (rewards * mask).sum(dim=-1), mask.sum(dim=-1)
    # The row sum in the rewards' dtype (torch's cascade sum), then float64: summing with dtype=float64 converts
    # element by element and costs 10x more; a 0/1 outcome reward is summed exactly either way.
    scores = sums.to(torch.float64)
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        rows = bad.nonzero().squeeze(1)
        r, m = rewards[rows], mask[rows]
        zero = torch.zeros((), dtype=r.dtype, device=r.device)
        scores[rows] = torch.where(m != 0, r * m, zero).sum(dim=-1, dtype=torch.float64)
    return OutcomeRows(rewards, mask, convert, scores, counts != 0)


def _blocked_rows(
    rewards: torch.Tensor, response_mask: torch.Tensor, convert: bool, block_bytes: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """(mask in the rewards' dtype, row sums of rewards * mask, row sums of the mask), block by block (CPU)."""
    rows, width = rewards.shape
    block = max(1, block_bytes // max(1, width * rewards.element_size()))
    mask = torch.empty_like(rewards) if convert else response_mask
    product = torch.empty(min(block, rows), width, dtype=rewards.dtype)
    sums = torch.empty(rows, dtype=rewards.dtype)
    counts = torch.empty(rows, dtype=rewards.dtype)
    for start in range(0, rows, block):
        stop = min(start + block, rows)
        part = mask[start:stop]
        if convert:
            part.copy_(response_mask[start:stop])
        buf = product[: stop - start]
        torch.mul(rewards[start:stop], part, out=buf)
        torch.sum(buf, dim=-1, out=sums[start:stop])
        torch.sum(part, dim=-1, out=counts[start:stop])
    return mask, sums, counts


def broadcast(
    per_row: torch.Tensor,
    valid: torch.Tensor,
    like: torch.Tensor,
    response_mask: torch.Tensor,
    reuse_mask: bool = False,
) -> torch.Tensor:
    """``per_row`` (batch,) (0 on invalid rows) times the mask: ``(batch, response_len)`` in ``like``'s dtype, one
    pass. ``reuse_mask=True`` (the mask is the estimator's own converted copy, see :func:`outcome_rows`) writes
    the result into the mask's storage when its dtype matches: no fresh (batch, response_len) allocation, whose
    page faults cost as much as the product itself on a CPU."""
    per_row = torch.where(valid, per_row, torch.zeros_like(per_row)).to(like.dtype)
    if reuse_mask and response_mask.dtype == like.dtype:
        return response_mask.mul_(per_row.unsqueeze(-1))
    return per_row.unsqueeze(-1) * response_mask.to(like.dtype)


def safe_ratio(num: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    return torch.where(denom > 0, num / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(num))
