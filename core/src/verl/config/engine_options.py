"""Which backend each role runs and the options it gets: one rule, used by config load and by the workers.

Roles and where their backend and its options are written:

| role         | kind              | backend named by                                   | options at (``<...>.engine_kwargs.<name>``)      |
|--------------|-------------------|----------------------------------------------------|--------------------------------------------------|
| ``actor``    | training_engine   | ``actor_rollout_ref.actor.strategy``               | ``actor_rollout_ref.actor.engine_kwargs``        |
| ``ref``      | training_engine   | ``actor_rollout_ref.ref.strategy`` (null: actor's) | ``actor_rollout_ref.ref.engine_kwargs``          |
| ``critic``   | training_engine   | ``critic.strategy`` (null: actor's)                | ``critic.engine_kwargs``                         |
| ``rollout``  | rollout_engine    | ``actor_rollout_ref.rollout.name``                 | ``actor_rollout_ref.rollout.engine_kwargs``      |
| ``checkpoint`` | checkpoint_engine | ``actor_rollout_ref.rollout.checkpoint_engine.backend`` | ``actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs`` |

Inheritance (the only one):

* ``critic`` takes **its own** options only, as in verl, where ``critic.model.fsdp_config`` is a section of
  its own built from the engine's defaults (``verl/trainer/config/critic/dp_critic.yaml``): the value model is
  another model with its own layout, so an actor's ``param_offload`` or dtype never lands on it unasked.
* ``ref`` takes the **actor's options overridden key by key by its own** (top-level keys: a nested mapping
  such as ``fsdp.mixed_precision`` given for ``ref`` replaces the actor's whole), but only when the reference
  policy runs on the actor's engine; a different ``ref.strategy`` takes ``ref``'s own options only. verl's
  ``ref.fsdp_config`` is its own section too (``ref/dp_ref.yaml``), with some keys following the actor's; we
  keep one inheritance instead because the frozen reference policy is the actor's model at step 0 and its
  log-probs enter the KL term: the same dtype, sharding and mixed precision keep that term exact, and
  ``ref.fsdp_config.param_offload: true`` (verl's usual setting) lands on top of the actor's layout.
* ``rollout`` and ``checkpoint`` take their own options only.

:func:`role_options` structures these into the backend's ``options_cls``; config load
(:func:`verl.config.validate_backend_options`) calls it for every selected role, and the workers call it
again to hand the result to the engine factory (``options=``), so an engine gets exactly what was validated
and never reads ``engine_kwargs`` itself. An error names the key where the bad value was written (a bad
value the reference policy inherited is reported at the actor's key).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

import attrs

from verl.config.converter import structure
from verl.config.errors import ConfigError, ConfigIssue
from verl.config.keys import find_unknown_keys

ARR = "actor_rollout_ref"

#: Roles a backend is selected for, in the order config load checks them.
ROLES: tuple[str, ...] = ("actor", "rollout", "checkpoint", "ref", "critic")


@attrs.frozen(kw_only=True)
class RoleSelection:
    """The backend one role runs and where its options are written.

    Attributes:
        role: ``actor``, ``ref``, ``critic``, ``rollout`` or ``checkpoint``.
        kind: plugin kind of the backend (``training_engine``, ``rollout_engine``, ``checkpoint_engine``).
        name_key: dotted key naming the backend (``actor_rollout_ref.actor.strategy``).
        name: the backend's name (null follow-values resolved: ``ref.strategy`` null = the actor's).
        kwargs_key: dotted key of the role's ``engine_kwargs`` section.
        kwargs: the role's raw ``engine_kwargs`` (``{backend name: mapping}``).
        inherits: the role whose options this role's lie over (``"actor"`` for a ``ref`` on the actor's
            engine), else None.
    """

    role: str
    kind: str
    name_key: str
    name: str
    kwargs_key: str
    kwargs: Mapping[str, Any] = attrs.field(repr=False)
    inherits: str | None = None

    @property
    def options_key(self) -> str:
        """``<kwargs_key>.<name>``: where this role's own options for its backend are written."""
        return f"{self.kwargs_key}.{self.name}"


def role_selection(cfg: Any, role: str) -> RoleSelection:
    """The backend ``role`` runs in ``cfg`` and where its options are (see the module table).

    Args:
        cfg: a :class:`verl.config.RootConfig` (null strategies are read as the actor's).
        role: one of :data:`ROLES`.

    Raises:
        ValueError: unknown role.
    """
    arr = cfg.actor_rollout_ref
    actor_strategy = arr.actor.strategy
    if role == "actor":
        return RoleSelection(
            role=role,
            kind="training_engine",
            name_key=f"{ARR}.actor.strategy",
            name=actor_strategy,
            kwargs_key=f"{ARR}.actor.engine_kwargs",
            kwargs=arr.actor.engine_kwargs,
        )
    if role == "ref":
        name = arr.ref.strategy or actor_strategy
        return RoleSelection(
            role=role,
            kind="training_engine",
            name_key=f"{ARR}.ref.strategy",
            name=name,
            kwargs_key=f"{ARR}.ref.engine_kwargs",
            kwargs=arr.ref.engine_kwargs,
            inherits="actor" if name == actor_strategy else None,
        )
    if role == "critic":
        return RoleSelection(
            role=role,
            kind="training_engine",
            name_key="critic.strategy",
            name=cfg.critic.strategy or actor_strategy,
            kwargs_key="critic.engine_kwargs",
            kwargs=cfg.critic.engine_kwargs,
        )
    if role == "rollout":
        return RoleSelection(
            role=role,
            kind="rollout_engine",
            name_key=f"{ARR}.rollout.name",
            name=arr.rollout.name,
            kwargs_key=f"{ARR}.rollout.engine_kwargs",
            kwargs=arr.rollout.engine_kwargs,
        )
    if role == "checkpoint":
        ce = arr.rollout.checkpoint_engine
        return RoleSelection(
            role=role,
            kind="checkpoint_engine",
            name_key=f"{ARR}.rollout.checkpoint_engine.backend",
            name=ce.backend,
            kwargs_key=f"{ARR}.rollout.checkpoint_engine.engine_kwargs",
            kwargs=ce.engine_kwargs,
        )
    raise ValueError(f"unknown engine role {role!r}; one of {list(ROLES)}")


