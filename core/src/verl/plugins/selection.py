"""Which engine runs on which platform: the one rule used by config load, ``verl train`` and ``verl plugins``.

An engine spec lists ``devices``, normally torch device types (``("cpu", "cuda")``). A platform matches
when its ``device_type`` or its ``name`` is listed, so a vendor platform named ``pretend`` whose tensors
live in host memory (device type ``cpu``) runs core's ``reference``/``hf``/``colocated`` engines, and
``rocm`` (device type ``cuda``) runs every engine that lists ``cuda``.

The platform's device type is read from its :class:`~verl.plugins.specs.PlatformSpec` (declared, or derived
from the factory class) without building the platform, so config load never initialises a device.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import attrs

from verl.plugins.specs import derived_device_type

#: :attr:`PlatformChoice.how` of a platform named by ``trainer.device`` (``verl.plugins.platforms.NAMED``).
NAMED_CHOICE = "named by trainer.device"


def platform_device_type(spec: Any) -> str:
    """The torch device type of a platform spec, without calling its factory.

    Args:
        spec: a :class:`~verl.plugins.specs.PlatformSpec` (or any object with ``name`` and optionally
            ``device_type`` / ``factory``, e.g. a test's stand-in).

    Returns:
        ``spec.device_type`` when it is set, else the factory class's ``device_type``, else ``spec.name``.
    """
    declared = getattr(spec, "device_type", None)
    if isinstance(declared, str) and declared:
        return declared
    return derived_device_type(spec.name, getattr(spec, "factory", None))


def engine_runs_on(devices: Iterable[str], platform_name: str, device_type: str) -> bool:
    """Whether an engine declaring ``devices`` runs on platform ``platform_name`` of ``device_type``.

    True when either is listed; an empty ``devices`` places no restriction (a stand-in spec without the
    field). This is the only place the rule is written.
    """
    listed = tuple(devices)
    return not listed or platform_name in listed or device_type in listed


def device_mismatch(kind: str, spec: Any, platform_name: str, device_type: str) -> str | None:
    """Why engine ``spec`` of ``kind`` cannot run on the platform, or ``None`` when it can.

    Args:
        kind: ``"training_engine"``, ``"rollout_engine"`` or ``"checkpoint_engine"`` (used in the text).
        spec: the engine spec (its ``name`` and ``devices`` are read).
        platform_name: the platform's name (``trainer.device`` or the automatic choice).
        device_type: that platform's torch device type (:func:`platform_device_type`).

    Returns:
        A message naming the engine, the platform, its device type, what the engine supports and the fix.
    """
    devices = tuple(getattr(spec, "devices", ()) or ())
    if engine_runs_on(devices, platform_name, device_type):
        return None
    label = kind.replace("_", " ")
    platform = f"platform {platform_name!r} (device type {device_type!r})"
    if platform_name == device_type:
        platform = f"platform {platform_name!r}"
    return (
        f"{label} {spec.name!r} does not run on {platform} (supports: {', '.join(devices)}); "
        f"choose a {label} that lists {device_type!r} in its devices, or a platform whose name or device type "
        f"is one of {', '.join(devices)} (trainer.device)"
    )


@attrs.frozen(kw_only=True)
class EngineChoice:
    """One engine a run uses: which role, from which config key, and the plugin providing it."""

    role: str  # "actor", "ref", "critic", "rollout", "checkpoint"
    kind: str  # plugin kind: "training_engine", "rollout_engine", "checkpoint_engine"
    key: str  # dotted config key that names it
    name: str
    spec: Any
    plugin: Any  # verl.plugins.PluginInfo

    def describe(self) -> str:
        """``"actor: training engine reference [verl-core 0.1.0]"``."""
        dist = " ".join(x for x in (self.plugin.distribution, self.plugin.version) if x) or self.plugin.name
        return f"{self.role}: {self.kind.replace('_', ' ')} {self.name} [{dist}]"


def selected_engines(cfg: Any, plugin_manager: Any) -> list[EngineChoice]:
    """The engines a resolved config selects, as the workers build them.

    Roles: ``actor`` (``actor.strategy``); ``ref`` when a reference policy is used (``actor.use_kl_loss`` or
    ``algorithm.use_kl_in_reward``; ``ref.strategy``, null = the actor's); ``critic`` when ``critic.enable``
    (``critic.strategy``, null = the actor's); ``rollout`` (``rollout.name``); ``checkpoint``
    (``rollout.checkpoint_engine.backend``).

    Raises:
        UnknownPluginError / PluginConflictError: a selected name has no single provider.
    """
    from verl.config.engine_options import role_selection  # the one table of roles, keys and null follow-values

    arr = cfg.actor_rollout_ref
    roles = ["actor"]
    if arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward:
        roles.append("ref")
    if cfg.critic.enable:
        roles.append("critic")
    roles += ["rollout", "checkpoint"]
    return [
        EngineChoice(
            role=sel.role,
            kind=sel.kind,
            key=sel.name_key,
            name=sel.name,
            spec=plugin_manager.get(sel.kind, sel.name),
            plugin=plugin_manager.provider(sel.kind, sel.name),
        )
        for sel in (role_selection(cfg, role) for role in roles)
    ]


def check_engines_run_on(engines: Iterable[EngineChoice], platform_name: str, device_type: str) -> None:
    """Refuse engines that do not run on the chosen platform (the rule config load applies to an explicit
    ``trainer.device``, applied here to any choice, automatic included).

    Raises:
        ValueError: one line per engine, ``<config key>: <device_mismatch message>``.
    """
    problems = [
        f"{e.key}: {problem}"
        for e in engines
        if (problem := device_mismatch(e.kind, e.spec, platform_name, device_type)) is not None
    ]
    if problems:
        raise ValueError("\n".join(problems))


def describe_selection(choice: Any, engines: Iterable[EngineChoice]) -> str:
    """What ``verl train`` prints once at start: the platform and why, then each engine and its plugin.

    Args:
        choice: a :class:`verl.plugins.platforms.PlatformChoice`.
        engines: from :func:`selected_engines`.
    """
    lines = [f"platform: {choice.describe()}"]
    idle = [a.name for a in choice.answers if a.available and a.accelerator and a.alias_of is None]
    if choice.how == NAMED_CHOICE and idle and choice.spec_name not in idle:
        lines.append(
            f"note: trainer.device={choice.spec_name} (the built-in run config's value, unless your config set it) "
            f"although {', '.join(idle)} answer(s) yes here; to use it: trainer.device={idle[0]}, or "
            "trainer.device=null to choose automatically"
        )
    lines += [e.describe() for e in engines]
    return "\n".join(lines)
