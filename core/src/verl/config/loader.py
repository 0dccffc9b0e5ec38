"""``load_config``: base <- YAML file <- dotted overrides, then structure, resolve and validate.

The base (bare schema, or a shipped run config) is chosen as :mod:`verl.config.base` describes; a file's
``defaults:`` list (and ``hydra.searchpath``) is composed as :mod:`verl.config.compose` describes.
"""

from __future__ import annotations

import copy
import logging
import os
import re
from collections.abc import Callable, Collection, Mapping, Sequence
from pathlib import Path
from typing import Any

import yaml

from verl.config.aliases import apply_section_aliases, apply_strategy_names
from verl.config.backend_options import validate_backend_options, validate_registered_names
from verl.config.base import ConfigBase, schema_base
from verl.config.compose import Composition, compose, defaults_entries, search_path_of
from verl.config.converter import structure
from verl.config.dump import to_dict
from verl.config.errors import ConfigError, ConfigIssue
from verl.config.keys import find_unknown_keys, prune_unknown
from verl.config.legacy_keys import apply_legacy_keys
from verl.config.overrides import apply_override, deep_merge, parse_override
from verl.config.resolve import resolve_config
from verl.config.reward_section import apply_reward_section
from verl.config.run_dir import follow_run_dir
from verl.config.schema import RootConfig
from verl.config.validate import validate_config
from verl.config.yaml_io import load_yaml

logger = logging.getLogger("verl.config")

_INDEX = re.compile(r"\[\d+\]$")


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    *,
    base: ConfigBase | None = None,
    search_path: Sequence[str | Path] = (),
    run_dir: str | os.PathLike[str] | None = None,
    plugin_manager: Any | None = None,
    on_warning: Callable[[str], None] | None = None,
    filled: dict[str, str] | None = None,
) -> RootConfig:
    """Build a validated, resolved config.

    Order: the base (schema defaults, or a shipped run config over them), then the YAML file at
    ``path`` merged on top (mappings merge key by key; with the files its ``defaults:`` list names, in the
    order Hydra composes them: :func:`verl.config.compose.compose`), then each ``key=value`` override in order
    (``+key=value`` accepted). Unknown keys, wrong types and inconsistent values are all reported
    in one :class:`ConfigError`.

    Args:
        path: YAML file, or None for the base alone.
        overrides: Hydra-style dotted overrides, e.g. ``["actor_rollout_ref.rollout.n=4"]``.
        base: the bottom layer; None = what the file's ``defaults:`` list names (:func:`config_base`),
            else the bare schema. Given, it wins over the built-in bases the file's list names (the CLI's
            ``--schema-defaults``); the user's own files in that list still compose.
        search_path: resolved search-path entries (:func:`verl.config.compose.resolve_search_entry`) for the
            names in ``defaults:`` lists, e.g. from ``hydra.searchpath=[...]`` on a command line.
        run_dir: the run folder ``verl train --run-dir`` was given; an unset ``trainer.default_local_dir``
            becomes ``<run_dir>/checkpoints`` (:mod:`verl.config.run_dir`).
        plugin_manager: for :func:`validate_backend_options`; None = the process-wide one.
        on_warning: called with each validation warning; default logs on ``verl.config``.
        filled: if given, gains ``{key: why}`` for the strategies and the controller that were null and got
            a value from the world size (:func:`resolve_config`); ``verl config show`` prints it.

    Returns:
        The frozen :class:`RootConfig`, null follow-values filled in (:func:`resolve_config`).

    Raises:
        ConfigError: unreadable file, bad override syntax, unknown key (full dotted key +
            did-you-mean), wrong type (key, expected type, value), failed validation rule.
    """
    tree = to_dict(RootConfig())
    origins: dict[str, str] = {}
    base_tree: dict[str, Any] = {}
    if path is None:
        base = base or schema_base("no file given")
        base_tree = read_yaml_file(base.path) if base.path is not None else {}
        deep_merge(tree, copy.deepcopy(base_tree))
    else:
        for layer in compose(path, search_path=search_path, forced_base=base).layers:
            if layer.builtin:
                if layer.path is not None:  # a shipped run config: its folders may follow the run folder
                    deep_merge(base_tree, copy.deepcopy(layer.tree))
            else:
                _record_origins(layer.tree, "", origins, f"from file '{layer.path}'")
            deep_merge(tree, copy.deepcopy(layer.tree))
    added: set[str] = set()  # keys given as +key=value, for the unknown-key message
    for text in overrides:
        override = parse_override(text)
        origins[override.key] = f"from override '{text}'"
        if override.added:
            added.add(override.key)
        try:
            apply_override(tree, override)
        except ConfigError as exc:
            raise ConfigError(exc.issues) from None
    apply_reward_section(tree, origins)
    apply_legacy_keys(tree, origins)
    apply_strategy_names(tree, origins)
    apply_section_aliases(tree, origins)
    follow_run_dir(tree, origins, run_dir, base_tree)
    cfg = resolve_config(build_config(tree, origins, added), filled)
    issues: list[ConfigIssue] = []
    warnings: list[str] = []
    # Independent checks: run all of them so one error message lists everything to fix.
    for check in (
        lambda: warnings.extend(validate_config(cfg)),
        lambda: validate_backend_options(cfg, plugin_manager),
        lambda: validate_registered_names(cfg),
    ):
        try:
            check()
        except ConfigError as exc:
            issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues)
    for message in warnings:
        (on_warning or logger.warning)(message)
    return cfg


