"""Checks of the estimator- and loss-specific keys, run by ``validate_config``.

Errors:
* ``optimal_token_baseline`` / ``tir_optimal_token_baseline`` need Σπ² of the old policy per response
  token (verl's ``actor.calculate_sum_pi_squared``), which no training engine here computes: refused with
  the reason (the functions in :mod:`verl.algorithms` work when called with the tensors);
* ``gdpo`` needs ``algorithm.gdpo_reward_keys`` (verl fails at the first step without them);
  ``gdpo_reward_weights`` must give one weight per key;
* ``loss_mode=dro`` needs ``policy_loss.dro_beta`` > 0 (verl's default is null, and its loss raises);
* ``algorithm.rollout_correction`` (verl's decoupled mode and bypass mode):
  ``rollout_is`` / ``rollout_rs`` need the rollout's log-probs (``rollout.calculate_log_probs=true``);
  ``rollout_is`` with a null ``rollout_is_threshold`` (verl silently computes no weights) is refused;
  thresholds and rejection modes must parse (:mod:`verl.algorithms.rollout_rejection`), ``rollout_rs``
  needs ``rollout_rs_threshold``;
* ``policy_loss.rollout_correction``: the same threshold and mode formats;
* ``algorithm.rollout_correction.bypass_mode=true`` with a ``loss_mode`` other than ``bypass_mode`` or
  ``vanilla``: verl's ``apply_bypass_mode`` (rollout_corr_helper.py) replaces the loss_mode with
  ``bypass_mode``, so gspo, dppo_*, ... would not run there; rather than silently swapping the loss or
  running it on rollout log-probs where verl does not, the combination is refused. ``vanilla`` (the
  default) is swapped for ``bypass_mode`` as in verl, whose ``loss_type=ppo_clip`` is vanilla PPO-clip on
  the rollout log-probs. With bypass mode, verl also overwrites ``policy_loss.rollout_correction`` with
  ``algorithm.rollout_correction``, so a value set there would be dropped: refused, naming the key to set.

Warnings: ``gdpo_reward_*`` set for another estimator (ignored, as in verl); ``loss_mode=bypass_mode``
without ``algorithm.rollout_correction.bypass_mode`` (the loss then compares the policy with the recomputed
old policy, not with the rollout's); rollout-correction keys that only another key makes verl read
(``rollout_rs_threshold`` without ``rollout_rs``, ``rollout_is_batch_normalize`` without ``rollout_is``,
``loss_type`` without ``bypass_mode``).
"""

from __future__ import annotations

from typing import Any

import attrs

from verl.config.errors import IssueCollector
from verl.config.schema import RootConfig

ARR = "actor_rollout_ref"
PL = f"{ARR}.actor.policy_loss"
AC = "algorithm.rollout_correction"
TOKEN_BASELINE_ESTIMATORS = frozenset({"optimal_token_baseline", "tir_optimal_token_baseline"})


def check_algorithm_keys(cfg: RootConfig, report: IssueCollector) -> None:
    """Record the problems listed in the module docstring in ``report``."""
    _check_estimator(cfg, report)
    _check_policy_loss(cfg, report)
    _check_rollout_correction(cfg, report)


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
    _check_formats(f"{PL}.rollout_correction", corr, report)
    bypass = cfg.algorithm.rollout_correction.bypass_mode
    if bypass and pl.loss_mode not in ("bypass_mode", "vanilla"):
        report.error(
            f"{PL}.loss_mode",
            f"={pl.loss_mode!r} with algorithm.rollout_correction.bypass_mode=true: verl replaces the loss_mode "
            "with bypass_mode there (rollout_corr_helper.apply_bypass_mode), so this loss would not run; set "
            f"loss_mode=bypass_mode (loss_type ppo_clip or reinforce), or bypass_mode=false to run {pl.loss_mode} "
            "against recomputed old log-probs",
        )
    if bypass:
        defaults = type(corr)()
        for key in (field.name for field in attrs.fields(type(corr))):
            if getattr(corr, key) != getattr(defaults, key):
                report.error(
                    f"{PL}.rollout_correction.{key}",
                    f"={getattr(corr, key)!r} would be dropped: with algorithm.rollout_correction.bypass_mode=true "
                    "verl's apply_bypass_mode hands algorithm.rollout_correction to the loss instead; set "
                    f"algorithm.rollout_correction.{key} there",
                )
    if pl.loss_mode == "bypass_mode" and not bypass:
        report.warn(
            f"{PL}.loss_mode",
            "bypass_mode treats old_log_prob as the rollout policy's, but algorithm.rollout_correction.bypass_mode "
            "is false, so old_log_prob is the actor's own (recomputed or on-policy); set it to true (with "
            f"{ARR}.rollout.calculate_log_probs=true) to correct for the rollout mismatch",
        )


def _check_rollout_correction(cfg: RootConfig, report: IssueCollector) -> None:
    """``algorithm.rollout_correction``: what needs what, and the formats (module docstring)."""
    corr = cfg.algorithm.rollout_correction
    _check_formats(AC, corr, report)
    if corr.rollout_is is not None and corr.rollout_is_threshold is None:
        report.error(
            f"{AC}.rollout_is_threshold",
            f"is null, with which verl computes no weights for rollout_is={corr.rollout_is!r}; give a threshold "
            "(2.0 truncates, '0.5_2.0' is an IcePop band) or set rollout_is=null",
        )
    if not cfg.actor_rollout_ref.rollout.calculate_log_probs:
        for key in ("rollout_is", "rollout_rs"):
            if getattr(corr, key) is not None:
                report.error(
                    f"{AC}.{key}",
                    f"={getattr(corr, key)!r} compares the old policy with the rollout policy and needs the "
                    f"rollout's log-probs; set {ARR}.rollout.calculate_log_probs=true (or {AC}.{key}=null)",
                )
    if corr.rollout_rs is None and corr.rollout_rs_threshold is not None:
        report.warn(f"{AC}.rollout_rs_threshold", "is read only with rollout_rs set (as in verl); it does nothing")
    if corr.rollout_is is None and corr.rollout_is_batch_normalize:
        report.warn(f"{AC}.rollout_is_batch_normalize", "normalises the weights of rollout_is, which is null")
    if not corr.bypass_mode and corr.loss_type != "ppo_clip":
        report.warn(
            f"{AC}.loss_type",
            f"={corr.loss_type!r} is read in bypass mode only (as in verl); with bypass_mode=false the loss is "
            f"{PL}.loss_mode, multiplied by the importance weights",
        )


def _check_formats(prefix: str, corr: Any, report: IssueCollector) -> None:
    """rollout_is_threshold (when not null), rollout_rs and rollout_rs_threshold parse as verl parses them."""
    from verl.algorithms.rollout_correction import parse_rollout_is_threshold
    from verl.algorithms.rollout_rejection import parse_rollout_rs, parse_rollout_rs_thresholds

    if corr.rollout_is_threshold is not None:
        try:
            parse_rollout_is_threshold(corr.rollout_is_threshold)
        except (TypeError, ValueError) as err:
            report.error(f"{prefix}.rollout_is_threshold", str(err))
    if corr.rollout_rs is None:
        return
    try:
        modes = parse_rollout_rs(corr.rollout_rs)
    except (TypeError, ValueError) as err:
        report.error(f"{prefix}.rollout_rs", str(err))
        return
    try:
        parse_rollout_rs_thresholds(modes, corr.rollout_rs_threshold)
    except (TypeError, ValueError) as err:
        report.error(f"{prefix}.rollout_rs_threshold", str(err))
