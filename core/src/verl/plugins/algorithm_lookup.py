"""Plugin-aware lookup of advantage estimators and policy losses by name.

Order: the in-process registry of :mod:`verl.algorithms.registry` (built-ins and functions registered with the
decorators), then the specs of kinds ``"advantage_estimator"`` / ``"policy_loss"`` from the plugin manager.
A name that a plugin provides with another function than the local registry holds is a conflict: the lookup
raises :class:`PluginConflictError` naming both providers instead of letting core win silently. The same
function offered twice is not a conflict (a plugin that decorates a function *and* returns it as a spec).

This lives in the plugins layer so that ``verl.algorithms`` never calls up into the plugin manager: the trainer,
the workers and config load look a function up here and pass it down.
"""

from __future__ import annotations

from collections.abc import Callable
from enum import Enum
from typing import Any

from verl.plugins.discovery import BUILTIN_MODULE
from verl.plugins.errors import PluginConflictError


def _manager(plugin_manager: Any | None) -> Any:
    if plugin_manager is not None:
        return plugin_manager
    import verl.plugins  # through the package attribute, so tests can substitute the process-wide manager

    return verl.plugins.get_plugin_manager()


def _qualname(fn: Callable[..., Any]) -> str:
    return f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}"


def _check_conflict(pm: Any, kind: str, what: str, name: str, local: Callable[..., Any]) -> None:
    """Raise PluginConflictError when a plugin other than core's builtin provides ``name`` with another function."""
    claims_of = getattr(pm, "claims", None)
    if claims_of is None:  # a manager without claim records (tests' stand-ins): nothing to compare
        return
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


def _lookup(kind: str, what: str, name_or_enum: str | Enum, plugin_manager: Any | None) -> Callable[..., Any]:
    from verl.algorithms import registry

    local = registry.lookup_local(kind, name_or_enum)
    name = name_or_enum.value if isinstance(name_or_enum, Enum) else name_or_enum
    pm = _manager(plugin_manager)
    if local is not None:
        _check_conflict(pm, kind, what, name, local)
        return local
    plugin_names: list[str] = []
    notes: list[str] = []
    try:
        return pm.get(kind, name).fn
    except PluginConflictError:
        raise  # two providers for one name: the manager's message names both; never "unknown"
    except (KeyError, ValueError) as err:
        # The manager's first line lists its names; they are listed once below, merged with the local ones.
        # Its other lines (plugins that failed to load or were disabled, install hints) are kept.
        notes = str(err).splitlines()[1:] if isinstance(err, ValueError) else []
        try:
            plugin_names = sorted(pm.available(kind))
        except Exception:  # listing names is best effort inside an error path
            plugin_names = []
    known = sorted(set(registry.local_names(kind)) | set(plugin_names))
    raise registry.unknown_name_error(what, name, known, notes)


def get_adv_estimator_fn(name_or_enum: str | Enum, plugin_manager: Any | None = None) -> Callable[..., Any]:
    """The advantage estimator called ``name_or_enum`` (str or ``AdvantageEstimator``): local registry first,
    then plugins.

    Args:
        plugin_manager: default :func:`verl.plugins.get_plugin_manager`.

    Raises:
        ValueError: unknown name; the message lists every registered name once (local and plugin-provided), a
            close spelling, and the plugin manager's notes (plugins that failed to import, install hints).
        PluginConflictError (a ValueError): a plugin provides the name with a different function than the local
            registry, or two plugins provide it; the message names both.
    """
    return _lookup("advantage_estimator", "advantage estimator", name_or_enum, plugin_manager)


def get_policy_loss_fn(name: str | Enum, plugin_manager: Any | None = None) -> Callable[..., Any]:
    """The policy loss called ``name``: local registry first, then plugins. Raises as :func:`get_adv_estimator_fn`."""
    return _lookup("policy_loss", "policy loss", name, plugin_manager)
