"""verl's backend-specific config sections, accepted under their verl names.

verl configures FSDP with ``actor_rollout_ref.actor.fsdp_config.*`` (and ``ref.fsdp_config``,
``critic.fsdp_config``, ``critic.model.fsdp_config``) and Megatron with ``actor_rollout_ref.actor.megatron.*``
(and ``ref.megatron``, ``critic.megatron``); here every backend's options live in
``<section>.engine_kwargs.<backend>``, checked by the backend plugin's options class. A verl-style key is moved
to its place before the schema check, so ``actor_rollout_ref.actor.fsdp_config.param_offload=true`` just works,
and setting the same option both ways is an error naming both keys.

Where it goes depends on the role's training engine (``actor.strategy``; the ref's and the critic's own
``strategy`` when set; unset, the default :func:`verl.config.resolve.default_strategy` gives):

* ``fsdp_config``: engine ``fsdp`` -> ``engine_kwargs.fsdp``; core's single-process ``reference``
  engine honours ``param_offload``, ``optimizer_offload`` and ``model_dtype`` (as its ``dtype``) ->
  ``engine_kwargs.reference``, and any other ``fsdp_config`` key is an error naming the engine (it would
  otherwise sit in a section nobody reads); any other engine (``megatron`` included): an error naming it.
* ``megatron``: engine ``megatron`` -> ``engine_kwargs.megatron``, keys unchanged (the verl-megatron plugin's
  options keep verl's ``McoreEngineConfig`` names); any other engine: an error naming it and the key to set.

verl's name ``fsdp2`` for a ``strategy`` (actor, ref, critic) is written ``fsdp`` first: the verl-fsdp plugin's
``fsdp`` engine is FSDP2 (``fully_shard``), and one name keeps ``engine_kwargs.fsdp``, checkpoints and
``verl export`` in agreement. verl's ``fsdp`` (FSDP1 there) gets the same FSDP2 engine.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from verl.config.errors import ConfigError, ConfigIssue
from verl.config.resolve import strategy_for
from verl.config.tree_paths import MISSING, get_dotted

#: verl section -> (the section holding its engine_kwargs, the key naming its training engine, fallback key).
SECTION_ALIASES: dict[str, tuple[str, str, str | None]] = {
    "actor_rollout_ref.actor.fsdp_config": ("actor_rollout_ref.actor", "actor_rollout_ref.actor.strategy", None),
    "actor_rollout_ref.ref.fsdp_config": (
        "actor_rollout_ref.ref",
        "actor_rollout_ref.ref.strategy",
        "actor_rollout_ref.actor.strategy",
    ),
    "critic.fsdp_config": ("critic", "critic.strategy", "actor_rollout_ref.actor.strategy"),
    "critic.model.fsdp_config": ("critic", "critic.strategy", "actor_rollout_ref.actor.strategy"),
    "actor_rollout_ref.actor.megatron": ("actor_rollout_ref.actor", "actor_rollout_ref.actor.strategy", None),
    "actor_rollout_ref.ref.megatron": (
        "actor_rollout_ref.ref",
        "actor_rollout_ref.ref.strategy",
        "actor_rollout_ref.actor.strategy",
    ),
    "critic.megatron": ("critic", "critic.strategy", "actor_rollout_ref.actor.strategy"),
}
#: Last part of a :data:`SECTION_ALIASES` key -> (the backend it configures, its name in messages).
ALIAS_BACKENDS = {"fsdp_config": ("fsdp", "FSDP"), "megatron": ("megatron", "Megatron")}
#: fsdp_config keys the ``reference`` engine honours -> its option name.
REFERENCE_KEYS = {"param_offload": "param_offload", "optimizer_offload": "optimizer_offload", "model_dtype": "dtype"}
_DTYPE_NAMES = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}
#: verl's strategy names -> ours, and the keys they are accepted in.
STRATEGY_NAMES = {"fsdp2": "fsdp"}
STRATEGY_KEYS = ("actor_rollout_ref.actor.strategy", "actor_rollout_ref.ref.strategy", "critic.strategy")


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


def _get(tree: MutableMapping[str, Any], dotted: str) -> Any:
    value = get_dotted(tree, dotted)
    return None if value is MISSING else value


def _default_strategy(tree: MutableMapping[str, Any]) -> str:
    """:func:`verl.config.resolve.strategy_for` on the raw tree (before the schema check)."""
    engine = tree.get("model_engine", "dp")
    try:
        nnodes, per_node = int(_get(tree, "trainer.nnodes")), int(_get(tree, "trainer.n_gpus_per_node"))
    except (TypeError, ValueError):  # a wrong type is the schema check's error
        nnodes = per_node = 1
    return strategy_for(engine if isinstance(engine, str) else "dp", nnodes, per_node)


def _engine_of(tree: MutableMapping[str, Any], key: str, fallback: str | None) -> tuple[str, str]:
    """(training engine name, the key it was read from) for one role."""
    value = _get(tree, key)
    if value is None and fallback is not None:
        key, value = fallback, _get(tree, fallback)
    return (str(value) if value is not None else _default_strategy(tree)), key


def apply_strategy_names(tree: MutableMapping[str, Any], origins: MutableMapping[str, str]) -> None:
    """Write verl's strategy names (:data:`STRATEGY_NAMES`: ``fsdp2``) as ours, in place; ``origins`` notes it."""
    for key in STRATEGY_KEYS:
        *parents, leaf = key.split(".")
        node = _node(tree, parents, create=False)
        value = node.get(leaf) if node is not None else None
        if isinstance(value, str) and value in STRATEGY_NAMES:
            node[leaf] = STRATEGY_NAMES[value]
            source = origins.get(key)
            origins[key] = f"{source + ', ' if source else ''}verl's {value!r} = {STRATEGY_NAMES[value]!r}"


