"""Aggregate a per-token loss matrix into the scalar that is back-propagated.

The normalisers are *global*: pass the mini-batch totals (``batch_num_tokens`` = valid tokens of the whole
mini-batch summed over data-parallel ranks, ``global_batch_size`` = non-empty rows of the whole mini-batch)
and sum the micro-batch losses; the sum equals one pass over the mini-batch whatever the split (K04).
Without them the local batch is the whole batch. ``· dp_size`` undoes the gradient *averaging* of
FSDP/DDP so that the reduced gradient is that of the global mean.

Empty rows (K08, pinned by tests): a row whose mask is all zero contributes 0 and gets zero gradient,
and it is *left out* of every sequence count; so seq-mean-token-mean of [[0.5, 0.5], [0.7, 0.7]] with
mask [[1, 1], [0, 0]] is 0.5, not 0.25. When every mask slot is zero, every mode returns 0 (finite, zero
gradient). Use :func:`compute_global_batch_info` to count the normalisers the same way.

Source: verl/trainer/ppo/core_algos.py:agg_loss, verl/workers/utils/losses.py:ppo_loss.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch

from verl.algorithms.utils import masked_sum

__all__ = ["LOSS_AGG_MODES", "agg_loss", "compute_global_batch_info", "split_global_batch_info"]

LOSS_AGG_MODES = (
    "token-mean",
    "token-sum",
    "seq-mean-token-sum",
    "seq-mean-token-mean",
    "seq-mean-token-sum-norm",
)
_GLOBAL_KEYS = ("dp_size", "batch_num_tokens", "global_batch_size", "loss_scale_factor")


def _safe_div(num: torch.Tensor, denom: Any) -> torch.Tensor:
    """num / denom, with a zero denominator meaning "nothing to average": the result is num (which is 0)."""
    denom_t = torch.as_tensor(denom, dtype=num.dtype, device=num.device)
    return num / torch.where(denom_t != 0, denom_t, torch.ones_like(denom_t))


def _check_count(name: str, value: Any) -> None:
    if isinstance(value, (int, float)) and value < 0:
        raise ValueError(f"agg_loss: {name} must be >= 0, got {value}")


def agg_loss(
    loss_mat: torch.Tensor,
    loss_mask: torch.Tensor,
    loss_agg_mode: str,
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> torch.Tensor:
    """Aggregate ``loss_mat`` (batch, response_len) to a scalar.

    Modes (m = mask, L_i = Σ_t m_it, rows with L_i = 0 excluded from every count):
      - ``token-mean``: Σ m·ℓ / batch_num_tokens · dp_size (default batch_num_tokens: local Σ m).
      - ``token-sum``: Σ m·ℓ · dp_size.
      - ``seq-mean-token-sum``: Σ_i Σ_t m·ℓ / global_batch_size · dp_size (default: local non-empty rows).
      - ``seq-mean-token-mean``: Σ_i [Σ_t m·ℓ / L_i] / global_batch_size · dp_size.
      - ``seq-mean-token-sum-norm``: seq-mean-token-sum / loss_scale_factor (default: response_len =
        ``loss_mask.shape[-1]``), Dr.GRPO's constant normaliser.

    Args:
        loss_mat: (batch, response_len) float per-token loss.
        loss_mask: (batch, response_len) 0/1 mask (response_mask).
        loss_agg_mode: one of :data:`LOSS_AGG_MODES`.
        dp_size: data-parallel world size the gradient is averaged over (int ≥ 1).
        batch_num_tokens: global valid-token count of the mini-batch (required when dp_size > 1 for token-mean).
        global_batch_size: global non-empty row count of the mini-batch (required when dp_size > 1 for seq modes).
        loss_scale_factor: constant divisor for seq-mean-token-sum-norm (> 0).

    Returns:
        0-dim tensor of ``loss_mat.dtype``; finite and 0 with zero gradient for an all-zero mask (K08).

    Raises:
        ValueError: unknown mode (lists the modes), shape mismatch, dp_size < 1, a missing global normaliser
            with dp_size > 1, a negative count, or loss_scale_factor <= 0.

    Source: verl/trainer/ppo/core_algos.py:agg_loss; Dr.GRPO (arXiv:2503.20783) for the -norm mode.
    """
    if loss_agg_mode not in LOSS_AGG_MODES:
        raise ValueError(f"Invalid loss_agg_mode {loss_agg_mode!r}; supported modes: {list(LOSS_AGG_MODES)}")
    if loss_mat.shape != loss_mask.shape:
        raise ValueError(
            f"agg_loss: loss_mat shape {tuple(loss_mat.shape)} != loss_mask shape {tuple(loss_mask.shape)}"
        )
    if not isinstance(dp_size, int) or dp_size < 1:
        raise ValueError(f"agg_loss: dp_size must be an int >= 1, got {dp_size!r}")
    _check_count("batch_num_tokens", batch_num_tokens)
    _check_count("global_batch_size", global_batch_size)

    if loss_agg_mode == "token-mean":
        if batch_num_tokens is None:
            if dp_size > 1:
                raise ValueError(
                    "agg_loss(token-mean): batch_num_tokens (valid tokens of the mini-batch summed over all DP ranks) "
                    "is required when dp_size > 1"
                )
            batch_num_tokens = loss_mask.to(loss_mat.dtype).sum()
        return _safe_div(masked_sum(loss_mat, loss_mask), batch_num_tokens) * dp_size

    if loss_agg_mode == "token-sum":
        return masked_sum(loss_mat, loss_mask) * dp_size

    row_len = loss_mask.to(loss_mat.dtype).sum(dim=-1)
    row_sum = masked_sum(loss_mat, loss_mask, axis=-1)
    nonempty = row_len > 0
    if loss_agg_mode == "seq-mean-token-mean":
        # exact per-row mean; verl divides by (len + 1e-8), identical in fp32 and only there to dodge 0/0
        row_loss = row_sum / torch.where(nonempty, row_len, torch.ones_like(row_len))
    else:
        row_loss = row_sum
    row_loss = torch.where(nonempty, row_loss, torch.zeros_like(row_loss))
    if global_batch_size is None:
        if dp_size > 1:
            raise ValueError(
                f"agg_loss({loss_agg_mode}): global_batch_size (non-empty rows of the mini-batch over all DP ranks) "
                "is required when dp_size > 1"
            )
        global_batch_size = nonempty.sum()
    loss = _safe_div(row_loss.sum(), global_batch_size) * dp_size
    if loss_agg_mode == "seq-mean-token-sum-norm":
        if loss_scale_factor is None:
            loss_scale_factor = loss_mask.shape[-1]
        if loss_scale_factor <= 0:
            raise ValueError(
                f"agg_loss(seq-mean-token-sum-norm): loss_scale_factor must be > 0, got {loss_scale_factor}; "
                "leave it None to use the response width"
            )
        loss = loss / loss_scale_factor
    return loss


def compute_global_batch_info(loss_mask: torch.Tensor, dp_size: int = 1) -> dict[str, Any]:
    """Normalisers of :func:`agg_loss` for a whole mini-batch, counted the way agg_loss counts them.

    Call it on the full mini-batch mask *before* splitting into micro-batches (and all-reduce-sum the two
    counts over data-parallel ranks when dp_size > 1), then pass ``**info`` to agg_loss for each
    micro-batch; summing the micro-batch losses gives the mini-batch loss (K04).

    Args:
        loss_mask: (batch, response_len) 0/1 mask of the whole (local) mini-batch.
        dp_size: data-parallel world size.

    Returns:
        ``{"dp_size": int, "batch_num_tokens": int, "global_batch_size": int}``; global_batch_size counts
        non-empty rows only (K08).
    """
    row_len = loss_mask.to(torch.float64).sum(dim=-1)
    return {
        "dp_size": int(dp_size),
        "batch_num_tokens": int(round(float(row_len.sum()))),
        "global_batch_size": int((row_len > 0).sum()),
    }


def split_global_batch_info(info: Mapping[str, Any] | Any | None) -> dict[str, Any]:
    """Validate a ``global_batch_info`` mapping (or attribute object) into agg_loss keyword arguments.

    Raises:
        ValueError: an unknown key (lists the allowed ones).
    """
    if info is None:
        return {}
    items = dict(info) if isinstance(info, Mapping) else {k: getattr(info, k) for k in _GLOBAL_KEYS if hasattr(info, k)}
    unknown = sorted(set(items) - set(_GLOBAL_KEYS))
    if unknown:
        raise ValueError(f"global_batch_info has unknown keys {unknown}; allowed: {list(_GLOBAL_KEYS)}")
    return {k: v for k, v in items.items() if v is not None}
