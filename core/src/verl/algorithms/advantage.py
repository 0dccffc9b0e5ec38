"""Advantage estimators under verl's names and keyword signatures (the DataProto driver is in driver.py).

Shapes: ``token_level_rewards``, ``response_mask``, ``values`` are (batch, response_len) float tensors
(the mask may be bool/int/float 0-1); ``index`` is a length-batch array of hashable group ids (the
``uid`` column, numpy object/str/int array or list). Every estimator returns ``(advantages, returns)``,
two (batch, response_len) tensors of the rewards' dtype, zero outside ``response_mask``. Integer or bool
rewards are promoted to float32 first (advantages are fractional; an integer dtype would truncate them
to 0 silently), so their outputs are float32. Nothing here
needs gradients; everything runs under ``torch.no_grad``.

Rules shared by every group-baseline estimator (grpo, grpo_passk, rloo, reinforce_plus_plus_baseline,
opo, gpg), pinned by tests:
  - statistics are per ``index`` group, never batch-wide (K01);
  - the sequence score is the masked sum of token rewards, so rewards outside the mask are ignored, and
    a row whose mask is all zero leaves its group's statistics and gets advantage 0 (K03);
  - a group with one (remaining) row uses mean 0 and std 1, verl's convention (K02a);
  - a group whose scores are all equal gets exactly 0, and a zero std is guarded explicitly, so
    epsilon = 0 never yields NaN or inf (K02b/c).
Group statistics are computed in float64. Sources: verl/trainer/ppo/core_algos.py and the papers cited
per function.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

import numpy as np
import torch

from verl.algorithms._config import cfg_get
from verl.algorithms._groups import (
    Groups,
    broadcast,
    check_2d,
    float_rewards,
    mask_f,
    outcome_rows,
    safe_ratio,
)
from verl.algorithms.registry import register_adv_est
from verl.algorithms.utils import masked_whiten

__all__ = [
    "AdvantageEstimator",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rloo_outcome_advantage",
]


class AdvantageEstimator(str, Enum):
    """Built-in estimator names (``algorithm.adv_estimator``); plain strings work everywhere too."""

    GAE = "gae"
    GRPO = "grpo"
    GRPO_PASSK = "grpo_passk"
    RLOO = "rloo"
    REINFORCE_PLUS_PLUS = "reinforce_plus_plus"
    REINFORCE_PLUS_PLUS_BASELINE = "reinforce_plus_plus_baseline"
    REMAX = "remax"
    OPO = "opo"
    GPG = "gpg"
    RLOO_VECTORIZED = "rloo_vectorized"
    GRPO_VECTORIZED = "grpo_vectorized"
    OPTIMAL_TOKEN_BASELINE = "optimal_token_baseline"
    TIR_OPTIMAL_TOKEN_BASELINE = "tir_optimal_token_baseline"
    GDPO = "gdpo"


# ------------------------------------------------------------------------------------------- estimators
@register_adv_est(AdvantageEstimator.GAE)
@torch.no_grad()
def compute_gae_advantage_return(
    token_level_rewards: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    gamma: float | torch.Tensor,
    lam: float | torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised Advantage Estimation (Schulman et al. 2016, arXiv:1506.02438).

    Reverse loop over t: δ_t = r_t + γ·V_{t+1} − V_t, A_t = δ_t + γλ·A_{t+1}. Masked slots (padding or
    tool/observation tokens) carry ``nextvalue`` and the running advantage through unchanged, so their
    rewards and values are ignored. returns = A + V (before whitening); advantages = masked_whiten(A).

    Args:
        token_level_rewards, values, response_mask: (batch, response_len).
        gamma: discount γ. lam: GAE λ.

    Returns:
        (advantages, returns), (batch, response_len), zero outside the mask.

    Raises:
        ValueError: shapes differ or are not 2-D.

    Source: verl/trainer/ppo/core_algos.py:compute_gae_advantage_return.
    """
    token_level_rewards = float_rewards(token_level_rewards)
    check_2d("token_level_rewards", token_level_rewards)
    check_2d("values", values, token_level_rewards)
    check_2d("response_mask", response_mask, token_level_rewards)
    valid = response_mask != 0
    next_value = torch.zeros_like(values[:, 0])
    last_gae = torch.zeros_like(values[:, 0])
    reversed_adv = []
    for t in reversed(range(token_level_rewards.shape[-1])):
        delta = token_level_rewards[:, t] + gamma * next_value - values[:, t]
        gae_t = delta + gamma * lam * last_gae
        next_value = torch.where(valid[:, t], values[:, t], next_value)
        last_gae = torch.where(valid[:, t], gae_t, last_gae)
        reversed_adv.append(last_gae)
    advantages = torch.stack(reversed_adv[::-1], dim=1)
    zero = torch.zeros((), dtype=advantages.dtype, device=advantages.device)
    returns = torch.where(valid, advantages + values, zero)
    advantages = torch.where(valid, masked_whiten(advantages, response_mask), zero)
    return advantages, returns


