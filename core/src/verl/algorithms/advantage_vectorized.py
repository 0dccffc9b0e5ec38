"""Vectorized GRPO and RLOO outcome advantages (``grpo_vectorized``, ``rloo_vectorized``).

Same inputs and outputs as the estimators in :mod:`verl.algorithms.advantage`: ``token_level_rewards``
and ``response_mask`` are (batch, response_len), ``index`` holds one group id (uid) per row, and the
result is ``(advantages, returns)``, two equal (batch, response_len) tensors of the rewards' dtype
(float32 for integer/bool rewards), zero outside the mask.

Group statistics come from scatter/bincount over a factorised index (no Python loop over rows), in
float64. The group rules are those of the loop estimators (K01-K03): the score is the masked sum of
token rewards, a row whose mask is all zero leaves its group's statistics and gets advantage 0, and a
group whose valid scores are all equal gets exactly 0.

They differ from the loop versions only where verl's do:
  - ``grpo_vectorized`` equals ``grpo`` on every input (singleton group: mean 0, std 1);
  - ``rloo_vectorized`` gives 0 to a group of one, where the loop ``rloo`` keeps A = s.

Source: verl/trainer/ppo/core_algos.py (compute_grpo_vectorized_outcome_advantage,
compute_rloo_vectorized_outcome_advantage) and verl/utils/groupwise.py (as_torch_index, group_mean_std).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms._groups import broadcast, outcome_rows
from verl.algorithms.advantage import AdvantageEstimator
from verl.algorithms.registry import register_adv_est

__all__ = [
    "as_torch_index",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "group_mean_std",
]


def as_torch_index(index: Any, device: torch.device | str | None = None) -> torch.Tensor:
    """Factorise group labels into a (N,) ``torch.long`` tensor of codes 0..G-1.

    Integer tensors/arrays (and floats that are whole numbers) keep their numeric order; any other
    labels (uid strings, mixed objects) are factorised by ``np.unique``, falling back to their ``str``
    when they are not mutually comparable. Only equality of codes matters to the estimators.

    Raises:
        ValueError: ``index`` is None (the estimator needs the ``uid`` column).

    Source: verl/utils/groupwise.py:as_torch_index.
    """
    if index is None:
        raise ValueError("index (one group id per row, the 'uid' column) is required by this estimator")
    if isinstance(index, torch.Tensor):
        flat = index.reshape(-1)
        if flat.is_floating_point() and torch.equal(flat, torch.round(flat)):
            flat = flat.to(torch.long)
        if not flat.is_floating_point():
            return torch.unique(flat.to(torch.long), return_inverse=True)[1].to(device)
        index = flat.cpu().numpy()
    arr = np.asarray(index, dtype=object if not isinstance(index, np.ndarray) else None).reshape(-1)
    if arr.dtype != object and (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.bool_)):
        codes = np.unique(arr.astype(np.int64), return_inverse=True)[1]
    else:
        try:
            codes = np.unique(arr, return_inverse=True)[1]
        except TypeError:  # e.g. a mix of str and int labels: only their identity matters
            codes = np.unique(np.array([str(x) for x in arr], dtype=object), return_inverse=True)[1]
    return torch.from_numpy(codes.astype(np.int64).reshape(-1)).to(device)


@torch.no_grad()
def group_mean_std(
    scores: torch.Tensor, gidx: torch.Tensor, weights: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Per-group mean, unbiased std and count of ``scores`` (N,) under codes ``gidx`` (N,).

    ``weights`` (N,) 0/1 selects the rows that count (default: all). mean = Σ/n,
    std = sqrt(Σ(x − mean)² / max(n − 1, 1)); groups with n <= 1 get mean 0 and std 1 (verl's
    singleton convention). Everything is float64.

    Returns:
        (mean_g, std_g, count_g), each (G,) float64 with G = max(gidx) + 1.

    Raises:
        ValueError: ``scores`` and ``gidx`` differ in length.

    Source: verl/utils/groupwise.py:group_mean_std (called there with eps=0 by grpo_vectorized).
    """
    if scores.numel() != gidx.numel():
        raise ValueError(f"scores and gidx length mismatch: {scores.numel()} vs {gidx.numel()}")
    x = scores.reshape(-1).to(torch.float64)
    g = gidx.reshape(-1).to(torch.long)
    w = torch.ones_like(x) if weights is None else weights.reshape(-1).to(torch.float64)
    n_groups = int(g.max()) + 1 if g.numel() else 0
    count = torch.bincount(g, weights=w, minlength=n_groups)
    mean = torch.bincount(g, weights=x * w, minlength=n_groups) / count.clamp(min=1)
    centred = (x - mean[g]) * w
    var = torch.bincount(g, weights=centred * centred, minlength=n_groups) / (count - 1).clamp(min=1)
    single = count <= 1
    mean = torch.where(single, torch.zeros_like(mean), mean)
    std = torch.where(single, torch.ones_like(var), var.sqrt())
    return mean, std, count


