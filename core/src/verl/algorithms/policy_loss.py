"""Policy-gradient losses, registered under verl's ``actor.policy_loss.loss_mode`` names.

Common signature: ``fn(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode="token-mean",
config=None, rollout_is_weights=None, *, global_batch_info=None) -> (loss, metrics)``.
  - tensors are (batch, response_len); log-probs are natural-log probabilities of the sampled tokens;
    ``log_prob`` carries the gradient, the others are constants;
  - ``loss`` is a 0-dim tensor (``agg_loss`` of the per-token loss); ``metrics`` has python floats
    ``actor/pg_clipfrac``, ``actor/ppo_kl`` (masked mean of logπ_old − logπ), ``actor/pg_clipfrac_lower``
    (0.0 where a loss has no such notion);
  - per-token losses are multiplied by ``rollout_is_weights`` (batch, response_len) when given;
  - ``config`` is any object (attrs, SimpleNamespace, dict) with verl's actor attributes, read with
    defaults: clip_ratio 0.2, clip_ratio_low/high -> clip_ratio, clip_ratio_c 3.0, tau_pos 1.0,
    tau_neg 1.05, policy_loss.{clip_cov_ratio 2e-4, clip_cov_lb 1.0, clip_cov_ub 5.0, kl_cov_ratio 2e-4,
    ppo_kl_coef 0.1, dro_beta (required)}, loss_scale_factor None, global_batch_info None;
  - ``global_batch_info`` (argument, else ``config.global_batch_info``): dict of agg_loss normalisers
    (dp_size, batch_num_tokens, global_batch_size, loss_scale_factor) for globally normalised
    micro-batch losses (K04).
The importance ratio is r = exp(clamp(logπ − logπ_old, −20, 20)) in every loss that forms it.
Source: verl/trainer/ppo/core_algos.py (compute_policy_loss_*).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms._config import cfg_get
from verl.algorithms.loss_agg import agg_loss, split_global_batch_info
from verl.algorithms.registry import register_policy_loss
from verl.algorithms.utils import masked_mean

__all__ = [
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
]

LOG_RATIO_CLAMP = 20.0
GSPO_LOG_RATIO_MAX = 10.0


# ----------------------------------------------------------------------------------------------- helpers
def _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights) -> None:
    ref = tuple(log_prob.shape)
    for name, t in (("old_log_prob", old_log_prob), ("advantages", advantages), ("response_mask", response_mask)):
        if tuple(t.shape) != ref:
            raise ValueError(f"policy loss: {name} shape {tuple(t.shape)} != log_prob shape {ref}")
    if rollout_is_weights is not None and tuple(rollout_is_weights.shape) != ref:
        raise ValueError(f"policy loss: rollout_is_weights shape {tuple(rollout_is_weights.shape)} != {ref}")


def _clip_ranges(config: Any) -> tuple[float, float]:
    clip = cfg_get(config, "clip_ratio", 0.2)
    return float(cfg_get(config, "clip_ratio_low", clip)), float(cfg_get(config, "clip_ratio_high", clip))


def _pl(config: Any, name: str, default: Any) -> Any:
    """config.policy_loss.<name>, then config.<name>, then the default."""
    value = cfg_get(cfg_get(config, "policy_loss", None), name, None)
    return cfg_get(config, name, default) if value is None else value


def _agg(loss_mat, mask, mode, config, global_batch_info) -> torch.Tensor:
    info = split_global_batch_info(
        global_batch_info if global_batch_info is not None else cfg_get(config, "global_batch_info")
    )
    if "loss_scale_factor" not in info and cfg_get(config, "loss_scale_factor") is not None:
        info["loss_scale_factor"] = cfg_get(config, "loss_scale_factor")
    return agg_loss(loss_mat, mask, mode, **info)


def _log_ratio(log_prob: torch.Tensor, old_log_prob: torch.Tensor) -> torch.Tensor:
    return torch.clamp(log_prob - old_log_prob, min=-LOG_RATIO_CLAMP, max=LOG_RATIO_CLAMP)


def _weighted(pg_losses: torch.Tensor, rollout_is_weights: torch.Tensor | None) -> torch.Tensor:
    return pg_losses if rollout_is_weights is None else pg_losses * rollout_is_weights


def _metrics(clipfrac: Any, ppo_kl: Any, clipfrac_lower: Any = 0.0) -> dict[str, float]:
    as_float = lambda x: float(x.detach()) if torch.is_tensor(x) else float(x)  # noqa: E731
    return {
        "actor/pg_clipfrac": as_float(clipfrac),
        "actor/ppo_kl": as_float(ppo_kl),
        "actor/pg_clipfrac_lower": as_float(clipfrac_lower),
    }


# ------------------------------------------------------------------------------------------------ losses
@register_policy_loss("vanilla")
def compute_policy_loss_vanilla(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """PPO clipped surrogate (Schulman et al. 2017, arXiv:1707.06347) with dual clip (Ye et al. 2020, arXiv:1912.09729).

    L1 = −A·r, L2 = −A·clip(r, 1−ε_low, 1+ε_high), L = max(L1, L2); for A < 0 only: L = min(L, −A·c)
    with c = clip_ratio_c. pg_clipfrac = masked mean of [L2 > L1]; pg_clipfrac_lower = masked mean of
    [max(L1, L2) > −A·c and A < 0].

    Raises:
        ValueError: clip_ratio_c <= 1, shape mismatch, bad agg mode.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_vanilla.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_low, clip_high = _clip_ranges(config)
    clip_c = float(cfg_get(config, "clip_ratio_c", 3.0))
    if clip_c <= 1.0:
        raise ValueError(f"clip_ratio_c (dual-clip lower bound) must be > 1.0, got {clip_c}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    clipped = torch.maximum(losses1, losses2)
    losses3 = -advantages * clip_c
    dual = torch.minimum(losses3, clipped)
    negative = advantages < 0
    pg_losses = torch.where(negative, dual, clipped)
    loss = _agg(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, config, global_batch_info)
    with torch.no_grad():
        clipfrac = masked_mean((losses2 > losses1).to(log_prob.dtype), response_mask)
        clipfrac_lower = masked_mean(((clipped > losses3) & negative).to(log_prob.dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("gspo")
def compute_policy_loss_gspo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group Sequence Policy Optimisation (Zheng et al. 2025, arXiv:2507.18071).

    s_i = exp(mean_t valid (logπ − logπ_old)); token ratio s_it = sg[s_i]·π/sg[π] (log clamped ≤ 10);
    PPO clip with ε_low/ε_high; always aggregated with ``seq-mean-token-mean`` (``loss_agg_mode`` ignored).

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_gspo.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_low, clip_high = _clip_ranges(config)
    raw_log_ratio = log_prob - old_log_prob
    seq_log_ratio = masked_mean(raw_log_ratio, response_mask, axis=-1)
    log_token_ratio = log_prob - log_prob.detach() + seq_log_ratio.detach().unsqueeze(-1)
    ratio = torch.exp(torch.clamp(log_token_ratio, max=GSPO_LOG_RATIO_MAX))
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    pg_losses = torch.maximum(losses1, losses2)
    loss = _agg(
        _weighted(pg_losses, rollout_is_weights), response_mask, "seq-mean-token-mean", config, global_batch_info
    )
    with torch.no_grad():
        clipfrac = masked_mean((losses2 > losses1).to(log_prob.dtype), response_mask)
        ppo_kl = masked_mean(-raw_log_ratio, response_mask)
    return loss, _metrics(clipfrac, ppo_kl)


@register_policy_loss("sapo")
def compute_policy_loss_sapo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Soft Adaptive Policy Optimisation (Gao et al. 2025, arXiv:2511.20347).

    L = −A·g(r), g(x) = sigmoid(τ(x − 1))·4/τ, τ = tau_pos (1.0) where A > 0 else tau_neg (1.05);
    always ``seq-mean-token-mean``. Raises ValueError if a τ is not > 0.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_sapo.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    tau_pos, tau_neg = float(cfg_get(config, "tau_pos", 1.0)), float(cfg_get(config, "tau_neg", 1.05))
    if tau_pos <= 0 or tau_neg <= 0:
        raise ValueError(f"sapo: tau_pos and tau_neg must be > 0, got {tau_pos}, {tau_neg}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    tau = torch.where(advantages > 0, torch.full_like(ratio, tau_pos), torch.full_like(ratio, tau_neg))
    gates = torch.sigmoid(tau * (ratio - 1.0)) * (4.0 / tau)
    pg_losses = -gates * advantages
    loss = _agg(
        _weighted(pg_losses, rollout_is_weights), response_mask, "seq-mean-token-mean", config, global_batch_info
    )
    with torch.no_grad():
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return loss, _metrics(0.0, ppo_kl)


@register_policy_loss("gpg")
def compute_policy_loss_gpg(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Group Policy Gradient loss (Chu et al. 2025, arXiv:2504.02546): L = −A·logπ (no ratio, no clip).

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_gpg.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    pg_losses = -log_prob * advantages
    loss = _agg(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, config, global_batch_info)
    with torch.no_grad():
        ppo_kl = masked_mean(-(log_prob - old_log_prob), response_mask)
    return loss, _metrics(0.0, ppo_kl)


@register_policy_loss("clip_cov")
def compute_policy_loss_clip_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clip-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617).

    PPO clipped loss max(L1, L2); among valid tokens that the PPO clip did not already clip and whose
    centred covariance cov = (A − mean A)·(logπ − mean logπ) lies in (clip_cov_lb, clip_cov_ub), a random
    max(1, ⌊clip_cov_ratio·#valid⌋) are detached (their loss multiplied by 0). pg_clipfrac is the fraction
    of valid tokens so removed. Selection uses the global torch RNG.

    Raises:
        ValueError: clip_cov_ratio <= 0.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_clip_cov.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_low, clip_high = _clip_ranges(config)
    ratio_frac = float(_pl(config, "clip_cov_ratio", 2e-4))
    lb, ub = float(_pl(config, "clip_cov_lb", 1.0)), float(_pl(config, "clip_cov_ub", 5.0))
    if ratio_frac <= 0:
        raise ValueError(f"clip_cov: policy_loss.clip_cov_ratio must be > 0, got {ratio_frac}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    losses1 = -advantages * ratio
    losses2 = -advantages * torch.clamp(ratio, 1 - clip_low, 1 + clip_high)
    valid = response_mask != 0
    with torch.no_grad():
        lp = log_prob.detach()
        cov = (advantages - masked_mean(advantages, response_mask)) * (lp - masked_mean(lp, response_mask))
        candidate = valid & ~(losses2 > losses1) & (cov > lb) & (cov < ub)
        picks = torch.nonzero(candidate)
        n_clip = max(int(ratio_frac * int(valid.sum())), 1)
        if len(picks) > n_clip:
            picks = picks[torch.randperm(len(picks))[:n_clip].to(picks.device)]
        keep = torch.ones_like(ratio)
        keep[picks[:, 0], picks[:, 1]] = 0
        clipfrac = masked_mean((keep == 0).to(ratio.dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    pg_losses = torch.maximum(losses1, losses2) * keep
    loss = _agg(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, config, global_batch_info)
    return loss, _metrics(clipfrac, ppo_kl)


@register_policy_loss("kl_cov")
def compute_policy_loss_kl_cov(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """KL-Cov (Cui et al. 2025, arXiv:2505.22617).

    L = −A·r on every token; the top max(1, ⌊kl_cov_ratio·#valid⌋) valid tokens by covariance
    (A − mean A)(logπ − mean logπ) additionally get ppo_kl_coef·|logπ − logπ_old|. ``actor/ppo_kl`` reports
    the masked mean of |logπ − logπ_old| (as verl).

    Raises:
        ValueError: kl_cov_ratio <= 0.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_kl_cov.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    ratio_frac = float(_pl(config, "kl_cov_ratio", 2e-4))
    kl_coef = float(_pl(config, "ppo_kl_coef", 0.1))
    if ratio_frac <= 0:
        raise ValueError(f"kl_cov: policy_loss.kl_cov_ratio must be > 0, got {ratio_frac}")
    log_ratio = _log_ratio(log_prob, old_log_prob)
    abs_kl = log_ratio.abs()
    pg_losses = -advantages * torch.exp(log_ratio)
    valid = response_mask != 0
    with torch.no_grad():
        flat_idx = torch.nonzero(valid.reshape(-1), as_tuple=True)[0]
        penalise = torch.zeros_like(pg_losses)
        if len(flat_idx) > 0:
            adv_v = advantages.detach().reshape(-1)[flat_idx]
            lp_v = log_prob.detach().reshape(-1)[flat_idx]
            cov = (adv_v - adv_v.mean()) * (lp_v - lp_v.mean())
            k = max(1, int(len(cov) * ratio_frac))
            top = flat_idx[torch.topk(cov, k, largest=True).indices]
            penalise.reshape(-1)[top] = 1.0
        ppo_kl_abs = masked_mean(abs_kl, response_mask)
    pg_losses = pg_losses + penalise * kl_coef * abs_kl
    loss = _agg(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, config, global_batch_info)
    return loss, _metrics(0.0, ppo_kl_abs)


@register_policy_loss("geo_mean")
def compute_policy_loss_geo_mean(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Geometric-Mean Policy Optimisation, GMPO (Zhao et al. 2025, arXiv:2507.20673).

    Per row: Δ = logπ − logπ_old, Δc = clip(Δ, −ε_low, ε_high), d = sgn(A)·min(sgn(A)·Δ, sgn(A)·Δc);
    ratio_i = exp(mean_t valid d); Ā_i = mean_t valid A; L_i = −Ā_i·ratio_i. IS weights enter as their
    per-row geometric mean. The scalar is the mean of L_i over non-empty rows (``seq-mean-token-sum`` of
    a one-token-per-row matrix, so ``global_batch_info`` applies; ``loss_agg_mode`` is ignored as in verl).
    pg_clipfrac / pg_clipfrac_lower: masked fraction of tokens with Δ ≠ Δc and A > 0 / A < 0.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_geo_mean.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_low, clip_high = _clip_ranges(config)
    delta = _log_ratio(log_prob, old_log_prob)
    delta_c = torch.clamp(delta, -clip_low, clip_high)
    sgn = torch.sign(advantages)
    d = sgn * torch.minimum(sgn * delta, sgn * delta_c)
    ratio = torch.exp(masked_mean(d, response_mask, axis=-1))
    seq_adv = masked_mean(advantages, response_mask, axis=-1)
    seq_losses = -seq_adv * ratio
    if rollout_is_weights is not None:
        log_w = torch.log(rollout_is_weights.clamp(min=1e-10))
        seq_losses = seq_losses * torch.exp(masked_mean(log_w, response_mask, axis=-1))
    row_mask = (response_mask != 0).any(dim=-1, keepdim=True)
    loss = _agg(seq_losses.unsqueeze(-1), row_mask, "seq-mean-token-sum", config, global_batch_info)
    with torch.no_grad():
        was_clipped = delta != delta_c
        clipfrac = masked_mean((was_clipped & (advantages > 0)).to(delta.dtype), response_mask)
        clipfrac_lower = masked_mean((was_clipped & (advantages < 0)).to(delta.dtype), response_mask)
        ppo_kl = masked_mean(-delta, response_mask)
    return loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


@register_policy_loss("cispo")
def compute_policy_loss_cispo(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Clipped IS-weight Policy Optimisation, CISPO (MiniMax-M1, arXiv:2506.13585).

    L = −sg(clip(r, 1−ε_low, 1+ε_high))·A·logπ: the weight is clipped and detached, every token keeps its
    gradient through logπ. pg_clipfrac = masked fraction with r outside the clip range.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_cispo.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    clip_low, clip_high = _clip_ranges(config)
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    weight = torch.clamp(ratio, 1 - clip_low, 1 + clip_high).detach()
    pg_losses = -weight * advantages * log_prob
    loss = _agg(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, config, global_batch_info)
    with torch.no_grad():
        clipfrac = masked_mean((ratio != weight).to(ratio.dtype), response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return loss, _metrics(clipfrac, ppo_kl)


@register_policy_loss("dro")
def compute_policy_loss_dro(
    old_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "token-mean",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Direct Reward Optimisation loss (Richemond et al. 2024, arXiv:2405.19107; verl docs/algo/dro.md).

    L = −(A·logπ − ½·β·(logπ − logπ_old)²), β = ``policy_loss.dro_beta`` (or ``dro_beta``); no default,
    as in verl (whose config default is null).

    Raises:
        ValueError: β unset or <= 0.

    Source: verl/trainer/ppo/core_algos.py (loss_mode "dro").
    """
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    beta = _pl(config, "dro_beta", None)
    if beta is None or float(beta) <= 0:
        raise ValueError(f"dro: set actor.policy_loss.dro_beta to a value > 0 (the penalty coefficient), got {beta}")
    beta = float(beta)
    diff = log_prob - old_log_prob
    pg_losses = -(advantages * log_prob - 0.5 * beta * diff.square())
    loss = _agg(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, config, global_batch_info)
    with torch.no_grad():
        ppo_kl = masked_mean(-_log_ratio(log_prob, old_log_prob), response_mask)
    return loss, _metrics(0.0, ppo_kl)