@register_adv_est(AdvantageEstimator.GRPO)
@torch.no_grad()
def compute_grpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GRPO outcome advantage (Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    A_i = (s_i − mean_g) / (std_g + ε) with the unbiased (n−1) std of the group; broadcast over the
    row's valid tokens. ``norm_adv_by_std_in_grpo=False`` gives Dr.GRPO (arXiv:2503.20783): A_i = s_i − mean_g.
    See the module docstring for the group rules (K01-K03).

    Args:
        token_level_rewards, response_mask: (batch, response_len).
        index: (batch,) group ids (uid).
        epsilon: added to the std (outside the sqrt), default 1e-6.
        norm_adv_by_std_in_grpo: divide by the std (GRPO) or not (Dr.GRPO).
        config: unused; accepted for the common signature.

    Returns:
        (advantages, returns): one tensor returned twice, as verl's, (batch, response_len), rewards dtype.

    Raises:
        ValueError: bad shapes, index length mismatch. TypeError: unhashable index entries.

    Source: verl/trainer/ppo/core_algos.py:compute_grpo_outcome_advantage.
    """
    token_level_rewards, response_mask, owned, scores, valid = outcome_rows(token_level_rewards, response_mask)
    g = Groups(scores, valid, index)
    single = g.count == 1
    mean = torch.where(single, torch.zeros_like(g.mean), g.mean)
    std = torch.where(single, torch.ones_like(g.std), g.std)
    centred = torch.where(g.all_equal & ~single, torch.zeros_like(scores), scores - mean)
    adv = safe_ratio(centred, std + epsilon) if norm_adv_by_std_in_grpo else centred
    adv = broadcast(adv, valid, token_level_rewards, response_mask, reuse_mask=owned)
    return adv, adv


@register_adv_est(AdvantageEstimator.GRPO_PASSK)
@torch.no_grad()
def compute_grpo_passk_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pass@k advantage (Chen et al. 2025, arXiv:2503.19595): only each group's best row gets r_max − r_2nd.

    Divided by (std_g + ε) when normalising; ``config.norm_adv_by_std_in_grpo`` overrides the argument
    (verl reads it from the config). Ties keep the first best row; equal top scores give 0.
    Groups whose valid rows dropped below 2 through masking (K03) get 0 everywhere.

    Args/Returns: as :func:`compute_grpo_outcome_advantage`.

    Raises:
        ValueError: a group has fewer than 2 rows in total (rollout.n must be >= 2 for pass@k).

    Source: verl/trainer/ppo/core_algos.py:compute_grpo_passk_outcome_advantage.
    """
    token_level_rewards, response_mask, owned, scores, valid = outcome_rows(token_level_rewards, response_mask)
    g = Groups(scores, valid, index)
    if bool((g.size_all < 2).any()):
        row = int(torch.nonzero(g.size_all < 2)[0])
        raise ValueError(
            f"grpo_passk needs at least 2 responses per prompt (rollout.n >= 2); group {index[row]!r} has 1"
        )
    normalise = bool(cfg_get(config, "norm_adv_by_std_in_grpo", norm_adv_by_std_in_grpo))
    adv = torch.zeros_like(scores)
    gid = g.gid.tolist()
    members: dict[int, list[int]] = {}
    for row, (group, ok) in enumerate(zip(gid, valid.tolist(), strict=True)):
        if ok:
            members.setdefault(group, []).append(row)
    for rows in members.values():
        if len(rows) < 2:
            continue
        ranked = sorted(rows, key=lambda r: (-float(scores[r]), r))
        gap = scores[ranked[0]] - scores[ranked[1]]
        if normalise:
            gap = safe_ratio(gap, g.std[ranked[0]] + epsilon)
        adv[ranked[0]] = gap
    adv = broadcast(adv, valid, token_level_rewards, response_mask, reuse_mask=owned)
    return adv, adv


@register_adv_est(AdvantageEstimator.RLOO)
@torch.no_grad()
def compute_rloo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Ahmadian et al. 2024, arXiv:2402.14740).

    A_i = n/(n−1)·(s_i − mean_g) = s_i − mean of the other rows; a group of one keeps A_i = s_i.
    n counts the valid rows of the group (K03).

    Returns/Raises: as :func:`compute_grpo_outcome_advantage`.

    Source: verl/trainer/ppo/core_algos.py:compute_rloo_outcome_advantage.
    """
    token_level_rewards, response_mask, owned, scores, valid = outcome_rows(token_level_rewards, response_mask)
    g = Groups(scores, valid, index)
    n = g.count
    loo = n / (n - 1).clamp(min=1) * (scores - g.mean)
    adv = torch.where(n > 1, torch.where(g.all_equal, torch.zeros_like(scores), loo), scores)
    adv = broadcast(adv, valid, token_level_rewards, response_mask, reuse_mask=owned)
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS_BASELINE)
@torch.no_grad()
def compute_reinforce_plus_plus_baseline_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ with a group-mean baseline (Hu 2025, arXiv:2501.03262).

    A = masked_whiten((s_i − mean_g) broadcast over the row's valid tokens) · mask; whitening pools all
    valid tokens of the batch. A group of one uses mean 0.

    Returns/Raises: as :func:`compute_grpo_outcome_advantage`.

    Source: verl/trainer/ppo/core_algos.py:compute_reinforce_plus_plus_baseline_outcome_advantage.
    """
    token_level_rewards, response_mask, _, scores, valid = outcome_rows(token_level_rewards, response_mask)
    g = Groups(scores, valid, index)
    centred = torch.where(g.count > 1, scores - g.mean, scores)
    centred = torch.where(g.all_equal & (g.count > 1), torch.zeros_like(scores), centred)
    mask64 = mask_f(response_mask, torch.float64)
    tiled = broadcast(centred, valid, mask64, response_mask)
    adv = (masked_whiten(tiled, response_mask) * mask64).to(token_level_rewards.dtype)
    return adv, adv


