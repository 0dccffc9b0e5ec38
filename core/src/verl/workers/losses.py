"""The actor's PPO loss as a training-engine loss function.

``make_ppo_loss(actor_config)`` returns ``loss_fn(micro, outputs, norm) -> (loss, metrics)``
for :meth:`TrainingEngine.train_batch`. Every term is aggregated with the *mini-batch*
normalisers in ``norm`` (see :func:`verl.algorithms.compute_global_batch_info`), so the
micro-batch losses sum to the mini-batch loss (DESIGN §5, K04). Metrics are returned as
additive contributions: the engine sums them over the micro-batches of a mini-batch, which
gives the token-weighted mini-batch value of every metric (losses and fractions alike).

Follows ``verl/workers/utils/losses.py:ppo_loss``:
``loss = pg_loss - entropy_coeff * entropy + kl_loss_coef * kl_loss`` (K10).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import attrs
import torch

from verl.algorithms import agg_loss, combine_actor_loss, kl_penalty
from verl.plugins import get_policy_loss_fn  # plugin-provided losses too

LossFn = Callable[[Any, dict[str, torch.Tensor], dict[str, Any]], tuple[torch.Tensor, dict[str, float]]]


def make_ppo_loss(actor: Any, *, entropy_metric: bool = False, rollout_correction: Any = None) -> LossFn:
    """Build the actor loss for the ``actor_rollout_ref.actor`` config section ``actor``.

    The micro-batch must carry ``advantages``, ``response_mask`` ``(bs, resp_len)``, plus
    ``ref_log_prob`` when ``actor.use_kl_loss`` and optionally ``rollout_is_weights`` ``(bs, resp_len)``
    (decoupled rollout correction: the policy loss multiplies its per-token loss by them); and
    ``old_log_probs``, unless ``meta_info["old_log_prob_source"] == "on_policy"``: then the
    detached log-probs of this very forward are the old policy's (one optimizer step per batch,
    see :meth:`verl.trainer.ppo_trainer.PPOTrainer.old_log_prob_source`).

    Args:
        actor: the ``actor_rollout_ref.actor`` section.
        entropy_metric: also report ``actor/entropy`` (the aggregated entropy of this forward; the
            engine computes it without a graph when the loss itself has no entropy term).
        rollout_correction: the ``algorithm.rollout_correction`` section. With ``bypass_mode`` on, the loss
            is ``bypass_mode`` and reads this section in place of ``actor.policy_loss.rollout_correction``
            (verl's ``apply_bypass_mode``, rollout_corr_helper.py: the old log-probs are the rollout's).

    Raises:
        ValueError: (at build time) for an unknown ``policy_loss.loss_mode``.
        KeyError: (at call time) if a required tensor is missing, naming it.
    """
    if rollout_correction is not None and rollout_correction.bypass_mode:
        actor = _bypass_actor(actor, rollout_correction)
    policy_loss_fn = get_policy_loss_fn(actor.policy_loss.loss_mode)
    mode = actor.loss_agg_mode

    def loss_fn(micro: Any, outputs: dict[str, torch.Tensor], norm: dict[str, Any]) -> tuple[torch.Tensor, dict]:
        batch = micro.batch
        on_policy = (micro.meta_info or {}).get("old_log_prob_source") == "on_policy"
        required = ("advantages", "response_mask") if on_policy else ("old_log_probs", "advantages", "response_mask")
        for key in required:
            if key not in batch.keys():
                raise KeyError(f"actor update needs batch[{key!r}]; present: {sorted(batch.keys())}")
        mask = batch["response_mask"]
        log_prob = outputs["log_probs"]
        old_log_prob = log_prob.detach() if on_policy else batch["old_log_probs"]
        is_weights = batch["rollout_is_weights"] if "rollout_is_weights" in batch.keys() else None
        pg_loss, pg_metrics = policy_loss_fn(
            old_log_prob=old_log_prob,
            log_prob=log_prob,
            advantages=batch["advantages"],
            response_mask=mask,
            loss_agg_mode=mode,
            config=actor,
            rollout_is_weights=is_weights,
            global_batch_info=norm,
        )
        entropy = agg_loss(outputs["entropys"], mask, mode, **norm) if "entropys" in outputs else None
        kl_loss = None
        if actor.use_kl_loss:
            if "ref_log_prob" not in batch.keys():
                raise KeyError("actor.use_kl_loss=true needs batch['ref_log_prob'] (run the reference policy)")
            kl = kl_penalty(log_prob, batch["ref_log_prob"], actor.kl_loss_type)
            kl_loss = agg_loss(kl, mask, mode, **norm)
        loss = combine_actor_loss(
            pg_loss, kl_loss=kl_loss, kl_coef=actor.kl_loss_coef, entropy=entropy, entropy_coeff=actor.entropy_coeff
        )
        # Ratio-type metrics are per-micro means: weight them by the micro-batch's token share.
        share = float(mask.sum()) / max(1, int(norm["batch_num_tokens"]))
        metrics = {key: float(value) * share for key, value in pg_metrics.items()}
        # Loss terms carry agg_loss's x dp_size (it undoes the DP gradient averaging); without it they
        # are this rank's additive share of the global value, so the sum over ranks is that value.
        dp = int(norm.get("dp_size", 1))
        metrics["actor/pg_loss"] = float(pg_loss.detach()) / dp
        metrics["actor/loss"] = float(loss.detach()) / dp
        if entropy is not None:
            metrics["actor/entropy_loss"] = float(entropy.detach()) / dp
        if entropy_metric and "entropys" in outputs:
            value = entropy if entropy is not None else agg_loss(outputs["entropys"], mask, mode, **norm)
            metrics["actor/entropy"] = float(value.detach()) / dp
        if kl_loss is not None:
            metrics["actor/kl_loss"] = float(kl_loss.detach()) / dp
            metrics["actor/kl_coef"] = float(actor.kl_loss_coef) * share
        return loss, metrics

    loss_fn.needs_entropy = actor.entropy_coeff != 0  # the engine skips the entropy's graph otherwise
    loss_fn.entropy_metric = entropy_metric  # the engine computes it (without a graph) for the metric
    return loss_fn


def _bypass_actor(actor: Any, rollout_correction: Any) -> Any:
    """``actor`` whose policy loss is ``bypass_mode`` with ``algorithm.rollout_correction``'s settings."""
    from verl.config.schema.actor import PolicyLossRolloutCorrectionConfig

    corr = PolicyLossRolloutCorrectionConfig(
        loss_type=rollout_correction.loss_type,
        rollout_is=rollout_correction.rollout_is,
        rollout_is_threshold=rollout_correction.rollout_is_threshold,
        rollout_is_batch_normalize=rollout_correction.rollout_is_batch_normalize,
        rollout_rs=rollout_correction.rollout_rs,
        rollout_rs_threshold=rollout_correction.rollout_rs_threshold,
    )
    policy_loss = attrs.evolve(actor.policy_loss, loss_mode="bypass_mode", rollout_correction=corr)
    return attrs.evolve(actor, policy_loss=policy_loss)


