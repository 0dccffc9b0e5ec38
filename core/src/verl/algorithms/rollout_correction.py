"""Importance weights between the training policy and the rollout policy, and mismatch metrics.

Used by the ``bypass_mode`` policy loss (:mod:`verl.algorithms.policy_loss_bypass`), where the old
policy *is* the rollout policy. log_ratio = logπ_train − logπ_rollout, all tensors (batch, response_len).

* ``rollout_is="token"``: w_t = exp(clamp(log_ratio_t, ±20)); ``"sequence"``: one weight per row,
  exp(clamp(Σ_t log_ratio_t, ±20)), broadcast over the row.
* ``rollout_is_threshold``: a number (or numeric string) u truncates, w = min(w, u) (TIS); a string
  ``"l_u"`` zeroes weights outside [l, u] (IcePop).
* ``rollout_is_batch_normalize``: divide by the mean weight (token mean, or mean of per-row weights)
  of the tensors passed in; with ``torch.distributed`` initialised and more than one rank, the sums and
  counts are all-reduced over the default group first (verl's ``distributed_masked_mean``), so the
  mean is over the micro-batches of all ranks (every rank must call it the same number of times).

Weights are zero outside the mask and detached. Rejection sampling (verl's ``rollout_rs``) is not
implemented; passing it raises ValueError.

Source: verl/trainer/ppo/rollout_corr_helper.py (compute_rollout_correction_weights,
compute_offpolicy_metrics, compute_rollout_correction_and_rejection_mask). Background: Liu et al. 2025,
"When Speed Kills Stability" (https://richardli.xyz/rl-collapse).
"""

from __future__ import annotations

import math

import torch

from verl.algorithms.utils import masked_mean, masked_sum

__all__ = [
    "ROLLOUT_IS_LEVELS",
    "compute_offpolicy_metrics",
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
        (weights (batch, response_len) detached, zero outside the mask; metrics without prefix:
        rollout_is_mean, rollout_is_ratio_fraction_high/low (token: share of valid tokens whose raw
        weight is above u / below l; sequence: share of rows, empty rows included, whose unclamped
        Σ_t log_ratio is above log u / below log l; l = 1/u for TIS), and rollout_is_batch_norm_factor
        when normalising, the all-rank mean when torch.distributed is initialised).

    Raises:
        ValueError: unknown ``rollout_is``; a bad threshold (see :func:`parse_rollout_is_threshold`).

    Source: verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_correction_weights.
    """
    if rollout_is not in ROLLOUT_IS_LEVELS:
        raise ValueError(f"rollout_is must be one of {ROLLOUT_IS_LEVELS} (or null to disable), got {rollout_is!r}")
    upper, lower = parse_rollout_is_threshold(rollout_is_threshold)
    mask = response_mask.to(log_ratio.dtype)
    if rollout_is == "token":
        raw = torch.exp(torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND))
    else:
        seq = masked_sum(log_ratio, response_mask, axis=-1).unsqueeze(-1)
        raw = torch.exp(torch.clamp(seq, -SAFETY_BOUND, SAFETY_BOUND)).expand_as(log_ratio)
    raw = raw * mask
    if lower is None:
        weights = raw.clamp(max=upper)
    else:
        weights = torch.where((raw >= lower) & (raw <= upper), raw, torch.zeros_like(raw))
    low_bound = 1.0 / upper if lower is None else lower
    if rollout_is == "token":
        high = float(masked_mean((raw > upper).to(raw.dtype), response_mask))
        low = float(masked_mean((raw < low_bound).to(raw.dtype), response_mask))
    else:
        # verl counts rows (every row, empty ones included) on the unclamped Σ log-ratio in log space,
        # so a row beyond exp(±20) still counts and a long row weighs as much as a short one.
        high = float((seq > math.log(upper)).to(raw.dtype).mean())
        low = float((seq < math.log(low_bound)).to(raw.dtype).mean())
    metrics = {
        "rollout_is_mean": float(masked_mean(weights, response_mask)),
        "rollout_is_ratio_fraction_high": high,
        "rollout_is_ratio_fraction_low": low,
    }
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
    """IS weights (when ``rollout_is`` is set) and mismatch metrics, keys prefixed ``rollout_corr/``.

    Args:
        old_log_prob: (batch, response_len) log-probs of the *training* policy (in bypass mode: the
            current policy). rollout_log_prob: the rollout policy's, same shape.
        response_mask: (batch, response_len) 0/1.
        rollout_is, rollout_is_threshold, rollout_is_batch_normalize: see
            :func:`compute_rollout_correction_weights`; ``rollout_is=None`` or a None threshold
            disables the weights.
        rollout_rs, rollout_rs_threshold: rejection sampling; only None is accepted.

    Returns:
        (weights or None, response mask (a copy, unchanged: no rejection), metrics). verl returns the
        weights wrapped in a DataProto; here they are the bare tensor.

    Raises:
        ValueError: shapes differ; ``rollout_rs`` is set; bad IS options.

    Source: verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_correction_and_rejection_mask.
    """
    if old_log_prob.shape != rollout_log_prob.shape or old_log_prob.shape != response_mask.shape:
        raise ValueError(
            f"rollout correction: old_log_prob {tuple(old_log_prob.shape)}, rollout_log_prob "
            f"{tuple(rollout_log_prob.shape)} and response_mask {tuple(response_mask.shape)} must match"
        )
    if rollout_rs is not None or rollout_rs_threshold is not None:
        raise ValueError(
            "rollout rejection sampling (policy_loss.rollout_correction.rollout_rs / rollout_rs_threshold) is not "
            "implemented; set both to null"
        )
    log_ratio = old_log_prob - rollout_log_prob
    metrics: dict[str, float] = {}
    weights = None
    if rollout_is is not None and rollout_is_threshold is not None:
        weights, is_metrics = compute_rollout_correction_weights(
            log_ratio, response_mask, rollout_is, rollout_is_threshold, rollout_is_batch_normalize
        )
        metrics.update(is_metrics)
    metrics.update(compute_offpolicy_metrics(old_log_prob, rollout_log_prob, response_mask))
    return weights, response_mask.clone(), {f"rollout_corr/{key}": value for key, value in metrics.items()}