@register_adv_est(AdvantageEstimator.OPO)
@torch.no_grad()
def compute_opo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """On-policy RL with optimal reward baseline (Hao et al. 2025, arXiv:2505.23585).

    baseline_g = Σ_j L_j s_j / Σ_j L_j over the group's valid rows (L_j = valid tokens of row j);
    A_i = s_i − baseline_g; a group of one uses baseline 0.

    Returns/Raises: as :func:`compute_grpo_outcome_advantage`.

    Source: verl/trainer/ppo/core_algos.py:compute_opo_outcome_advantage.
    """
    token_level_rewards, response_mask, owned, scores, valid = outcome_rows(token_level_rewards, response_mask)
    g = Groups(scores, valid, index)
    length = mask_f(response_mask, torch.float64).sum(dim=-1)
    zeros = torch.zeros(g.n_groups, dtype=torch.float64, device=scores.device)
    num = zeros.index_add(0, g.gid, length * scores)[g.gid]
    den = zeros.index_add(0, g.gid, length)[g.gid]
    baseline = torch.where(g.count > 1, safe_ratio(num, den), torch.zeros_like(scores))
    adv = torch.where(g.all_equal & (g.count > 1), torch.zeros_like(scores), scores - baseline)
    adv = broadcast(adv, valid, token_level_rewards, response_mask, reuse_mask=owned)
    return adv, adv


