"""Rollout correction: importance weights and rejection between the training and the rollout policy.

log_ratio = logπ_train − logπ_rollout, all tensors (batch, response_len). "Training policy" is the old
policy recomputed by the trainer in verl's decoupled mode (three policies: rollout, old, current;
:func:`compute_rollout_correction_and_add_to_batch`, called by the trainer after old_log_prob), or the
current policy in the ``bypass_mode`` loss (:mod:`verl.algorithms.policy_loss_bypass`).

* ``rollout_is="token"``: w_t = exp(clamp(log_ratio_t, ±20)); ``"sequence"``: one weight per row,
  exp(clamp(Σ_t log_ratio_t, ±20)), broadcast over the row.
* ``rollout_is_threshold``: a number (or numeric string) u truncates, w = min(w, u) (TIS); a string
  ``"l_u"`` zeroes weights outside [l, u] (IcePop).
* ``rollout_is_batch_normalize``: divide by the mean weight (token mean, or mean of per-row weights)
  of the tensors passed in; with ``torch.distributed`` initialised and more than one rank, the sums and
  counts are all-reduced over the default group first (verl's ``distributed_masked_mean``), so the
  mean is over the micro-batches of all ranks (every rank must call it the same number of times).
* ``rollout_rs``: rejection sampling (:mod:`verl.algorithms.rollout_rejection`) zeroes tokens or rows
  of the response mask.

Weights are zero outside the mask and detached. Metrics follow verl's names (``rollout_is_*``,
``rollout_rs_*``, and the mismatch diagnostics of :func:`compute_offpolicy_metrics`); the combined
functions prefix them ``rollout_corr/``. Degenerate input (no valid token) gives 0-valued weight and
mismatch metrics where verl raises, as :func:`verl.algorithms.utils.masked_mean` does.

Source: verl/trainer/ppo/rollout_corr_helper.py (compute_rollout_correction_weights, compute_is_metrics,
compute_offpolicy_metrics, compute_rollout_correction_and_rejection_mask,
compute_rollout_correction_and_add_to_batch). Background: Liu et al. 2025, "When Speed Kills Stability"
(https://richardli.xyz/rl-collapse).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from verl.algorithms.rollout_rejection import compute_rollout_rejection_mask
from verl.algorithms.utils import masked_mean, masked_sum

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "compute_is_metrics",
    "compute_offpolicy_metrics",
    "compute_rollout_correction_and_add_to_batch",
    "compute_rollout_correction_and_rejection_mask",
    "compute_rollout_correction_weights",
    "parse_rollout_is_threshold",
]

SAFETY_BOUND = 20.0  # exp(±20): the largest/smallest weight that stays finite in fp32 arithmetic
ROLLOUT_IS_LEVELS = ("token", "sequence")


def parse_rollout_is_threshold(spec: str | float) -> tuple[float, float | None]:
    """``2.0`` / ``"2.0"`` -> (2.0, None) (TIS); ``"0.5_2.0"`` -> (2.0, 0.5) (IcePop bounds).

    Raises:
        TypeError: a bool or a non-number, non-string spec.
        ValueError: unparsable string, a bound <= 0, or lower > upper.

    Source: verl/trainer/ppo/rollout_corr_helper.py:_parse_rollout_is_threshold.
    """
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError(f"rollout_is_threshold must be a number or a 'lower_upper' string, got {spec!r}")
    lower: float | None = None
    if isinstance(spec, str):
        text = spec.strip()
        try:
            if "_" in text:
                low_text, high_text = text.split("_", 1)
                lower, upper = float(low_text), float(high_text)
            else:
                upper = float(text)
        except ValueError as err:
            raise ValueError(f"rollout_is_threshold {spec!r} is neither a number nor 'lower_upper'") from err
    else:
        upper = float(spec)
    if upper <= 0 or (lower is not None and lower <= 0):
        raise ValueError(f"rollout_is_threshold bounds must be > 0, got {spec!r}")
    if lower is not None and lower > upper:
        raise ValueError(f"rollout_is_threshold lower bound exceeds the upper bound in {spec!r}")
    return upper, lower


@torch.no_grad()
def compute_rollout_correction_weights(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str = "token",
    rollout_is_threshold: str | float = 2.0,
    rollout_is_batch_normalize: bool = False,
) -> tuple[torch.Tensor, dict[str, float]]:
    """Truncated (TIS) or band-passed (IcePop) importance weights π_train/π_rollout.

    Args:
        log_ratio: (batch, response_len) logπ_train − logπ_rollout.
        response_mask: (batch, response_len) 0/1.
        rollout_is: ``"token"`` or ``"sequence"`` (see the module docstring).
        rollout_is_threshold: see :func:`parse_rollout_is_threshold`.
        rollout_is_batch_normalize: rescale to mean 1 over the valid tokens (token) or rows (sequence).

    Returns:
        (weights (batch, response_len) detached, zero outside the mask; metrics without prefix: those of
        :func:`compute_is_metrics` (on the weights before normalisation), ``rollout_is_oob_ratio`` for
        IcePop (share of valid tokens whose raw weight is outside [l, u]), and
        ``rollout_is_batch_norm_factor`` when normalising, the all-rank mean when torch.distributed is
        initialised).

    Raises:
        ValueError: unknown ``rollout_is``; a bad threshold (see :func:`parse_rollout_is_threshold`).

    Source: verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_correction_weights.
    """
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is must be one of {ROLLOUT_IS_LEVELS} (or null to disable), got {rollout_is!r}")
    upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
    mask = response_mask.to(log_ratio.dtype)
    if rollout_is == "token":
        unclamped = log_ratio
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        unclamped = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(unclamped, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    metrics = compute_is_metrics(weights, raw, unclamped, response_mask, rollout_is, upper, lower)
    if lower is not None:
        outside = (raw < lower) | (raw > upper)
        metrics["rollout_is_oob_ratio"] = float(masked_mean(outside.to(raw.dtype), response_mask))
    if rollout_is_batch_normalize:
        if rollout_is == "token":
            mean = _global_masked_mean(weights, mask)
        else:
            rows = (mask.sum(dim=-1) > 0).to(weights.dtype)
            mean = _global_masked_mean(masked_mean(weights, response_mask, axis=-1), rows)
        if float(mean) > 1e-8:
            weights = weights / mean
            metrics["rollout_is_batch_norm_factor"] = float(mean)
        else:
            metrics["rollout_is_batch_norm_factor"] = 1.0
    return weights.detach(), metrics


def _valid_extreme(values: torch.Tensor, valid: torch.Tensor, largest: bool) -> float:
    picked = values[valid]
    if picked.numel() == 0:
        return 0.0
    return float(picked.max() if largest else picked.min())


def compute_is_metrics(
    rollout_is_weights: torch.Tensor,
    raw_rollout_is_weights: torch.Tensor,
    log_ratio_for_metrics: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str,
    rollout_is_threshold: float,
    rollout_is_threshold_lower: float | None = None,
) -> dict[str, float]:
    """verl's IS weight statistics (no prefix), python floats.

    Args:
        rollout_is_weights: (batch, response_len) applied weights (after TIS / IcePop, before normalisation).
        raw_rollout_is_weights: the same before TIS / IcePop (safety-clamped, zero outside the mask).
        log_ratio_for_metrics: unclamped log-ratio: (batch, response_len) for ``token``, the per-row sum
            (batch, 1) for ``sequence``.
        response_mask: (batch, response_len) 0/1.
        rollout_is: ``"token"`` or ``"sequence"``.
        rollout_is_threshold: upper bound u; ``rollout_is_threshold_lower``: l (None: 1/u).

    Returns:
        ``rollout_is_mean`` (masked mean of the applied weights); ``_max`` / ``_min`` (sequence: exp of the
        largest row sum capped at e^20 / of the smallest, over all rows; token: of the applied weights over
        valid tokens); ``_ratio_fraction_high`` / ``_low`` (sequence: share of all rows whose unclamped sum
        is above log u / below log l; token: share of valid tokens whose raw weight is above u / below l);
        ``_std`` (of the applied weights clipped to [0, u] over valid tokens; 0 with at most one token);
        ``_eff_sample_size`` (1 / masked mean of (w / (mean w + 1e-8))², w clipped to [0, u]; 0 when every
        weight is 0, where verl divides by zero); ``_seq_mean`` / ``_seq_std`` (unbiased) / ``_seq_max`` /
        ``_seq_min`` of the per-row mean applied weight over all rows; ``_seq_max_deviation`` (max
        |row mean − 1|); ``_seq_fraction_high`` / ``_low`` (share of rows whose raw mean weight is above u /
        below l).

    Source: verl/trainer/ppo/rollout_corr_helper.py:compute_is_metrics.
    """
    upper = float(rollout_is_threshold)
    lower = 1.0 / upper if rollout_is_threshold_lower is None else float(rollout_is_threshold_lower)
    w, raw, mask = rollout_is_weights, raw_rollout_is_weights, response_mask
    valid = mask != 0
    dtype = w.dtype
    out = {"rollout_is_mean": float(masked_mean(w, mask))}
    if rollout_is == "sequence":
        seq = log_ratio_for_metrics
        out["rollout_is_max"] = float(torch.exp(torch.clamp(seq.max(), max=SAFETY_BOUND)))
        out["rollout_is_min"] = float(torch.exp(seq.min()))
        # verl counts rows (every row, empty ones included) on the unclamped Σ log-ratio in log space,
        # so a row beyond exp(±20) still counts and a long row weighs as much as a short one.
        out["rollout_is_ratio_fraction_high"] = float((seq > math.log(upper)).to(dtype).mean())
        out["rollout_is_ratio_fraction_low"] = float((seq < math.log(lower)).to(dtype).mean())
    else:
        out["rollout_is_ratio_fraction_high"] = float(masked_mean((raw > upper).to(dtype), mask))
        out["rollout_is_ratio_fraction_low"] = float(masked_mean((raw < lower).to(dtype), mask))
        out["rollout_is_max"] = _valid_extreme(w, valid, largest=True)
        out["rollout_is_min"] = _valid_extreme(w, valid, largest=False)
    clipped = w.clamp(min=0.0, max=upper)
    mean = masked_mean(clipped, mask)
    if int(valid.sum()) > 1:
        out["rollout_is_std"] = float(torch.sqrt(torch.clamp(masked_mean(clipped.square(), mask) - mean**2, min=0)))
    else:
        out["rollout_is_std"] = 0.0
    second = float(masked_mean((clipped / (mean + 1e-8)).square(), mask))
    out["rollout_is_eff_sample_size"] = 1.0 / second if second > 0 else 0.0
    row_mean = masked_mean(w, mask, axis=-1)
    out["rollout_is_seq_mean"] = float(row_mean.mean())
    out["rollout_is_seq_std"] = float(row_mean.std()) if row_mean.numel() > 1 else 0.0
    out["rollout_is_seq_max"] = float(row_mean.max())
    out["rollout_is_seq_min"] = float(row_mean.min())
    out["rollout_is_seq_max_deviation"] = float((row_mean - 1.0).abs().max())
    # On the raw row mean: a mean of weights truncated at u can never exceed u.
    raw_row_mean = masked_mean(raw, mask, axis=-1)
    out["rollout_is_seq_fraction_high"] = float((raw_row_mean > upper).to(dtype).mean())
    out["rollout_is_seq_fraction_low"] = float((raw_row_mean < lower).to(dtype).mean())
    return out


def _global_masked_mean(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Σ values·mask / Σ mask over this rank, or over all ranks of the default group when distributed.

    An all-zero mask gives 0 (verl gives NaN across ranks; both leave the weights unnormalised).
    Source: verl/utils/torch_functional.py:distributed_masked_mean.
    """
    total = (values * mask).sum()
    count = mask.sum()
    dist = torch.distributed
    if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
        both = torch.stack([total, count])
        dist.all_reduce(both, op=dist.ReduceOp.SUM)
        total, count = both[0], both[1]
    return total / count.clamp(min=1e-8)


