"""Optimal Token Baseline advantages (``optimal_token_baseline``, ``tir_optimal_token_baseline``).

Instead of one baseline per response, every step t of a prompt group gets its own baseline
B_t = Σ_g G_t·W_t / (Σ_g W_t + ε), where G_t is the reward-to-go and W_t = Σ_{j<=t} w_j the
cumulative path-variance proxy with w_j = 1 − 2·π_j + Σ_v π_v² (π_j the probability of the sampled
token under the old policy, Σ_v π_v² the squared-probability mass over the vocabulary). With
rollout importance weights ρ the proxy is w_j·ρ_j². A_t = G_t − B_t.

Both need ``sum_pi_squared`` (batch, response_len), which verl's actor computes when
``actor.calculate_sum_pi_squared=true``. The training engines of this project do not compute it, so
selecting these estimators in a config is rejected at validation; the functions work when called
with the tensors (e.g. from a custom trainer).

Source: verl/trainer/ppo/core_algos.py (compute_optimal_token_baseline_advantage,
compute_multi_turn_optimal_token_baseline_advantage); https://yingru.notion.site/The-Optimal-Token-Baseline-399211a558b782cfa936014c0d42dfb8
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms._groups import check_2d, float_rewards
from verl.algorithms.advantage import AdvantageEstimator
from verl.algorithms.advantage_vectorized import as_torch_index
from verl.algorithms.registry import register_adv_est

__all__ = ["compute_multi_turn_optimal_token_baseline_advantage", "compute_optimal_token_baseline_advantage"]


def _inputs(token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights):
    rewards = float_rewards(token_level_rewards)
    check_2d("token_level_rewards", rewards)
    for name, t in (("response_mask", response_mask), ("old_log_probs", old_log_probs)):
        check_2d(name, t, rewards)
    if sum_pi_squared is None:
        raise ValueError(
            "optimal token baseline needs sum_pi_squared (batch, response_len): Σ_v π_v² of the old policy "
            "per response token (verl: actor.calculate_sum_pi_squared=true)"
        )
    check_2d("sum_pi_squared", sum_pi_squared, rewards)
    if rollout_is_weights is not None:
        check_2d("rollout_is_weights", rollout_is_weights, rewards)
    mask = (response_mask != 0).to(torch.float64)
    returns = (rewards.to(torch.float64) * mask).flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1])
    w = 1.0 - 2.0 * torch.exp(old_log_probs.to(torch.float64)) + sum_pi_squared.to(torch.float64)
    if rollout_is_weights is not None:
        w = w * rollout_is_weights.to(torch.float64) ** 2
    w_cumulative = (w * mask).cumsum(dim=-1)
    return rewards, mask, returns, w_cumulative


def _baselines(
    returns: torch.Tensor,
    w_cumulative: torch.Tensor,
    mask: torch.Tensor,
    index: Any,
    handle_zero_tail: bool,
    epsilon: float,
) -> torch.Tensor:
    """Per-step group baselines (rows, steps); 0 for a group of one and for rows without valid steps."""
    gidx = as_torch_index(index, device=returns.device)
    if gidx.numel() != returns.shape[0]:
        raise ValueError(f"index has {gidx.numel()} entries but the batch has {returns.shape[0]} rows")
    lengths = mask.sum(dim=-1)
    valid = lengths > 0
    baselines = torch.zeros_like(returns)
    for group in torch.unique(gidx[valid]).tolist():
        rows = torch.nonzero((gidx == group) & valid, as_tuple=True)[0]
        if rows.numel() == 1:  # a lone trajectory has no baseline: A = G
            continue
        m = mask[rows]
        num = (returns[rows] * w_cumulative[rows] * m).sum(dim=0)
        den = (w_cumulative[rows] * m).sum(dim=0) + epsilon
        baselines[rows] = (num / den).unsqueeze(0).expand(rows.numel(), -1)
        if handle_zero_tail:
            # Past the second-longest response only the longest one is left, and B_t would equal its own
            # G_t (A = 0): the unique longest response keeps its returns there instead.
            group_len = lengths[rows]
            ordered = torch.sort(group_len).values
            longest, second = int(ordered[-1]), int(ordered[-2])
            at_max = torch.nonzero(group_len == longest, as_tuple=True)[0]
            if at_max.numel() == 1 and longest > second:
                baselines[rows[at_max[0]], second:] = 0.0
    return baselines


@register_adv_est(AdvantageEstimator.OPTIMAL_TOKEN_BASELINE)
@torch.no_grad()
def compute_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline over response positions (see the module docstring for the formula).

    Rows are grouped by ``index``; rows whose mask is all zero are left out of their group (K03).
    With ``handle_zero_tail`` the unique longest response of a group gets baseline 0 beyond the
    second-longest length.

    Args:
        token_level_rewards, response_mask: (batch, response_len).
        index: (batch,) group ids (uid).
        old_log_probs: (batch, response_len) log π_old of the sampled tokens (nats).
        sum_pi_squared: (batch, response_len) Σ_v π_old(v)², in [0, 1].
        rollout_is_weights: optional (batch, response_len) IS weights ρ; W uses w·ρ².
        handle_zero_tail: see above (default True). epsilon: added to the denominator (1e-8).

    Returns:
        (advantages, returns): A = (G − B)·mask and the reward-to-go G·mask, (batch, response_len),
        in the rewards' dtype. (verl leaves G unmasked at masked slots inside a response.)

    Raises:
        ValueError: bad shapes, sum_pi_squared missing, index length mismatch.

    Source: verl/trainer/ppo/core_algos.py:compute_optimal_token_baseline_advantage.
    """
    rewards, mask, returns, w_cum = _inputs(
        token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights
    )
    baselines = _baselines(returns, w_cum, mask, index, handle_zero_tail, epsilon)
    advantages = ((returns - baselines) * mask).to(rewards.dtype)
    return advantages, (returns * mask).to(rewards.dtype)


