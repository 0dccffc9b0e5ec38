"""Checks of the estimator- and loss-specific keys, run by ``validate_config``.

Errors:
* ``optimal_token_baseline`` / ``tir_optimal_token_baseline`` need Σπ² of the old policy per response
  token (verl's ``actor.calculate_sum_pi_squared``), which no training engine here computes: refused with
  the reason (the functions in :mod:`verl.algorithms` work when called with the tensors);
* ``gdpo`` needs ``algorithm.gdpo_reward_keys`` (verl fails at the first step without them);
  ``gdpo_reward_weights`` must give one weight per key;
* ``loss_mode=dro`` needs ``policy_loss.dro_beta`` > 0 (verl's default is null, and its loss raises);
* ``policy_loss.rollout_correction``: ``rollout_is_threshold`` must be a number > 0 or a ``"lower_upper"``
  string; rejection sampling (``rollout_rs``, ``rollout_rs_threshold``) is not implemented and must be null;
* ``algorithm.rollout_correction.bypass_mode=true`` with a ``loss_mode`` other than ``bypass_mode`` or
  ``vanilla``: verl's ``apply_bypass_mode`` (rollout_corr_helper.py) replaces the loss_mode with
  ``bypass_mode``, so gspo, dppo_*, ... would not run there; rather than silently swapping the loss or
  running it on rollout log-probs where verl does not, the combination is refused. ``vanilla`` keeps the
  fast path: vanilla PPO-clip against the rollout log-probs is the loss verl's bypass_mode computes for
  ``loss_type=ppo_clip`` (its default); ``loss_type=reinforce`` there needs ``loss_mode=bypass_mode``.

Warnings: ``gdpo_reward_*`` set for another estimator (ignored, as in verl); ``loss_mode=bypass_mode``
without ``algorithm.rollout_correction.bypass_mode`` (the loss then compares the policy with the recomputed
old policy, not with the rollout's).
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.schema import RootConfig

ARR = "actor_rollout_ref"
PL = f"{ARR}.actor.policy_loss"
TOKEN_BASELINE_ESTIMATORS = frozenset({"optimal_token_baseline", "tir_optimal_token_baseline"})


def check_algorithm_keys(cfg: RootConfig, report: IssueCollector) -> None:
    """Record the problems listed in the module docstring in ``report``."""
    _check_estimator(cfg, report)
    _check_policy_loss(cfg, report)


def _check_estimator(cfg: RootConfig, report: IssueCollector) -> None:
    algo = cfg.algorithm
    if algo.adv_estimator in TOKEN_BASELINE_ESTIMATORS:
        report.error(
            "algorithm.adv_estimator",
            f"{algo.adv_estimator} needs sum_pi_squared (Σπ² of the old policy per response token, verl's "
            f"{ARR}.actor.calculate_sum_pi_squared), which the training engines here do not compute; choose "
            "another estimator (grpo, rloo, ...) or call verl.algorithms."
            "compute_optimal_token_baseline_advantage from your own code with the tensors",
        )
    keys, weights = algo.gdpo_reward_keys, algo.gdpo_reward_weights
    if algo.adv_estimator == "gdpo":
        if not keys:
            report.error(
                "algorithm.gdpo_reward_keys",
                "adv_estimator=gdpo needs the reward component keys that compute_score returns in its dict, "
                "e.g. algorithm.gdpo_reward_keys=[format_reward,accuracy_reward]",
            )
        elif any(not key for key in keys):
            report.error("algorithm.gdpo_reward_keys", f"entries must be non-empty names, got {list(keys)}")
        if keys and weights is not None and len(weights) != len(keys):
            report.error(
                "algorithm.gdpo_reward_weights",
                f"has {len(weights)} entries for {len(keys)} gdpo_reward_keys; give one weight per key "
                "(or null for equal weights)",
            )
    elif keys is not None or weights is not None:
        report.warn(
            "algorithm.gdpo_reward_keys",
            f"gdpo_reward_keys / gdpo_reward_weights are read only by adv_estimator=gdpo, not {algo.adv_estimator}",
        )


def _check_policy_loss(cfg: RootConfig, report: IssueCollector) -> None:
    pl = cfg.actor_rollout_ref.actor.policy_loss
    if pl.loss_mode == "dro" and (pl.dro_beta is None or pl.dro_beta <= 0):
        report.error(
            f"{PL}.dro_beta",
            f"loss_mode=dro needs the penalty coefficient dro_beta > 0 (e.g. 0.1), got {pl.dro_beta}",
        )
    corr = pl.rollout_correction
    from verl.algorithms.rollout_correction import parse_rollout_is_threshold

    try:
        parse_rollout_is_threshold(corr.rollout_is_threshold)
    except (TypeError, ValueError) as err:
        report.error(f"{PL}.rollout_correction.rollout_is_threshold", str(err))
    for key in ("rollout_rs", "rollout_rs_threshold"):
        if getattr(corr, key) is not None:
            report.error(
                f"{PL}.rollout_correction.{key}",
                f"rollout rejection sampling is not implemented here; set it to null (got {getattr(corr, key)!r})",
            )
    bypass = cfg.algorithm.rollout_correction.bypass_mode
    if bypass and pl.loss_mode not in ("bypass_mode", "vanilla"):
        report.error(
            f"{PL}.loss_mode",
            f"={pl.loss_mode!r} with algorithm.rollout_correction.bypass_mode=true: verl replaces the loss_mode "
            "with bypass_mode there (rollout_corr_helper.apply_bypass_mode), so this loss would not run; set "
            f"loss_mode=bypass_mode (loss_type ppo_clip or reinforce), or bypass_mode=false to run {pl.loss_mode} "
            "against recomputed old log-probs",
        )
    elif bypass and pl.loss_mode == "vanilla" and corr.loss_type != "ppo_clip":
        report.error(
            f"{PL}.rollout_correction.loss_type",
            f"={corr.loss_type!r} is read by loss_mode=bypass_mode only (verl switches to it when "
            "algorithm.rollout_correction.bypass_mode=true); set loss_mode=bypass_mode",
        )
    if pl.loss_mode == "bypass_mode" and not bypass:
        report.warn(
            f"{PL}.loss_mode",
            "bypass_mode treats old_log_prob as the rollout policy's, but algorithm.rollout_correction.bypass_mode "
            "is false, so old_log_prob is the actor's own (recomputed or on-policy); set it to true (with "
            f"{ARR}.rollout.calculate_log_probs=true) to correct for the rollout mismatch",
        )