def selected_roles(cfg: Any) -> list[RoleSelection]:
    """The roles config load checks: actor, rollout, checkpoint; ``ref`` when it adds something to the actor's
    (options of its own or another engine; otherwise its options are the actor's, checked there); ``critic``
    when ``critic.enable``."""
    rows = [role_selection(cfg, role) for role in ("actor", "rollout", "checkpoint")]
    ref = role_selection(cfg, "ref")
    if ref.inherits is None or ref.kwargs:
        rows.append(ref)
    if cfg.critic.enable:
        rows.append(role_selection(cfg, "critic"))
    return rows


def _own(selection: RoleSelection) -> Any:
    raw = (selection.kwargs or {}).get(selection.name, {})
    return {} if raw is None else raw


def _as_mapping(raw: Any, key: str) -> dict[str, Any]:
    """A role's raw options as a dict (an options instance, as tests and direct callers pass, included)."""
    if isinstance(raw, Mapping):
        return dict(raw)
    if attrs.has(type(raw)):
        return attrs.asdict(raw, recurse=False)
    if dataclasses.is_dataclass(raw) and not isinstance(raw, type):
        return {f.name: getattr(raw, f.name) for f in dataclasses.fields(raw)}
    raise ConfigError(ConfigIssue(key, f"{key}: must be a mapping of options, got {type(raw).__name__} ({raw!r})"))


def structure_options(options_cls: type | None, raw: Mapping[str, Any], path: str, backend: str) -> Any:
    """Structure a backend's option dict into ``options_cls`` (None: the backend takes no options).

    Args:
        options_cls: the plugin's attrs options class (or dataclass), or None.
        raw: the dict found at ``path`` (e.g. ``rollout.engine_kwargs["vllm"]``).
        path: its dotted key, used in error messages.
        backend: backend name, used in error messages.

    Raises:
        ConfigError: unknown option keys (full dotted key + did-you-mean) or wrong types.
    """
    if options_cls is None:
        if raw:
            keys = [f"{path}.{k}" for k in raw]
            raise ConfigError(
                [ConfigIssue(k, f"unknown config key '{k}': backend '{backend}' takes no options") for k in keys]
            )
        return None
    if attrs.has(options_cls):
        unknown = find_unknown_keys(raw, options_cls, path)
        if unknown:
            raise ConfigError(unknown)
    return structure(dict(raw), options_cls, tuple(path.split(".")))


def role_options(cfg: Any, role: str, spec: Any) -> Any:
    """The validated options ``role``'s backend gets: an instance of ``spec.options_cls`` (None when the spec
    has no options class), built by the inheritance rule of the module docstring.

    Args:
        cfg: a :class:`verl.config.RootConfig`.
        role: one of :data:`ROLES`.
        spec: the role's backend spec (anything with ``options_cls``; ``name`` is read from ``cfg``).

    Returns:
        The options instance, or None for a backend without ``options_cls``.

    Raises:
        ConfigError: an unknown option or a bad value, naming the key where it was written
            (``actor_rollout_ref.actor.engine_kwargs.fsdp.<key>`` for a value a reference policy inherited).
        ValueError: unknown role.
    """
    selection = role_selection(cfg, role)
    options_cls = getattr(spec, "options_cls", None)
    own_key = selection.options_key
    own = _own(selection)
    if selection.inherits is None:
        if options_cls is not None and isinstance(own, options_cls):
            return own
        return structure_options(options_cls, _as_mapping(own, own_key), own_key, selection.name)
    base = role_selection(cfg, selection.inherits)
    base_key = base.options_key
    base_raw, own_raw = _as_mapping(_own(base), base_key), _as_mapping(own, own_key)
    # Each role's own values are checked where they were written (the inherited ones at the actor's key, so a
    # mistake there is reported once, at the key to fix); what is left can only come from combining them.
    issues: list[ConfigIssue] = []
    for key, raw in ((base_key, base_raw), (own_key, own_raw)):
        try:
            structure_options(options_cls, raw, key, selection.name)
        except ConfigError as exc:
            issues.extend(exc.issues)
    if issues:
        raise ConfigError(issues)
    return structure_options(options_cls, {**base_raw, **own_raw}, own_key, selection.name)


__all__ = ["ROLES", "RoleSelection", "role_options", "role_selection", "selected_roles", "structure_options"]
