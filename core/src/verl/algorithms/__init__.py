"""RL algorithm maths: advantage estimators, policy/value losses, KL terms, loss aggregation.

Everything here is pure tensor code (torch + numpy), device-agnostic, with verl's names and keyword
signatures (verl/trainer/ppo/core_algos.py). Estimators and policy losses are looked up by name through
:func:`get_adv_estimator_fn` / :func:`get_policy_loss_fn`, which also see plugin-provided ones.
"""

from verl.algorithms.actor_loss import combine_actor_loss, compute_entropy_loss
from verl.algorithms.advantage import (
    AdvantageEstimator,
    compute_gae_advantage_return,
    compute_gpg_outcome_advantage,
    compute_grpo_outcome_advantage,
    compute_grpo_passk_outcome_advantage,
    compute_opo_outcome_advantage,
    compute_reinforce_plus_plus_baseline_outcome_advantage,
    compute_reinforce_plus_plus_outcome_advantage,
    compute_remax_outcome_advantage,
    compute_rloo_outcome_advantage,
)
from verl.algorithms.advantage_gdpo import compute_gdpo_outcome_advantage
from verl.algorithms.advantage_token_baseline import (
    compute_multi_turn_optimal_token_baseline_advantage,
    compute_optimal_token_baseline_advantage,
)
from verl.algorithms.advantage_vectorized import (
    compute_grpo_vectorized_outcome_advantage,
    compute_rloo_vectorized_outcome_advantage,
)
from verl.algorithms.driver import compute_advantage, compute_response_mask
from verl.algorithms.kl import (
    KL_PENALTY_MODES,
    AdaptiveKLController,
    FixedKLController,
    apply_kl_penalty,
    compute_rewards,
    get_kl_controller,
    kl_penalty,
)
from verl.algorithms.loss_agg import LOSS_AGG_MODES, agg_loss, compute_global_batch_info
from verl.algorithms.policy_loss import (
    compute_policy_loss_cispo,
    compute_policy_loss_clip_cov,
    compute_policy_loss_dro,
    compute_policy_loss_geo_mean,
    compute_policy_loss_gpg,
    compute_policy_loss_gspo,
    compute_policy_loss_kl_cov,
    compute_policy_loss_sapo,
    compute_policy_loss_vanilla,
)
from verl.algorithms.policy_loss_bypass import compute_policy_loss_bypass_mode, compute_policy_loss_reinforce
from verl.algorithms.policy_loss_dppo import compute_policy_loss_dppo_kl, compute_policy_loss_dppo_tv
from verl.algorithms.registry import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    register_adv_est,
    register_policy_loss,
)
from verl.algorithms.utils import (
    entropy_from_logits,
    logprobs_from_logits,
    masked_mean,
    masked_sum,
    masked_var,
    masked_whiten,
)
from verl.algorithms.value_loss import compute_value_loss

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "KL_PENALTY_MODES",
    "LOSS_AGG_MODES",
    "POLICY_LOSS_REGISTRY",
    "AdaptiveKLController",
    "AdvantageEstimator",
    "FixedKLController",
    "agg_loss",
    "apply_kl_penalty",
    "combine_actor_loss",
    "compute_advantage",
    "compute_entropy_loss",
    "compute_gae_advantage_return",
    "compute_gdpo_outcome_advantage",
    "compute_global_batch_info",
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
    "compute_response_mask",
    "compute_rewards",
    "compute_rloo_outcome_advantage",
    "compute_rloo_vectorized_outcome_advantage",
    "compute_value_loss",
    "entropy_from_logits",
    "get_adv_estimator_fn",
    "get_kl_controller",
    "get_policy_loss_fn",
    "kl_penalty",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
    "register_adv_est",
    "register_policy_loss",
]