def make_value_loss(critic: Any) -> LossFn:
    """Build the critic loss for the ``critic`` config section (``cliprange_value``, ``loss_agg_mode``).

    ``loss_fn(micro, outputs, norm)``: ``outputs["values"]`` ``(bs, resp_len)`` are the current value
    predictions; the micro-batch must carry ``values`` (the rollout-time V_old), ``returns`` and
    ``response_mask`` ``(bs, resp_len)``. ``loss = 0.5 * agg(max((v - R)^2, (clip(v, V_old +- c) - R)^2))``
    with the mini-batch normalisers ``norm`` (verl ``verl/workers/utils/losses.py:value_loss`` and
    ``core_algos.py:compute_value_loss``).

    Metrics (additive contributions, summed over micro-batches by the engine): ``critic/vf_loss``,
    ``critic/vf_clipfrac`` (token-weighted), ``critic/vpred_mean`` (token-weighted mean of the predictions).

    Raises:
        KeyError: (at call time) a required tensor is missing, naming it.
    """
    from verl.algorithms import compute_value_loss, masked_mean

    mode = critic.loss_agg_mode
    clip = float(critic.cliprange_value)

    def loss_fn(micro: Any, outputs: dict[str, torch.Tensor], norm: dict[str, Any]) -> tuple[torch.Tensor, dict]:
        batch = micro.batch
        for key in ("values", "returns", "response_mask"):
            if key not in batch.keys():
                raise KeyError(f"critic update needs batch[{key!r}]; present: {sorted(batch.keys())}")
        mask = batch["response_mask"]
        vpreds = outputs["values"]
        vf_loss, vf_clipfrac = compute_value_loss(
            vpreds=vpreds,
            returns=batch["returns"],
            values=batch["values"],
            response_mask=mask,
            cliprange_value=clip,
            loss_agg_mode=mode,
            **norm,
        )
        share = float(mask.sum()) / max(1, int(norm["batch_num_tokens"]))
        dp = int(norm.get("dp_size", 1))
        metrics = {
            "critic/vf_loss": float(vf_loss.detach()) / dp,
            "critic/vf_clipfrac": float(vf_clipfrac) * share,
            "critic/vpred_mean": float(masked_mean(vpreds.detach(), mask)) * share if share else 0.0,
        }
        return vf_loss, metrics

    loss_fn.needs_entropy = False
    return loss_fn


def make_sft_loss() -> LossFn:
    """The SFT loss: token-mean negative log-likelihood over the loss-mask tokens of the whole mini-batch.

    ``loss_fn(micro, outputs, norm)``: ``outputs["log_probs"]`` ``(bs, L)`` are the log-probs of the micro-batch's
    ``responses`` (for SFT rows the whole sequence after its first token, :func:`verl.data.sft_dataset.collate_sft`)
    and ``micro.batch["response_mask"]`` ``(bs, L)`` marks the assistant tokens. ``loss = -sum(log_probs * mask) /
    batch_num_tokens * dp_size`` with the mini-batch normalisers ``norm``, so the micro-batch losses sum to the
    mini-batch token mean (verl ``verl/workers/utils/losses.py:sft_loss``).

    Metrics (additive, summed over micro-batches by the engine): ``train/loss`` (this rank's share of the
    mini-batch NLL per token).

    Raises:
        KeyError: (at call time) ``response_mask`` missing.
    """

    def loss_fn(micro: Any, outputs: dict[str, torch.Tensor], norm: dict[str, Any]) -> tuple[torch.Tensor, dict]:
        if "response_mask" not in micro.batch.keys():
            raise KeyError(f"SFT update needs batch['response_mask']; present: {sorted(micro.batch.keys())}")
        mask = micro.batch["response_mask"].to(outputs["log_probs"].dtype)
        dp = int(norm.get("dp_size", 1))
        tokens = max(1, int(norm["batch_num_tokens"]))
        loss = -(outputs["log_probs"] * mask).sum() / tokens * dp
        return loss, {"train/loss": float(loss.detach()) / dp}

    loss_fn.needs_entropy = False
    return loss_fn
