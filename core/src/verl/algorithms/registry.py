"""Name -> function registries for advantage estimators and policy losses.

Lookup order for ``get_*``: the local registry (built-ins of this package plus anything registered with
the decorators), then plugin specs from ``verl.plugins.get_plugin_manager()`` (kinds
``"advantage_estimator"`` and ``"policy_loss"``), imported lazily so this module stays importable
without the plugin system.

Source: verl/trainer/ppo/core_algos.py (register_adv_est, get_adv_estimator_fn, register_policy_loss,
get_policy_loss_fn). Difference: re-registering a *different* function under a policy-loss name raises
ValueError here too (verl silently overwrites), so two plugins cannot shadow each other unnoticed.
"""

from __future__ import annotations

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
    from verl.algorithms import advantage, policy_loss  # noqa: F401


def _lookup(registry: dict[str, Callable[..., Any]], kind: str, what: str, name_or_enum: str | Enum):
    name = _name(name_or_enum)
    _ensure_builtins()
    if name in registry:
        return registry[name]
    plugin_names: list[str] = []
    detail = "plugin system not available (verl.plugins could not be imported)"
    try:
        from verl.plugins import get_plugin_manager
    except ImportError:
        pass
    else:
        pm = get_plugin_manager()
        try:
            return pm.get(kind, name).fn
        except (KeyError, ValueError) as err:
            detail = str(err)
            try:
                plugin_names = sorted(pm.available(kind))
            except Exception:  # listing names is best effort inside an error path
                plugin_names = []
    known = sorted(set(registry) | set(plugin_names))
    raise ValueError(f"Unknown {what} {name!r}. Registered names: {known}. Plugin lookup: {detail}")


def get_adv_estimator_fn(name_or_enum: str | Enum) -> Callable[..., Any]:
    """Return the advantage estimator registered as ``name_or_enum`` (local first, then plugins).

    Raises:
        ValueError: unknown name; the message lists every registered name and the plugin manager's
            explanation (including plugins that failed to import).
    """
    return _lookup(ADV_ESTIMATOR_REGISTRY, "advantage_estimator", "advantage estimator", name_or_enum)


def get_policy_loss_fn(name: str | Enum) -> Callable[..., Any]:
    """Return the policy loss registered as ``name`` (local first, then plugins).

    Raises:
        ValueError: unknown name; the message lists the supported names.
    """
    return _lookup(POLICY_LOSS_REGISTRY, "policy_loss", "policy loss", name)