@register_adv_est(AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE)
@torch.no_grad()
def compute_multi_turn_optimal_token_baseline_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    old_log_probs: torch.Tensor,
    sum_pi_squared: torch.Tensor,
    rollout_is_weights: torch.Tensor | None = None,
    handle_zero_tail: bool = True,
    epsilon: float = 1e-8,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Optimal Token Baseline for multi-turn / tool-integrated responses.

    Like :func:`compute_optimal_token_baseline_advantage`, but steps are counted over each row's
    *valid* tokens only: the k-th generated token of every response of a group shares one baseline,
    wherever tool or observation tokens (mask 0) put it in the padded row. G and W are computed on the
    padded row first (masked slots carry them unchanged), then compacted, baselined and scattered back.
    On responses without interior masked slots it equals the plain OTB.

    Args/Raises: as :func:`compute_optimal_token_baseline_advantage`.

    Returns:
        (advantages, returns) (batch, response_len), rewards dtype; advantages zero outside the mask.

    Source: verl/trainer/ppo/core_algos.py:compute_multi_turn_optimal_token_baseline_advantage.
    """
    rewards, mask, returns, w_cum = _inputs(
        token_level_rewards, response_mask, old_log_probs, sum_pi_squared, rollout_is_weights
    )
    keep = mask.bool()
    lengths = keep.sum(dim=-1)
    width = int(lengths.max()) if lengths.numel() else 0
    steps = torch.arange(width, device=mask.device).unsqueeze(0)
    compact_mask = (steps < lengths.unsqueeze(-1)).to(torch.float64)
    compact_returns = torch.zeros((mask.shape[0], width), dtype=torch.float64, device=mask.device)
    compact_w = torch.zeros_like(compact_returns)
    # Boolean-mask selection walks rows in order, so the k-th selected value of a row is its k-th valid step.
    compact_returns[compact_mask.bool()] = returns[keep]
    compact_w[compact_mask.bool()] = w_cum[keep]
    baselines = _baselines(compact_returns, compact_w, compact_mask, index, handle_zero_tail, epsilon)
    advantages = torch.zeros_like(returns)
    advantages[keep] = (compact_returns - baselines)[compact_mask.bool()]
    return advantages.to(rewards.dtype), (returns * mask).to(rewards.dtype)
