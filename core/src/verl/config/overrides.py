"""Dotted ``key=value`` overrides (Hydra syntax, as in verl run scripts) applied to a plain config tree.

``actor_rollout_ref.rollout.n=4``, ``+trainer.logger=[console,tensorboard]`` (``+``/``++``
"add" prefixes are accepted for existing keys too), ``actor_rollout_ref.actor.optim.lr=1e-6``.
Values are typed like YAML 1.2 scalars (:func:`verl.config.yaml_io.parse_scalar`).

In Hydra, ``+key=value`` adds a key the config lacks. The schema here is closed, so ``+`` cannot add a key
it does not define; :attr:`Override.added` keeps the prefix so the unknown-key error can say so
(:func:`verl.config.keys.find_unknown_keys`).
"""

from __future__ import annotations

import re
from collections.abc import Mapping, MutableMapping
from typing import Any

import attrs

from verl.config.converter import describe_value
from verl.config.errors import ConfigError, ConfigIssue
from verl.config.yaml_io import parse_scalar

_KEY_PART = re.compile(r"^[A-Za-z0-9_\-]+$")


@attrs.frozen
class Override:
    """One parsed override: the original text, its dotted key split into parts, the typed value, and whether
    it had Hydra's ``+``/``++`` add prefix (``added``)."""

    text: str
    path: tuple[str, ...]
    value: Any
    added: bool = False

    @property
    def key(self) -> str:
        return ".".join(self.path)


def parse_override(text: str) -> Override:
    """Parse ``[+|++]a.b.c=value``. Raises :class:`ConfigError` for anything else (e.g. ``~key`` deletion)."""
    stripped = text.strip()
    if stripped.startswith("~"):
        key = stripped[1:].split("=", 1)[0]
        raise ConfigError(
            f"override '{text}': deleting a key is not supported; set '{key}=null' or leave the key out", key=key
        )
    body = stripped
    added = False
    for prefix in ("++", "+"):  # Hydra's force-add / add: accepted, the key must exist in the schema anyway
        if body.startswith(prefix):
            body = body[len(prefix) :]
            added = True
            break
    key, sep, raw_value = body.partition("=")
    key = key.strip()
    if not sep or not key:
        raise ConfigError(
            f"override '{text}' is not of the form key=value (e.g. data.train_batch_size=8)", key=key or "<override>"
        )
    parts = tuple(key.split("."))
    bad = [p for p in parts if not _KEY_PART.match(p)]
    if bad:
        raise ConfigError(f"override '{text}': '{key}' is not a dotted key (bad part {bad[0]!r})", key=key)
    return Override(text=text, path=parts, value=parse_scalar(raw_value.strip()), added=added)


def deep_merge(base: MutableMapping[str, Any], incoming: Mapping[str, Any]) -> None:
    """Merge ``incoming`` into ``base`` in place: mappings merge key by key, anything else replaces.

    A null given for a mapping keeps the mapping (``critic:`` with every sub-key commented
    out means "no changes", not "delete the section").
    """
    for key, value in incoming.items():
        current = base.get(key)
        if isinstance(current, MutableMapping) and isinstance(value, Mapping):
            deep_merge(current, value)
        elif isinstance(current, Mapping) and value is None:
            continue
        else:
            base[key] = _copy(value)


def _copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_copy(v) for v in value]
    return value


def apply_override(tree: MutableMapping[str, Any], override: Override) -> None:
    """Set ``override.value`` at ``override.path`` in ``tree``, creating missing parents.

    Unknown keys are not rejected here (the schema check names them with a suggestion);
    a path through a non-mapping value is a :class:`ConfigError`.
    """
    node: MutableMapping[str, Any] = tree
    for depth, part in enumerate(override.path[:-1]):
        child = node.get(part)
        if child is None:
            child = node[part] = {}
        elif not isinstance(child, MutableMapping):
            parent = ".".join(override.path[: depth + 1])
            raise ConfigError(
                ConfigIssue(
                    override.key,
                    f"override '{override.text}': cannot set '{override.key}' because '{parent}' is "
                    f"{describe_value(child)}, not a section",
                )
            )
        node = child
    last = override.path[-1]
    if isinstance(node.get(last), MutableMapping) and isinstance(override.value, Mapping):
        deep_merge(node[last], override.value)
    else:
        node[last] = _copy(override.value)
