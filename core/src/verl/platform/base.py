"""The :class:`Platform` interface: everything verl needs to know about a device family.

What a vendor implements (bring-up of a new accelerator, e.g. Ascend in ``verl-npu``):

1. Class attributes: ``name``, ``device_type``, ``vendor``, ``dist_backend``,
   ``visible_devices_env``, ``ray_resource_name`` (checked when the platform is instantiated).
2. ``probe()``: a cheap, fork-safe availability check returning :class:`ProbeResult`.
3. ``device_module``: the ``torch.<device>`` module (``torch.npu``), or ``None``.
4. ``device_name()``.
5. Every other method has a default written against a ``torch.cuda``-like ``device_module``
   (``device_count``, ``set_device``, ``current_device``, ``synchronize``, ``empty_cache``,
   ``memory_allocated``, ``memory_reserved``, ``max_memory_allocated``, ``manual_seed_all``);
   override the ones your device module lacks or does differently, and ``supports_ipc`` (and
   ``configure_allocator`` where the device's tensors need a process-wide allocator setting).
6. ``check_sync_backend`` / ``new_sync_group`` when ``dist_backend`` is not ``gloo`` or ``nccl``
   (Ascend's ``hccl``): they build the standalone weight-sync group from the vendor's extension.

Then return a ``PlatformSpec(name=..., probe=YourPlatform.probe, factory=YourPlatform)`` from
a ``verl_platforms`` hook. Nothing here forwards unknown attributes to torch: a missing method
is an ``AttributeError`` at bring-up, not a silent ``None`` at run time.
"""

from __future__ import annotations

import abc
import datetime
import random
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

import attrs

if TYPE_CHECKING:
    import torch

_REQUIRED_ATTRS = ("name", "device_type", "vendor", "dist_backend", "visible_devices_env", "ray_resource_name")

# Backends that core's platforms cannot build but a plugin's can: named in the refusal, so a user whose config
# asks for one (an NPU platform's dist_backend reaching a CPU process) learns where it comes from.
_BACKEND_PROVIDERS = {"hccl": "the 'npu' platform of the verl-npu plugin (Ascend; trainer.device=npu)"}


class UnsupportedBackendError(ValueError):
    """A platform cannot build a standalone collective group for this backend in this process.

    Raised by :meth:`Platform.check_sync_backend` / :meth:`Platform.new_sync_group`; the message names the
    backend, the platform and what it can build instead (or the library that is missing).
    """


@attrs.frozen
class ProbeResult:
    """Answer of a platform probe: truthy when the platform is usable here, with the reason.

    ``bool(result)`` is ``available``; ``reason`` is shown to users (``verl plugins``, resolution
    errors), e.g. ``"2 devices (CUDA 12.4)"`` or ``"torch 2.6.0+cpu is a CPU-only build"``.
    """

    available: bool
    reason: str = ""

    def __bool__(self) -> bool:
        return self.available


