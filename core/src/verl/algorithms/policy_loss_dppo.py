"""DPPO policy losses (``dppo_tv``, ``dppo_kl``): a divergence trust region instead of a ratio clip.

Both use L = −A · sg(min(r, c)) · logπ · valid, with r = exp(clamp(logπ − logπ_old, ±20)) and c =
``clip_ratio_c`` (truncated importance sampling, TIS, in place of dual-clip; 20.0 when the config does
not set it, but the actor config's default is 3.0). ``valid`` (detached) drops the tokens that moved
out of the trust region in the direction the advantage pushes them:

* ``dppo_tv`` (total variation of the sampled token's probability, p = π, p_old = π_old):
  A > 0: p − p_old <= δ_high; otherwise p − p_old >= −δ_low.
* ``dppo_kl`` (binary KL between Bernoulli(p_old) and Bernoulli(p)):
  KL = p_old·(logp_old − logp) + (1 − p_old)·log((1 − p_old + 1e-8)/(1 − p + 1e-8));
  A > 0: KL <= δ_high or p <= p_old; otherwise KL <= δ_low or p >= p_old.

δ_low/δ_high are ``clip_ratio_low``/``clip_ratio_high`` (falling back to ``clip_ratio``): for DPPO
these keys are divergence thresholds, not ratio ranges. Metrics: ``actor/pg_clipfrac`` = masked
fraction of tokens outside the region, ``actor/pg_clipfrac_lower`` = masked fraction inside it with
r > c, ``actor/ppo_kl`` = masked mean of logπ_old − logπ.

Signature and config reading as in :mod:`verl.algorithms.policy_loss`.
Source: verl/trainer/ppo/core_algos.py (compute_policy_loss_dppo_tv, compute_policy_loss_dppo_kl);
paper: arXiv:2602.04879.
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms._config import cfg_get
from verl.algorithms.policy_loss import _agg, _check, _clip_ranges, _log_ratio, _metrics, _weighted
from verl.algorithms.registry import register_policy_loss
from verl.algorithms.utils import masked_mean

__all__ = ["compute_policy_loss_dppo_kl", "compute_policy_loss_dppo_tv"]

DPPO_DEFAULT_CLIP_RATIO_C = 20.0


def _dppo(old_log_prob, log_prob, advantages, response_mask, loss_agg_mode, config, rollout_is_weights, gbi, region):
    _check(old_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    delta_low, delta_high = _clip_ranges(config)
    clip_c = float(cfg_get(config, "clip_ratio_c", DPPO_DEFAULT_CLIP_RATIO_C))
    log_ratio = _log_ratio(log_prob, old_log_prob)
    ratio = torch.exp(log_ratio)
    truncated = torch.clamp(ratio, max=clip_c).detach()
    with torch.no_grad():
        valid = region(log_prob.detach(), old_log_prob, advantages, delta_low, delta_high).to(log_prob.dtype)
    pg_losses = -advantages * truncated * log_prob * valid
    loss = _agg(_weighted(pg_losses, rollout_is_weights), response_mask, loss_agg_mode, config, gbi)
    with torch.no_grad():
        clipfrac = masked_mean(1.0 - valid, response_mask)
        clipfrac_lower = masked_mean((ratio > clip_c).to(valid.dtype) * valid, response_mask)
        ppo_kl = masked_mean(-log_ratio, response_mask)
    return loss, _metrics(clipfrac, ppo_kl, clipfrac_lower)


def _tv_region(log_prob, old_log_prob, advantages, delta_low, delta_high):
    diff = torch.exp(log_prob) - torch.exp(old_log_prob)
    return torch.where(advantages > 0, diff <= delta_high, diff >= -delta_low)


def binary_kl(old_log_prob: torch.Tensor, log_prob: torch.Tensor) -> torch.Tensor:
    """KL(Bernoulli(p_old) ‖ Bernoulli(p)) per token, p = exp(log_prob); the 1e-8 guards are verl's.

    Shapes: any, equal; returns the same shape (nats).
    """
    p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
    return p_old * (old_log_prob - log_prob) + (1 - p_old) * torch.log((1.0 - p_old + 1e-8) / (1.0 - p + 1e-8))


def _kl_region(log_prob, old_log_prob, advantages, delta_low, delta_high):
    kl = binary_kl(old_log_prob, log_prob)
    p, p_old = torch.exp(log_prob), torch.exp(old_log_prob)
    return torch.where(advantages > 0, (kl <= delta_high) | (p <= p_old), (kl <= delta_low) | (p >= p_old))


@register_policy_loss("dppo_tv")
def compute_policy_loss_dppo_tv(
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
    """DPPO with a total-variation trust region (see the module docstring).

    Args: (batch, response_len) tensors as every policy loss; ``config`` supplies clip_ratio(_low/_high)
    (TV thresholds, default 0.2) and clip_ratio_c (TIS cap).

    Returns:
        (loss, metrics): 0-dim loss, python-float metrics.

    Raises:
        ValueError: shape mismatch or an unknown ``loss_agg_mode``.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_dppo_tv.
    """
    return _dppo(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        config,
        rollout_is_weights,
        global_batch_info,
        _tv_region,
    )


@register_policy_loss("dppo_kl")
def compute_policy_loss_dppo_kl(
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
    """DPPO with a binary-KL trust region (see the module docstring; thresholds in nats).

    Args/Returns/Raises: as :func:`compute_policy_loss_dppo_tv`.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_dppo_kl.
    """
    return _dppo(
        old_log_prob,
        log_prob,
        advantages,
        response_mask,
        loss_agg_mode,
        config,
        rollout_is_weights,
        global_batch_info,
        _kl_region,
    )
