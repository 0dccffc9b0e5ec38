"""Which agent loops exist: the ``verl_agent_loops`` plugins and ``rollout.agent.agent_loop_config_path``.

The YAML file is verl's format: a list of ``{name, _target_}`` with ``_target_`` a dotted import path of an
:class:`~verl.agents.AgentLoopBase` subclass (or a factory taking the :class:`~verl.agents.AgentLoopContext`).
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

KEY = "actor_rollout_ref.rollout.agent.agent_loop_config_path"


def import_target(target: str, *, where: str) -> Any:
    """Import ``pkg.module.Name``; ValueError naming ``where`` and the fix when it cannot be found."""
    module_name, _, attr = str(target).rpartition(".")
    if not module_name:
        raise ValueError(f"{where}: {target!r} is not a dotted import path (pkg.module.Class)")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise ValueError(f"{where}: cannot import module {module_name!r} of {target!r}: {exc}") from exc
    if not hasattr(module, attr):
        raise ValueError(f"{where}: module {module_name!r} has no {attr!r} (from {target!r})")
    return getattr(module, attr)


def load_agent_loop_config(path: str | Path) -> dict[str, Any]:
    """``{name: factory}`` from a verl ``agent_loop_config_path`` file.

    Raises:
        ValueError: a missing file, an entry without ``name`` / ``_target_``, a target that cannot be imported or
            is not callable, a name listed twice; each names the file and the entry.
    """
    import yaml

    path = Path(path)
    if not path.is_file():
        raise ValueError(f"{KEY}={str(path)!r}: no such file")
    entries = yaml.safe_load(path.read_text()) or []
    if not isinstance(entries, list):
        raise ValueError(f"{KEY}={str(path)!r}: expected a YAML list of {{name, _target_}} entries")
    out: dict[str, Any] = {}
    for i, entry in enumerate(entries):
        where = f"{path} entry {i}"
        if not isinstance(entry, dict) or not entry.get("name") or not entry.get("_target_"):
            raise ValueError(f"{where}: each entry needs `name` and `_target_` (pkg.module.Class), got {entry!r}")
        if entry["name"] in out:
            raise ValueError(f"{where}: agent loop {entry['name']!r} is listed twice")
        factory = import_target(entry["_target_"], where=where)
        if not callable(factory):
            raise ValueError(f"{where}: {entry['_target_']!r} is not a class or callable")
        out[str(entry["name"])] = factory
    return out


def agent_loop_factories(agent_config: Any = None, plugin_manager: Any = None) -> dict[str, Any]:
    """Every agent loop by name: plugins' (``verl_agent_loops``) then the config file's.

    Args:
        agent_config: the ``rollout.agent`` section (its ``agent_loop_config_path``), or None.
        plugin_manager: ``available(kind) -> {name: spec}``; None = :func:`verl.plugins.get_plugin_manager`.

    Raises:
        ValueError: a config-file loop named like a plugin's (names must be unique), or a bad file.
    """
    if plugin_manager is None:
        from verl.plugins import get_plugin_manager

        plugin_manager = get_plugin_manager()
    loops = {name: spec.factory for name, spec in plugin_manager.available("agent_loop").items()}
    path = getattr(agent_config, "agent_loop_config_path", None)
    if path:
        for name, factory in load_agent_loop_config(path).items():
            if name in loops:
                raise ValueError(f"{KEY}: agent loop {name!r} is already provided by a plugin; pick another name")
            loops[name] = factory
    return loops


__all__ = ["agent_loop_factories", "import_target", "load_agent_loop_config"]