class Platform(abc.ABC):
    """A device family (cpu, cuda, npu, ...): device selection, seeding, memory, collectives.

    Class attributes (required on every concrete subclass):
        name: platform name as used in ``trainer.device`` (``"cuda"``; ``"rocm"`` on AMD).
        device_type: torch device type (``"cpu"``, ``"cuda"`` — also for ROCm —, ``"npu"``).
        vendor: hardware vendor (``"nvidia"``, ``"amd"``, ``"huawei"``, ``"generic"``).
        dist_backend: ``torch.distributed`` backend (``"gloo"``, ``"nccl"``, ``"hccl"``).
        visible_devices_env: environment variable restricting visible devices
            (``"CUDA_VISIBLE_DEVICES"``, ``"HIP_VISIBLE_DEVICES"``,
            ``"ASCEND_RT_VISIBLE_DEVICES"``), ``None`` when there is none.
        ray_resource_name: Ray resource that workers request (``"CPU"``, ``"GPU"``, ``"NPU"``).
    """

    name: ClassVar[str]
    device_type: ClassVar[str]
    vendor: ClassVar[str]
    dist_backend: ClassVar[str]
    visible_devices_env: ClassVar[str | None]
    ray_resource_name: ClassVar[str]

    def __new__(cls, *args: Any, **kwargs: Any) -> Platform:
        missing = [attr for attr in _REQUIRED_ATTRS if not hasattr(cls, attr)]
        if missing:
            raise TypeError(f"platform class {cls.__qualname__} must define class attribute(s): {', '.join(missing)}")
        return super().__new__(cls)

    def __repr__(self) -> str:
        return f"<{type(self).__name__} name={self.name!r} device_type={self.device_type!r} vendor={self.vendor!r}>"

    # ---------------------------------------------------------------- what a vendor implements

    @classmethod
    @abc.abstractmethod
    def probe(cls) -> ProbeResult:
        """Cheap availability check, safe to call before ``fork`` (must not create a device
        context). Never raises for a missing driver or library: report it in ``reason``."""

    @property
    @abc.abstractmethod
    def device_module(self) -> ModuleType | None:
        """The ``torch.<device_type>`` module (``torch.cuda``), or ``None`` (cpu)."""

    @abc.abstractmethod
    def device_name(self, index: int | None = None) -> str:
        """Human-readable name of device ``index`` (default: current), e.g. ``"NVIDIA H100 80GB HBM3"``."""

    # ---------------------------------------------------------------- defaults via device_module

    def _module(self) -> ModuleType:
        module = self.device_module
        if module is None:
            raise TypeError(f"{type(self).__name__} has no device_module; it must override this method")
        return module

    def is_available(self) -> bool:
        """``bool(self.probe())``."""
        return bool(self.probe())

    def device_count(self) -> int:
        """Number of devices visible to this process (after ``visible_devices_env``)."""
        return int(self._module().device_count())

    def set_device(self, index: int) -> None:
        """Make device ``index`` (a local rank) current for this process.

        Raises:
            TypeError: ``index`` is not an int.
            ValueError: ``index`` is negative or not below :meth:`device_count`; the message
                names ``visible_devices_env`` and its value.
        """
        self._check_index(index)
        self._module().set_device(index)

    def _check_index(self, index: int) -> None:
        import os

        if not isinstance(index, int) or isinstance(index, bool):
            raise TypeError(f"device index must be an int, got {type(index).__name__} ({index!r})")
        count = self.device_count()
        if not 0 <= index < count:
            env = self.visible_devices_env
            shown = f" ({env}={os.environ.get(env)!r})" if env else ""
            raise ValueError(
                f"{self.name} device index {index} is out of range: {count} device(s) visible{shown}; "
                f"use an index in [0, {count})"
            )

    def current_device(self) -> int:
        """Index of the current device."""
        return int(self._module().current_device())

    def torch_device(self, index: int | None = None) -> torch.device:
        """``torch.device(device_type, index)``; ``index`` defaults to :meth:`current_device`.

        Device type ``cpu`` (host memory, also a vendor platform posing as an accelerator) gives
        ``torch.device("cpu")`` whatever ``index`` is: CPU tensors carry no index, and ``torch.device("cpu", 0)``
        compares unequal to their ``.device``.
        """
        import torch

        if self.device_type == "cpu":
            return torch.device("cpu")
        return torch.device(self.device_type, self.current_device() if index is None else index)

    def manual_seed(self, seed: int) -> None:
        """Seed Python's ``random``, numpy's global RNG, torch's CPU generator and every device
        generator of this platform, so a run is reproducible from one integer."""
        import numpy as np
        import torch

        if not isinstance(seed, int) or isinstance(seed, bool):
            raise TypeError(f"seed must be an int, got {type(seed).__name__} ({seed!r})")
        random.seed(seed)
        np.random.seed(seed % 2**32)  # numpy only accepts 32-bit seeds
        torch.manual_seed(seed)
        module = self.device_module
        if module is not None:
            module.manual_seed_all(seed)

    def configure_threads(self, local_world_size: int = 1) -> int:
        """Set torch's intra-op thread count for a worker that shares its node with ``local_world_size - 1``
        others; returns the count. Accelerators leave torch's default (host threads only feed the device)."""
        import torch

        return torch.get_num_threads()

    def configure_allocator(self) -> str:
        """Set up how this process allocates tensor memory on the platform; a worker calls it once, before it
        builds its engines. Returns a short name of the setting in effect. The default leaves torch's allocator
        as it is (``"default"``: on accelerators the device's caching allocator already keeps freed memory);
        the ``cpu`` platform keeps freed host memory in the process (:mod:`verl.platform.host_allocator`)."""
        return "default"

    def memory_stats(self) -> dict[str, int]:
        """Memory of this process on the current device, in bytes.

        Keys: ``allocated_bytes`` (held by tensors), ``reserved_bytes`` (held by the caching
        allocator, >= allocated), ``max_allocated_bytes`` and ``max_reserved_bytes`` (their peaks since
        the last :meth:`reset_peak_memory_stats`).
        """
        m = self._module()
        return {
            "allocated_bytes": int(m.memory_allocated()),
            "reserved_bytes": int(m.memory_reserved()),
            "max_allocated_bytes": int(m.max_memory_allocated()),
            "max_reserved_bytes": int(m.max_memory_reserved()),
        }

    def reset_peak_memory_stats(self) -> bool:
        """Restart the peaks of :meth:`memory_stats` at the current values; returns whether it could."""
        self._module().reset_peak_memory_stats()
        return True

    def empty_cache(self) -> None:
        """Return cached, unused device memory to the driver."""
        self._module().empty_cache()

    def synchronize(self) -> None:
        """Block until all queued work on the current device has finished (for timing and
        before handing buffers to another process)."""
        self._module().synchronize()

    def supports_ipc(self) -> bool:
        """Whether device tensors can be shared with another process on the node without a
        copy (CUDA IPC handles); weight sync uses it to pick a zero-copy path. Default ``False``."""
        return False

    # ---------------------------------------------------------------- standalone collective groups

    #: Backends :meth:`new_sync_group` builds. The default builds gloo (any platform: host memory, also the
    #: override for colocated placement) and nccl; a vendor adds its own (``("gloo", "hccl")``).
    sync_backends: ClassVar[tuple[str, ...]] = ("gloo", "nccl")

    def check_sync_backend(self, backend: str) -> None:
        """Raise :class:`UnsupportedBackendError` unless :meth:`new_sync_group` can build ``backend`` here.

        Cheap (no group, no connection); called before a store is opened so a bad backend fails first.
        The default knows ``gloo`` and ``nccl`` and checks that this torch build has them; a vendor override
        checks its own backend (its extension importable) and passes the others to ``super()``.

        Raises:
            UnsupportedBackendError: ``backend`` not in :attr:`sync_backends` (names the plugin that provides
                it, where known), ``torch.distributed`` missing, or Gloo/NCCL missing from this torch build.
        """
        import torch.distributed as dist

        if backend not in self.sync_backends:
            provider = _BACKEND_PROVIDERS.get(backend)
            hint = f"; {backend!r} groups are built by {provider}" if provider else ""
            raise UnsupportedBackendError(
                f"sync group: dist_backend {backend!r} is not supported by platform {self.name!r}; "
                f"supported: {', '.join(self.sync_backends)}{hint} (the backend is the platform's dist_backend, "
                "see `verl plugins`)"
            )
        if not dist.is_available():
            raise UnsupportedBackendError(f"sync group: this torch build has no torch.distributed ({backend!r})")
        if backend == "gloo" and not dist.is_gloo_available():
            raise UnsupportedBackendError("sync group: this torch build has no Gloo backend ('gloo')")
        if backend == "nccl" and not dist.is_nccl_available():
            raise UnsupportedBackendError(
                "sync group: this torch build has no NCCL ('nccl'); install a CUDA build of torch"
            )

    def new_sync_group(
        self, backend: str, store: Any, rank: int, world_size: int, timeout_s: float, *, host: str | None = None
    ) -> Any:
        """Build a standalone collective backend object over ``store``, outside torch.distributed's groups.

        Not registered with ``torch.distributed`` (no ``init_process_group``): the weight-sync group joins
        processes that have default groups of their own. Gloo blocks until all ``world_size`` ranks have
        joined; NCCL (and HCCL) connect lazily on the first collective.

        Args:
            backend: one of :attr:`sync_backends` (the platform's ``dist_backend``, or ``gloo`` as override).
            store: a ``torch.distributed.Store`` shared by the ranks (``PrefixStore`` over a ``TCPStore``).
            rank: this process's rank in ``[0, world_size)``.
            world_size: number of ranks, at least 2.
            timeout_s: rendezvous and collective timeout, seconds.
            host: the address this rank's own sockets bind (``127.0.0.1`` when every rank is on this node);
                None = the backend's default (Gloo: the address the host name resolves to). Since plugin API 2.6.

        Returns:
            ``ProcessGroupGloo`` / ``ProcessGroupNCCL`` (the vendor's class in an override): an object with
            ``broadcast([tensor], BroadcastOptions) -> Work`` and ``shutdown()``.

        Raises:
            UnsupportedBackendError: as :meth:`check_sync_backend`.
        """
        import torch.distributed as dist

        self.check_sync_backend(backend)
        timeout = datetime.timedelta(seconds=timeout_s)
        if backend == "gloo":
            if host is None:
                return dist.ProcessGroupGloo(store, rank, world_size, timeout)
            options = dist.ProcessGroupGloo._Options()
            options._timeout = timeout
            options._devices = [dist.ProcessGroupGloo.create_device(hostname=host)]
            return dist.ProcessGroupGloo(store, rank, world_size, options)
        options = dist.ProcessGroupNCCL.Options()
        options._timeout = timeout
        return dist.ProcessGroupNCCL(store, rank, world_size, options)
