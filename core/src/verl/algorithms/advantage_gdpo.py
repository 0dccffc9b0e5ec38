"""GDPO: group reward-decoupled normalisation (``algorithm.adv_estimator=gdpo``).

Where GRPO sums the reward components first and normalises the sum, GDPO normalises every
component within its group, then combines them, so a large component cannot drown a small one.

Source: verl/trainer/ppo/core_algos.py:compute_gdpo_outcome_advantage; paper: GDPO, arXiv:2601.05242.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verl.algorithms._config import cfg_get
from verl.algorithms._groups import check_2d, float_rewards
from verl.algorithms.advantage import AdvantageEstimator, compute_grpo_outcome_advantage
from verl.algorithms.registry import register_adv_est
from verl.algorithms.utils import masked_whiten

__all__ = ["REWARD_EXTRA_PREFIX", "compute_gdpo_outcome_advantage"]

#: Our trainer stores the extra keys of a dict-returning ``compute_score`` as
#: ``non_tensor_batch["reward_extra/<key>"]``; verl stores them under the bare key. Both are read.
REWARD_EXTRA_PREFIX = "reward_extra/"


def _component(non_tensor_batch: Mapping[str, Any], key: str) -> np.ndarray:
    for name in (key, f"{REWARD_EXTRA_PREFIX}{key}"):
        if name in non_tensor_batch:
            try:
                values = np.asarray(non_tensor_batch[name], dtype=np.float32)
            except (TypeError, ValueError) as err:
                values, detail = None, str(err)
            else:
                bad = np.flatnonzero(~np.isfinite(values.reshape(-1)))
                detail = f"rows {bad[:5].tolist()} are not finite numbers" if bad.size else ""
            if detail:  # None (a row whose dict lacked the key) would become NaN advantages for the whole group
                raise ValueError(
                    f"gdpo: reward component {key!r} ({name}) must hold one finite number per row; "
                    f"compute_score's dict lacked it or gave a non-number ({detail})"
                )
            return values
    raise KeyError(
        f"gdpo: reward component {key!r} (algorithm.gdpo_reward_keys) is not in the batch; present: "
        f"{sorted(non_tensor_batch)}. compute_score must return a dict with {key!r} for every response."
    )


def _last_token(batch: Mapping[str, Any], response_mask: torch.Tensor) -> torch.Tensor:
    """Column of each row's last response token (verl: attention_mask[:, prompt_len:].sum(1) - 1)."""
    if "prompts" in batch and "attention_mask" in batch:
        prompt_len = batch["prompts"].shape[1]
        length = batch["attention_mask"][:, prompt_len:].sum(dim=1)
    else:
        length = (response_mask != 0).sum(dim=1)
    return (length.to(torch.long) - 1).to(response_mask.device)


def _component_rewards(
    keys: Sequence[str], non_tensor_batch: Mapping[str, Any], batch: Mapping[str, Any], response_mask: torch.Tensor
) -> list[torch.Tensor]:
    rows = response_mask.shape[0]
    last = _last_token(batch, response_mask)
    has_token = last >= 0  # an empty response has nowhere to put its score (and is masked out anyway)
    arange = torch.arange(rows, device=response_mask.device)
    out = []
    for key in keys:
        values = _component(non_tensor_batch, key).reshape(-1)
        if values.shape[0] != rows:
            raise ValueError(f"gdpo: reward component {key!r} has {values.shape[0]} values for {rows} rows")
        dense = torch.zeros(response_mask.shape, dtype=torch.float32, device=response_mask.device)
        score = torch.as_tensor(values, device=response_mask.device)
        dense[arange[has_token], last[has_token]] = score[has_token]
        out.append(dense)
    return out


