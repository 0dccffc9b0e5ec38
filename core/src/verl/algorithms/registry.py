"""Name -> function registries for advantage estimators and policy losses (the in-process ones).

``register_adv_est`` / ``register_policy_loss`` fill them (the built-ins of this package register themselves);
``get_adv_estimator_fn`` / ``get_policy_loss_fn`` look only here, exactly like verl's. This layer never asks the
plugin manager: the plugin-aware lookups (local first, then plugin specs, with conflicts between the two
refused) are :func:`verl.plugins.get_adv_estimator_fn` / :func:`verl.plugins.get_policy_loss_fn`, which the
trainer, the workers and config load use and whose result is passed down (``compute_advantage(...,
estimator_fn=...)``).

Source: verl/trainer/ppo/core_algos.py (register_adv_est, get_adv_estimator_fn, register_policy_loss,
get_policy_loss_fn). Difference: re-registering a *different* function under a policy-loss name raises
ValueError here too (verl silently overwrites; for estimators verl raises as here), so two plugins
cannot shadow each other unnoticed.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable
from enum import Enum
from typing import Any, TypeVar

__all__ = [
    "ADV_ESTIMATOR_REGISTRY",
    "POLICY_LOSS_REGISTRY",
    "get_adv_estimator_fn",
    "get_policy_loss_fn",
    "register_adv_est",
    "register_policy_loss",
]

F = TypeVar("F", bound=Callable[..., Any])

ADV_ESTIMATOR_REGISTRY: dict[str, Callable[..., Any]] = {}
POLICY_LOSS_REGISTRY: dict[str, Callable[..., Any]] = {}
_REGISTRIES = {"advantage_estimator": ADV_ESTIMATOR_REGISTRY, "policy_loss": POLICY_LOSS_REGISTRY}


def _name(name_or_enum: str | Enum) -> str:
    name = name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum
    if not isinstance(name, str) or not name:
        raise TypeError(f"registry name must be a non-empty str or a str Enum, got {name_or_enum!r}")
    return name


def _register(registry: dict[str, Callable[..., Any]], what: str, name_or_enum: str | Enum) -> Callable[[F], F]:
    name = _name(name_or_enum)

    def decorator(fn: F) -> F:
        existing = registry.get(name)
        if existing is not None and existing is not fn:
            raise ValueError(
                f"{what} {name!r} is already registered to {existing.__module__}.{existing.__qualname__}; "
                f"refusing to replace it with {fn.__module__}.{fn.__qualname__}. Pick another name."
            )
        registry[name] = fn
        return fn

    return decorator


def register_adv_est(name_or_enum: str | Enum) -> Callable[[F], F]:
    """Decorator registering an advantage estimator under ``name_or_enum``.

    The function must accept the verl keyword arguments (``token_level_rewards``, ``response_mask``,
    ``config`` and, for grouped estimators, ``index``) and return ``(advantages, returns)``, both
    (batch, response_len).

    Raises:
        ValueError: the name is already bound to a different function.
        TypeError: the name is not a non-empty string (or str Enum).
    """
    return _register(ADV_ESTIMATOR_REGISTRY, "advantage estimator", name_or_enum)


def register_policy_loss(name: str | Enum) -> Callable[[F], F]:
    """Decorator registering a policy loss under ``name``.

    Signature of the function: ``(old_log_prob, log_prob, advantages, response_mask,
    loss_agg_mode="token-mean", config=None, rollout_is_weights=None) -> (loss, metrics: dict)``.

    Raises:
        ValueError: the name is already bound to a different function.
    """
    return _register(POLICY_LOSS_REGISTRY, "policy loss", name)


def _ensure_builtins() -> None:
    # Built-ins register themselves on import; importing here makes lookups work even when a caller
    # imported only this module.
    from verl.algorithms import (  # noqa: F401
        advantage,
        advantage_gdpo,
        advantage_token_baseline,
        advantage_vectorized,
        policy_loss,
        policy_loss_bypass,
        policy_loss_dppo,
    )


def local_names(kind: str) -> list[str]:
    """Sorted names in the local registry of ``kind`` (``"advantage_estimator"`` or ``"policy_loss"``), built-ins
    included."""
    _ensure_builtins()
    return sorted(_REGISTRIES[kind])


def lookup_local(kind: str, name_or_enum: str | Enum) -> Callable[..., Any] | None:
    """The function registered in-process as ``name_or_enum`` (built-ins and decorator registrations), or ``None``.

    Raises:
        ValueError: ``kind`` is not ``"advantage_estimator"`` / ``"policy_loss"``.
        TypeError: the name is not a non-empty str (or str Enum).
    """
    if kind not in _REGISTRIES:
        raise ValueError(f"unknown registry kind {kind!r}; expected one of: {', '.join(_REGISTRIES)}")
    name = _name(name_or_enum)
    _ensure_builtins()
    return _REGISTRIES[kind].get(name)


def unknown_name_error(what: str, name: str, known: list[str], notes: list[str]) -> ValueError:
    """The error of an unknown name: every known name once, one close spelling, then ``notes`` lines."""
    close = difflib.get_close_matches(name, known, n=1)
    if close:  # one suggestion, over local and plugin names alike
        notes = [line for line in notes if not line.startswith("Did you mean")]
    first = f"Unknown {what} {name!r}; registered names: {', '.join(known)}."
    return ValueError("\n".join([first + (f" Did you mean {close[0]!r}?" if close else ""), *notes]))


_PLUGIN_NOTE = (
    "(this lookup sees the in-process registry only; plugin-provided names are looked up by "
    "verl.plugins.get_adv_estimator_fn / get_policy_loss_fn, which the trainer and config load use)"
)


def _lookup(kind: str, what: str, name_or_enum: str | Enum) -> Callable[..., Any]:
    fn = lookup_local(kind, name_or_enum)
    if fn is not None:
        return fn
    raise unknown_name_error(what, _name(name_or_enum), local_names(kind), [_PLUGIN_NOTE])


def get_adv_estimator_fn(name_or_enum: str | Enum) -> Callable[..., Any]:
    """Return the advantage estimator registered in-process as ``name_or_enum`` (a str or an
    :class:`~verl.algorithms.AdvantageEstimator` member): built-ins and ``register_adv_est``, as verl's
    ``core_algos.get_adv_estimator_fn``. Plugin-provided estimators: :func:`verl.plugins.get_adv_estimator_fn`.

    Raises:
        ValueError: unknown name; the message lists the registered names and a close spelling.
    """
    return _lookup("advantage_estimator", "advantage estimator", name_or_enum)


def get_policy_loss_fn(name: str | Enum) -> Callable[..., Any]:
    """Return the policy loss registered in-process as ``name`` (built-ins and ``register_policy_loss``), as verl's
    ``core_algos.get_policy_loss_fn``. Plugin-provided losses: :func:`verl.plugins.get_policy_loss_fn`.

    Raises:
        ValueError: unknown name; the message lists the registered names.
    """
    return _lookup("policy_loss", "policy loss", name)
