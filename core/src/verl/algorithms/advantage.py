"""Advantage estimators (verl names and keyword signatures) and the driver helper ``compute_advantage``.

Shapes: ``token_level_rewards``, ``response_mask``, ``values`` are (batch, response_len) float tensors
(the mask may be bool/int/float 0-1); ``index`` is a length-batch array of hashable group ids (the
``uid`` column, numpy object/str/int array or list). Every estimator returns ``(advantages, returns)``,
two (batch, response_len) tensors of the rewards' dtype, zero outside ``response_mask``. Nothing here
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
from types import SimpleNamespace
from typing import Any

import numpy as np
import torch

from verl.algorithms._config import cfg_get
from verl.algorithms.registry import get_adv_estimator_fn, register_adv_est
from verl.algorithms.utils import masked_sum, masked_whiten

__all__ = [
    "AdvantageEstimator",
    "compute_advantage",
    "compute_gae_advantage_return",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_opo_outcome_advantage",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_response_mask",
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


# ----------------------------------------------------------------------------------------------- helpers
def _check_2d(name: str, t: torch.Tensor, like: torch.Tensor | None = None) -> None:
    if t.dim() != 2:
        raise ValueError(f"{name} must be (batch, response_len), got shape {tuple(t.shape)}")
    if like is not None and t.shape != like.shape:
        raise ValueError(f"{name} shape {tuple(t.shape)} != token_level_rewards shape {tuple(like.shape)}")


def _mask_f(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    return mask.to(dtype)


def _group_ids(index: Any, batch_size: int, device: torch.device) -> tuple[torch.Tensor, int]:
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


class _Groups:
    """Per-row view of per-group statistics over the *valid* rows (rows with at least one mask slot)."""

    def __init__(self, scores: torch.Tensor, valid: torch.Tensor, index: Any) -> None:
        device = scores.device
        self.gid, g = _group_ids(index, scores.shape[0], device)
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


def _scores(token_level_rewards: torch.Tensor, response_mask: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(masked score per row in float64, valid-row flag)."""
    _check_2d("token_level_rewards", token_level_rewards)
    _check_2d("response_mask", response_mask, token_level_rewards)
    scores = masked_sum(token_level_rewards.to(torch.float64), response_mask, axis=-1)
    valid = (response_mask != 0).any(dim=-1)
    return scores, valid


def _broadcast(per_row: torch.Tensor, valid: torch.Tensor, like: torch.Tensor, response_mask: torch.Tensor):
    per_row = torch.where(valid, per_row, torch.zeros_like(per_row)).to(like.dtype)
    return per_row.unsqueeze(-1) * _mask_f(response_mask, like.dtype)