def _all_equal(scores: torch.Tensor, gidx: torch.Tensor, valid: torch.Tensor, n_groups: int) -> torch.Tensor:
    """Per-row flag: every valid score of the row's group is the same value (exact, no rounding noise)."""
    hi = torch.full((n_groups,), -torch.inf, dtype=scores.dtype, device=scores.device)
    lo = torch.full((n_groups,), torch.inf, dtype=scores.dtype, device=scores.device)
    hi = hi.scatter_reduce(0, gidx, torch.where(valid, scores, -torch.inf), "amax")
    lo = lo.scatter_reduce(0, gidx, torch.where(valid, scores, torch.inf), "amin")
    return (hi == lo)[gidx]


def _prepare(token_level_rewards, response_mask, index):
    token_level_rewards, response_mask, owned, scores, valid = outcome_rows(token_level_rewards, response_mask)
    gidx = as_torch_index(index, device=scores.device)
    if gidx.numel() != scores.shape[0]:
        raise ValueError(f"index has {gidx.numel()} entries but the batch has {scores.shape[0]} rows")
    return token_level_rewards, response_mask, owned, scores, valid, gidx


def _tile(per_row: torch.Tensor, valid: torch.Tensor, like: torch.Tensor, response_mask: torch.Tensor, owned: bool):
    adv = broadcast(per_row, valid, like, response_mask, reuse_mask=owned)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_VECTORIZED)
@torch.no_grad()
def compute_grpo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO (Shao et al. 2024, arXiv:2402.03300) with vectorized group statistics.

    A_i = (s_i − mean_g)/(std_g + ε), unbiased std over the group's valid rows; Dr.GRPO
    (arXiv:2503.20783) A_i = s_i − mean_g when ``norm_adv_by_std_in_grpo`` is False. A group with one
    valid row uses mean 0 and std 1; a zero std (all scores equal) gives 0, never NaN, even with ε = 0.

    Args:
        token_level_rewards, response_mask: (batch, response_len).
        index: (batch,) group ids (uid): numpy array, list or tensor.
        epsilon: added to the std, default 1e-6.
        norm_adv_by_std_in_grpo: divide by the std (GRPO) or not (Dr.GRPO); like verl, taken from the
            argument, not from ``config``. Our driver passes ``algorithm.norm_adv_by_std_in_grpo`` here;
            verl's passes it to ``grpo`` only (so verl always divides here): a deliberate deviation that
            keeps ``grpo_vectorized`` == ``grpo`` with the flag off too.
        config: unused, accepted for the common signature.

    Returns:
        (advantages, returns): one tensor returned twice, as verl's, (batch, response_len).

    Raises:
        ValueError: bad shapes, missing index or index length mismatch.

    Source: verl/trainer/ppo/core_algos.py:compute_grpo_vectorized_outcome_advantage.
    """
    rewards, response_mask, owned, scores, valid, gidx = _prepare(token_level_rewards, response_mask, index)
    mean, std, count = group_mean_std(scores, gidx, valid)
    centred = scores - mean[gidx]
    equal = _all_equal(scores, gidx, valid, mean.numel()) & (count[gidx] > 1)
    centred = torch.where(equal, torch.zeros_like(centred), centred)
    if norm_adv_by_std_in_grpo:
        denom = std[gidx] + epsilon
        centred = torch.where(denom > 0, centred / torch.where(denom > 0, denom, 1.0), torch.zeros_like(centred))
    return _tile(centred, valid, rewards, response_mask, owned)


@register_adv_est(AdvantageEstimator.RLOO_VECTORIZED)
@torch.no_grad()
def compute_rloo_vectorized_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """RLOO (Ahmadian et al. 2024, arXiv:2402.14740), vectorized.

    A_i = (c·s_i − Σ_g s)/(c − 1) = s_i − mean of the group's other rows, c = valid rows of the group;
    a group with c <= 1 gets 0 (verl's vectorized convention; the loop ``rloo`` keeps s_i there).

    Args/Returns/Raises: as :func:`compute_grpo_vectorized_outcome_advantage` (``epsilon`` unused).

    Source: verl/trainer/ppo/core_algos.py:compute_rloo_vectorized_outcome_advantage.
    """
    rewards, response_mask, owned, scores, valid, gidx = _prepare(token_level_rewards, response_mask, index)
    w = valid.to(torch.float64)
    count = torch.bincount(gidx, weights=w)[gidx]
    total = torch.bincount(gidx, weights=scores * w)[gidx]
    adv = (count * scores - total) / (count - 1).clamp(min=1)
    equal = _all_equal(scores, gidx, valid, int(gidx.max()) + 1 if gidx.numel() else 0)
    adv = torch.where((count > 1) & ~equal, adv, torch.zeros_like(adv))
    return _tile(adv, valid, rewards, response_mask, owned)
