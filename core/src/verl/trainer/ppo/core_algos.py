"""verl's ``verl.trainer.ppo.core_algos`` import path: the functions of :mod:`verl.algorithms` under verl's names.

``from verl.trainer.ppo.core_algos import register_adv_est, compute_grpo_outcome_advantage, agg_loss`` works
as in verl and gives the very objects :mod:`verl.algorithms` holds (one registry: an estimator registered
through this path is found by ``algorithm.adv_estimator``). Signatures and results follow verl's
``verl/trainer/ppo/core_algos.py``; where this package differs, the function's own docstring says so.

Names of verl's module that are not provided here:

* ``compute_policy_loss``: verl's deprecated clipped-PPO loss with explicit ``cliprange*`` arguments; use
  ``compute_policy_loss_vanilla`` (or ``get_policy_loss_fn("vanilla")``), which reads them from the actor config.
* ``compute_pf_ppo_reweight_data``: PF-PPO sample reweighting (verl's ``algorithm.use_pf_ppo``) is not built.

``get_adv_estimator_fn`` / ``get_policy_loss_fn`` are the plugin-aware lookups of :mod:`verl.plugins` (the
local registry first, as verl's, then plugin-provided names).

:func:`kl_penalty_forward` is a thin wrapper over :func:`verl.algorithms.kl_penalty` (defined here because
``verl.algorithms`` has no separate forward-only function).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verl.algorithms import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdaptiveKLController,
    AdvantageEstimator,
    FixedKLController,
    agg_loss,
    compute_entropy_loss,
    compute_gae_advantage_return,
    compute_gdpo_outcome_advantage,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_grpo_vectorized_outcome_advantage,
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_opo_outcome_advantage,
    compute_optimal_token_baseline_advantage,
    compute_policy_loss_bypass_mode,
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dppo_kl,
    compute_policy_loss_dppo_tv,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_reinforce,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rewards,
    compute_rloo_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
    compute_value_loss,
    get_kl_controller,
    kl_penalty,
    register_adv_est,
    register_policy_loss,
)
from verl.plugins import get_adv_estimator_fn, get_policy_loss_fn  # local registry, then plugin-provided

#: A registered policy loss, as verl types it: ``(old_log_prob, log_prob, advantages, response_mask,
#: loss_agg_mode, config, rollout_is_weights) -> (pg_loss, metrics)``; the tensors are (batch, response_len).
PolicyLossFn = Callable[
    [torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor, str, Any, torch.Tensor | None],
    tuple[torch.Tensor, dict[str, Any]],
]


def kl_penalty_forward(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """verl's forward-only KL estimate: the value of :func:`kl_penalty` for a mode without the ``+`` suffix.

    Args:
        logprob, ref_logprob: (batch, response_len) log-probs of the sampled tokens (float; half precision is
            computed in float32).
        kl_penalty: ``kl``/``k1``, ``abs``, ``mse``/``k2`` or ``low_var_kl``/``k3`` (J. Schulman, "Approximating
            KL divergence", 2020).

    Returns:
        (batch, response_len) per-token estimate, unmasked.

    Raises:
        ValueError: a ``+`` mode (the straight-through gradient is :func:`kl_penalty`'s; verl's forward function
            has no such modes either) or an unknown mode. verl raises ``NotImplementedError`` for an unknown one.

    Source: verl/trainer/ppo/core_algos.py:kl_penalty_forward.
    """
    if kl_penalty.endswith("+"):
        raise ValueError(
            f"kl_penalty_forward({kl_penalty!r}): '+' modes only exist in kl_penalty (value of the mode, gradient "
            f"of k2); use kl_penalty(logprob, ref_logprob, {kl_penalty!r}) or the mode {kl_penalty[:-1]!r}"
        )
    return _kl_penalty(logprob, ref_logprob, kl_penalty)


_kl_penalty = kl_penalty  # kl_penalty_forward's parameter (verl's name) shadows the function inside it

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "PolicyLossFn",
    "agg_loss",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_gpg_outcome_advantage",
    "compute_grpo_outcome_advantage",
    "compute_grpo_passk_outcome_advantage",
    "compute_grpo_vectorized_outcome_advantage",
    "compute_multi_turn_optimal_token_baseline_advantage",
    "compute_opo_outcome_advantage",
    "compute_optimal_token_baseline_advantage",
    "compute_policy_loss_bypass_mode",
    "compute_policy_loss_cispo",
    "compute_policy_loss_clip_cov",
    "compute_policy_loss_dppo_kl",
    "compute_policy_loss_dppo_tv",
    "compute_policy_loss_dro",
    "compute_policy_loss_geo_mean",
    "compute_policy_loss_gpg",
    "compute_policy_loss_gspo",
    "compute_policy_loss_kl_cov",
    "compute_policy_loss_reinforce",
    "compute_policy_loss_sapo",
    "compute_policy_loss_vanilla",
    "compute_reinforce_plus_plus_baseline_outcome_advantage",
    "compute_reinforce_plus_plus_outcome_advantage",
    "compute_remax_outcome_advantage",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "kl_penalty_forward",
    "register_adv_est",
    "register_policy_loss",
]
