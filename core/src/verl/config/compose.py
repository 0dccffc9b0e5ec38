"""Compose a CONFIG file with its Hydra ``defaults:`` list (and those of the files it names), as Hydra does.

verl's YAML files start with

.. code-block:: yaml

    hydra:
      searchpath: [file://verl/trainer/config]
    defaults: [ppo_trainer, _self_]

Here:

* Each entry of a ``defaults:`` list is a config name, looked up in the primary file's directory, then in
  the search path (``hydra.searchpath`` of the files composed so far and of the command line, in order), then
  among the built-in configs. ``_self_`` is where the file's own values go; without it they go last (Hydra
  1.1+'s default: a file overrides what its defaults list brings in). Each named file is composed the same
  way (its own list, its own ``_self_``); a cycle is an error naming the files.
* The built-in configs are ``ppo_trainer`` (verl's full default config = this package's bare schema) and the
  run configs shipped in ``verl/trainer/config`` (:mod:`verl.config.base`). verl's own config directory in a
  search path (``file://verl/trainer/config``, ``pkg://verl.trainer.config``, any path ending in
  ``verl/trainer/config``) means them. Other ``file://`` entries are directories relative to the current
  working directory (Hydra's rule); ``pkg://pkg.sub`` is the directory of that importable package.
* A layer merges over what is below it key by key, so ``ppo_trainer`` after a file puts verl's defaults back
  over that file, as in Hydra.
* Refused with the reason: entries selecting a config group (``{override model_engine: megatron}``,
  ``group/option``), two built-in configs in one list, and any ``hydra:`` key but ``searchpath``.
"""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Mapping, Sequence
from pathlib import Path, PurePath
from typing import Any

import attrs

from verl.config.base import RUN_CONFIG_DIR, SCHEMA_BASE_NAME, ConfigBase, run_configs, schema_base
from verl.config.errors import ConfigError

_SELF = "_self_"
#: A search-path entry meaning verl's own config directory, i.e. the built-in configs.
BUILTIN = "<built-in configs>"
_VERL_CONFIG_PARTS = ("verl", "trainer", "config")


@attrs.frozen
class Layer:
    """One config merged in composition order.

    Attributes:
        name: ``ppo_trainer``, a shipped run config's name, or a user file's path (as text).
        path: the YAML file; ``None`` for ``ppo_trainer`` (the bare schema).
        tree: the values it sets (plain dicts), without ``defaults``/``hydra``/``_target_``.
        builtin: ``True`` for ``ppo_trainer`` and the shipped run configs.
    """

    name: str
    path: Path | None
    tree: dict[str, Any]
    builtin: bool


@attrs.frozen
class Composition:
    """A composed CONFIG file: its layers in merge order and the :class:`ConfigBase` that reports them."""

    layers: tuple[Layer, ...]
    base: ConfigBase


def resolve_search_entry(entry: str, *, key: str = "hydra.searchpath") -> str | Path:
    """A ``hydra.searchpath`` entry as :data:`BUILTIN` or a directory.

    ``file://DIR`` (relative to the working directory, as Hydra), ``pkg://package.name`` (the package's
    directory), or a plain path. verl's own config directory in any of these forms is :data:`BUILTIN`.

    Raises:
        ConfigError: on ``key``: not a string, an unknown scheme, or a ``pkg://`` package that is not importable.
    """
    if not isinstance(entry, str) or not entry:
        raise ConfigError(f"{key}: entry {entry!r} must be a file:// or pkg:// path", key=key)
    scheme, sep, rest = entry.partition("://")
    if not sep:
        scheme, rest = "file", entry
    if scheme == "pkg":
        if rest.strip("/").replace("/", ".") == "verl.trainer.config":
            return BUILTIN
        try:
            spec = importlib.util.find_spec(rest)
        except (ImportError, ValueError):
            spec = None
        if spec is None or not spec.submodule_search_locations:
            raise ConfigError(
                f"{key}: {entry!r}: package {rest!r} is not importable here; install it or give its directory "
                "as file://DIR",
                key=key,
            )
        return Path(next(iter(spec.submodule_search_locations)))
    if scheme != "file":
        raise ConfigError(f"{key}: {entry!r}: unknown scheme {scheme!r}; use file://DIR or pkg://package", key=key)
    path = Path(rest)
    parts = PurePath(os.path.normpath(rest)).parts
    if parts[-3:] == _VERL_CONFIG_PARTS or path.resolve() == RUN_CONFIG_DIR:
        return BUILTIN
    return path


