"""Sampling parameters and next-token selection for the reference rollout (anatomy §6.2).

Conventions follow verl/vLLM: ``top_k <= 0`` (verl default ``-1``) disables top-k, ``top_p >= 1``
disables nucleus filtering, and greedy decoding is used when ``do_sample`` is False or the
temperature is 0. Log-probs are always taken from ``log_softmax(logits / T)`` *before* top-k/top-p
filtering, which is exactly what the trainer recomputes (K09); greedy uses ``T = 1`` (untempered).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import attrs
import torch


@attrs.frozen(kw_only=True)
class SamplingParams:
    """Resolved per-call sampling settings.

    Attributes:
        do_sample: False -> greedy argmax.
        temperature: divides the logits when sampling (> 0); ignored when greedy.
        top_p: nucleus mass in (0, 1]; 1 disables.
        top_k: keep the k most likely tokens; <= 0 disables.
    """

    do_sample: bool
    temperature: float
    top_p: float
    top_k: int

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature <= 0.0

    @property
    def logprob_temperature(self) -> float:
        """Temperature the returned log-probs are computed under: 1.0 when greedy."""
        return 1.0 if self.greedy else float(self.temperature)


def _get(obj: Any, name: str, default: Any) -> Any:
    if obj is None:
        return default
    if isinstance(obj, Mapping):
        value = obj.get(name, default)
    else:
        value = getattr(obj, name, default)
    return default if value is None else value


def resolve_sampling_params(config: Any, meta_info: Mapping[str, Any] | None) -> SamplingParams:
    """Combine the rollout config with per-call ``meta_info`` (verl's vLLM rollout precedence).

    * base values: ``config.{do_sample, temperature, top_p, top_k}`` (defaults True, 1.0, 1.0, -1);
    * ``meta_info["validate"]`` truthy -> ``config.val_kwargs.{do_sample, temperature, top_p, top_k}``
      (defaults False, 0.0, 1.0, -1) replace them;
    * explicit ``meta_info`` keys ``do_sample``, ``temperature``, ``top_p``, ``top_k`` override last.

    Raises:
        ValueError: negative temperature, ``top_p`` outside (0, 1].
    """
    meta = dict(meta_info or {})
    if meta.get("validate"):
        val = _get(config, "val_kwargs", None)
        values = {
            "do_sample": bool(_get(val, "do_sample", False)),
            "temperature": float(_get(val, "temperature", 0.0)),
            "top_p": float(_get(val, "top_p", 1.0)),
            "top_k": int(_get(val, "top_k", -1)),
        }
    else:
        values = {
            "do_sample": bool(_get(config, "do_sample", True)),
            "temperature": float(_get(config, "temperature", 1.0)),
            "top_p": float(_get(config, "top_p", 1.0)),
            "top_k": int(_get(config, "top_k", -1)),
        }
    for key, cast in (("do_sample", bool), ("temperature", float), ("top_p", float), ("top_k", int)):
        if meta.get(key) is not None:
            values[key] = cast(meta[key])
    if values["temperature"] < 0:
        raise ValueError(f"rollout temperature must be >= 0 (0 means greedy), got {values['temperature']}")
    if not 0.0 < values["top_p"] <= 1.0:
        raise ValueError(f"rollout top_p must be in (0, 1], got {values['top_p']}")
    return SamplingParams(**values)


def filter_logits(logits: torch.Tensor, top_k: int, top_p: float) -> torch.Tensor:
    """Mask (to ``-inf``) tokens outside top-k and outside the top-p nucleus; ``(bs, vocab)``.

    Top-p keeps the smallest set of most likely tokens whose probability mass reaches ``top_p``
    (the token that crosses the threshold is kept; at least one token always survives).
    """
    if 0 < top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, dim=-1, descending=True)
        probs = torch.softmax(sorted_logits, dim=-1)
        mass_before = torch.cumsum(probs, dim=-1) - probs
        drop = mass_before >= top_p
        drop[..., 0] = False
        sorted_logits = sorted_logits.masked_fill(drop, float("-inf"))
        logits = torch.empty_like(logits).scatter_(-1, order, sorted_logits)
    return logits


def select_next_tokens(
    logits: torch.Tensor,
    params: SamplingParams,
    generator: torch.Generator | Sequence[torch.Generator] | torch.Tensor | None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Pick one token per row and return ``(tokens (bs,) int64, log_probs (bs,) float32)``.

    ``log_probs = log_softmax(logits / T)[token]`` with ``T = params.logprob_temperature``,
    computed on the unfiltered distribution (K09).

    ``generator`` is one generator for the batch, one per row (``len == bs``), or a ``(bs,)`` float tensor
    of uniform draws in ``[0, 1)``, one per row: then each row takes the token where its draw falls in the
    cumulative distribution (:func:`inverse_cdf_sample`; one batched operation instead of one
    ``multinomial`` call per row, and a row's sample depends only on its own draw). Per-row generators or
    draws make a row's sample independent of which other rows share its batch (same samples at any
    data-parallel split).

    Raises:
        ValueError: the number of per-row generators or draws differs from the number of rows.
    """
    logits = logits.float()
    if params.greedy:
        tokens = torch.argmax(logits, dim=-1)
        logp = torch.log_softmax(logits, dim=-1)
    else:
        scaled = logits / params.temperature
        logp = torch.log_softmax(scaled, dim=-1)
        filtering = 0 < params.top_k < logits.shape[-1] or params.top_p < 1.0
        probs = torch.softmax(filter_logits(scaled, params.top_k, params.top_p), dim=-1) if filtering else logp.exp()
        if isinstance(generator, torch.Tensor):
            tokens = inverse_cdf_sample(probs, generator)
        elif isinstance(generator, Sequence):
            if len(generator) != probs.shape[0]:
                raise ValueError(f"select_next_tokens: {len(generator)} generators for {probs.shape[0]} rows")
            tokens = (
                torch.stack(
                    [torch.multinomial(probs[i], num_samples=1, generator=g)[0] for i, g in enumerate(generator)]
                )
                if len(generator)
                else torch.zeros(0, dtype=torch.long, device=probs.device)
            )
        else:
            tokens = torch.multinomial(probs, num_samples=1, generator=generator).squeeze(-1)
    return tokens, logp.gather(-1, tokens.unsqueeze(-1)).squeeze(-1)


def inverse_cdf_sample(probs: torch.Tensor, uniforms: torch.Tensor) -> torch.Tensor:
    """Sample one token per row by inverse transform: the first token whose cumulative mass exceeds ``u``.

    Args:
        probs: ``(bs, vocab)`` non-negative weights (need not sum to 1: draws are scaled by each row's total).
        uniforms: ``(bs,)`` draws in ``[0, 1)``.

    Returns:
        ``(bs,)`` int64 token ids. A token of zero weight is never chosen; the cumulative sum is taken in
        float64 so that rounding over a 49k vocabulary shifts no boundary by more than about 1e-12.

    Raises:
        ValueError: ``uniforms`` does not hold one draw per row.
    """
    if uniforms.shape != probs.shape[:1]:
        raise ValueError(f"select_next_tokens: {tuple(uniforms.shape)} uniform draws for {probs.shape[0]} rows")
    if probs.shape[0] == 0:
        return torch.zeros(0, dtype=torch.long, device=probs.device)
    cdf = torch.cumsum(probs.double(), dim=-1)
    target = uniforms.to(cdf).unsqueeze(-1) * cdf[:, -1:]
    tokens = torch.searchsorted(cdf, target, right=True).squeeze(-1)
    return tokens.clamp_(max=probs.shape[-1] - 1)
