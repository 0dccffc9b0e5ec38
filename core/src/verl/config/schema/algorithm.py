"""``algorithm.*``: advantage estimator and in-reward KL (verl ``AlgoConfig``)."""

from __future__ import annotations

from typing import Literal

import attrs

from verl.config.schema._fields import fld, section

KlCtrlType = Literal["fixed", "adaptive"]


@attrs.frozen(kw_only=True)
class KlCtrlConfig:
    """Coefficient of the in-reward KL penalty (used only with ``use_kl_in_reward``)."""

    type: KlCtrlType = fld("fixed", doc="fixed: constant kl_coef; adaptive: steer the KL toward target_kl")
    kl_coef: float = fld(0.001, doc="(initial) KL coefficient")
    horizon: int = fld(10000, doc="adaptive: update horizon in samples (> 0)")
    target_kl: float = fld(0.1, doc="adaptive: target KL per token")


@attrs.frozen(kw_only=True)
class RolloutCorrectionConfig:
    """Rollout / training policy mismatch handling (verl ``algorithm.rollout_correction``).

    Only ``bypass_mode`` is implemented: verl's importance-sampling and rejection-sampling keys
    (``rollout_is``, ``rollout_rs``, ...) are not, and are rejected as unknown keys.
    """

    bypass_mode: bool = fld(
        False,
        doc="use the rollout's log-probs as the old policy's (needs rollout.calculate_log_probs) and skip "
        "the old_log_prob pass; exact only when the rollout computes log-probs as the trainer does",
    )


@attrs.frozen(kw_only=True)
class AlgorithmConfig:
    """Advantage estimation and KL-in-reward.

    KL routing (known failure K22): ``use_kl_in_reward`` subtracts ``kl_ctrl.kl_coef * KL``
    from the token rewards; ``actor.use_kl_loss`` adds a KL term to the loss. Neither is
    switched on implicitly. Both on is allowed and additive (the KL is penalised twice) and
    produces a validation warning.
    """

    gamma: float = fld(1.0, doc="discount factor per token")
    lam: float = fld(1.0, doc="GAE lambda")
    adv_estimator: str = fld("gae", doc="registered estimator: gae|grpo|rloo|reinforce_plus_plus|remax|...")
    norm_adv_by_std_in_grpo: bool = fld(True, doc="GRPO: divide by group std; false = Dr.GRPO")
    use_kl_in_reward: bool = fld(False, doc="subtract kl_ctrl.kl_coef * KL(policy || ref) from token rewards")
    kl_penalty: str = fld("kl", doc="KL estimator for the reward penalty: kl|k1|abs|mse|k2|low_var_kl|k3 (+ suffix)")
    kl_ctrl: KlCtrlConfig = section(KlCtrlConfig, doc="in-reward KL coefficient controller")
    rollout_correction: RolloutCorrectionConfig = section(
        RolloutCorrectionConfig, doc="where the old policy's log-probs come from (bypass_mode)"
    )
    gdpo_reward_keys: tuple[str, ...] | None = fld(
        None,
        doc="gdpo: keys of compute_score's returned dict holding the reward components, each normalised "
        "per group (required with adv_estimator=gdpo)",
    )
    gdpo_reward_weights: tuple[float, ...] | None = fld(
        None, doc="gdpo: one weight per gdpo_reward_keys entry for the sum of normalised components; null = all 1"
    )