def search_path_of(data: Mapping[str, Any], file: str | Path) -> list[str | Path]:
    """The resolved ``hydra.searchpath`` of a file's top-level mapping ([] when it has no ``hydra:``).

    Raises:
        ConfigError: (key ``hydra``) a ``hydra:`` that is not a mapping, a key in it other than ``searchpath``,
            or a bad entry (:func:`resolve_search_entry`).
    """
    hydra = data.get("hydra")
    if hydra is None:
        return []
    where = f"config file '{file}': hydra"
    if not isinstance(hydra, Mapping):
        raise ConfigError(f"{where} must be a mapping such as {{searchpath: [file://DIR]}}", key="hydra")
    other = sorted(str(k) for k in hydra if k != "searchpath")
    if other:
        raise ConfigError(
            f"{where}: only hydra.searchpath has a meaning here (where defaults: names are looked up); "
            f"remove {', '.join(f'hydra.{k}' for k in other)} (the run folder is verl train --run-dir; Hydra's "
            "logging and launcher settings do not apply)",
            key="hydra",
        )
    entries = hydra.get("searchpath") or []
    if isinstance(entries, str):
        entries = [entries]
    if not isinstance(entries, list):
        raise ConfigError(f"{where}.searchpath must be a list of file:// or pkg:// paths", key="hydra.searchpath")
    return [resolve_search_entry(e, key=f"hydra.searchpath of '{file}'") for e in entries]


def defaults_entries(defaults: Any, file: str | Path) -> list[str]:
    """A ``defaults:`` list as names (``_self_`` included, ``.yaml`` suffixes dropped), after checking it.

    Raises:
        ConfigError: (key ``defaults``) not a list, an entry selecting a Hydra config group, or two built-in
            configs in one list.
    """
    where = f"config file '{file}': defaults"
    if not isinstance(defaults, list | tuple):
        raise ConfigError(f"{where} must be a list such as [ppo_trainer, _self_], got {defaults!r}", key="defaults")
    names: list[str] = []
    for entry in defaults:
        if not isinstance(entry, str) or "/" in entry or "@" in entry:
            if isinstance(entry, Mapping):
                text = ", ".join(f"{k}: {v}" for k, v in entry.items())
            else:
                text = str(entry)
            raise ConfigError(
                f"{where}: entry {{{text}}} selects a Hydra config group, which verl.config does not have; "
                "keep the base name (ppo_trainer) and set the value itself in the file (a backend: "
                "actor_rollout_ref.actor.strategy / actor_rollout_ref.rollout.name)",
                key="defaults",
            )
        names.append(entry if entry == _SELF else entry.removesuffix(".yaml"))
    builtins = [n for n in names if n == SCHEMA_BASE_NAME or n in run_configs()]
    if len(builtins) > 1:
        raise ConfigError(f"{where}: name one base config, got {builtins}", key="defaults")
    return names


