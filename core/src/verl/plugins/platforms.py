"""Choosing the platform of this process (the plugins layer: it owns selection; ``verl.platform`` only
defines the :class:`~verl.platform.Platform` interface and the cpu/cuda platforms, and never calls up here).

    from verl.plugins import choose_platform, resolve_platform

    choice = choose_platform(cfg.trainer.device)   # PlatformChoice: .platform, .how, .reason, .describe()
    platform = resolve_platform(cfg.trainer.device)  # just the Platform

Order (DESIGN §4): an explicit name (``trainer.device``) wins; otherwise every accelerator
probe runs and exactly one positive answer wins; no positive answer falls back to ``cpu``; two
or more is an error listing every probe's answer. Nothing is chosen silently: unlike vLLM's
"unspecified platform", every way this can go wrong raises with the probes' reasons.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

import attrs

from verl.platform.base import Platform, ProbeResult
from verl.plugins.discovery import PluginInfo
from verl.plugins.errors import (
    PlatformResolutionError,
    PlatformUnavailableError,
    PluginConflictError,
    PluginValidationError,
)
from verl.plugins.manager import get_plugin_manager
from verl.plugins.selection import NAMED_CHOICE, platform_device_type

if TYPE_CHECKING:
    from verl.plugins.manager import PluginManager
    from verl.plugins.specs import PlatformSpec

FALLBACK = "cpu"


@attrs.frozen(kw_only=True)
class ProbeAnswer:
    """What one platform's probe said on this machine."""

    name: str
    available: bool
    reason: str
    accelerator: bool
    plugin: PluginInfo
    device_type: str = ""
    alias_of: str | None = None

    def describe(self) -> str:
        """``"cuda [verl-core 0.1.0]: no, torch 2.6.0+cpu is a CPU-only build"``."""
        dist = " ".join(p for p in (self.plugin.distribution, self.plugin.version) if p) or self.plugin.name
        role = f" (alias of {self.alias_of})" if self.alias_of else ("" if self.accelerator else " (fallback)")
        return f"{self.name}{role} [{dist}]: {'yes' if self.available else 'no'}, {self.reason}"


#: :attr:`PlatformChoice.how` values.
NAMED = NAMED_CHOICE
ONLY_ACCELERATOR = "only accelerator answering yes"
FALLBACK_CHOICE = "fallback: no accelerator answered yes"


@attrs.frozen(kw_only=True)
class PlatformChoice:
    """The platform this process uses and why (what ``verl train`` prints at start).

    Attributes:
        platform: the built :class:`Platform`.
        spec_name: the name of the spec chosen (``cuda`` also when the platform is ``RocmPlatform``, ``rocm``).
        how: :data:`NAMED`, :data:`ONLY_ACCELERATOR` or :data:`FALLBACK_CHOICE`.
        reason: the chosen platform's probe answer (``"2 device(s), CUDA 12.4"``).
        plugin: the plugin that provides the spec.
        answers: every probe's answer for an automatic choice (the accelerators that said no, with why);
            for a named non-accelerator (``cpu``) the accelerators answering yes (``verl train`` notes them);
            empty for a named accelerator (no other probe runs).
    """

    platform: Platform
    spec_name: str
    how: str
    reason: str
    plugin: PluginInfo
    answers: tuple[ProbeAnswer, ...] = ()

    def describe(self) -> str:
        """One line, e.g. ``"cpu (device type cpu) [verl-core 0.1.0]: fallback: no accelerator answered yes
        (cuda: torch 2.13.0+cpu is a CPU-only build ...); probe: always available"``."""
        p = self.platform
        name = p.name if p.name == self.spec_name else f"{p.name} (platform spec {self.spec_name!r})"
        dist = " ".join(x for x in (self.plugin.distribution, self.plugin.version) if x) or self.plugin.name
        why = self.how
        if self.how == FALLBACK_CHOICE:
            said_no = [f"{a.name}: {a.reason}" for a in self.answers if a.accelerator and a.alias_of is None]
            why += f" ({'; '.join(said_no)})" if said_no else " (no accelerator platform registered)"
        return f"{name} (device type {p.device_type}) [{dist}]: {why}; probe: {self.reason}"


