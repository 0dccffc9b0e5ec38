"""Driver-side advantage step on a DataProto (verl/trainer/ppo/ray_trainer.py:compute_advantage)."""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from types import SimpleNamespace
from typing import Any

import torch

from verl.algorithms.advantage import (
    AdvantageEstimator,
    compute_gae_advantage_return,
    compute_grpo_outcome_advantage,
)
from verl.algorithms.registry import get_adv_estimator_fn

__all__ = ["compute_advantage", "compute_response_mask"]

# Estimators taking norm_adv_by_std_in_grpo as an argument (grpo_passk reads it from config).
_STD_FLAG = (AdvantageEstimator.GRPO_VECTORIZED.value, AdvantageEstimator.GDPO.value)

_TOKEN_BASELINE = (
    AdvantageEstimator.OPTIMAL_TOKEN_BASELINE.value,
    AdvantageEstimator.TIR_OPTIMAL_TOKEN_BASELINE.value,
)


def compute_response_mask(data: Any) -> torch.Tensor:
    """response_mask = attention_mask[:, -response_len:] (verl/trainer/ppo/ray_trainer.py:compute_response_mask).

    Raises:
        KeyError: ``responses`` or ``attention_mask`` missing from ``data.batch``.
    """
    keys = set(data.batch.keys())
    missing = {"responses", "attention_mask"} - keys
    if missing:
        raise KeyError(f"cannot derive response_mask: data.batch lacks {sorted(missing)} (has {sorted(keys)})")
    response_len = data.batch["responses"].shape[-1]
    return data.batch["attention_mask"][:, -response_len:]


def compute_advantage(
    data: Any,
    adv_estimator: str | Enum,
    gamma: float = 1.0,
    lam: float = 1.0,
    num_repeat: int = 1,
    norm_adv_by_std_in_grpo: bool = True,
    config: Any = None,
    estimator_fn: Callable[..., Any] | None = None,
) -> Any:
    """Driver-side advantage step on a DataProto; writes ``advantages`` and ``returns`` into ``data.batch``.

    Reads ``token_level_rewards`` and ``response_mask`` (derived from ``attention_mask``/``responses`` if
    absent), ``values`` for gae, ``non_tensor_batch["uid"]`` as the group index and ``reward_baselines``
    when present. ``gae`` gets (gamma, lam); ``grpo``, ``grpo_vectorized`` and ``gdpo`` get
    ``norm_adv_by_std_in_grpo`` (verl's driver passes it to ``grpo`` only, so there the other two always
    divide by the std: a deliberate deviation, so that the flag means the same for all three); every other
    estimator (built-in or plugin) is called as in verl with token_level_rewards, response_mask, config
    [, index] [, reward_baselines]; ``gdpo`` also gets ``non_tensor_batch`` and ``batch``, the optimal
    token baselines ``sum_pi_squared``, ``old_log_probs`` and ``rollout_is_weights`` (or None). When
    ``config`` is None a namespace with gamma, lam and norm_adv_by_std_in_grpo is passed so config-reading estimators see the driver's values.
    ``num_repeat`` is accepted for verl compatibility and unused (as in verl).

    Args:
        data: DataProto (only ``.batch`` and ``.non_tensor_batch`` are used).
        adv_estimator: estimator name or :class:`AdvantageEstimator`.
        estimator_fn: the function of ``adv_estimator`` when the caller looked it up (the trainer asks
            :func:`verl.plugins.get_adv_estimator_fn`, which also sees plugin-provided estimators); ``None``:
            this package's registry (:func:`verl.algorithms.get_adv_estimator_fn`). Not a verl argument.

    Returns:
        The same ``data`` object.

    Raises:
        KeyError: a required key is missing (named). ValueError: unknown estimator (lists names).

    Source: verl/trainer/ppo/ray_trainer.py:compute_advantage.
    """
    name = adv_estimator.value if isinstance(adv_estimator, Enum) else adv_estimator
    batch = data.batch
    keys = set(batch.keys())
    if "token_level_rewards" not in keys:
        raise KeyError(f"compute_advantage: data.batch lacks 'token_level_rewards' (has {sorted(keys)})")
    if "response_mask" not in keys:
        batch["response_mask"] = compute_response_mask(data)
    rewards, mask = batch["token_level_rewards"], batch["response_mask"]
    uid = data.non_tensor_batch.get("uid") if data.non_tensor_batch is not None else None
    if config is None:
        config = SimpleNamespace(gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo)

    if name == AdvantageEstimator.GAE.value:
        if "values" not in keys:
            raise KeyError("compute_advantage(gae): data.batch lacks 'values' (run the critic's compute_values first)")
        advantages, returns = compute_gae_advantage_return(rewards, batch["values"], mask, gamma=gamma, lam=lam)
    elif name == AdvantageEstimator.GRPO.value:
        if uid is None:
            raise KeyError("compute_advantage(grpo): data.non_tensor_batch lacks 'uid' (assign it before repeat)")
        advantages, returns = compute_grpo_outcome_advantage(
            token_level_rewards=rewards,
            response_mask=mask,
            index=uid,
            norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
            config=config,
        )
    else:
        fn = estimator_fn if estimator_fn is not None else get_adv_estimator_fn(name)
        kwargs: dict[str, Any] = {"token_level_rewards": rewards, "response_mask": mask, "config": config}
        if uid is not None:
            kwargs["index"] = uid
        if "reward_baselines" in keys:
            kwargs["reward_baselines"] = batch["reward_baselines"]
        if name in _STD_FLAG:
            # Deliberate deviation: verl's driver passes the flag only to grpo, so there
            # norm_adv_by_std_in_grpo=false is silently ignored by these two GRPO variants.
            kwargs["norm_adv_by_std_in_grpo"] = norm_adv_by_std_in_grpo
        if name == AdvantageEstimator.GDPO.value:  # per-component rewards live in the raw columns
            kwargs["non_tensor_batch"] = data.non_tensor_batch if data.non_tensor_batch is not None else {}
            kwargs["batch"] = batch
        if name in _TOKEN_BASELINE:
            for key in ("sum_pi_squared", "old_log_probs"):
                if key not in keys:
                    raise KeyError(
                        f"compute_advantage({name}): data.batch lacks {key!r}; the optimal token baseline needs "
                        "the old policy's log-probs and its Σπ² per token (verl: actor.calculate_sum_pi_squared)"
                    )
                kwargs[key] = batch[key]
            kwargs["rollout_is_weights"] = batch["rollout_is_weights"] if "rollout_is_weights" in keys else None
        advantages, returns = fn(**kwargs)
    batch["advantages"] = advantages
    batch["returns"] = returns
    return data
