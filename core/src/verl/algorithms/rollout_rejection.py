"""Rollout rejection sampling (verl's ``rollout_rs``): a hard trust region on the rollout/training mismatch.

log_ratio = logπ_train − logπ_rollout, (batch, response_len). Per token, on x = clamp(log_ratio, ±20):
k1 = −x, k2 = ½x², k3 = eˣ − 1 − x (verl's divergence estimators; k2, k3 ≥ 0, ideal 0).

Modes (``rollout_rs``, a comma-separated list; every listed mode must pass, duplicates dropped):

* ``token_k1|k2|k3``: the token's own statistic; a failing token is dropped;
* ``seq_sum_k1|k2|k3``, ``seq_mean_k1|k2|k3``: the sum / mean of the statistic over the row's valid tokens;
  ``seq_max_k2|k3``: its maximum; a failing row is dropped whole (an empty row's statistic is 0).

Thresholds (``rollout_rs_threshold``): one value for all modes, or one per mode, comma-separated. A ``*_k1``
entry ``"l_u"`` keeps log l ≤ stat ≤ log u (a single number u means l = 1/u); since the k1 statistic is
−log r, a token keeps r in [1/u, 1/l], the band itself when it is symmetric (l = 1/u), as in verl. k2/k3
modes keep stat ≤ u for a single positive number u (no ``_``).

The result is the response mask times the product of the modes' keep masks. Metrics (no prefix) per mode
``rollout_rs_<mode>_{mean,max,min,std,fraction_high,fraction_low,seq_mean,seq_std,seq_max,seq_min,
seq_max_deviation,seq_fraction_high[,seq_fraction_low for k1],masked_fraction,seq_masked_fraction}`` and
overall ``rollout_rs_masked_fraction`` (share of valid tokens dropped) and ``rollout_rs_seq_masked_fraction``
(share of all rows, empty ones included, that lost a token).

Degenerate input: with no valid token at all nothing is dropped and no metric is returned (verl raises).
Source: verl/trainer/ppo/rollout_corr_helper.py (SUPPORTED_ROLLOUT_RS_OPTIONS, _parse_rollout_rs_thresholds,
compute_rollout_rejection_mask, compute_rs_metrics).
"""

from __future__ import annotations

import math

import torch

from verl.algorithms.utils import masked_mean, masked_sum

__all__ = [
    "ROLLOUT_RS_OPTIONS",
    "compute_rollout_rejection_mask",
    "parse_rollout_rs",
    "parse_rollout_rs_thresholds",
]

SAFETY_BOUND = 20.0  # the clamp of log_ratio before the estimators (as the IS weights)
ROLLOUT_RS_OPTIONS = (
    "token_k1",
    "token_k2",
    "token_k3",
    "seq_sum_k1",
    "seq_sum_k2",
    "seq_sum_k3",
    "seq_mean_k1",
    "seq_mean_k2",
    "seq_mean_k3",
    "seq_max_k2",
    "seq_max_k3",
)


def parse_rollout_rs(spec: str) -> list[str]:
    """``"token_k1, seq_max_k3,token_k1"`` -> ``["token_k1", "seq_max_k3"]`` (order kept, duplicates dropped).

    Raises:
        TypeError: not a string.
        ValueError: empty, or a mode outside :data:`ROLLOUT_RS_OPTIONS` (named, with the list).
    """
    if not isinstance(spec, str):
        raise TypeError(f"rollout_rs must be a string of comma-separated modes, got {spec!r}")
    modes: list[str] = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part not in ROLLOUT_RS_OPTIONS:
            raise ValueError(f"rollout_rs mode {part!r} is unknown; choose from {', '.join(ROLLOUT_RS_OPTIONS)}")
        if part not in modes:
            modes.append(part)
    if not modes:
        raise ValueError(f"rollout_rs {spec!r} names no mode; choose from {', '.join(ROLLOUT_RS_OPTIONS)}")
    return modes