def _safe_ratio(num: torch.Tensor, denom: torch.Tensor) -> torch.Tensor:
    return torch.where(denom > 0, num / torch.where(denom > 0, denom, torch.ones_like(denom)), torch.zeros_like(num))


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
    _check_2d("token_level_rewards", token_level_rewards)
    _check_2d("values", values, token_level_rewards)
    _check_2d("response_mask", response_mask, token_level_rewards)
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
        (advantages, returns), equal, (batch, response_len), rewards dtype.

    Raises:
        ValueError: bad shapes, index length mismatch. TypeError: unhashable index entries.

    Source: verl/trainer/ppo/core_algos.py:compute_grpo_outcome_advantage.
    """
    scores, valid = _scores(token_level_rewards, response_mask)
    g = _Groups(scores, valid, index)
    single = g.count == 1
    mean = torch.where(single, torch.zeros_like(g.mean), g.mean)
    std = torch.where(single, torch.ones_like(g.std), g.std)
    centred = torch.where(g.all_equal & ~single, torch.zeros_like(scores), scores - mean)
    adv = _safe_ratio(centred, std + epsilon) if norm_adv_by_std_in_grpo else centred
    adv = _broadcast(adv, valid, token_level_rewards, response_mask)
    return adv, adv.clone()


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
    scores, valid = _scores(token_level_rewards, response_mask)
    g = _Groups(scores, valid, index)
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
            gap = _safe_ratio(gap, g.std[ranked[0]] + epsilon)
        adv[ranked[0]] = gap
    adv = _broadcast(adv, valid, token_level_rewards, response_mask)
    return adv, adv.clone()


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
    scores, valid = _scores(token_level_rewards, response_mask)
    g = _Groups(scores, valid, index)
    n = g.count
    loo = n / (n - 1).clamp(min=1) * (scores - g.mean)
    adv = torch.where(n > 1, torch.where(g.all_equal, torch.zeros_like(scores), loo), scores)
    adv = _broadcast(adv, valid, token_level_rewards, response_mask)
    return adv, adv.clone()


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
    scores, valid = _scores(token_level_rewards, response_mask)
    g = _Groups(scores, valid, index)
    centred = torch.where(g.count > 1, scores - g.mean, scores)
    centred = torch.where(g.all_equal & (g.count > 1), torch.zeros_like(scores), centred)
    mask64 = _mask_f(response_mask, torch.float64)
    tiled = _broadcast(centred, valid, mask64, response_mask)
    adv = (masked_whiten(tiled, response_mask) * mask64).to(token_level_rewards.dtype)
    return adv, adv.clone()


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
    scores, valid = _scores(token_level_rewards, response_mask)
    g = _Groups(scores, valid, index)
    length = _mask_f(response_mask, torch.float64).sum(dim=-1)
    zeros = torch.zeros(g.n_groups, dtype=torch.float64, device=scores.device)
    num = zeros.index_add(0, g.gid, length * scores)[g.gid]
    den = zeros.index_add(0, g.gid, length)[g.gid]
    baseline = torch.where(g.count > 1, _safe_ratio(num, den), torch.zeros_like(scores))
    adv = torch.where(g.all_equal & (g.count > 1), torch.zeros_like(scores), scores - baseline)
    adv = _broadcast(adv, valid, token_level_rewards, response_mask)
    return adv, adv.clone()


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
    scores, valid = _scores(token_level_rewards, response_mask)
    g = _Groups(scores, valid, index)
    n_valid = valid.sum().to(torch.float64)
    n_nonzero = (valid & (scores != 0)).sum().to(torch.float64)
    alpha_t = n_valid / n_nonzero.clamp(min=1)
    centred = torch.where(g.count > 1, scores - g.mean, scores)
    centred = torch.where(g.all_equal & (g.count > 1), torch.zeros_like(scores), centred)
    adv = _broadcast(alpha_t * centred / f_norm, valid, token_level_rewards, response_mask)
    return adv, adv.clone()


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
    _check_2d("token_level_rewards", token_level_rewards)
    _check_2d("response_mask", response_mask, token_level_rewards)
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
    _check_2d("token_level_rewards", token_level_rewards)
    _check_2d("response_mask", response_mask, token_level_rewards)
    if reward_baselines.shape != token_level_rewards.shape[:1]:
        raise ValueError(
            f"reward_baselines must be (batch,) = {tuple(token_level_rewards.shape[:1])}, "
            f"got {tuple(reward_baselines.shape)}"
        )
    mask = _mask_f(response_mask, token_level_rewards.dtype)
    masked = torch.where(response_mask != 0, token_level_rewards, torch.zeros_like(token_level_rewards))
    returns = masked.flip(dims=[-1]).cumsum(dim=-1).flip(dims=[-1]) * mask
    advantages = (returns - reward_baselines.to(returns.dtype).unsqueeze(-1)) * mask
    return advantages, returns


# ------------------------------------------------------------------------------------------------ driver
def compute_response_mask(data: Any) -> torch.Tensor:
    """response_mask = attention_mask[:, -response_len:] (verl/trainer/ppo/ray_trainer.py:compute_response_mask).

    Raises:
        KeyError: ``responses`` or ``attention_mask`` missing from ``data.batch``.
    """
    keys = set(data.batch.keys())
    missing = {"responses", "attention_mask"} - keys
    if missing:
        raise KeyError(f"cannot derive response_mask: data.batch lacks {sorted(missing)} (has {sorted(keys)})")
    response_len = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -response_len:]


def compute_advantage(
    data: Any,
    adv_estimator: str | Enum,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
) -> Any:
    """Driver-side advantage step on a DataProto; writes ``advantages`` and ``returns`` into ``data.batch``.

    Reads ``token_level_rewards`` and ``response_mask`` (derived from ``attention_mask``/``responses`` if
    absent), ``values`` for gae, ``non_tensor_batch["uid"]`` as the group index and ``reward_baselines``
    when present. ``gae`` gets (gamma, lam); ``grpo`` gets ``norm_adv_by_std_in_grpo``; every other
    estimator (built-in or plugin) is called as in verl with token_level_rewards, response_mask, config
    [, index] [, reward_baselines]. When ``config`` is None a namespace with gamma, lam and
    norm_adv_by_std_in_grpo is passed so config-reading estimators see the driver's values.
    ``num_repeat`` is accepted for verl compatibility and unused (as in verl).

    Args:
        data: DataProto (only ``.batch`` and ``.non_tensor_batch`` are used).
        adv_estimator: estimator name or :class:`AdvantageEstimator`.

    Returns:
        The same ``data`` object.

    Raises:
        KeyError: a required key is missing (named). ValueError: unknown estimator (lists names).

    Source: verl/trainer/ppo/ray_trainer.py:compute_advantage.
    """
    name = adv_estimator.value if isinstance(adv_estimator, Enum) else adv_estimator
    batch = data.batch
    keys = set(batch.keys())
    if "token_level_rewards" not in keys:
        raise KeyError(f"compute_advantage: data.batch lacks 'token_level_rewards' (has {sorted(keys)})")
    if "response_mask" not in keys:
        batch["response_mask"] = compute_response_mask(data)
    rewards, mask = batch["token_level_rewards"], batch["response_mask"]
    uid = data.non_tensor_batch.get("uid") if data.non_tensor_batch is not None else None
    if config is None:
        config = SimpleNamespace(gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)

    if name == AdvantageEstimator.GAE.value:
        if "values" not in keys:
            raise KeyError("compute_advantage(gae): data.batch lacks 'values' (run the critic's compute_values first)")
        advantages, returns = compute_gae_advantage_return(rewards, batch["values"], mask, gamma=gamma, lam=lam)
    elif name == AdvantageEstimator.GRPO.value:
        if uid is None:
            raise KeyError("compute_advantage(grpo): data.non_tensor_batch lacks 'uid' (assign it before repeat)")
        advantages, returns = compute_grpo_outcome_advantage(
            token_level_rewards=rewards,
            response_mask=mask,
            index=uid,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
    else:
        fn = get_adv_estimator_fn(name)
        kwargs: dict[str, Any] = {"token_level_rewards": rewards, "response_mask": mask, "config": config}
        if uid is not None:
            kwargs["index"] = uid
        if "reward_baselines" in keys:
            kwargs["reward_baselines"] = batch["reward_baselines"]
        advantages, returns = fn(**kwargs)
    batch["advantages"] = advantages
    batch["returns"] = returns
    return data
