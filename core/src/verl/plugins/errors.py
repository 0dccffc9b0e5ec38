"""Errors raised by the plugin manager and by platform resolution.

Every class derives from :class:`PluginError` and from one builtin type (``ValueError`` or
``TypeError``) so callers can catch either. Messages name the kind, the name asked for, what
is available, which plugins failed to load (distribution, version, error) and the fix.

Extra attributes (``kind``, ``name``, ...) are keyword-only and live in ``__dict__``, so the
exceptions survive pickling (Ray ships worker exceptions to the driver by pickling them).
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any


class PluginError(Exception):
    """Base class of every error raised by :mod:`verl.plugins` and platform resolution."""


class PluginValidationError(PluginError, TypeError):
    """A plugin object breaks the hook API.

    Raised for: a ``@hookimpl`` function whose name matches no verl hook, a function named like a
    hook but not marked with ``@hookimpl``, wrapper hookimpls, a hook returning something other
    than a list of the hook's spec type, or a platform factory returning a non-``Platform``.
    """


class IncompatiblePluginError(PluginError, ValueError):
    """A plugin declares a ``VERL_PLUGIN_API`` this verl-core cannot serve."""


class UnknownPluginError(PluginError, ValueError):
    """No plugin provides the requested ``(kind, name)``.

    Attributes: ``kind``, ``name``, ``available`` (names of that kind), ``failures``
    (:class:`verl.plugins.PluginLoadFailure` records of plugins that did not load).
    """

    def __init__(
        self,
        message: str,
        *,
        kind: str | None = None,
        name: str | None = None,
        available: Sequence[str] = (),
        failures: Sequence[Any] = (),
    ) -> None:
        super().__init__(message)
        self.kind = kind
        self.name = name
        self.available = tuple(available)
        self.failures = tuple(failures)


class PluginConflictError(PluginError, ValueError):
    """Two or more plugins claim the same ``(kind, name)``; neither wins silently.

    Attributes: ``kind``, ``conflicts`` (``{name: (PluginInfo, ...)}``, every claimant).
    """

    def __init__(self, message: str, *, kind: str | None = None, conflicts: dict[str, tuple] | None = None) -> None:
        super().__init__(message)
        self.kind = kind
        self.conflicts = dict(conflicts or {})


class PlatformResolutionError(PluginError, ValueError):
    """No single platform could be chosen: two or more accelerator probes answered yes and no
    device was named (``trainer.device``), or no ``cpu`` fallback is registered.

    Attribute ``answers``: the :class:`~verl.platform.resolve.ProbeAnswer` of every probe.
    """

    def __init__(self, message: str, *, answers: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.answers = tuple(answers)


class PlatformUnavailableError(PlatformResolutionError):
    """A platform was named explicitly but its probe says it is not usable on this machine."""


# Backend names users type in configs -> the distribution that ships them. Used only for the
# "pip install ..." hint when that distribution is not installed at all.
INSTALL_HINTS: dict[str, str] = {
    "vllm": "verl-vllm",
    "sglang": "verl-sglang",
    "fsdp": "verl-fsdp",
    "fsdp2": "verl-fsdp",
    "megatron": "verl-megatron",
    "trtllm": "verl-trtllm",
    "tensorrt_llm": "verl-trtllm",
    "npu": "verl-npu",
    "ascend": "verl-npu",
}

# Hints only make sense for backend kinds; an unknown advantage estimator named "vllm" is a typo.
HINTED_KINDS = frozenset({"platform", "training_engine", "rollout_engine", "checkpoint_engine"})


def normalize_dist_name(name: str | None) -> str:
    """PEP 503 normalisation (``Verl_VLLM`` -> ``verl-vllm``) for comparing distribution names."""
    return "" if name is None else re.sub(r"[-_.]+", "-", name).lower()