def parse_rollout_rs_thresholds(modes: list[str], spec: str | float | None) -> dict[str, tuple[float | None, float]]:
    """Each mode's (lower, upper) bound: ``lower`` in ratio space for ``*_k1`` modes, None for k2/k3.

    Args:
        modes: from :func:`parse_rollout_rs`.
        spec: a positive number, or a string of one entry or one per mode, comma-separated; a k1 entry
            may be ``"l_u"`` (a single u means l = 1/u), a k2/k3 entry is a single number.

    Raises:
        TypeError: ``spec`` is a bool or neither a number nor a string.
        ValueError: ``spec`` is None or empty, the entry count is neither 1 nor ``len(modes)``, an entry
            is not a number, a bound is <= 0, l > u, or a k2/k3 entry has ``_``.

    Source: verl/trainer/ppo/rollout_corr_helper.py:_parse_rollout_rs_thresholds.
    """
    if spec is None:
        raise ValueError("rollout_rs needs rollout_rs_threshold (e.g. 2.0, or '0.5_2.0' for a *_k1 mode)")
    if isinstance(spec, bool) or not isinstance(spec, (int, float, str)):
        raise TypeError(f"rollout_rs_threshold must be a number or a string, got {spec!r}")
    entries = [str(spec)] if not isinstance(spec, str) else [p.strip() for p in spec.split(",") if p.strip()]
    if not entries:
        raise ValueError("rollout_rs_threshold is empty; give one threshold, or one per rollout_rs mode")
    if len(entries) not in (1, len(modes)):
        raise ValueError(
            f"rollout_rs_threshold has {len(entries)} entries for {len(modes)} rollout_rs modes; give one "
            "threshold shared by all modes or exactly one per mode"
        )
    if len(entries) == 1:
        entries = entries * len(modes)
    bounds: dict[str, tuple[float | None, float]] = {}
    for mode, entry in zip(modes, entries, strict=True):
        if "_" in entry and not mode.endswith("k1"):
            raise ValueError(
                f"rollout_rs_threshold {entry!r} for {mode}: k2/k3 modes take a single upper bound (no '_')"
            )
        low_text, high_text = entry.split("_", 1) if "_" in entry else ("", entry)
        try:
            upper = float(high_text)
            lower = float(low_text) if low_text else (1.0 / upper if mode.endswith("k1") and upper > 0 else None)
        except ValueError as err:
            raise ValueError(f"rollout_rs_threshold {entry!r} for {mode} is not a number (or 'lower_upper')") from err
        if upper <= 0 or (lower is not None and lower <= 0):
            raise ValueError(f"rollout_rs_threshold {entry!r} for {mode}: bounds must be > 0")
        if lower is not None and lower > upper:
            raise ValueError(f"rollout_rs_threshold {entry!r} for {mode}: the lower bound exceeds the upper")
        bounds[mode] = (lower, upper)
    return bounds


