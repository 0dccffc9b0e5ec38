"""verl's backend-specific config sections, accepted under their verl names.

verl configures FSDP with ``actor_rollout_ref.actor.fsdp_config.*`` (and ``ref.fsdp_config``,
``critic.fsdp_config``); here every backend's options live in ``<section>.engine_kwargs.<backend>``,
checked by the backend plugin's options class. A verl-style key is moved to its place before the
schema check, so ``actor_rollout_ref.actor.fsdp_config.param_offload=true`` just works, and
setting the same option both ways is an error naming both keys.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from verl.config.errors import ConfigError, ConfigIssue

#: verl key -> our key (both dotted paths of a section).
SECTION_ALIASES: dict[str, str] = {
    "actor_rollout_ref.actor.fsdp_config": "actor_rollout_ref.actor.engine_kwargs.fsdp",
    "actor_rollout_ref.ref.fsdp_config": "actor_rollout_ref.ref.engine_kwargs.fsdp",
    "critic.fsdp_config": "critic.engine_kwargs.fsdp",
    "critic.model.fsdp_config": "critic.engine_kwargs.fsdp",
}


def _node(tree: MutableMapping[str, Any], path: list[str], create: bool) -> MutableMapping[str, Any] | None:
    node: Any = tree
    for part in path:
        if not isinstance(node, MutableMapping):
            return None
        if part not in node:
            if not create:
                return None
            node[part] = {}
        node = node[part]
    return node if isinstance(node, MutableMapping) else None


def apply_section_aliases(tree: MutableMapping[str, Any], origins: MutableMapping[str, str]) -> None:
    """Move every :data:`SECTION_ALIASES` section of ``tree`` (in place) to its target key.

    ``origins`` (dotted key -> where it was set) gains the moved keys, noting the verl name.

    Raises:
        ConfigError: an alias that is not a mapping, or an option set under both names.
    """
    for alias, target in SECTION_ALIASES.items():
        *parent_path, leaf = alias.split(".")
        parent = _node(tree, parent_path, create=False)
        if parent is None or leaf not in parent:
            continue
        value = parent.pop(leaf)
        if value is None or value == {}:
            continue
        if not isinstance(value, MutableMapping):
            raise ConfigError(ConfigIssue(alias, f"{alias} must be a section of options, got {value!r}"))
        dest = _node(tree, target.split("."), create=True)
        if dest is None:
            raise ConfigError(ConfigIssue(target, f"{target} must be a section of options"))
        issues = [
            ConfigIssue(f"{alias}.{key}", f"{alias}.{key} is also set as {target}.{key}; keep one of them")
            for key in value
            if key in dest
        ]
        if issues:
            raise ConfigError(issues)
        for key, item in value.items():
            dest[key] = item
            source = origins.get(f"{alias}.{key}")
            origins[f"{target}.{key}"] = f"{source + ', ' if source else ''}as {alias}.{key}"