@register_adv_est(AdvantageEstimator.GPG)
@torch.no_grad()
def compute_gpg_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    f_norm: float = 1.0,
    alpha: float = 1.0,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group Policy Gradient (Chu et al. 2025, arXiv:2504.02546).

    A_i = α·(s_i − mean_g)/f_norm with α = B / max(1, #rows with a nonzero score); B and the count are
    over valid rows (K03). As in verl the ``alpha`` argument is recomputed (kept for signature
    compatibility). A group of one uses mean 0.

    Returns/Raises: as :func:`compute_grpo_outcome_advantage`; ValueError if f_norm == 0.

    Source: verl/trainer/ppo/core_algos.py:compute_gpg_outcome_advantage.
    """
    if f_norm == 0:
        raise ValueError("gpg: f_norm must be nonzero")
    token_level_rewards, response_mask, owned, scores, valid = outcome_rows(token_level_rewards, response_mask)
    g = Groups(scores, valid, index)
    n_valid = valid.sum().to(torch.float64)
    n_nonzero = (valid & (scores != 0)).sum().to(torch.float64)
    alpha_t = n_valid / n_nonzero.clamp(min=1)
    centred = torch.where(g.count > 1, scores - g.mean, scores)
    centred = torch.where(g.all_equal & (g.count > 1), torch.zeros_like(scores), centred)
    adv = broadcast(alpha_t * centred / f_norm, valid, token_level_rewards, response_mask, reuse_mask=owned)
    return adv, adv


@register_adv_est(AdvantageEstimator.REINFORCE_PLUS_PLUS)
@torch.no_grad()
def compute_reinforce_plus_plus_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return G_t = r_t + γ·G_{t+1}, A = whiten(G).

    γ = ``config.gamma`` (default 1.0). Masked slots carry G through unchanged and their rewards are
    ignored (anatomy §4.2; K03). Whitening pools all valid tokens of the batch.

    Returns:
        (advantages, returns), (batch, response_len), zero outside the mask.

    Source: verl/trainer/ppo/core_algos.py:compute_reinforce_plus_plus_outcome_advantage.
    """
    token_level_rewards = float_rewards(token_level_rewards)
    check_2d("token_level_rewards", token_level_rewards)
    check_2d("response_mask", response_mask, token_level_rewards)
    gamma = float(cfg_get(config, "gamma", 1.0))
    valid = response_mask != 0
    running = torch.zeros_like(token_level_rewards[:, 0])
    returns = torch.zeros_like(token_level_rewards)
    for t in reversed(range(token_level_rewards.shape[1])):
        running = torch.where(valid[:, t], token_level_rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    zero = torch.zeros((), dtype=returns.dtype, device=returns.device)
    returns = torch.where(valid, returns, zero)
    advantages = torch.where(valid, masked_whiten(returns, response_mask), zero)
    return advantages, returns


@register_adv_est(AdvantageEstimator.REMAX)
@torch.no_grad()
def compute_remax_outcome_advantage(
    token_level_rewards: torch.Tensor,
    reward_baselines: torch.Tensor,
    response_mask: torch.Tensor,
    config: Any = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """ReMax (Li et al. 2023, arXiv:2310.10505): A_t = Σ_{t'≥t} m·r − b, b = greedy-rollout score.

    Args:
        token_level_rewards, response_mask: (batch, response_len).
        reward_baselines: (batch,) score of the greedy response per row.

    Returns:
        (advantages, returns) with returns = reverse cumulative sum of masked rewards; zero outside the mask.

    Raises:
        ValueError: reward_baselines is not (batch,).

    Source: verl/trainer/ppo/core_algos.py:compute_remax_outcome_advantage.
    """
    token_level_rewards = float_rewards(token_level_rewards)
    check_2d("token_level_rewards", token_level_rewards)
    check_2d("response_mask", response_mask, token_level_rewards)
    if reward_baselines.shape != token_level_rewards.shape[:1]:
        raise ValueError(
            f"reward_baselines must be (batch,) = {tuple(token_level_rewards.shape[:1])}, "
            f"got {tuple(reward_baselines.shape)}"
        )
    mask = mask_f(response_mask, token_level_rewards.dtype)
    masked = torch.where(response_mask != 0, token_level_rewards, torch.zeros_like(token_level_rewards))
    returns = masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
    advantages = (returns - reward_baselines.to(returns.dtype).unsqueeze(-1)) * mask
    return advantages, returns