@torch.no_grad()
def compute_offpolicy_metrics(
    old_log_prob: torch.Tensor, rollout_log_prob: torch.Tensor, response_mask: torch.Tensor
) -> dict[str, float]:
    """Training-vs-rollout mismatch diagnostics (no prefix), all python floats.

    training_ppl / rollout_ppl: batch mean of per-row exp(−mean_t logπ); *_log_ppl: mean of −mean_t logπ;
    kl: masked mean of logπ_rollout − logπ_train (KL(rollout‖train)); k3_kl: masked mean of
    e^x − x − 1, x = logπ_train − logπ_rollout; log_ppl_diff(_abs/_max/_min): per-row
    mean_t logπ_rollout − mean_t logπ_train; ppl_ratio: mean of its exp; chi2_token: masked mean of
    ρ² − 1 (ρ = e^x, x clamped to ±20); chi2_seq: batch mean of exp(2·clamp(Σ_t x)) − 1.

    Args:
        old_log_prob: (batch, response_len) training-policy log-probs; rollout_log_prob: same shape.
        response_mask: (batch, response_len) 0/1.

    Source: verl/trainer/ppo/rollout_corr_helper.py:compute_offpolicy_metrics.
    """
    train_row = masked_mean(old_log_prob, response_mask, axis=-1)
    roll_row = masked_mean(rollout_log_prob, response_mask, axis=-1)
    log_ratio = old_log_prob - rollout_log_prob
    diff = roll_row - train_row
    rho = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    seq = torch.clamp(masked_sum(log_ratio, response_mask, axis=-1), -SAFETY_BOUND, SAFETY_BOUND)
    return {
        "training_ppl": float(torch.exp(-train_row).mean()),
        "training_log_ppl": float((-train_row).mean()),
        "kl": float(masked_mean(rollout_log_prob - old_log_prob, response_mask)),
        "k3_kl": float(masked_mean(torch.exp(log_ratio) - log_ratio - 1, response_mask)),
        "rollout_ppl": float(torch.exp(-roll_row).mean()),
        "rollout_log_ppl": float((-roll_row).mean()),
        "log_ppl_diff": float(diff.mean()),
        "log_ppl_abs_diff": float(diff.abs().mean()),
        "log_ppl_diff_max": float(diff.max()),
        "log_ppl_diff_min": float(diff.min()),
        "ppl_ratio": float(torch.exp(diff).mean()),
        "chi2_token": float(masked_mean(rho.square(), response_mask) - 1.0),
        "chi2_seq": float(torch.exp(2.0 * seq).mean() - 1.0),
    }


