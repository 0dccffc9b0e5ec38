"""Mode switches of the hybrid engine, measured: what each switch cost in seconds and device memory.

A worker calls :func:`measured` around each switch (rollout sleep / wake-up, weight sync, training-engine
offload / onload). Memory comes from the platform (``Platform.memory_stats``: device memory on
accelerators, the process's resident set on the CPU), in GiB (``bytes / 2**30``, verl's ``/ 1024**3``).
:class:`PhasePeaks` turns the platform's resettable peak into per-phase peaks: the peak of generation is
read when the rollout goes to sleep, the peak of training when the rollout wakes for the next sync.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from typing import Any

GIB = float(1 << 30)


def memory_gb(platform: Any) -> dict[str, float]:
    """``{"allocated", "reserved", "max_allocated", "max_reserved"}`` of this process on ``platform``, in GiB.

    Empty when the platform cannot report memory (a vendor platform without the counters).
    """
    try:
        stats = platform.memory_stats()
    except (AttributeError, TypeError, RuntimeError):
        return {}
    keys = ("allocated", "reserved", "max_allocated", "max_reserved")
    return {k: stats[f"{k}_bytes"] / GIB for k in keys if f"{k}_bytes" in stats}


def host_memory_used_gb() -> float | None:
    """verl's ``perf/cpu_memory_used_gb``: memory in use on this host (``psutil.virtual_memory().used``), GiB."""
    try:
        import psutil
    except ImportError:
        return None
    return psutil.virtual_memory().used / GIB


def measured(platform: Any, name: str, fn: Callable[[], Any]) -> dict[str, float]:
    """Run ``fn`` (one switch) and return ``memory/<name>/{allocated_before,allocated_after,reserved_after}_gb``
    for this rank; the device has finished the switch's work when it returns (``platform.synchronize``), so
    the caller's wall time of the call is the switch's time.

    ``fn`` may return a dict of numbers, added under ``<name>/<key>`` (e.g. bytes moved).
    """
    before = memory_gb(platform)
    result = fn()
    _synchronize(platform)
    after = memory_gb(platform)
    out: dict[str, float] = {}
    if before:
        out[f"memory/{name}/allocated_before_gb"] = before["allocated"]
    if after:
        out[f"memory/{name}/allocated_after_gb"] = after["allocated"]
        out[f"memory/{name}/reserved_after_gb"] = after["reserved"]
    if isinstance(result, dict):
        out.update({f"{name}/{k}": float(v) for k, v in result.items() if isinstance(v, int | float)})
    return out


def _synchronize(platform: Any) -> None:
    sync = getattr(platform, "synchronize", None)
    if callable(sync):
        sync()


class PhasePeaks:
    """Peak memory per phase from the platform's resettable peak counters.

    :meth:`close` reads the peak since the last close (or since construction) as
    ``memory/<phase>/peak_allocated_gb`` / ``peak_reserved_gb``, and restarts the counter.
    """

    def __init__(self, platform: Any) -> None:
        self.platform = platform
        self.restart()

    def restart(self) -> None:
        """Start a new phase without reporting the one that ends."""
        reset = getattr(self.platform, "reset_peak_memory_stats", None)
        if callable(reset):
            with contextlib.suppress(RuntimeError, OSError):
                reset()

    def close(self, phase: str) -> dict[str, float]:
        """The peak of ``phase`` (everything since the previous close) for this rank; restarts the peak."""
        stats = memory_gb(self.platform)
        out = {}
        if "max_allocated" in stats:
            out[f"memory/{phase}/peak_allocated_gb"] = stats["max_allocated"]
        if "max_reserved" in stats:
            out[f"memory/{phase}/peak_reserved_gb"] = stats["max_reserved"]
        self.restart()
        return out


def reduce_rank_metrics(per_rank: list[dict[str, float]]) -> dict[str, float]:
    """Combine the switch metrics of several ranks: the maximum of each key (the slowest / fullest rank)."""
    out: dict[str, float] = {}
    for metrics in per_rank:
        for key, value in (metrics or {}).items():
            out[key] = max(out.get(key, value), value)
    return out