def run_probe(spec: PlatformSpec) -> ProbeResult:
    """Call ``spec.probe()``; an exception or a non-bool answer becomes ``ProbeResult(False, why)``."""
    try:
        result = spec.probe()
    except Exception as exc:  # a probe crashing means "not usable here", and the user sees why
        return ProbeResult(False, f"probe raised {type(exc).__name__}: {exc}")
    if isinstance(result, ProbeResult):
        return result
    if isinstance(result, bool):
        return ProbeResult(result, "probe answered yes" if result else "probe answered no")
    return ProbeResult(
        False, f"probe returned {type(result).__name__} ({result!r}); it must return bool or ProbeResult"
    )


def probe_platforms(plugin_manager: PluginManager | None = None) -> list[ProbeAnswer]:
    """Run every registered platform's probe (accelerators and fallback), in load order.

    A platform name two plugins claim is not probed (neither claimant is chosen); see
    :meth:`verl.plugins.PluginManager.conflicts`.
    """
    pm = get_plugin_manager() if plugin_manager is None else plugin_manager
    providers = pm.providers("platform")
    answers = []
    for name, spec in pm.available("platform").items():
        result = run_probe(spec)
        answers.append(
            ProbeAnswer(
                name=name,
                available=result.available,
                reason=result.reason,
                accelerator=spec.accelerator,
                plugin=providers[name],
                device_type=platform_device_type(spec),
                alias_of=getattr(spec, "alias_of", None),
            )
        )
    return answers


def choose_platform(name: str | None = None, plugin_manager: PluginManager | None = None) -> PlatformChoice:
    """Choose the platform of this process and say why (:class:`PlatformChoice`).

    Args:
        name: ``trainer.device``; ``None`` (null in the config) chooses automatically.
        plugin_manager: defaults to :func:`verl.plugins.get_plugin_manager`.

    Raises:
        UnknownPluginError: ``name`` is not a registered platform (lists the platforms and
            plugins that failed to load, e.g. ``verl-npu``).
        PlatformUnavailableError: ``name`` is registered but its probe says no here
            ("device 'cuda' requested but not available: <reason>"), or its probe said yes and its factory
            raised (the message names the plugin and the exception).
        PlatformResolutionError: automatic choice with two or more positive accelerator
            probes, or with none and no usable ``cpu`` platform; lists every probe's answer.
        PluginConflictError: ``name`` is claimed by two plugins, or (automatic choice) any platform
            name is.
        PluginValidationError: the platform factory did not return a ``Platform``, or one of another
            device type than its spec declares.
    """
    pm = get_plugin_manager() if plugin_manager is None else plugin_manager
    if name is not None:
        spec = pm.get("platform", name)
        result = run_probe(spec)
        if not result:
            answers = probe_platforms(pm)
            usable = [a.name for a in answers if a.available and a.name != name]
            raise PlatformUnavailableError(
                f"device {name!r} requested but not available: {result.reason}. "
                f"Usable here: {', '.join(usable) or 'none'}; set trainer.device to one of them, "
                "or to null to choose automatically",
                answers=answers,
            )
        # Named the host fallback: say which accelerators answer yes (a built-in run config pins cpu, and a user
        # who installed a platform plugin expects it to be used); probes are cheap by contract.
        others = () if spec.accelerator else tuple(a for a in probe_platforms(pm) if a.accelerator and a.available)
        return _chosen(spec, pm, NAMED, result.reason, others)

    clash = pm.conflicts("platform")
    if clash:
        # A platform claimed twice is never probed, so it cannot be told apart from "no": refuse, don't guess.
        first = pm.conflict_error("platform", next(iter(clash)))
        raise PluginConflictError(
            f"cannot choose a platform automatically while two plugins claim one platform name (either may be "
            f"the accelerator of this machine); name another with trainer.device, or remove one:\n{first}",
            kind="platform",
            conflicts=clash,
        )
    answers = probe_platforms(pm)
    # An alias (rocm of cuda) answers yes exactly where its target does: counting it would make one device two.
    positive = [a for a in answers if a.accelerator and a.available and a.alias_of is None]
    listing = "\n".join(f"  - {a.describe()}" for a in answers)
    if len(positive) > 1:
        names = ", ".join(a.name for a in positive)
        raise PlatformResolutionError(
            f"cannot choose a platform: {len(positive)} accelerator probes answered yes and no device was named:\n"
            f"{listing}\nSet trainer.device to one of: {names} (e.g. trainer.device={positive[0].name})",
            answers=answers,
        )
    if positive:
        return _chosen(pm.get("platform", positive[0].name), pm, ONLY_ACCELERATOR, positive[0].reason, answers)
    fallback = next((a for a in answers if a.name == FALLBACK), None)
    if fallback is None or not fallback.available:
        raise PlatformResolutionError(
            f"cannot choose a platform: no accelerator probe answered yes and the {FALLBACK!r} fallback is "
            f"{'missing' if fallback is None else 'not usable'}:\n{listing or '  (no platform registered)'}",
            answers=answers,
        )
    return _chosen(pm.get("platform", FALLBACK), pm, FALLBACK_CHOICE, fallback.reason, answers)