def config_base(
    path: str | os.PathLike[str] | None, fallback: ConfigBase, *, search_path: Sequence[str | Path] = ()
) -> ConfigBase:
    """The base a config file names with its Hydra ``defaults:`` list (with the composed chain), else ``fallback``.

    Raises:
        ConfigError: what :func:`verl.config.compose.compose` raises.
    """
    if path is None:
        return fallback
    return composition(path, fallback, search_path=search_path).base


def composition(
    path: str | os.PathLike[str], fallback: ConfigBase, *, search_path: Sequence[str | Path] = ()
) -> Composition:
    """:func:`verl.config.compose.compose` of ``path``, reporting ``fallback``'s reason when it has no list."""
    return compose(path, search_path=search_path, fallback_reason=fallback.reason)


def read_yaml_file(path: str | os.PathLike[str]) -> dict[str, Any]:
    """Read one config YAML file into a dict (empty file = ``{}``), without ``defaults:`` and ``hydra:``.

    Hydra's ``_target_`` keys are dropped (instantiation metadata with no meaning here). The ``defaults:``
    list and ``hydra.searchpath`` are checked here and composed by :func:`load_config`
    (:mod:`verl.config.compose`). ``${...}`` interpolations are rejected by :func:`build_config`.

    Raises:
        ConfigError: missing/unreadable file, YAML syntax error (with line), not a mapping, a defaults
            list or ``hydra:`` section that :mod:`verl.config.compose` refuses.
    """
    data = read_mapping(path)
    if "defaults" in data:
        defaults_entries(data["defaults"], path)
    search_path_of(data, path)
    return strip_targets({k: v for k, v in data.items() if k not in ("defaults", "hydra")})


def read_mapping(path: str | os.PathLike[str]) -> Mapping[str, Any]:
    """The top-level mapping of a YAML file, as written (``defaults:`` and ``hydra:`` included).

    Raises:
        ConfigError: (key ``<file>``) unreadable file, invalid YAML, not a mapping.
    """
    file = Path(path)
    try:
        text = file.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config file '{file}': {exc.strerror or exc}", key="<file>") from None
    try:
        data = load_yaml(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"config file '{file}' is not valid YAML: {exc}", key="<file>") from None
    if data is None:
        return {}
    if not isinstance(data, Mapping):
        raise ConfigError(
            f"config file '{file}' must hold a mapping of sections (data:, trainer:, ...), got {type(data).__name__}",
            key="<file>",
        )
    return data


def strip_targets(node: Mapping[str, Any]) -> dict[str, Any]:
    """``node`` as plain dicts without Hydra's ``_target_`` keys (instantiation metadata, no meaning here)."""
    return {k: (strip_targets(v) if isinstance(v, Mapping) else v) for k, v in node.items() if k != "_target_"}


def _record_origins(node: Mapping[str, Any], prefix: str, origins: dict[str, str], origin: str) -> None:
    for key, value in node.items():
        full = f"{prefix}.{key}" if prefix else str(key)
        origins[full] = origin
        if isinstance(value, Mapping):
            _record_origins(value, full, origins, origin)


def _origin_of(key: str, origins: Mapping[str, str]) -> str | None:
    key = _INDEX.sub("", key)
    while key:
        if key in origins:
            return origins[key]
        key = key.rpartition(".")[0]
    return None


def _with_origin(issue: ConfigIssue, origins: Mapping[str, str]) -> ConfigIssue:
    origin = _origin_of(issue.key, origins)
    return ConfigIssue(issue.key, f"{issue.message} ({origin})") if origin else issue


def _find_interpolations(node: Any, prefix: str) -> list[ConfigIssue]:
    if isinstance(node, Mapping):
        return [i for k, v in node.items() for i in _find_interpolations(v, f"{prefix}.{k}" if prefix else str(k))]
    if isinstance(node, list):
        return [i for idx, v in enumerate(node) for i in _find_interpolations(v, f"{prefix}[{idx}]")]
    if isinstance(node, str) and "${" in node:
        return [
            ConfigIssue(
                prefix,
                f"{prefix}: interpolation {node!r} is not supported; write the value itself "
                "(null follow-values such as rollout.prompt_length are filled in automatically)",
            )
        ]
    return []


def build_config(
    tree: Mapping[str, Any], origins: Mapping[str, str] | None = None, added: Collection[str] = ()
) -> RootConfig:
    """Structure a merged plain tree into :class:`RootConfig` (no resolving or cross-field validation).

    ``added``: keys given with Hydra's ``+`` prefix; an unknown one says that ``+`` cannot add keys here.

    Raises:
        ConfigError: every unknown key, wrong type and interpolation, each tagged with where
            it was set (file or override) when known.
    """
    origins = origins or {}
    issues = find_unknown_keys(tree, added=added) + _find_interpolations(tree, "")
    try:
        cfg = structure(prune_unknown(tree), RootConfig)
    except ConfigError as exc:
        issues += list(exc.issues)
        cfg = None
    if issues or cfg is None:
        raise ConfigError([_with_origin(issue, origins) for issue in issues])
    return cfg