@torch.no_grad()
def compute_rollout_correction_and_rejection_mask(
    old_log_prob: torch.Tensor,
    rollout_log_prob: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_is: str | None = None,
    rollout_is_threshold: str | float | None = 2.0,
    rollout_is_batch_normalize: bool = False,
    rollout_rs: str | None = None,
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor | None, torch.Tensor, dict[str, float]]:
    """IS weights (when ``rollout_is`` is set), the rejection mask and mismatch metrics (``rollout_corr/``).

    Args:
        old_log_prob: (batch, response_len) log-probs of the *training* policy (decoupled: the recomputed
            old policy; bypass mode: the current policy). rollout_log_prob: the rollout policy's, same shape.
        response_mask: (batch, response_len) 0/1.
        rollout_is, rollout_is_threshold, rollout_is_batch_normalize: see
            :func:`compute_rollout_correction_weights`; ``rollout_is=None`` or a None threshold
            disables the weights (as verl).
        rollout_rs, rollout_rs_threshold: see
            :func:`verl.algorithms.rollout_rejection.compute_rollout_rejection_mask`; None disables it.

    Returns:
        (weights or None; the response mask with rejected tokens zeroed (a copy, unchanged without
        ``rollout_rs``); metrics prefixed ``rollout_corr/``: the IS metrics, the ``rollout_rs_*`` metrics,
        and :func:`compute_offpolicy_metrics`). verl returns the weights wrapped in a DataProto; here they
        are the bare tensor.

    Raises:
        ValueError: shapes differ; ``rollout_rs`` without ``rollout_rs_threshold``; bad IS / RS options.

    Source: verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_correction_and_rejection_mask.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"rollout correction: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
            f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} must match"
        )
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    mask = response_mask.clone()
    if rollout_rs is not None:
        if rollout_rs_threshold is None:
            raise ValueError(
                f"rollout_rs={rollout_rs!r} needs rollout_rs_threshold (e.g. 2.0, or '0.5_2.0' for a *_k1 mode)"
            )
        mask, rs_metrics = compute_rollout_rejection_mask(log_ratio, response_mask, rollout_rs, rollout_rs_threshold)
        metrics.update(rs_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, mask, {f"rollout_corr/{key}": value for key, value in metrics.items()}


def compute_rollout_correction_and_add_to_batch(batch: Any, rollout_corr_config: Any) -> tuple[Any, dict[str, float]]:
    """verl's decoupled mode on the driver: weights and rejection from ``old_log_probs`` vs ``rollout_log_probs``.

    Always replaces ``batch.batch["response_mask"]`` with the rejection-masked one (unchanged without
    ``rollout_rs``); adds ``batch.batch["rollout_is_weights"]`` (batch, response_len) when
    ``rollout_is`` is set. Every policy loss multiplies its per-token loss by those weights, and every
    later stage (advantages, losses, their token normalisers) sees the masked response_mask.

    Args:
        batch: DataProto with ``old_log_probs``, ``rollout_log_probs`` and ``response_mask``.
        rollout_corr_config: ``algorithm.rollout_correction`` (any object or mapping with rollout_is,
            rollout_is_threshold, rollout_is_batch_normalize, rollout_rs, rollout_rs_threshold).

    Returns:
        (the same batch, metrics prefixed ``rollout_corr/``).

    Raises:
        KeyError: a required column is missing (named). ValueError: as
        :func:`compute_rollout_correction_and_rejection_mask`.

    Source: verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_correction_and_add_to_batch.
    """
    tensors = batch.batch
    for key in ("old_log_probs", "rollout_log_probs", "response_mask"):
        if key not in tensors.keys():
            raise KeyError(f"rollout correction needs batch[{key!r}]; present: {sorted(tensors.keys())}")
    cfg = rollout_corr_config
    weights, mask, metrics = compute_rollout_correction_and_rejection_mask(
        old_log_prob=tensors["old_log_probs"],
        rollout_log_prob=tensors["rollout_log_probs"],
        response_mask=tensors["response_mask"],
        rollout_is=_get(cfg, "rollout_is", None),
        rollout_is_threshold=_get(cfg, "rollout_is_threshold", 2.0),
        rollout_is_batch_normalize=bool(_get(cfg, "rollout_is_batch_normalize", False)),
        rollout_rs=_get(cfg, "rollout_rs", None),
        rollout_rs_threshold=_get(cfg, "rollout_rs_threshold", None),
    )
    tensors["response_mask"] = mask
    if weights is not None:
        tensors["rollout_is_weights"] = weights
    return batch, metrics


def _get(config: Any, key: str, default: Any) -> Any:
    """``config.key`` / ``config[key]`` when present, even None (verl's ``.get(key, default)``: an explicit
    null threshold disables the weights rather than falling back to the default)."""
    if isinstance(config, Mapping):
        return config.get(key, default)
    return getattr(config, key, default)
