"""What the tool and interaction YAML loaders share: reading the file's entry list and importing ``class_name``.

Errors name the file, the entry (``tools[2]``) and the fix, because they surface at config load
(:mod:`verl.config.validate_agents`) far from the file that caused them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

__all__ = ["VERL_CLASS_PATHS", "entry_mapping", "import_class", "read_entries"]

#: verl's dotted class paths (its example YAML files) -> where the same class lives here.
VERL_CLASS_PATHS = {
    "verl.tools.gsm8k_tool.Gsm8kTool": "verl.tools.gsm8k.Gsm8kTool",
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "verl.tools.sandbox_fusion.SandboxFusionTool",
    "verl.interactions.gsm8k_interaction.Gsm8kInteraction": "verl.interactions.gsm8k.Gsm8kInteraction",
}


def read_entries(path: str | Path, key: str, example: str) -> tuple[Path, list[Any]]:
    """``(resolved path, the list under key)`` of a YAML file.

    Args:
        path: the file (``~`` expanded).
        key: the top-level key holding the list (``tools`` / ``interaction``).
        example: one entry as YAML, shown in the error when the shape is wrong.

    Raises:
        ValueError: the file is missing, not valid YAML, not a mapping, or has no list under ``key``.
    """
    file = Path(path).expanduser()
    if not file.is_file():
        raise ValueError(f"{file}: no such file (check the path; relative paths are read from {Path.cwd()})")
    try:
        data = yaml.safe_load(file.read_text())
    except yaml.YAMLError as exc:
        raise ValueError(f"{file}: not valid YAML: {exc}") from exc
    if not isinstance(data, Mapping) or key not in data:
        raise ValueError(f"{file}: expected a top-level '{key}:' list, e.g.\n{key}:\n{example}")
    entries = data[key]
    if entries is None:
        entries = []
    if not isinstance(entries, list):
        raise ValueError(f"{file}: '{key}' must be a list of entries, got {type(entries).__name__}")
    return file, entries


def entry_mapping(entry: Any, field: str, where: str) -> dict[str, Any]:
    """The entry's ``field`` as a dict (missing or null: ``{}``); ValueError naming ``where`` otherwise."""
    value = entry.get(field)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ValueError(f"{where}.{field} must be a mapping, got {type(value).__name__}: {value!r}")
    return dict(value)


def import_class(dotted: Any, *, base: type, where: str) -> type:
    """Import ``"pkg.mod.Class"`` (verl's paths in :data:`VERL_CLASS_PATHS` map to this package's) and check it.

    Raises:
        ValueError: naming ``where``: not a dotted string, the module does not import (with its error), no such
            class in it, or the class is not a subclass of ``base``.
    """
    if not isinstance(dotted, str) or "." not in dotted.strip(". "):
        raise ValueError(f"{where}.class_name must be a dotted import path 'package.module.Class', got {dotted!r}")
    dotted = VERL_CLASS_PATHS.get(dotted, dotted)
    module_name, _, class_name = dotted.rpartition(".")
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:  # any import-time failure of user code is this entry's problem
        raise ValueError(
            f"{where}.class_name={dotted!r}: module {module_name!r} does not import ({type(exc).__name__}: {exc}); "
            "check the spelling and that its package is installed or on PYTHONPATH"
        ) from exc
    cls = getattr(module, class_name, None)
    if cls is None:
        found = sorted(
            n
            for n, v in vars(module).items()
            if isinstance(v, type) and issubclass(v, base) and v.__module__ == module.__name__
        )
        raise ValueError(
            f"{where}.class_name={dotted!r}: {module_name} has no {class_name!r} ({base.__name__} classes defined "
            f"there: {found})"
        )
    if not isinstance(cls, type) or not issubclass(cls, base):
        raise ValueError(
            f"{where}.class_name={dotted!r} is not a subclass of {base.__module__}.{base.__qualname__}; "
            f"derive it from {base.__qualname__}"
        )
    return cls