def _translate(
    alias: str, value: MutableMapping[str, Any], engine: str, engine_key: str, section: str
) -> dict[str, Any]:
    """The options of ``value`` under the names of ``engine``'s options (raises for what it cannot take)."""
    backend, label = ALIAS_BACKENDS[alias.rsplit(".", 1)[1]]
    if engine == backend:
        return dict(value)
    if backend != "fsdp" or engine != "reference":
        raise ConfigError(
            [
                ConfigIssue(
                    f"{alias}.{key}",
                    f"{alias}.{key}: {alias} configures {label}, but the training engine is {engine!r} ({engine_key}); "
                    f"set {engine_key}={backend}, or configure {engine!r} under {section}.engine_kwargs.{engine}",
                )
                for key in value
            ]
        )
    unknown = [key for key in value if key not in REFERENCE_KEYS]
    if unknown:
        raise ConfigError(
            [
                ConfigIssue(
                    f"{alias}.{key}",
                    f"{alias}.{key}: training engine 'reference' ({engine_key}={engine}, core's single-process engine) "
                    "is not FSDP; "
                    f"of {alias} it honours {', '.join(REFERENCE_KEYS)} only: set {engine_key}=fsdp "
                    "(from the verl checkout: pip install ./plugins/verl-fsdp) to use FSDP's options, or remove the key",
                )
                for key in unknown
            ]
        )
    out = {REFERENCE_KEYS[key]: item for key, item in value.items()}
    if isinstance(out.get("dtype"), str):
        out["dtype"] = _DTYPE_NAMES.get(out["dtype"], out["dtype"])
    return out


def apply_section_aliases(tree: MutableMapping[str, Any], origins: MutableMapping[str, str]) -> None:
    """Move every :data:`SECTION_ALIASES` section of ``tree`` (in place) to the role's
    ``engine_kwargs.<engine>`` (see the module docstring for which engine takes which key).

    ``origins`` (dotted key -> where it was set) gains the moved keys, noting the verl name.

    Raises:
        ConfigError: an alias that is not a mapping, an option set under both names, an ``fsdp_config`` or
            ``megatron`` key the role's training engine cannot take (naming the engine and ``<role>.strategy``).
    """
    for alias, (section, engine_key, fallback) in SECTION_ALIASES.items():
        *parent_path, leaf = alias.split(".")
        parent = _node(tree, parent_path, create=False)
        if parent is None or leaf not in parent:
            continue
        value = parent.pop(leaf)
        if value is None or value == {}:
            continue
        if not isinstance(value, MutableMapping):
            raise ConfigError(ConfigIssue(alias, f"{alias} must be a section of options, got {value!r}"))
        engine, read_from = _engine_of(tree, engine_key, fallback)
        options = _translate(alias, value, engine, read_from, section)
        target = f"{section}.engine_kwargs.{engine}"
        dest = _node(tree, target.split("."), create=True)
        if dest is None:
            raise ConfigError(ConfigIssue(target, f"{target} must be a section of options"))
        names = dict(zip(options, value, strict=True))  # our option name -> the verl name it came from
        issues = [
            ConfigIssue(
                f"{alias}.{names[key]}", f"{alias}.{names[key]} is also set as {target}.{key}; keep one of them"
            )
            for key in options
            if key in dest
        ]
        if issues:
            raise ConfigError(issues)
        for key, item in options.items():
            dest[key] = item
            source = origins.get(f"{alias}.{names[key]}")
            origins[f"{target}.{key}"] = f"{source + ', ' if source else ''}as {alias}.{names[key]}"
