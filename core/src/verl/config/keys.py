"""Unknown-key detection with "did you mean" hints, before structuring.

cattrs would report an extra key per class; checking the raw tree first lets us name the
full dotted key, suggest a close spelling among its siblings, and recognise a key put in the
wrong section (``actor_rollout_ref.actor.temperature`` -> ``actor_rollout_ref.rollout.temperature``).
"""

from __future__ import annotations

import difflib
import functools
import typing
from collections.abc import Collection, Mapping
from typing import Any

import attrs

from verl.config.errors import ConfigIssue
from verl.config.schema import RootConfig

# Sections whose unknown keys are often backend options that moved to engine_kwargs.<backend>.
_ENGINE_SECTIONS = {
    "actor_rollout_ref.actor": ("actor_rollout_ref.actor.engine_kwargs", ("actor_rollout_ref", "actor", "strategy")),
    "actor_rollout_ref.rollout": ("actor_rollout_ref.rollout.engine_kwargs", ("actor_rollout_ref", "rollout", "name")),
    "critic": ("critic.engine_kwargs", ("critic", "strategy")),
}
# verl keeps some backends' options in their own sections; here they are engine_kwargs.<backend>.
_BACKEND_SECTIONS = {"fsdp_config": "fsdp", "megatron": "megatron", "fsdp": "fsdp"}
#: Added to an unknown key given as ``+key=value``: in Hydra ``+`` adds a key to the config; here it cannot.
PLUS_CANNOT_ADD = (
    "Hydra's '+' adds a key the config lacks, but this config's schema is closed: '+' cannot add keys here. "
    "Use a key the schema defines (`verl config show` prints them all), put backend options under "
    "engine_kwargs.<backend> (e.g. actor_rollout_ref.actor.engine_kwargs.fsdp.<option>) and reward-function "
    "options under custom_reward_function.reward_kwargs.<name>."
)


def section_class(tp: Any) -> type | None:
    """The attrs class behind an annotation (``X`` or ``X | None``), else None."""
    if attrs.has(tp):
        return tp
    for arg in typing.get_args(tp):
        if attrs.has(arg):
            return arg
    return None


@functools.cache
def _field_types(cls: type) -> dict[str, Any]:
    hints = typing.get_type_hints(cls)
    return {f.name: hints[f.name] for f in attrs.fields(cls)}


@functools.cache
def schema_paths() -> tuple[str, ...]:
    """Every dotted key of the schema, sections included (``trainer``, ``trainer.nnodes``, ...)."""
    out: list[str] = []

    def walk(cls: type, prefix: str) -> None:
        for name, tp in _field_types(cls).items():
            path = f"{prefix}.{name}" if prefix else name
            out.append(path)
            sub = section_class(tp)
            if sub is not None:
                walk(sub, path)

    walk(RootConfig, "")
    return tuple(out)


def _suggest(parent: str, key: str, siblings: list[str], raw_root: Mapping[str, Any]) -> str:
    """Hint text for an unknown ``key`` under section ``parent`` (may be empty)."""
    full = f"{parent}.{key}" if parent else key
    elsewhere = [p for p in schema_paths() if p.rsplit(".", 1)[-1] == key and p != full]
    close = difflib.get_close_matches(key, siblings, n=3, cutoff=0.6)
    hints = []
    if close:
        hints.append("Did you mean " + " or ".join(f"'{_join(parent, c)}'" for c in close) + "?")
    if elsewhere:
        where = " or ".join(f"'{p}'" for p in elsewhere[:4])
        hints.append(f"'{key}' belongs to another section: did you mean {where}?")
    if not hints:
        leaf_names = sorted({p.rsplit(".", 1)[-1] for p in schema_paths()})
        fuzzy = difflib.get_close_matches(key, leaf_names, n=2, cutoff=0.75)
        paths = [p for p in schema_paths() if p.rsplit(".", 1)[-1] in fuzzy][:3]
        if paths:
            hints.append("Did you mean " + " or ".join(f"'{p}'" for p in paths) + "?")
    if not hints and parent in _ENGINE_SECTIONS:
        kwargs_path, name_path = _ENGINE_SECTIONS[parent]
        if key in _BACKEND_SECTIONS:
            hints.append(
                f"Options of the {_BACKEND_SECTIONS[key]} backend go under '{kwargs_path}.{_BACKEND_SECTIONS[key]}'."
            )
        else:
            backend = _lookup(raw_root, name_path)
            backend = backend if isinstance(backend, str) else "<name>"
            hints.append(f"Backend-specific options go under '{kwargs_path}.{backend}.{key}'.")
    return " ".join(hints)


def _join(parent: str, key: str) -> str:
    return f"{parent}.{key}" if parent else key


def _lookup(root: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = root
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def find_unknown_keys(
    raw: Mapping[str, Any], cls: type = RootConfig, parent: str = "", *, added: Collection[str] = ()
) -> list[ConfigIssue]:
    """Issues for keys of ``raw`` that ``cls`` (recursively) does not define.

    Free-form dicts (``override_config``, ``engine_kwargs``, ...) are not checked here; a
    section given a non-mapping value is left to the type check.

    Args:
        added: dotted keys given with Hydra's ``+``/``++`` prefix (:attr:`verl.config.overrides.Override.added`);
            an unknown key among them (or a section above one) also gets :data:`PLUS_CANNOT_ADD`.
    """
    return _find(raw, cls, parent, raw, frozenset(added))


def _find(
    raw: Mapping[str, Any], cls: type, parent: str, root: Mapping[str, Any], added: frozenset[str]
) -> list[ConfigIssue]:
    fields = _field_types(cls)
    issues: list[ConfigIssue] = []
    for key, value in raw.items():
        name = str(key)
        full = f"{parent}.{name}" if parent else name
        if name not in fields:
            hints = [_suggest(parent, name, list(fields), root)]
            if any(k == full or k.startswith(full + ".") for k in added):
                hints.append(PLUS_CANNOT_ADD)
            hint = " ".join(h for h in hints if h)
            what = "section" if isinstance(value, Mapping) else "key"
            issues.append(ConfigIssue(full, f"unknown config {what} '{full}'." + (f" {hint}" if hint else "")))
            continue
        sub = section_class(fields[name])
        if sub is not None and isinstance(value, Mapping):
            issues.extend(_find(value, sub, full, root, added))
    return issues


def prune_unknown(raw: Mapping[str, Any], cls: type = RootConfig) -> dict[str, Any]:
    """A copy of ``raw`` without the keys :func:`find_unknown_keys` reports (to type-check the rest)."""
    fields = _field_types(cls)
    out: dict[str, Any] = {}
    for key, value in raw.items():
        if key not in fields:
            continue
        sub = section_class(fields[key])
        out[key] = prune_unknown(value, sub) if sub is not None and isinstance(value, Mapping) else value
    return out
