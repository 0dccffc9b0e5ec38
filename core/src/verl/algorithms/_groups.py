"""Group bookkeeping shared by the outcome-advantage estimators (see verl.algorithms.advantage).

Rows are grouped by ``index`` (the uid column); statistics use only *valid* rows (at least one mask slot)
and are computed in float64 (K01-K03).
"""

from __future__ import annotations

from typing import Any

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
    codes: dict[Any, int] = {}
    try:
        inv = [codes.setdefault(key, len(codes)) for key in items]
    except TypeError as err:
        raise TypeError(f"index entries must be hashable group ids (str/int), got {type(items[0]).__name__}") from err
    return torch.tensor(inv, dtype=torch.long, device=device), len(codes)


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


def _same_float(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """A floating mask in ``dtype`` (a product with it must stay in ``dtype``); bool and integer masks as they are:
    the product promotes them to the other operand's floating dtype on the fly, with no converted copy."""
    return mask.to(dtype) if mask.is_floating_point() and mask.dtype != dtype else mask


def masked_scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked score per row in float64, valid-row flag).

    ``score = sum(rewards * mask)`` per row (verl's), the product and the row sum in the rewards' dtype (exact for
    a 0/1 mask), returned as float64. One pass over ``(batch, response_len)`` for the product, one read for the sum
    and one of the mask for the valid flag; a row whose sum is not finite (a NaN or inf reward at a masked-out position times 0) is
    summed again over its valid positions only, so nothing outside the mask leaks in.
    """
    check_2d("token_level_rewards", token_level_rewards)
    check_2d("response_mask", response_mask, token_level_rewards)
    mask = _same_float(response_mask, token_level_rewards.dtype)
    # The row sum in the product's dtype (torch's cascade sum), then float64: summing with dtype=float64 converts
    # element by element and costs 10x more; a 0/1 outcome reward is summed exactly either way.
    scores = (token_level_rewards * mask).sum(dim=-1).to(torch.float64)
    valid = response_mask.sum(dim=-1) != 0  # masks are non-negative weights; about 3x cheaper than any()
    bad = ~torch.isfinite(scores)
    if bool(bad.any()):
        rows = bad.nonzero().squeeze(1)
        r, m = token_level_rewards[rows], mask[rows]
        zero = torch.zeros((), dtype=r.dtype, device=r.device)
        scores[rows] = torch.where(m != 0, r * m, zero).sum(dim=-1, dtype=torch.float64)
    return scores, valid


def broadcast(per_row: torch.Tensor, valid: torch.Tensor, like: torch.Tensor, response_mask: torch.Tensor):
    """``per_row`` (0 on invalid rows) times the mask, ``(batch, response_len)`` in ``like``'s dtype: one pass."""
    per_row = torch.where(valid, per_row, torch.zeros_like(per_row)).to(like.dtype)
    return per_row.unsqueeze(-1) * _same_float(response_mask, like.dtype)


def safe_ratio(num: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    return torch.where(denom > 0, num / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(num))