@register_adv_est(AdvantageEstimator.GDPO)
@torch.no_grad()
def compute_gdpo_outcome_advantage(
    token_level_rewards: torch.Tensor,
    response_mask: torch.Tensor,
    index: np.ndarray,
    epsilon: float = 1e-6,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    non_tensor_batch: Mapping[str, Any] | None = None,
    batch: Mapping[str, Any] | None = None,
    **kwargs: Any,
) -> tuple[torch.Tensor, torch.Tensor]:
    """GDPO advantage: A = whiten(Σ_k w_k · GRPO_k) · mask.

    1. For each key k of ``config.gdpo_reward_keys`` the per-row score ``non_tensor_batch[k]`` (or
       ``non_tensor_batch["reward_extra/k"]``, where our trainer keeps compute_score's extra keys) is
       placed at the row's last response token, and GRPO-normalised within its ``index`` group
       (:func:`~verl.algorithms.advantage.compute_grpo_outcome_advantage`, same ε and std flag).
    2. The normalised components are summed with weights ``config.gdpo_reward_weights`` (default 1).
    3. The sum is whitened over all valid tokens of the batch (masked mean, unbiased variance).

    Without ``config``, ``non_tensor_batch`` or ``batch`` (a direct call) the single component is
    ``token_level_rewards``: GRPO followed by whitening.

    Args:
        token_level_rewards, response_mask: (batch, response_len).
        index: (batch,) group ids (uid).
        epsilon, norm_adv_by_std_in_grpo: passed to the per-component GRPO. As in verl the flag comes
            from the argument. Our driver passes ``algorithm.norm_adv_by_std_in_grpo`` here; verl's
            never sets it for gdpo (so it is always True there): a deliberate deviation, so that the
            flag means the same for grpo and gdpo.
        config: ``algorithm`` section (attrs, namespace or dict) with ``gdpo_reward_keys`` (list of str)
            and optional ``gdpo_reward_weights`` (list of float, one per key).
        non_tensor_batch: the batch's numpy columns (one float per row per key).
        batch: tensor columns; ``prompts`` and ``attention_mask`` locate the last response token
            (the response mask's last valid slot when they are absent).

    Returns:
        (advantages, returns): one tensor returned twice, (batch, response_len) float32 (rewards dtype without components).

    Raises:
        ValueError: no ``gdpo_reward_keys`` while the batch is given; weights not one per key; a
            component with a wrong length or non-numeric values. KeyError: a component missing.

    Source: verl/trainer/ppo/core_algos.py:compute_gdpo_outcome_advantage.
    """
    token_level_rewards = float_rewards(token_level_rewards)
    check_2d("token_level_rewards", token_level_rewards)
    check_2d("response_mask", response_mask, token_level_rewards)
    components = [token_level_rewards]
    weights: list[float] | None = None
    if config is not None and non_tensor_batch is not None and batch is not None:
        keys = cfg_get(config, "gdpo_reward_keys")
        if not keys:
            raise ValueError(
                "gdpo needs algorithm.gdpo_reward_keys: the reward component keys returned by compute_score "
                "(e.g. [format_reward, accuracy_reward])"
            )
        components = _component_rewards(list(keys), non_tensor_batch, batch, response_mask)
        raw_weights = cfg_get(config, "gdpo_reward_weights")
        if raw_weights is not None:
            weights = [float(w) for w in raw_weights]
            if len(weights) != len(components):
                raise ValueError(
                    f"algorithm.gdpo_reward_weights has {len(weights)} entries for {len(components)} "
                    "gdpo_reward_keys; give one weight per key (or null for equal weights)"
                )
    if weights is None:
        weights = [1.0] * len(components)
    total = None
    for weight, rewards in zip(weights, components, strict=True):
        normalised, _ = compute_grpo_outcome_advantage(
            token_level_rewards=rewards,
            response_mask=response_mask,
            index=index,
            epsilon=epsilon,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        )
        term = weight * normalised.to(torch.float64)
        total = term if total is None else total + term
    mask64 = response_mask.to(torch.float64)
    advantages = (masked_whiten(total, response_mask) * mask64).to(components[0].dtype)
    return advantages, advantages
