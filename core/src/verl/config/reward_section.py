"""verl's top-level ``reward`` section, accepted under its verl names and moved onto ours.

verl 0.7 moved reward settings into one ``reward`` section (``verl/trainer/config/reward/reward.yaml``) and
migrates the older keys into it (``verl/experimental/reward_loop/reward_loop.py:migrate_legacy_reward_impl``):
``reward_model.num_workers`` -> ``reward.num_workers``, ``reward_model.reward_manager`` ->
``reward.reward_manager.name``, ``custom_reward_function`` -> ``reward.custom_reward_function``, ... This
package keeps the older layout (``reward_model.*`` and ``custom_reward_function.*``), so the migration runs the
other way: each ``reward.*`` key is moved to its place before the schema check.

| verl ``reward.`` key                    | here                                   |
|-----------------------------------------|----------------------------------------|
| num_workers                             | reward_model.num_workers               |
| reward_manager.name                     | reward_model.reward_manager            |
| reward_kwargs.*                         | reward_model.reward_kwargs.*           |
| custom_reward_function.path / name      | custom_reward_function.path / name     |
| reward_model.enable                     | reward_model.enable                    |
| reward_model.model_path                 | reward_model.model.path                |

Accepted at verl's default only, any other value refused with the reason (see :data:`DEFAULT_ONLY`):
``reward_manager.source`` / ``module`` (a reward-manager class from a file), the reward model's own resource
pool, ``sandbox_fusion``. ``reward_model.rollout.*`` (verl serves the reward model with a rollout engine, which
a generative reward model needs) is refused whatever the value. A key set both as ``reward.*`` and under our
name (in the file or the overrides) is an error naming both.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from verl.config.errors import ConfigError, ConfigIssue
from verl.config.keys import schema_paths
from verl.config.tree_paths import set_dotted

SECTION = "reward"
#: verl key under ``reward.`` -> our dotted key. ``reward_kwargs`` moves key by key.
MOVED = {
    "num_workers": "reward_model.num_workers",
    "reward_manager.name": "reward_model.reward_manager",
    "custom_reward_function.path": "custom_reward_function.path",
    "custom_reward_function.name": "custom_reward_function.name",
    "reward_model.enable": "reward_model.enable",
    "reward_model.model_path": "reward_model.model.path",
}
_KWARGS = "reward_kwargs"
_MANAGER_FILE = (
    "a reward-manager class loaded from a file is not built; the managers are naive and dapo "
    "(reward.reward_manager.name), and custom scoring goes in reward.custom_reward_function"
)
_POOL = (
    "the reward model runs on the trainer's workers; a resource pool of its own (verl's enable_resource_pool) "
    "is not built"
)
#: keys accepted at verl's default (the value here) and refused otherwise, with the reason.
DEFAULT_ONLY: dict[str, tuple[Any, str]] = {
    "reward_manager.source": ("register", _MANAGER_FILE),
    "reward_manager.module.path": (None, _MANAGER_FILE),
    "reward_manager.module.name": ("custom_reward_manager", _MANAGER_FILE),
    "reward_model.enable_resource_pool": (False, _POOL),
    "reward_model.n_gpus_per_node": (8, _POOL),
    "reward_model.nnodes": (0, _POOL),
    "sandbox_fusion.url": (None, "sandbox-fusion code execution for rewards is not built"),
    "sandbox_fusion.max_concurrent": (64, "sandbox-fusion code execution for rewards is not built"),
    "sandbox_fusion.memory_limit_mb": (1024, "sandbox-fusion code execution for rewards is not built"),
}
#: prefixes refused whatever the value.
REFUSED = {
    "reward_model.rollout": (
        "verl serves the reward model with a rollout engine (vLLM/SGLang server; generative reward models need "
        "it); here reward_model.enable scores with a sequence-classification forward pass on the trainer's "
        "workers, configured by reward_model.model.path and reward_model.micro_batch_size_per_gpu"
    ),
}


def _leaves(node: Mapping[str, Any], prefix: str) -> list[tuple[str, Any]]:
    out: list[tuple[str, Any]] = []
    for key, value in node.items():
        dotted = f"{prefix}.{key}" if prefix else str(key)
        if isinstance(value, Mapping) and value:
            out.extend(_leaves(value, dotted))
        else:
            out.append((dotted, value))
    return out


def _target(key: str) -> str | None:
    if key in MOVED:
        return MOVED[key]
    if key == _KWARGS or key.startswith(f"{_KWARGS}."):
        return f"reward_model.{key}"
    return None


def _unknown(key: str) -> str:
    full = f"{SECTION}.{key}"
    known = ", ".join([*MOVED, f"{_KWARGS}.*", *DEFAULT_ONLY])
    ours = f"reward_model.{key}"
    hint = f"; did you mean '{ours}'?" if ours in schema_paths() else ""
    return f"unknown config key '{full}' (verl's reward section has {known}){hint}"


def apply_reward_section(tree: MutableMapping[str, Any], origins: MutableMapping[str, str]) -> None:
    """Move verl's ``reward.*`` keys of ``tree`` (in place) to ours (see the module table).

    ``origins`` (dotted key -> where it was set) decides what "set" means for a clash (the file or an override;
    the defaults and the base config do not count) and gains the moved keys, noting the verl name.

    Raises:
        ConfigError: ``reward`` is not a section; a key both ways; a value refused (naming the reason); a key
            verl's reward section does not have.
    """
    if SECTION not in tree:
        return
    section = tree.pop(SECTION)
    if section is None:
        return
    if not isinstance(section, Mapping):
        raise ConfigError(ConfigIssue(SECTION, f"{SECTION} must be a section (verl's reward config), got {section!r}"))
    issues: list[ConfigIssue] = []
    moves: list[tuple[str, str, Any]] = []
    for key, value in _leaves(section, ""):
        full = f"{SECTION}.{key}"
        refused = next((reason for prefix, reason in REFUSED.items() if f"{key}.".startswith(f"{prefix}.")), None)
        if refused is not None:
            issues.append(ConfigIssue(full, f"{full}: {refused}"))
            continue
        if key in DEFAULT_ONLY:
            default, reason = DEFAULT_ONLY[key]
            if value != default:
                issues.append(ConfigIssue(full, f"{full}={value!r}: {reason} (verl's default {default!r} is)"))
            continue
        target = _target(key)
        if value is None or value == {}:
            continue  # verl's "unset": nothing to move, our default (or the base config's value) stays
        if target is None:
            issues.append(ConfigIssue(full, _unknown(key)))
            continue
        if target in origins:
            issues.append(ConfigIssue(full, f"{full} is also set as {target} ({origins[target]}); keep one of them"))
            continue
        moves.append((full, target, value))
    if issues:
        raise ConfigError(issues)
    for full, target, value in moves:
        set_dotted(tree, target, value)
        source = origins.get(full)
        origins[target] = f"{source + ', ' if source else ''}as {full}"