def _row_max(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """Max over each row's valid slots; 0 for an empty row (verl's _sequence_max)."""
    filled = values.masked_fill(mask == 0, float("-inf")).max(dim=-1).values
    return torch.where(torch.isinf(filled) & (filled < 0), torch.zeros_like(filled), filled)


def _mode_statistic(mode: str, stats: dict[str, torch.Tensor], mask: torch.Tensor) -> torch.Tensor:
    """The per-token (token_*) or per-row (seq_*) statistic of ``mode``."""
    token = stats[mode.rsplit("_", 1)[1]]
    if mode.startswith("token_"):
        return token
    if mode.startswith("seq_sum_"):
        return masked_sum(token, mask, axis=-1)
    if mode.startswith("seq_mean_"):
        return masked_mean(token, mask, axis=-1)
    return _row_max(token, mask)


def _mode_metrics(
    prefix: str,
    stat_tok: torch.Tensor,
    seq_values: torch.Tensor,
    mask: torch.Tensor,
    rows: torch.Tensor,
    *,
    level: str,
    upper: float,
    lower: float | None,
) -> dict[str, float]:
    """verl's compute_rs_metrics; ``upper``/``lower`` are in the statistic's space (log for k1)."""
    valid = mask != 0
    seqs = seq_values[rows]
    out: dict[str, float] = {f"{prefix}_mean": float(masked_mean(stat_tok, mask))}
    if level == "sequence":
        out[f"{prefix}_max"], out[f"{prefix}_min"] = float(seqs.max()), float(seqs.min())
        out[f"{prefix}_fraction_high"] = float((seqs > upper).to(mask.dtype).mean())
        out[f"{prefix}_fraction_low"] = float((seqs < lower).to(mask.dtype).mean()) if lower is not None else 0.0
    else:
        out[f"{prefix}_max"] = float(stat_tok[valid].max())
        out[f"{prefix}_min"] = float(stat_tok[valid].min())
        out[f"{prefix}_fraction_high"] = float(masked_mean((stat_tok > upper).to(mask.dtype), mask))
        low = masked_mean((stat_tok < lower).to(mask.dtype), mask) if lower is not None else 0.0
        out[f"{prefix}_fraction_low"] = float(low)
    if int(valid.sum()) > 1:
        # verl's std is taken on the statistic clamped into the band, so one outlier does not dominate it.
        clamped = stat_tok.clamp(min=lower if lower is not None else 0.0, max=upper)
        mean = masked_mean(clamped, mask)
        out[f"{prefix}_std"] = float(torch.sqrt(torch.clamp(masked_mean(clamped.square(), mask) - mean**2, min=0)))
    else:
        out[f"{prefix}_std"] = 0.0
    out[f"{prefix}_seq_mean"] = float(seqs.mean())
    out[f"{prefix}_seq_std"] = float(seqs.std()) if seqs.numel() > 1 else 0.0
    out[f"{prefix}_seq_max"], out[f"{prefix}_seq_min"] = float(seqs.max()), float(seqs.min())
    out[f"{prefix}_seq_max_deviation"] = float(seqs.abs().max())
    out[f"{prefix}_seq_fraction_high"] = float((seqs > upper).to(mask.dtype).mean())
    if lower is not None:
        out[f"{prefix}_seq_fraction_low"] = float((seqs < lower).to(mask.dtype).mean())
    return out


@torch.no_grad()
def compute_rollout_rejection_mask(
    log_ratio: torch.Tensor,
    response_mask: torch.Tensor,
    rollout_rs: str = "token_k1",
    rollout_rs_threshold: str | float | None = None,
) -> tuple[torch.Tensor, dict[str, float]]:
    """The response mask with the rejected tokens / rows zeroed, and the metrics of the module docstring.

    Args:
        log_ratio: (batch, response_len) logπ_train − logπ_rollout.
        response_mask: (batch, response_len) 0/1, any dtype.
        rollout_rs: comma-separated modes (:func:`parse_rollout_rs`).
        rollout_rs_threshold: see :func:`parse_rollout_rs_thresholds`.

    Returns:
        (mask of ``response_mask``'s dtype and shape, metrics as python floats, keys without prefix).

    Raises:
        TypeError, ValueError: a bad mode or threshold (see the parsers); shapes differ.

    Source: verl/trainer/ppo/rollout_corr_helper.py:compute_rollout_rejection_mask.
    """
    if log_ratio.shape != response_mask.shape:
        raise ValueError(
            f"rollout rejection: log_ratio {tuple(log_ratio.shape)} and response_mask {tuple(response_mask.shape)} "
            "must match"
        )
    modes = parse_rollout_rs(rollout_rs)
    bounds = parse_rollout_rs_thresholds(modes, rollout_rs_threshold)
    mask = response_mask.to(log_ratio.dtype)
    valid = response_mask != 0
    if log_ratio.shape[0] == 0 or not bool(valid.any()):
        return response_mask.clone(), {}
    x = torch.clamp(log_ratio, -SAFETY_BOUND, SAFETY_BOUND)
    stats = {"k1": -x, "k2": 0.5 * x.square(), "k3": torch.exp(x) - 1.0 - x}
    rows = valid.any(dim=-1)
    keep_all = torch.ones_like(mask)
    metrics: dict[str, float] = {}
    for mode in modes:
        lower, upper = bounds[mode]
        stat = _mode_statistic(mode, stats, mask)
        if mode.endswith("k1"):
            low, high = math.log(lower), math.log(upper)
            keep = (stat >= low) & (stat <= high)
        else:
            low, high = None, upper
            keep = stat <= high
        if mode.startswith("token_"):
            level, stat_tok, seq_values = "token", stat, masked_mean(stat, mask, axis=-1)
        else:
            level, seq_values = "sequence", stat
            stat_tok, keep = stat.unsqueeze(-1).expand_as(mask), keep.unsqueeze(-1).expand_as(valid)
        keep_f = keep.to(mask.dtype)
        keep_all = keep_all * keep_f
        prefix = f"rollout_rs_{mode}"
        metrics.update(_mode_metrics(prefix, stat_tok, seq_values, mask, rows, level=level, upper=high, lower=low))
        metrics[f"{prefix}_masked_fraction"] = float(masked_mean(1.0 - keep_f, mask))
        lost = (~keep & valid).any(dim=-1)
        metrics[f"{prefix}_seq_masked_fraction"] = float(lost[rows].to(mask.dtype).mean())
    metrics["rollout_rs_masked_fraction"] = float(masked_mean(1.0 - keep_all, mask))
    metrics["rollout_rs_seq_masked_fraction"] = float(((keep_all <= 0.5) & valid).any(dim=-1).to(mask.dtype).mean())
    return (response_mask * keep_all).to(response_mask.dtype), metrics
