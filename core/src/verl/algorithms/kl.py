"""KL estimators, KL-coefficient controllers and the in-reward KL penalty.

Two KL routes exist and are independent (K22): ``apply_kl_penalty`` subtracts β·KL(π_old‖π_ref) from the
token rewards (``algorithm.use_kl_in_reward``), and the actor adds kl_loss_coef·agg(KL(π‖π_ref)) to its loss
(``actor.use_kl_loss``, see :func:`verl.algorithms.actor_loss.combine_actor_loss`). Neither is ever switched
on implicitly by this package: it only acts when called. Enabling both penalises KL twice, additively;
this package treats that as deliberate (it computes exactly what each switch asks for) and leaves warning
about it to config validation.

Source: verl/trainer/ppo/core_algos.py (kl_penalty, kl_penalty_forward, FixedKLController,
AdaptiveKLController, get_kl_controller, compute_rewards), verl/trainer/ppo/ray_trainer.py:apply_kl_penalty;
estimators from J. Schulman, "Approximating KL divergence" (2020), http://joschu.net/blog/kl-approx.html.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from verl.algorithms._config import cfg_get
from verl.algorithms.utils import masked_mean

__all__ = [
    "KL_PENALTY_MODES",
    "AdaptiveKLController",
    "FixedKLController",
    "apply_kl_penalty",
    "compute_rewards",
    "get_kl_controller",
    "kl_penalty",
]

_BASE_MODES = ("kl", "k1", "abs", "mse", "k2", "low_var_kl", "k3")
KL_PENALTY_MODES = _BASE_MODES + tuple(m + "+" for m in _BASE_MODES)
K3_LOG_RATIO_CLAMP = 20.0
K3_VALUE_CLAMP = 10.0


def _forward(diff: torch.Tensor, mode: str) -> torch.Tensor:
    """Estimator value from d = logπ − logπ_ref (``mode`` without the ``+`` suffix)."""
    if mode in ("kl", "k1"):
        return diff
    if mode == "abs":
        return diff.abs()
    if mode in ("mse", "k2"):
        return 0.5 * diff.square()
    # low_var_kl / k3: exp(x) − x − 1 with x = log(π_ref/π) = −d; expm1 avoids cancellation for small x.
    x = torch.clamp(-diff, min=-K3_LOG_RATIO_CLAMP, max=K3_LOG_RATIO_CLAMP)
    return torch.clamp(torch.expm1(x) - x, min=-K3_VALUE_CLAMP, max=K3_VALUE_CLAMP)


def kl_penalty(logprob: torch.Tensor, ref_logprob: torch.Tensor, kl_penalty: str) -> torch.Tensor:
    """Per-token KL estimate between the policy (``logprob``) and the reference (``ref_logprob``).

    Let d = logπ − logπ_ref:
      - ``kl`` / ``k1``: d
      - ``abs``: |d|
      - ``mse`` / ``k2``: ½d²
      - ``low_var_kl`` / ``k3``: x = clamp(−d, ±20); eˣ − x − 1, clamped to [−10, 10]
      - ``<mode>+``: value of ``<mode>``, gradient of k2 (straight-through: k2 − sg(k2) + sg(value));
        ``mse+`` / ``k2+`` equal plain k2.
    Values and gradients are finite for any finite inputs (tested at |d| = 1000). Half-precision inputs are
    computed and returned in float32 so exp(20) cannot overflow.

    Non-finite d (e.g. ``ref_logprob`` = −inf or NaN in padded slots): the value there is whatever the
    formula gives (inf/NaN; callers mask it with ``torch.where``-based reductions such as ``agg_loss``), but
    the gradient there is exactly 0 in every mode. Otherwise the upstream zero of a mask (``kl * mask`` or
    ``masked_sum``) meets the k2 derivative d = inf and 0·inf = NaN poisons every gradient of the batch.

    Args:
        logprob, ref_logprob: (batch, response_len) log-probs of the sampled tokens.
        kl_penalty: mode name, see :data:`KL_PENALTY_MODES`.

    Returns:
        (batch, response_len) tensor (unmasked: multiply by / aggregate with response_mask).

    Raises:
        ValueError: unknown mode (lists the modes; "full" needs whole-vocabulary logits, unsupported).
    """
    mode = kl_penalty
    if mode not in KL_PENALTY_MODES:
        hint = " ('full' needs whole-vocabulary distributions and is not supported)" if mode == "full" else ""
        raise ValueError(f"Unknown kl_penalty {mode!r}{hint}; supported: {list(KL_PENALTY_MODES)}")
    if logprob.dtype in (torch.float16, torch.bfloat16):
        logprob = logprob.float()
    if ref_logprob.dtype in (torch.float16, torch.bfloat16):
        ref_logprob = ref_logprob.float()
    base = mode.rstrip("+")
    diff = logprob - ref_logprob
    finite = torch.isfinite(diff)
    # Differentiate only through finite slots: non-finite ones take a detached value (zero gradient).
    safe = torch.where(finite, diff, torch.zeros_like(diff))
    value = torch.where(finite, _forward(safe, base), _forward(diff.detach(), base))
    if not mode.endswith("+") or base in ("mse", "k2"):
        return value
    k2 = 0.5 * safe.square()
    return k2 - k2.detach() + value.detach()


_kl_estimate = kl_penalty  # apply_kl_penalty's parameter ``kl_penalty`` (verl's signature) shadows the function


class FixedKLController:
    """Constant KL coefficient. ``value`` is the coefficient; ``update`` is a no-op.

    Source: verl/trainer/ppo/core_algos.py:FixedKLController.
    """

    def __init__(self, kl_coef: float) -> None:
        self.value = float(kl_coef)

    def update(self, current_kl: float, n_steps: int) -> None:
        """No-op (kept for the controller interface)."""


class AdaptiveKLController:
    """Adaptive KL coefficient (Ziegler et al. 2019, arXiv:1909.08593).

    update: e = clip(current_kl / target_kl − 1, −0.2, 0.2); value *= 1 + e·n_steps/horizon.

    Raises:
        ValueError: horizon <= 0 or target_kl <= 0.

    Source: verl/trainer/ppo/core_algos.py:AdaptiveKLController.
    """

    def __init__(self, init_kl_coef: float, target_kl: float, horizon: float) -> None:
        if horizon <= 0:
            raise ValueError(f"AdaptiveKLController: horizon must be > 0, got {horizon}")
        if target_kl <= 0:
            raise ValueError(f"AdaptiveKLController: target_kl must be > 0, got {target_kl}")
        self.value = float(init_kl_coef)
        self.target = float(target_kl)
        self.horizon = float(horizon)

    def update(self, current_kl: float, n_steps: int) -> None:
        """Scale ``value`` towards ``target_kl``; ``n_steps`` is the number of sequences in the batch."""
        error = float(np.clip(current_kl / self.target - 1.0, -0.2, 0.2))
        self.value *= 1.0 + error * n_steps / self.horizon


def get_kl_controller(kl_ctrl: Any) -> FixedKLController | AdaptiveKLController:
    """Build a controller from ``algorithm.kl_ctrl`` (type fixed|adaptive, kl_coef 0.001, horizon 10000, target_kl 0.1).

    Raises:
        ValueError: unknown type (lists the types) or invalid adaptive parameters.

    Source: verl/trainer/ppo/core_algos.py:get_kl_controller.
    """
    kind = cfg_get(kl_ctrl, "type", "fixed")
    coef = cfg_get(kl_ctrl, "kl_coef", 0.001)
    if kind == "fixed":
        return FixedKLController(kl_coef=coef)
    if kind == "adaptive":
        return AdaptiveKLController(
            init_kl_coef=coef, target_kl=cfg_get(kl_ctrl, "target_kl", 0.1), horizon=cfg_get(kl_ctrl, "horizon", 10000)
        )
    raise ValueError(f"algorithm.kl_ctrl.type {kind!r} is unknown; supported: ['fixed', 'adaptive']")


def compute_rewards(
    token_level_scores: torch.Tensor, old_log_prob: torch.Tensor, ref_log_prob: torch.Tensor, kl_ratio: float
) -> torch.Tensor:
    """scores − (logπ_old − logπ_ref)·kl_ratio, all (batch, response_len). Source: core_algos.py:compute_rewards."""
    return token_level_scores - (old_log_prob - ref_log_prob) * kl_ratio


def apply_kl_penalty(data: Any, kl_ctrl: Any, kl_penalty: str = "kl") -> tuple[Any, dict[str, float]]:
    """In-reward KL: token_level_rewards = token_level_scores − β·KL(π_old‖π_ref)·mask.

    β = ``kl_ctrl.value`` read *before* ``kl_ctrl.update(current_kl, n_steps=batch)``; current_kl is the mean
    over non-empty rows of each row's masked-mean KL (verl averages over all rows; an empty row would
    only dilute it). Example (K22b): scores [0, 0, 1], KL [0.1, 0.2, 0.3], β = 0.001 ->
    rewards [−0.0001, −0.0002, 0.9997].

    Args:
        data: DataProto whose ``batch`` has token_level_scores, old_log_probs, ref_log_prob, response_mask
            (all (batch, response_len)). ``token_level_rewards`` is written into ``data.batch``.
        kl_ctrl: FixedKLController / AdaptiveKLController (anything with ``value`` and ``update``).
        kl_penalty: estimator name, default ``"kl"`` (``algorithm.kl_penalty``).

    Returns:
        (data, metrics) with ``actor/reward_kl_penalty`` (current_kl) and ``actor/reward_kl_penalty_coeff`` (β).

    Raises:
        KeyError: a required batch key is missing (named).

    Source: verl/trainer/ppo/ray_trainer.py:apply_kl_penalty.
    """
    batch = data.batch
    keys = set(batch.keys())
    missing = [k for k in ("token_level_scores", "old_log_probs", "ref_log_prob", "response_mask") if k not in keys]
    if missing:
        raise KeyError(f"apply_kl_penalty: data.batch lacks {missing} (has {sorted(keys)})")
    mask = batch["response_mask"]
    scores = batch["token_level_scores"]
    kld = _kl_estimate(batch["old_log_probs"], batch["ref_log_prob"], kl_penalty)
    kld = torch.where(mask != 0, kld, torch.zeros_like(kld)).to(scores.dtype)
    beta = float(kl_ctrl.value)
    batch["token_level_rewards"] = scores - beta * kld
    nonempty = (mask != 0).any(dim=-1)
    row_kl = masked_mean(kld, mask, axis=-1)
    current_kl = float(row_kl[nonempty].mean()) if bool(nonempty.any()) else 0.0
    kl_ctrl.update(current_kl=current_kl, n_steps=int(scores.shape[0]))
    return data, {"actor/reward_kl_penalty": current_kl, "actor/reward_kl_penalty_coeff": beta}
