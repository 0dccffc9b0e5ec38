"""``load_interactions``: the interactions of ``actor_rollout_ref.rollout.multi_turn.interaction_config_path``
(verl 0.5's ``verl/interactions/utils/interaction_registry.py:initialize_interactions_from_config``).

The file is verl's::

    interaction:
      - name: gsm8k                                        # what rows put in interaction_kwargs.name
        class_name: verl.interactions.gsm8k.Gsm8kInteraction  # dotted import path; verl's own paths work too
        config: {}                                         # passed to the class, with `name` added

Without ``name`` an entry is named after its class, lower-case, without an ``Interaction`` suffix
(``Gsm8kInteraction`` -> ``gsm8k``), as in verl.
"""

from __future__ import annotations

from pathlib import Path

from verl.interactions.base import BaseInteraction
from verl.tools._loading import entry_mapping, import_class, read_entries

__all__ = ["load_interactions"]

_EXAMPLE = """  - name: gsm8k
    class_name: verl.interactions.gsm8k.Gsm8kInteraction
    config: {}"""


def _default_name(class_name: str) -> str:
    simple = class_name.rsplit(".", 1)[-1]
    return (
        simple[: -len("Interaction")] if simple.endswith("Interaction") and simple != "Interaction" else simple
    ).lower()


def load_interactions(path: str | Path) -> dict[str, BaseInteraction]:
    """Build every interaction of an interaction YAML file: ``{name: interaction}`` in file order.

    Raises:
        ValueError: naming the file, the entry (``interaction[i]``) and the fix: an unreadable file or wrong
            shape, an entry that is not a mapping or has no ``class_name``, an unknown key, a ``name`` that is not a
            non-empty string, a class that does not import or is not a :class:`BaseInteraction` subclass, a
            ``config`` that is not a mapping, a constructor that raises, or two entries with the same name.
    """
    file, entries = read_entries(path, "interaction", _EXAMPLE)
    interactions: dict[str, BaseInteraction] = {}
    seen: dict[str, int] = {}
    for i, entry in enumerate(entries):
        where = f"{file}: interaction[{i}]"
        if not isinstance(entry, dict):
            raise ValueError(f"{where} must be a mapping with name, class_name, config; got {entry!r}")
        unknown = sorted(set(entry) - {"name", "class_name", "config"})
        if unknown:
            raise ValueError(f"{where}: unknown key(s) {unknown}; an entry has name, class_name, config")
        if "class_name" not in entry:
            raise ValueError(
                f"{where} has no class_name: give the interaction's dotted class path, e.g. "
                "verl.interactions.gsm8k.Gsm8kInteraction"
            )
        cls = import_class(entry["class_name"], base=BaseInteraction, where=where)
        name = entry.get("name")
        if name is None:
            name = _default_name(entry["class_name"])
        if not isinstance(name, str) or not name.strip():
            raise ValueError(f"{where}.name must be a non-empty string (rows name it in interaction_kwargs.name)")
        if name in seen:
            raise ValueError(
                f"{where}: interaction name {name!r} is already used by interaction[{seen[name]}]; give each entry "
                "its own name"
            )
        config = {**entry_mapping(entry, "config", where), "name": name}
        try:
            interaction = cls(config=config)
        except Exception as exc:  # the class's own validation: say which entry it was
            raise ValueError(f"{where} ({cls.__qualname__}): {type(exc).__name__}: {exc}") from exc
        seen[name] = i
        interactions[name] = interaction
    return interactions
