"""Device platforms: the :class:`Platform` interface, built-in ``cpu`` and ``cuda`` (incl. ROCm),
and probe-based resolution.

    from verl.platform import resolve_platform, current_platform

    platform = resolve_platform(cfg.trainer.device)   # explicit name, or None: automatic
    platform.set_device(local_rank)
    device = platform.torch_device()

Only this package touches ``torch.cuda`` in core. Importing it does not import torch.
"""

from verl.platform.base import Platform, ProbeResult
from verl.platform.resolve import ProbeAnswer, current_platform, probe_platforms, resolve_platform
from verl.plugins.errors import PlatformResolutionError, PlatformUnavailableError

__all__ = [
    "Platform",
    "PlatformResolutionError",
    "PlatformUnavailableError",
    "ProbeAnswer",
    "ProbeResult",
    "current_platform",
    "probe_platforms",
    "resolve_platform",
]
