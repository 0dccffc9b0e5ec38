"""Masked reductions and logit helpers shared by estimators and losses.

Conventions: ``values`` and ``mask`` have the same shape, typically (batch, response_len); the mask is
0/1 (bool, int or float; float weights are allowed and multiply the values). Masked-out slots never
influence a result, whatever they hold (NaN and inf included), and give zero gradient: reductions
select with ``torch.where`` rather than multiplying, because ``nan * 0`` is still NaN.

Source: verl/utils/torch_functional.py (masked_sum, masked_mean, masked_var, masked_whiten,
entropy_from_logits, logprobs_from_logits). Differences, all on degenerate inputs where verl returns
NaN or raises: an empty mask gives mean 0 and variance 0; an unbiased variance over one element is 0.
"""

from __future__ import annotations

import torch

__all__ = [
    "entropy_from_logits",
    "logprobs_from_logits",
    "masked_mean",
    "masked_sum",
    "masked_var",
    "masked_whiten",
]

WHITEN_EPS = 1e-8  # verl masked_whiten: rsqrt(var + 1e-8)


def _check_same_shape(values: torch.Tensor, mask: torch.Tensor, fn: str) -> None:
    if values.shape != mask.shape:
        raise ValueError(
            f"{fn}: values has shape {tuple(values.shape)} but mask has shape {tuple(mask.shape)}; "
            "pass a mask with exactly the shape of the values (e.g. response_mask for (batch, response_len))"
        )


def _masked(values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """values * mask on valid slots, exact 0 elsewhere (no NaN leaks from padding)."""
    weights = mask.to(values.dtype) if mask.dtype == torch.bool else mask
    return torch.where(mask != 0, values * weights, torch.zeros((), dtype=values.dtype, device=values.device))


def _count(mask: torch.Tensor, dtype: torch.dtype, axis: int | None = None) -> torch.Tensor:
    weights = mask.to(dtype)
    return weights.sum() if axis is None else weights.sum(dim=axis)


def masked_sum(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask over valid slots.

    Args:
        values: float tensor, e.g. (batch, response_len).
        mask: same shape; 0/1 or non-negative weights.
        axis: reduce this dim only; ``None`` reduces everything to a scalar.

    Returns:
        Tensor of ``values.dtype``: scalar, or ``values`` with ``axis`` removed.

    Raises:
        ValueError: shapes differ.

    Source: verl/utils/torch_functional.py:masked_sum.
    """
    _check_same_shape(values, mask, "masked_sum")
    masked = _masked(values, mask)
    return masked.sum() if axis is None else masked.sum(dim=axis)


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Σ values·mask / Σ mask; 0 where the mask is empty (verl adds 1e-8 to the count: 0 there too, a 1e-8 bias elsewhere).

    Shapes as :func:`masked_sum`. Returns ``values.dtype``. Raises ValueError on a shape mismatch.

    Source: verl/utils/torch_functional.py:masked_mean.
    """
    total = masked_sum(values, mask, axis)
    count = _count(mask, total.dtype, axis)
    return torch.where(
        count > 0, total / torch.where(count > 0, count, torch.ones_like(count)), torch.zeros_like(total)
    )


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the valid slots (all of them together, a scalar).

    var = mean_valid((x − mean_valid(x))²), times n/(n−1) when ``unbiased`` (Bessel, n = Σ mask).
    With n ≤ 1 the unbiased variance is 0 (verl raises ValueError): a single value has no spread,
    so whitening it yields 0 instead of crashing the step.

    Args:
        values: float tensor, any shape (typically (batch, response_len)).
        mask: same shape, 0/1.
        unbiased: apply the Bessel correction (verl default True).

    Returns:
        Scalar tensor of ``values.dtype``.

    Source: verl/utils/torch_functional.py:masked_var.
    """
    mean = masked_mean(values, mask)
    variance = masked_mean((values - mean) ** 2, mask)
    if unbiased:
        n = _count(mask, variance.dtype)
        bessel = torch.where(n > 1, n / torch.where(n > 1, n - 1, torch.ones_like(n)), torch.zeros_like(n))
        variance = variance * bessel
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """(x − mean) · rsqrt(var + 1e-8) with masked mean and unbiased masked variance (all valid slots pooled).

    Args:
        values: float tensor (batch, response_len).
        mask: same shape, 0/1.
        shift_mean: if False the mean is added back (verl semantics).

    Returns:
        Tensor of the input shape and dtype. Slots outside the mask are transformed too (verl semantics);
        callers multiply by the mask when they need zeros there.

    Source: verl/utils/torch_functional.py:masked_whiten; GAE whitening in verl/trainer/ppo/core_algos.py.
    """
    mean = masked_mean(values, mask)
    var = masked_var(values, mask, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(var + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return whitened


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Categorical entropy H = −Σ_v p_v log p_v per position, p = softmax(logits).

    Equal to verl's logsumexp(z) − Σ softmax(z)·z for finite logits, and also finite for ``-inf`` logits
    (vocabulary masking), where the textbook form gives NaN. Apply the sampling temperature to the
    logits before calling (verl: logits / temperature). Average it over valid tokens only with
    :func:`masked_mean` or ``agg_loss`` (K05): padded positions hold arbitrary logits.

    Args:
        logits: (..., vocab) float tensor, e.g. (batch, response_len, vocab).

    Returns:
        (...) tensor; float32 for half-precision inputs, else the input dtype. Nats.

    Source: verl/utils/torch_functional.py:entropy_from_logits.
    """
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    logp = torch.log_softmax(logits, dim=-1)
    p = logp.exp()
    safe_logp = torch.where(torch.isfinite(logp), logp, torch.zeros_like(logp))
    return -(p * safe_logp).sum(dim=-1)


def logprobs_from_logits(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """log softmax(logits)[label] per position, computed as z[label] − logsumexp(z).

    Args:
        logits: (..., vocab) float tensor (already divided by the temperature, K09).
        labels: (...) integer tensor of token ids in [0, vocab).

    Returns:
        (...) log-probabilities; float32 for half-precision logits, else the logits dtype.

    Raises:
        ValueError: ``labels.shape`` is not ``logits.shape[:-1]``.

    Source: verl/utils/torch_functional.py:logprobs_from_logits.
    """
    if labels.shape != logits.shape[:-1]:
        raise ValueError(
            f"logprobs_from_logits: labels shape {tuple(labels.shape)} must equal logits shape without the "
            f"vocab dim {tuple(logits.shape[:-1])}"
        )
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()
    picked = logits.gather(-1, labels.long().unsqueeze(-1)).squeeze(-1)
    return picked - torch.logsumexp(logits, dim=-1)
