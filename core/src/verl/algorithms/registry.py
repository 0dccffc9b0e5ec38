"""Name -> function registries for advantage estimators and policy losses.

Lookup order for ``get_*``: the local registry (built-ins of this package plus anything registered with
the decorators), then plugin specs from ``verl.plugins.get_plugin_manager()`` (kinds
``"advantage_estimator"`` and ``"policy_loss"``), imported lazily so this module stays importable
without the plugin system.

A name that a plugin provides and that is also in the local registry (a built-in, or registered
in-process with the decorators) is a conflict: the lookup raises :class:`verl.plugins.PluginConflictError`
naming both providers instead of letting core win silently. The same function offered twice is not a
conflict. Two plugins providing one name are refused by the plugin manager itself.

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


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_plugin_conflict(pm: Any, kind: str, what: str, name: str, local: Callable[..., Any]) -> None:
    """Raise PluginConflictError when a plugin other than core's builtin provides ``name`` with another function."""
    claims_of = getattr(pm, "claims", None)
    if claims_of is None:  # a manager without claim records (tests' stand-ins): nothing to compare
        return
    from verl.plugins import PluginConflictError
    from verl.plugins.discovery import BUILTIN_MODULE

    claims = [c for c in claims_of(kind) if c.spec.name == name]
    rivals = [c for c in claims if c.plugin.module != BUILTIN_MODULE and c.spec.fn is not local]
    if not rivals:
        return
    core = next((c.plugin for c in claims if c.plugin.module == BUILTIN_MODULE), None)
    if core is None:
        core = next((p for p in getattr(pm, "plugins", ()) if p.module == BUILTIN_MODULE), None)
    core_text = core.describe() if core is not None else "verl-core (local registry)"
    providers = [f"{core_text} as {_qualname(local)}"]
    providers += [f"{c.plugin.describe()} as {_qualname(c.spec.fn)}" for c in rivals]
    raise PluginConflictError(
        f"{what} {name!r} is provided by {len(providers)} plugins: "
        + "; ".join(providers)
        + f"\nNeither is chosen silently: rename the plugin's {what}, uninstall the plugin, or leave it out of "
        "VERL_PLUGINS.",
        kind=kind,
        conflicts={name: tuple(([core] if core is not None else []) + [c.plugin for c in rivals])},
    )


def _conflict_types() -> tuple[type[BaseException], ...]:
    try:
        from verl.plugins import PluginConflictError
    except ImportError:  # a stand-in plugin module without it: nothing to let through
        return ()
    return (PluginConflictError,)


def _plugin_manager() -> Any | None:
    try:
        from verl.plugins import get_plugin_manager
    except ImportError:
        return None
    return get_plugin_manager()


def _lookup(registry: dict[str, Callable[..., Any]], kind: str, what: str, name_or_enum: str | Enum):
    name = _name(name_or_enum)
    _ensure_builtins()
    pm = _plugin_manager()
    if name in registry:
        if pm is not None:
            _check_plugin_conflict(pm, kind, what, name, registry[name])
        return registry[name]
    plugin_names: list[str] = []
    notes = ["(plugin-provided names are not listed: verl.plugins could not be imported)"]
    if pm is not None:
        try:
            return pm.get(kind, name).fn
        except _conflict_types():
            raise  # two providers for one name: the manager's message names both; never "unknown"
        except (KeyError, ValueError) as err:
            # The manager's first line lists its names; they are listed once below, merged with the local
            # ones. Its other lines (plugins that failed to load or were disabled, install hints) are kept.
            notes = str(err).splitlines()[1:] if isinstance(err, ValueError) else []
            try:
                plugin_names = sorted(pm.available(kind))
            except Exception:  # listing names is best effort inside an error path
                plugin_names = []
    known = sorted(set(registry) | set(plugin_names))
    close = difflib.get_close_matches(name, known, n=1)
    if close:  # one suggestion, over local and plugin names alike
        notes = [line for line in notes if not line.startswith("Did you mean")]
    first = f"Unknown {what} {name!r}; registered names: {', '.join(known)}."
    raise ValueError("\n".join([first + (f" Did you mean {close[0]!r}?" if close else ""), *notes]))


def get_adv_estimator_fn(name_or_enum: str | Enum) -> Callable[..., Any]:
    """Return the advantage estimator registered as ``name_or_enum`` (a str or an
    :class:`~verl.algorithms.AdvantageEstimator` member; local first, then plugins).

    Raises:
        ValueError: unknown name; the message lists every registered name once (local and plugin-provided),
            a close spelling, and the plugin manager's notes (plugins that failed to import, install hints).
        verl.plugins.PluginConflictError (a ValueError): a plugin provides the name with a different
            function than the local registry, or two plugins provide it; the message names both.
    """
    return _lookup(ADV_ESTIMATOR_REGISTRY, "advantage_estimator", "advantage estimator", name_or_enum)


def get_policy_loss_fn(name: str | Enum) -> Callable[..., Any]:
    """Return the policy loss registered as ``name`` (local first, then plugins).

    Raises:
        ValueError: unknown name; the message lists the supported names.
        verl.plugins.PluginConflictError (a ValueError): the name has two providers (named).
    """
    return _lookup(POLICY_LOSS_REGISTRY, "policy_loss", "policy loss", name)
