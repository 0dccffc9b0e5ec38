"""Older verl keys that verl's run scripts still pass, moved onto ours or accepted at verl's default only.

DAPO recipe scripts (``recipe/dapo/*.sh``) set the soft overlong penalty with the recipe's own old section,
``reward_model.overlong_buffer.{enable,len,penalty_factor,log}``, which the recipe's ``main_dapo.py`` handed to
the ``dapo`` reward manager as ``overlong_buffer_cfg`` together with ``max_resp_len=data.max_response_length``.
Here (:func:`apply_overlong_buffer`) each leaf moves to ``reward_model.reward_kwargs.overlong_buffer_cfg.<leaf>``
and ``reward_model.reward_kwargs.max_resp_len`` becomes ``data.max_response_length``, as ``main_dapo`` did.
A value set both ways (in a file or an override; a built-in base config does not count) that differs is an
error naming both keys.

verl's deprecated *global* micro-batch sizes (:data:`GLOBAL_MICRO_BATCH`, e.g.
``actor_rollout_ref.actor.ppo_micro_batch_size``; verl divides them by the data-parallel size into the
``*_per_gpu`` key, ``verl/workers/fsdp_workers.py``) are accepted at null (verl's default, what the scripts pass
when they mean "unset") and refused otherwise with the per-GPU key and value to set
(:func:`apply_global_micro_batch`): verl itself refuses both set at once and calls the global form deprecated.
"""

from __future__ import annotations

from collections.abc import Mapping, MutableMapping
from typing import Any

from verl.config.errors import ConfigError, ConfigIssue
from verl.config.tree_paths import MISSING, get_dotted, pop_dotted, set_dotted

OLD_BUFFER = "reward_model.overlong_buffer"
NEW_BUFFER = "reward_model.reward_kwargs.overlong_buffer_cfg"
MAX_RESP_LEN = "reward_model.reward_kwargs.max_resp_len"
BUFFER_LEAVES = ("enable", "len", "penalty_factor", "log")

#: verl's deprecated global micro-batch key -> the per-GPU key that replaces it.
GLOBAL_MICRO_BATCH = {
    "actor_rollout_ref.actor.ppo_micro_batch_size": "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu",
    "actor_rollout_ref.rollout.log_prob_micro_batch_size": "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu",
    "actor_rollout_ref.ref.log_prob_micro_batch_size": "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu",
    "critic.ppo_micro_batch_size": "critic.ppo_micro_batch_size_per_gpu",
    "reward_model.micro_batch_size": "reward_model.micro_batch_size_per_gpu",
}


def _set_by_user(key: str, origins: Mapping[str, str], stop: str) -> str | None:
    """Where ``key`` was set by the user: its own origin, or an override that assigned a mapping above it
    (up to ``stop``). A file's origins of intermediate sections do not count (they set other leaves)."""
    if key in origins:
        return origins[key]
    parent = key.rpartition(".")[0]
    while parent and len(parent) >= len(stop):
        origin = origins.get(parent)
        if origin is not None and origin.startswith("from override"):
            return origin
        parent = parent.rpartition(".")[0]
    return None


