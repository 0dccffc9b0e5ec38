"""Dotted-key access to a raw config tree (nested dicts, before the schema check).

The key rewrites that run before structuring (:mod:`verl.config.legacy_keys`, :mod:`verl.config.reward_section`,
:mod:`verl.config.aliases`) address leaves by their dotted key (``reward_model.overlong_buffer.len``).
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

#: What :func:`get_dotted` / :func:`pop_dotted` return for an absent key (a present key may hold None).
MISSING: Any = object()


def get_dotted(tree: Mapping[str, Any], dotted: str) -> Any:
    """The value at ``dotted`` in ``tree``, or :data:`MISSING` when a part of the path is absent or not a mapping."""
    node: Any = tree
    for part in dotted.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return MISSING
        node = node[part]
    return node


def pop_dotted(tree: MutableMapping[str, Any], dotted: str) -> Any:
    """Remove and return the value at ``dotted``; :data:`MISSING` (and nothing removed) when it is absent."""
    *parents, leaf = dotted.split(".")
    node = get_dotted(tree, ".".join(parents)) if parents else tree
    if not isinstance(node, MutableMapping) or leaf not in node:
        return MISSING
    return node.pop(leaf)


def set_dotted(tree: MutableMapping[str, Any], dotted: str, value: Any) -> None:
    """Write ``value`` at ``dotted``, creating (or replacing non-mapping values with) the sections above it."""
    *parents, leaf = dotted.split(".")
    node: Any = tree
    for part in parents:
        if not isinstance(node.get(part), MutableMapping):
            node[part] = {}
        node = node[part]
    node[leaf] = value