def resolve_platform(name: str | None = None, plugin_manager: PluginManager | None = None) -> Platform:
    """The :class:`Platform` to use in this process: :func:`choose_platform` without the reasons.

    Args:
        name: ``trainer.device``; ``None`` (null in the config) chooses automatically.
        plugin_manager: defaults to :func:`verl.plugins.get_plugin_manager`.

    Raises: as :func:`choose_platform`.
    """
    return choose_platform(name, plugin_manager).platform


def _chosen(
    spec: PlatformSpec, pm: PluginManager, how: str, reason: str, answers: Sequence[ProbeAnswer]
) -> PlatformChoice:
    platform = _build(spec, pm)
    return PlatformChoice(
        platform=platform,
        spec_name=spec.name,
        how=how,
        reason=reason,
        plugin=pm.providers("platform")[spec.name],
        answers=tuple(answers),
    )


def _build(spec: PlatformSpec, pm: PluginManager) -> Platform:
    try:
        platform = spec.factory()
    except Exception as exc:  # a missing runtime/firmware surfaces here first: name the plugin, not a traceback
        plugin = pm.providers("platform")[spec.name]
        raise PlatformUnavailableError(
            f"platform {spec.name!r} from plugin {plugin.describe()}: its probe answered yes, but its factory "
            f"raised {type(exc).__name__}: {exc}. The platform cannot be used here: fix its runtime (the plugin's "
            "install notes), or set trainer.device to another platform (`verl plugins` lists them)"
        ) from exc
    if not isinstance(platform, Platform):
        plugin = pm.providers("platform")[spec.name]
        raise PluginValidationError(
            f"factory of platform {spec.name!r} from plugin {plugin.describe()} returned "
            f"{type(platform).__name__}; it must return a verl.platform.Platform instance"
        )
    declared = platform_device_type(spec)
    if platform.device_type != declared:
        # Config load matched the engines against the declared type; a different one would run them unchecked.
        plugin = pm.providers("platform")[spec.name]
        raise PluginValidationError(
            f"factory of platform {spec.name!r} from plugin {plugin.describe()} returned a platform of device type "
            f"{platform.device_type!r}, but its PlatformSpec has device_type={declared!r} (config load matches "
            f"engines against that, without building the platform; undeclared, it is the factory class's "
            f"device_type or else the name); declare PlatformSpec(name={spec.name!r}, ..., "
            f"device_type={platform.device_type!r}) or pass the Platform class itself as the factory"
        )
    return platform


_current: tuple[PluginManager, Platform] | None = None
_current_lock = threading.Lock()


def current_platform() -> Platform:
    """The automatically resolved platform of this process, resolved once and cached.

    The cache follows the process-wide plugin manager (``reset_plugin_manager()`` re-resolves).
    Code that knows the configured device (``trainer.device``) should call
    :func:`resolve_platform` with it and pass the platform along instead. Raises as
    :func:`resolve_platform` with ``name=None``.
    """
    global _current
    pm = get_plugin_manager()
    cached = _current
    if cached is not None and cached[0] is pm:
        return cached[1]
    with _current_lock:
        if _current is None or _current[0] is not pm:
            _current = (pm, resolve_platform(plugin_manager=pm))
        return _current[1]