def compose(
    path: str | os.PathLike[str],
    *,
    search_path: Sequence[str | Path] = (),
    forced_base: ConfigBase | None = None,
    fallback_reason: str = "no defaults: list in the file",
) -> Composition:
    """Compose the CONFIG file at ``path`` with its defaults lists (module docstring).

    Args:
        path: the primary file.
        search_path: resolved entries (:func:`resolve_search_entry`) from the command line; searched after
            the primary file's directory and before the files' own ``hydra.searchpath``.
        forced_base: the CLI's ``--schema-defaults``: the shipped run configs named by defaults lists are left
            out (the user's own files still compose); its reason is reported.
        fallback_reason: the reason reported when the primary file has no ``defaults:`` list.

    Raises:
        ConfigError: unreadable file, a defaults list :func:`defaults_entries` refuses, a name found nowhere
            (listing where it was looked for), a cycle, a bad ``hydra:`` section.
    """
    from verl.config.loader import read_mapping

    primary = Path(path)
    data = read_mapping(primary)
    here = BUILTIN if primary.parent.resolve() == RUN_CONFIG_DIR else primary.parent
    search: list[str | Path] = [here, *search_path]
    layers = _expand(primary, data, search, (), builtin=False)
    if forced_base is not None:
        layers = [layer for layer in layers if not (layer.builtin and layer.path is not None)]
    run_layers = [layer for layer in layers if layer.builtin and layer.path is not None]
    if forced_base is not None:
        base = forced_base
    elif "defaults" in data:
        reason = f"named by the defaults list of '{primary}'"
        last = run_layers[-1] if run_layers else None
        base = ConfigBase(last.name, last.path, reason) if last else schema_base(reason)
    else:
        base = schema_base(fallback_reason)
    shown = [layer.name for layer in layers]
    simple = shown in ([str(primary)], [base.name, str(primary)])
    return Composition(tuple(layers), attrs.evolve(base, chain=() if simple else tuple(shown)))


def _expand(
    file: Path, data: Mapping[str, Any], search: list[str | Path], stack: tuple[Path, ...], *, builtin: bool
) -> list[Layer]:
    here = file.resolve()
    if here in stack:
        cycle = " -> ".join(str(p) for p in (*stack[stack.index(here) :], here))
        raise ConfigError(f"defaults: the config files name each other in a cycle: {cycle}", key="defaults")
    search.extend(p for p in search_path_of(data, file) if p not in search)
    names = defaults_entries(data["defaults"], file) if "defaults" in data else [_SELF]
    if _SELF not in names:
        names.append(_SELF)
    from verl.config.loader import read_mapping, strip_targets

    layers: list[Layer] = []
    for name in names:
        if name == _SELF:
            own = strip_targets({k: v for k, v in data.items() if k not in ("defaults", "hydra")})
            layers.append(Layer(file.stem if builtin else str(file), file, own, builtin))
            continue
        found = _find(name, file, search)
        if found is None:
            layers.append(Layer(SCHEMA_BASE_NAME, None, _schema_tree(), True))
            continue
        path, is_builtin = found
        layers += _expand(path, read_mapping(path), search, (*stack, here), builtin=is_builtin)
    return layers


def _find(name: str, file: Path, search: Sequence[str | Path]) -> tuple[Path, bool] | None:
    """``(path, builtin)`` of the config ``name``; ``None`` = ``ppo_trainer`` (the bare schema)."""
    looked: list[str] = []
    for entry in [*search, BUILTIN]:
        if entry == BUILTIN:
            if name == SCHEMA_BASE_NAME:
                return None
            if name in run_configs():
                return run_configs()[name], True
            looked.append(BUILTIN)
            continue
        candidate = Path(entry) / f"{name}.yaml"
        if candidate.is_file():
            return candidate, False
        looked.append(str(candidate))
    known = ", ".join([SCHEMA_BASE_NAME, *run_configs()])
    files = [p for p in dict.fromkeys(looked) if p != BUILTIN]
    raise ConfigError(
        f"config file '{file}': defaults: unknown base config {name!r}; known: {known}; "
        f"no file {' or '.join(files)} either",
        key="defaults",
    )


def _schema_tree() -> dict[str, Any]:
    from verl.config.dump import to_dict
    from verl.config.schema import RootConfig

    return to_dict(RootConfig())
