"""The ``npu`` platform: Huawei Ascend NPUs through torch-npu (``torch.npu``, HCCL, Ray resource ``NPU``).

Nothing here imports ``torch_npu`` at module level: :meth:`NPUPlatform.device_module` does, in the worker that
uses the device (the driver only probes, :mod:`verl_npu.probe`). With ``TORCH_DEVICE_BACKEND_AUTOLOAD=0`` (the
setting that lets plain ``import torch`` work where torch-npu is installed without CANN) torch no longer
imports torch_npu by itself, so the explicit import is what registers ``torch.npu`` and the ``hccl`` backend.
Seeding, memory statistics, device selection and synchronisation are the :class:`verl.platform.Platform`
defaults over ``torch.npu``, which mirrors ``torch.cuda`` (``manual_seed_all``, ``memory_allocated``,
``max_memory_reserved``, ``reset_peak_memory_stats``, ``get_rng_state_all``, ...).
"""

from __future__ import annotations

import datetime
import functools
import logging
from types import ModuleType
from typing import Any

from verl.platform import Platform, ProbeResult
from verl.platform.base import UnsupportedBackendError
from verl_npu.cann import read_cann
from verl_npu.probe import ProbeRoots, probe_npu
from verl_npu.smi import parse_board_software_version, parse_npu_smi_info, run_npu_smi
from verl_npu.versions import ipc_support

__all__ = ["NPUPlatform", "driver_version", "import_torch_npu"]

logger = logging.getLogger(__name__)


def import_torch_npu() -> ModuleType:
    """Import ``torch_npu`` (registers ``torch.npu`` and ``hccl``) and return it.

    Raises:
        RuntimeError: torch_npu cannot be imported here; the message has torch's error and the fix.
    """
    try:
        import torch_npu
    except Exception as exc:  # ImportError without CANN's libraries, RuntimeError from a broken CANN
        raise RuntimeError(
            f"the npu platform needs torch_npu in this process, and importing it failed ({type(exc).__name__}: "
            f"{exc}); install torch-npu matching torch and source CANN's set_env.sh in the worker's environment "
            "(`verl plugins` shows the probe's reason)"
        ) from exc
    return torch_npu


def driver_version(npu_smi: str | None, npu_id: int = 0) -> str | None:
    """The NPU driver version from ``npu-smi``: the ``Version:`` of ``npu-smi info``, else the ``Software
    Version`` of ``npu-smi info -t board -i <npu_id>``; ``None`` without npu-smi or an answer."""
    if npu_smi is None:
        return None
    ok, out = run_npu_smi(npu_smi, ["info"])
    if ok:
        version = parse_npu_smi_info(out).version
        if version:
            return version
    ok, out = run_npu_smi(npu_smi, ["info", "-t", "board", "-i", str(npu_id)])
    return parse_board_software_version(out) if ok else None


class NPUPlatform(Platform):
    """Huawei Ascend NPUs (``torch.npu`` from torch-npu, ``hccl``, ``ASCEND_RT_VISIBLE_DEVICES``, Ray ``NPU``).

    Args:
        roots: where the probe and :meth:`supports_ipc` look (fixtures in tests); default the real machine.
    """

    name = "npu"
    device_type = "npu"
    vendor = "huawei"
    dist_backend = "hccl"
    visible_devices_env = "ASCEND_RT_VISIBLE_DEVICES"
    ray_resource_name = "NPU"
    # gloo stays for the colocated override (host memory); nccl does not exist on Ascend.
    sync_backends = ("gloo", "hccl")

    def __init__(self, roots: ProbeRoots | None = None) -> None:
        self._roots = roots

    @classmethod
    def probe(cls) -> ProbeResult:
        """See :mod:`verl_npu.probe` (cached per process; never imports torch_npu, never raises)."""
        return probe_npu()

    @property
    def device_module(self) -> ModuleType:
        """``torch.npu``, after importing torch_npu (raises ``RuntimeError`` with the fix when it cannot)."""
        import_torch_npu()
        import torch

        return torch.npu

    def device_name(self, index: int | None = None) -> str:
        """``torch.npu.get_device_name`` of ``index`` (default: current), e.g. ``"Ascend910B3"``."""
        module = self.device_module
        return str(module.get_device_name(self.current_device() if index is None else index))

    def supports_ipc(self) -> bool:
        """Whether NPU memory can be shared between processes: npu-smi driver >= 25.3.rc1 and CANN >= 8.3.RC1
        (verl's rule). ``False`` when a version is unknown; :meth:`ipc_support` has the reason."""
        return self.ipc_support()[0]

    def ipc_support(self) -> tuple[bool, str]:
        """``(answer, reason)`` behind :meth:`supports_ipc`, from npu-smi and the CANN version file."""
        roots = self._roots if self._roots is not None else ProbeRoots.from_env()
        return _ipc_support(roots)

    # ---------------------------------------------------------------- the weight-sync group (HCCL)

    def check_sync_backend(self, backend: str) -> None:
        """``hccl``: torch_npu's ``ProcessGroupHCCL`` importable here; other backends as the default.

        Raises:
            UnsupportedBackendError: torch_npu (or its ProcessGroupHCCL) cannot be imported, or a backend
                other than ``gloo``/``hccl``.
        """
        if backend == "hccl":
            _process_group_hccl()
            return
        super().check_sync_backend(backend)

    def new_sync_group(
        self, backend: str, store: Any, rank: int, world_size: int, timeout_s: float, *, host: str | None = None
    ) -> Any:
        """``ProcessGroupHCCL(store, rank, world_size, options)`` for ``hccl`` (options carry the timeout;
        HCCL connects on the first collective); ``gloo`` as the default. See
        :meth:`verl.platform.Platform.new_sync_group`."""
        if backend != "hccl":
            return super().new_sync_group(backend, store, rank, world_size, timeout_s, host=host)
        cls = _process_group_hccl()
        options = cls.Options()
        options._timeout = datetime.timedelta(seconds=timeout_s)
        return cls(store, rank, world_size, options)


def _process_group_hccl() -> Any:
    try:
        import torch_npu  # noqa: F401  registers the NPU device and HCCL
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL
    except Exception as exc:
        raise UnsupportedBackendError(
            f"sync group: backend 'hccl' needs torch_npu with ProcessGroupHCCL in this process "
            f"({type(exc).__name__}: {exc}); install torch-npu matching torch and source CANN's set_env.sh"
        ) from exc
    return ProcessGroupHCCL


@functools.lru_cache(maxsize=8)
def _ipc_support(roots: ProbeRoots) -> tuple[bool, str]:
    # Files and npu-smi only: no child process, no torch_npu (the answer is asked before weight sync starts).
    answer = ipc_support(driver_version(roots.npu_smi), read_cann(roots.ascend_home, roots.arch).version)
    logger.debug("npu IPC support: %s (%s)", *answer)
    return answer
