"""``algorithm.*``: advantage estimator, in-reward KL and DAPO group filtering (verl ``AlgoConfig``)."""

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

    verl's keys and YAML defaults (``algorithm/rollout_correction.yaml``). Decoupled mode (three policies,
    ``bypass_mode=false``): after the old_log_prob pass the trainer computes importance weights and the
    rejection mask from old vs rollout log-probs, stores ``rollout_is_weights`` (every policy loss multiplies
    by them) and masks ``response_mask``; with ``rollout_is`` or ``rollout_rs`` set the old_log_prob pass
    always runs. Bypass mode (two policies): the rollout's log-probs are the old policy's and the actor's
    loss is ``bypass_mode`` reading these keys. See :mod:`verl.algorithms.rollout_correction`.
    """

    rollout_is: Literal["token", "sequence"] | None = fld(
        None, doc="importance weights pi_old/pi_rollout per token or per sequence; null = none (metrics only)"
    )
    rollout_is_threshold: float | str | None = fld(
        2.0, doc="weights truncated at this upper bound (TIS), or 'lower_upper' zeroes them outside the band (IcePop)"
    )
    rollout_is_batch_normalize: bool = fld(False, doc="rescale the weights to mean 1 over the batch")
    rollout_rs: str | None = fld(
        None,
        doc="rejection sampling, comma-separated modes token_k1|k2|k3, seq_sum_k1|k2|k3, seq_mean_k1|k2|k3, "
        "seq_max_k2|k3 (all must pass); null = none",
    )
    rollout_rs_threshold: float | str | None = fld(
        None, doc="per rollout_rs mode (one shared, or comma-separated): k1 'lower_upper' (or u: 1/u_u), k2/k3 u"
    )
    bypass_mode: bool = fld(
        False,
        doc="use the rollout's log-probs as the old policy's (needs rollout.calculate_log_probs) and skip "
        "the old_log_prob pass; exact only when the rollout computes log-probs as the trainer does",
    )
    loss_type: Literal["ppo_clip", "reinforce"] = fld(
        "ppo_clip",
        doc="bypass_mode: ppo_clip = PPO clip with r = pi/pi_rollout; reinforce = -w * A * log pi (no clip)",
    )


@attrs.frozen(kw_only=True)
class FilterGroupsConfig:
    """DAPO's dynamic sampling (verl ``algorithm.filter_groups``, ``FilterGroupsConfig`` in
    ``verl/trainer/config/algorithm.py``; the loop is ``recipe/dapo/dapo_ray_trainer.py``).

    With ``enable``, a step generates ``data.gen_batch_size`` prompts x ``rollout.n`` per round, drops the
    groups (responses of one prompt) whose ``metric`` is the same for every response, and runs more rounds
    until ``data.train_batch_size`` groups are kept; the batch is then cut to exactly that many groups.
    Trainer side: :mod:`verl.trainer.dynamic_sampling`; the filter: :mod:`verl.algorithms.filter_groups`.
    """

    enable: bool = fld(False, doc="drop groups whose metric is equal for every response and sample more prompts")
    metric: str | None = fld(
        None,
        doc="acc|score|seq_reward|seq_final_reward|<a key of compute_score's dict>: the per-response value "
        "compared within a group (seq_reward: sum of token_level_scores; seq_final_reward: of token_level_rewards, "
        "after the in-reward KL); required with enable",
    )
    max_num_gen_batches: int = fld(
        0, doc="generation rounds a step may use before it fails (check the data or raise it); <= 0 = no limit"
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
        RolloutCorrectionConfig, doc="importance weights, rejection sampling and bypass mode vs the rollout policy"
    )
    filter_groups: FilterGroupsConfig = section(
        FilterGroupsConfig, doc="DAPO dynamic sampling: drop groups without reward spread, sample more prompts"
    )
    gdpo_reward_keys: tuple[str, ...] | None = fld(
        None,
        doc="gdpo: keys of compute_score's returned dict holding the reward components, each normalised "
        "per group (required with adv_estimator=gdpo)",
    )
    gdpo_reward_weights: tuple[float, ...] | None = fld(
        None, doc="gdpo: one weight per gdpo_reward_keys entry for the sum of normalised components; null = all 1"
    )
