"""Device platforms: the :class:`Platform` interface and the built-in ``cpu`` and ``cuda`` (incl. ROCm)
platforms.

Choosing the platform of a process (probes, ``trainer.device``, the automatic choice) is selection and
lives in the plugins layer: :func:`verl.plugins.choose_platform` / :func:`verl.plugins.resolve_platform`
(moved from here; this package never imports :mod:`verl.plugins`). Callers build engines on the platform
they were handed.

Only this package touches ``torch.cuda`` in core. Importing it does not import torch.
"""

from verl.platform.base import Platform, ProbeResult

__all__ = ["Platform", "ProbeResult"]

# Names that lived here before resolution moved to the plugins layer: a clear pointer, not a silent re-export
# (re-exporting would make this package import verl.plugins again).
_MOVED = {
    name: "verl.plugins"
    for name in (
        "resolve_platform",
        "current_platform",
        "probe_platforms",
        "ProbeAnswer",
        "PlatformResolutionError",
        "PlatformUnavailableError",
    )
}


def __getattr__(name: str) -> object:
    if name in _MOVED:
        raise AttributeError(
            f"verl.platform.{name} moved to {_MOVED[name]}.{name} (platform selection is done by the plugins "
            f"layer): use 'from {_MOVED[name]} import {name}'"
        )
    raise AttributeError(f"module 'verl.platform' has no attribute {name!r}")