def apply_overlong_buffer(tree: MutableMapping[str, Any], origins: MutableMapping[str, str]) -> None:
    """Move ``reward_model.overlong_buffer.*`` of ``tree`` (in place) to the dapo manager's ``reward_kwargs``.

    Each given leaf (``enable``, ``len``, ``penalty_factor``, ``log``; null leaves are verl's "unset" and
    skipped) goes to ``reward_model.reward_kwargs.overlong_buffer_cfg.<leaf>``; when any leaf is given,
    ``reward_model.reward_kwargs.max_resp_len`` is set to ``data.max_response_length`` (tokens), which is what
    the recipe's ``main_dapo.py`` passed. The values themselves are checked later, by the dapo manager's rules
    (:func:`verl.rewards.reward_managers.split_reward_kwargs`). ``origins`` gains the moved keys.

    Raises:
        ConfigError: ``overlong_buffer`` is not a section; an unknown leaf (naming the four); a leaf, or
            ``max_resp_len``, also set under the new name with another value (naming both keys).
    """
    section = pop_dotted(tree, OLD_BUFFER)
    if section is MISSING or section is None:
        return
    if not isinstance(section, Mapping):
        raise ConfigError(
            ConfigIssue(
                OLD_BUFFER, f"{OLD_BUFFER} must be a section {{enable, len, penalty_factor, log}}, got {section!r}"
            )
        )
    issues: list[ConfigIssue] = []
    moves: list[tuple[str, str, Any]] = []
    for leaf, value in section.items():
        old = f"{OLD_BUFFER}.{leaf}"
        if leaf not in BUFFER_LEAVES:
            issues.append(
                ConfigIssue(
                    old, f"unknown config key '{old}' (the recipe's overlong_buffer has {', '.join(BUFFER_LEAVES)})"
                )
            )
            continue
        if value is None:
            continue
        new = f"{NEW_BUFFER}.{leaf}"
        where = _set_by_user(new, origins, NEW_BUFFER)
        current = get_dotted(tree, new)
        if where is not None and current is not MISSING and current != value:
            issues.append(
                ConfigIssue(old, f"{old}={value!r} conflicts with {new}={current!r} ({where}); keep one of them")
            )
            continue
        moves.append((old, new, value))
    if moves:
        max_len = get_dotted(tree, "data.max_response_length")
        where = _set_by_user(MAX_RESP_LEN, origins, "reward_model.reward_kwargs")
        current = get_dotted(tree, MAX_RESP_LEN)
        if where is not None and current not in (MISSING, None) and current != max_len:
            issues.append(
                ConfigIssue(
                    MAX_RESP_LEN,
                    f"{MAX_RESP_LEN}={current!r} ({where}) conflicts with data.max_response_length={max_len!r}, which "
                    f"{OLD_BUFFER}.* implies (verl's DAPO recipe passes max_resp_len=data.max_response_length); "
                    "keep one of them",
                )
            )
        else:
            moves.append(("data.max_response_length", MAX_RESP_LEN, max_len))
    if issues:
        raise ConfigError(issues)
    for old, new, value in moves:
        set_dotted(tree, new, value)
        source = origins.get(old) or origins.get(OLD_BUFFER)
        if old == "data.max_response_length":
            origins[new] = f"= data.max_response_length, as {OLD_BUFFER}.* in verl's DAPO recipe"
        else:
            origins[new] = f"{source + ', ' if source else ''}as {old}"


def apply_global_micro_batch(tree: MutableMapping[str, Any]) -> None:
    """Drop verl's deprecated global micro-batch keys (:data:`GLOBAL_MICRO_BATCH`) set to null, in place.

    Raises:
        ConfigError: every such key set to anything but null, naming the per-GPU key and, when the world size
            (``trainer.nnodes x trainer.n_gpus_per_node``) divides the value, the per-GPU value verl would use.
    """
    nnodes, per_node = get_dotted(tree, "trainer.nnodes"), get_dotted(tree, "trainer.n_gpus_per_node")
    world = nnodes * per_node if isinstance(nnodes, int) and isinstance(per_node, int) else None
    issues: list[ConfigIssue] = []
    for key, per_gpu in GLOBAL_MICRO_BATCH.items():
        value = pop_dotted(tree, key)
        if value is MISSING or value is None:
            continue
        if isinstance(value, int) and not isinstance(value, bool) and world and value % world == 0:
            fix = f"set {per_gpu}={value // world} (= {value} / world size {world}, what verl derives)"
        else:
            fix = f"set {per_gpu} (verl divides {key} by the data-parallel size)"
        issues.append(
            ConfigIssue(
                key,
                f"{key}={value!r}: verl's deprecated global micro-batch size is not taken here (verl refuses it "
                f"next to the per-GPU key); {fix} and remove {key} (null, verl's default, is accepted)",
            )
        )
    if issues:
        raise ConfigError(issues)


def apply_legacy_keys(tree: MutableMapping[str, Any], origins: MutableMapping[str, str]) -> None:
    """:func:`apply_overlong_buffer` then :func:`apply_global_micro_batch`, all issues reported at once."""
    issues: list[ConfigIssue] = []
    for step in (lambda: apply_overlong_buffer(tree, origins), lambda: apply_global_micro_batch(tree)):
        try:
            step()
        except ConfigError as exc:
            issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues)
