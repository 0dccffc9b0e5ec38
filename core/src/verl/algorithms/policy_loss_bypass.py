"""The ``bypass_mode`` policy loss: the old policy is the rollout policy (two policies, not three).

With ``algorithm.rollout_correction.bypass_mode=true`` the trainer skips the old_log_prob pass and
hands the rollout's log-probs to the loss as ``old_log_prob``, and the actor's loss becomes this one,
reading ``algorithm.rollout_correction`` (verl's ``apply_bypass_mode``; see
:func:`verl.workers.losses.make_ppo_loss`). This loss then

1. computes importance weights w = π_θ/π_rollout, the rejection mask and mismatch metrics from the
   *current* log-probs (:func:`verl.algorithms.rollout_correction.compute_rollout_correction_and_rejection_mask`,
   under no_grad, so w is a constant); the rejected tokens leave the loss's mask;
2. dispatches on ``rollout_correction.loss_type``:
   ``ppo_clip`` (default): the vanilla PPO loss with r = π_θ/π_rollout and *no* extra weights (the
   ratio already is the IS correction; applying w too would count it twice);
   ``reinforce``: L = −w·A·logπ_θ (−A·logπ_θ when ``rollout_is`` is null).

Config read from ``config.policy_loss.rollout_correction``: loss_type, rollout_is, rollout_is_threshold
(2.0), rollout_is_batch_normalize (False), rollout_rs, rollout_rs_threshold. The ``rollout_is_weights``
argument is ignored, as in verl (the weights are computed here).

Source: verl/trainer/ppo/core_algos.py (compute_policy_loss_bypass_mode, compute_policy_loss_reinforce).
"""

from __future__ import annotations

from typing import Any

import torch

from verl.algorithms._config import cfg_get
from verl.algorithms.policy_loss import _agg, _check, _metrics, compute_policy_loss_vanilla
from verl.algorithms.registry import register_policy_loss
from verl.algorithms.rollout_correction import compute_rollout_correction_and_rejection_mask
from verl.algorithms.utils import masked_mean

__all__ = ["BYPASS_LOSS_TYPES", "compute_policy_loss_bypass_mode", "compute_policy_loss_reinforce"]

BYPASS_LOSS_TYPES = ("ppo_clip", "reinforce")


def compute_policy_loss_reinforce(
    rollout_log_prob: torch.Tensor,
    log_prob: torch.Tensor,
    advantages: torch.Tensor,
    response_mask: torch.Tensor,
    loss_agg_mode: str = "seq-mean-token-sum",
    config: Any = None,
    rollout_is_weights: torch.Tensor | None = None,
    *,
    global_batch_info: dict | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """REINFORCE with optional IS weights: L = −w·A·logπ_θ (w = 1 when ``rollout_is_weights`` is None).

    No ratio and no clipping; the gradient flows through logπ_θ only (w is a constant).
    ``actor/ppo_kl`` = masked mean of logπ_rollout − logπ_θ; the clip fractions are 0.

    Args:
        rollout_log_prob, log_prob, advantages, response_mask: (batch, response_len).
        rollout_is_weights: optional (batch, response_len), detached.

    Returns:
        (0-dim loss, metrics).

    Raises:
        ValueError: shape mismatch, unknown agg mode.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_reinforce.
    """
    _check(rollout_log_prob, log_prob, advantages, response_mask, rollout_is_weights)
    pg_losses = -advantages * log_prob
    if rollout_is_weights is not None:
        pg_losses = pg_losses * rollout_is_weights
    loss = _agg(pg_losses, response_mask, loss_agg_mode, config, global_batch_info)
    with torch.no_grad():
        ppo_kl = masked_mean(rollout_log_prob - log_prob.detach(), response_mask)
    return loss, _metrics(0.0, ppo_kl)


@register_policy_loss("bypass_mode")
def compute_policy_loss_bypass_mode(
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
    """Bypass-mode loss (see the module docstring); ``old_log_prob`` holds the rollout's log-probs.

    Returns:
        (0-dim loss, metrics): the chosen loss's metrics plus ``rollout_corr/*`` (IS weight statistics
        when ``rollout_is`` is set, and mismatch metrics: kl, k3_kl, training/rollout ppl, chi2, ...).

    Raises:
        ValueError: ``config.policy_loss.rollout_correction`` missing; unknown ``loss_type``; bad IS or
            rejection options; shape mismatch.

    Source: verl/trainer/ppo/core_algos.py:compute_policy_loss_bypass_mode.
    """
    _check(old_log_prob, log_prob, advantages, response_mask, None)
    corr = cfg_get(cfg_get(config, "policy_loss"), "rollout_correction")
    if corr is None:
        raise ValueError(
            "loss_mode=bypass_mode reads actor.policy_loss.rollout_correction (loss_type, rollout_is, ...); "
            "the config passed has none"
        )
    loss_type = cfg_get(corr, "loss_type", "ppo_clip")
    if loss_type not in BYPASS_LOSS_TYPES:
        raise ValueError(
            f"policy_loss.rollout_correction.loss_type must be one of {BYPASS_LOSS_TYPES}, got {loss_type!r}"
        )
    weights, mask, corr_metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=log_prob.detach(),
        rollout_log_prob=old_log_prob,
        response_mask=response_mask,
        rollout_is=cfg_get(corr, "rollout_is"),
        rollout_is_threshold=cfg_get(corr, "rollout_is_threshold", 2.0),
        rollout_is_batch_normalize=bool(cfg_get(corr, "rollout_is_batch_normalize", False)),
        rollout_rs=cfg_get(corr, "rollout_rs"),
        rollout_rs_threshold=cfg_get(corr, "rollout_rs_threshold"),
    )
    if loss_type == "reinforce":
        loss, metrics = compute_policy_loss_reinforce(
            old_log_prob,
            log_prob,
            advantages,
            mask,
            loss_agg_mode,
            config,
            weights,
            global_batch_info=global_batch_info,
        )
    else:
        loss, metrics = compute_policy_loss_vanilla(
            old_log_prob,
            log_prob,
            advantages,
            mask,
            loss_agg_mode,
            config,
            None,
            global_batch_info=global_batch_info,
        )
    metrics.update(corr_metrics)
    return loss, metrics
