"""Clipped value-function loss of the PPO critic.

Source: verl/trainer/ppo/core_algos.py:compute_value_loss (from TRL's PPO trainer), PPO (arXiv:1707.06347).
"""

from __future__ import annotations

import torch

from verl.algorithms.loss_agg import agg_loss
from verl.algorithms.utils import masked_mean

__all__ = ["compute_value_loss"]


def compute_value_loss(
    vpreds: torch.Tensor,
    returns: torch.Tensor,
    values: torch.Tensor,
    response_mask: torch.Tensor,
    cliprange_value: float,
    loss_agg_mode: str = "token-mean",
    dp_size: int = 1,
    batch_num_tokens: int | torch.Tensor | None = None,
    global_batch_size: int | torch.Tensor | None = None,
    loss_scale_factor: float | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """vf_loss = 0.5·agg(max((v − R)², (clip(v, V_old − c, V_old + c) − R)²)).

    Args:
        vpreds: (batch, response_len) current value predictions (carry the gradient).
        returns: (batch, response_len) targets R (from the advantage estimator).
        values: (batch, response_len) values V_old of the rollout-time critic.
        response_mask: (batch, response_len) 0/1.
        cliprange_value: c >= 0 (``critic.cliprange_value``, default 0.5).
        loss_agg_mode, dp_size, batch_num_tokens, global_batch_size, loss_scale_factor: see ``agg_loss``
            (same global normalisation as the actor, K04).

    Returns:
        (vf_loss, vf_clipfrac): 0-dim tensors; vf_clipfrac = masked fraction of tokens where the clipped
        term is strictly larger.

    Raises:
        ValueError: cliprange_value < 0, shapes differ, or agg_loss errors.
    """
    if cliprange_value < 0:
        raise ValueError(f"compute_value_loss: cliprange_value must be >= 0, got {cliprange_value}")
    for name, t in (("returns", returns), ("values", values), ("response_mask", response_mask)):
        if t.shape != vpreds.shape:
            raise ValueError(f"compute_value_loss: {name} shape {tuple(t.shape)} != vpreds shape {tuple(vpreds.shape)}")
    vpred_clipped = torch.maximum(torch.minimum(vpreds, values + cliprange_value), values - cliprange_value)
    losses1 = (vpreds - returns) ** 2
    losses2 = (vpred_clipped - returns) ** 2
    vf_loss = 0.5 * agg_loss(
        torch.maximum(losses1, losses2),
        response_mask,
        loss_agg_mode,
        dp_size=dp_size,
        batch_num_tokens=batch_num_tokens,
        global_batch_size=global_batch_size,
        loss_scale_factor=loss_scale_factor,
    )
    with torch.no_grad():
        vf_clipfrac = masked_mean((losses2 > losses1).to(vpreds.dtype), response_mask)
    return vf_loss, vf_clipfrac
