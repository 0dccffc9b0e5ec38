"""How the actor's loss terms are combined, and the entropy term.

Sign convention (K10): the KL loss is *added* (it is a penalty to minimise) and the entropy bonus is
*subtracted* (maximising entropy lowers the loss):

    total = pg_loss + kl_coef · kl_loss − entropy_coeff · entropy

so d total / d kl_loss = +kl_coef. Example: pg 0.3, kl 0.2, kl_coef 0.1 -> 0.32.

Source: verl/workers/actor/dp_actor.py:update_policy and verl/workers/utils/losses.py:ppo_loss
(policy_loss -= entropy_coeff·entropy; policy_loss += kl_loss·kl_loss_coef).
"""

from __future__ import annotations

import torch

from verl.algorithms.loss_agg import agg_loss
from verl.algorithms.utils import entropy_from_logits

__all__ = ["combine_actor_loss", "compute_entropy_loss"]


def combine_actor_loss(
    pg_loss: torch.Tensor | float,
    kl_loss: torch.Tensor | float | None = None,
    kl_coef: float = 0.0,
    entropy: torch.Tensor | float | None = None,
    entropy_coeff: float = 0.0,
) -> torch.Tensor | float:
    """total = pg_loss + kl_coef·kl_loss − entropy_coeff·entropy (K10: KL added, never subtracted).

    Args:
        pg_loss: aggregated policy loss (0-dim tensor or float).
        kl_loss: aggregated KL(π‖π_ref) loss, e.g. ``agg_loss(kl_penalty(logp, ref_logp, "low_var_kl"), mask, mode)``;
            None when ``actor.use_kl_loss`` is off.
        kl_coef: ``actor.kl_loss_coef`` (>= 0).
        entropy: aggregated entropy over valid tokens (see :func:`compute_entropy_loss`); None to skip.
        entropy_coeff: ``actor.entropy_coeff`` (default 0).

    Returns:
        Same kind as the inputs (0-dim tensor if any is a tensor).

    Raises:
        ValueError: kl_coef < 0 (a negative coefficient would reward drifting away from the reference).
    """
    if kl_coef < 0:
        raise ValueError(f"kl_coef (actor.kl_loss_coef) must be >= 0, got {kl_coef}")
    total = pg_loss
    if kl_loss is not None and kl_coef != 0:
        total = total + kl_coef * kl_loss
    if entropy is not None and entropy_coeff != 0:
        total = total - entropy_coeff * entropy
    return total


def compute_entropy_loss(
    logits: torch.Tensor, response_mask: torch.Tensor, loss_agg_mode: str = "token-mean", **agg_kwargs
) -> torch.Tensor:
    """Aggregated entropy of the policy over valid response tokens only (K05).

    Args:
        logits: (batch, response_len, vocab), already divided by the sampling temperature.
        response_mask: (batch, response_len) 0/1; padded positions never contribute, whatever their logits.
        loss_agg_mode: see ``agg_loss``; ``agg_kwargs`` are passed on (dp_size, batch_num_tokens, ...).

    Returns:
        0-dim tensor, >= 0 (nats).

    Source: verl/trainer/ppo/core_algos.py:compute_entropy_loss.
    """
    return agg_loss(entropy_from_logits(logits), response_mask, loss_agg_mode, **agg_kwargs)
