"""The ``cpu`` platform: always available, chosen when no accelerator probe answers yes or when
``trainer.device=cpu``. Collectives run on gloo; there is one logical device."""

from __future__ import annotations

import os
import platform as _pyplatform
import resource
import sys
from types import ModuleType
from typing import TYPE_CHECKING

from verl.platform.base import Platform, ProbeResult

if TYPE_CHECKING:
    import torch


def _rss_bytes() -> int | None:
    # /proc/self/statm: "size resident shared ..." in pages; no psutil needed.
    try:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
    except (OSError, ValueError, IndexError):
        return None


def _peak_rss_bytes() -> int:
    # VmHWM (Linux) is the peak since the last reset_peak_memory_stats; getrusage's never resets.
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024  # Linux reports KiB, macOS bytes


class CpuPlatform(Platform):
    """Host CPU. ``set_device`` accepts any non-negative index (gloo ranks share the host)."""

    name = "cpu"
    device_type = "cpu"
    vendor = "generic"
    dist_backend = "gloo"
    visible_devices_env = None
    ray_resource_name = "CPU"

    @classmethod
    def probe(cls) -> ProbeResult:
        """Always available."""
        return ProbeResult(True, "always available (fallback when no accelerator is found)")

    @property
    def device_module(self) -> ModuleType | None:
        """``None``: CPU work needs no device module."""
        return None

    def device_name(self, index: int | None = None) -> str:
        """CPU model from ``/proc/cpuinfo`` (``"AMD EPYC 7B13"``), else ``platform.processor()``."""
        try:
            with open("/proc/cpuinfo") as f:
                for line in f:
                    if line.startswith("model name"):
                        return line.split(":", 1)[1].strip()
        except OSError:
            pass
        return _pyplatform.processor() or _pyplatform.machine() or "cpu"

    def device_count(self) -> int:
        """1: the host is one device; data-parallel CPU ranks all use it."""
        return 1

    def set_device(self, index: int) -> None:
        """No-op for any index >= 0 (every gloo rank on a host uses the same CPU).

        Raises:
            TypeError: not an int. ValueError: negative.
        """
        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"device index must be an int, got {type(index).__name__} ({index!r})")
        if index < 0:
            raise ValueError(f"cpu device index must be >= 0, got {index}")

    def current_device(self) -> int:
        """0."""
        return 0

    def torch_device(self, index: int | None = None) -> torch.device:
        """``torch.device("cpu")`` whatever ``index`` is."""
        import torch

        return torch.device("cpu")

    def configure_threads(self, local_world_size: int = 1) -> int:
        """Give each of the node's ``local_world_size`` workers an equal share of this process's cores.

        ``OMP_NUM_THREADS``, when set, wins (Ray sets it to an actor's ``num_cpus``). Otherwise the cores this
        process may run on (``sched_getaffinity``) are divided among the workers of the node, at least one
        each: on CPU the rollout and training engines of a worker run one after the other in its process,
        so this share is what both use, and co-located workers never oversubscribe the cores (an
        oversubscribed OpenMP pool spins and can run several times slower). Returns the thread count.
        """
        import torch

        env = os.environ.get("OMP_NUM_THREADS", "").strip()
        if env.isdigit() and int(env) > 0:
            threads = int(env)
        else:
            try:
                cores = len(os.sched_getaffinity(0))
            except (AttributeError, OSError):
                cores = os.cpu_count() or 1
            threads = max(1, cores // max(1, int(local_world_size)))
        if torch.get_num_threads() != threads:
            torch.set_num_threads(threads)
        return threads

    def memory_stats(self) -> dict[str, int]:
        """Process memory in bytes: ``allocated_bytes`` = ``reserved_bytes`` = resident set size
        (``/proc/self/statm``; the peak where ``/proc`` is missing), ``max_allocated_bytes`` =
        ``max_reserved_bytes`` = peak RSS since the last :meth:`reset_peak_memory_stats` (``VmHWM``;
        ``getrusage``, which never resets, where ``/proc`` is missing)."""
        peak = _peak_rss_bytes()
        rss = _rss_bytes()
        rss = peak if rss is None else rss
        top = max(peak, rss)
        return {"allocated_bytes": rss, "reserved_bytes": rss, "max_allocated_bytes": top, "max_reserved_bytes": top}

    def reset_peak_memory_stats(self) -> bool:
        """Restart the peak RSS at the current RSS (Linux: ``5`` into ``/proc/self/clear_refs``); False where the
        kernel does not allow it (the peak then keeps counting from the process start)."""
        try:
            with open("/proc/self/clear_refs", "w") as f:
                f.write("5")
        except OSError:
            return False
        return True

    def configure_allocator(self) -> str:
        """Keep freed tensor memory in the process (``VERL_CPU_ALLOCATOR=caching``, the default), as a device's
        caching allocator does, so an update's activations reuse mapped pages instead of taking page faults;
        ``VERL_CPU_ALLOCATOR=system`` leaves the C library's defaults. Returns what is in effect (see
        :func:`verl.platform.host_allocator.configure_host_allocator`).

        Raises:
            ValueError: ``VERL_CPU_ALLOCATOR`` holds an unknown policy.
        """
        from verl.platform.host_allocator import configure_host_allocator

        return configure_host_allocator()

    def empty_cache(self) -> None:
        """Give the free host memory the C library keeps back to the kernel (glibc ``malloc_trim``; no-op
        elsewhere): the CPU counterpart of emptying a device's cache. Like ``torch.cuda.empty_cache`` it is for
        phase ends (an engine going to sleep), not every step: the next phase pays page faults for what it
        gave back."""
        from verl.platform.host_allocator import release_host_cache

        release_host_cache()

    def synchronize(self) -> None:
        """No-op: CPU ops complete before they return."""

    def supports_ipc(self) -> bool:
        """``False``: no device-memory handles (CPU tensors go through shared memory instead)."""
        return False
