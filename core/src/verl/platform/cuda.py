"""The ``cuda`` platform: NVIDIA GPUs through CUDA, and AMD GPUs through ROCm.

torch exposes ROCm (HIP) devices as device type ``cuda`` with the same ``torch.cuda`` module and
the ``nccl`` backend name (RCCL underneath), so the spec named ``cuda`` covers both, as in verl,
where ``trainer.device=cuda`` also runs on AMD. On a ROCm build (``torch.version.hip`` set) its
factory returns :class:`RocmPlatform` (name ``rocm``, vendor ``amd``, ``HIP_VISIBLE_DEVICES``).

A second spec, ``rocm`` (:func:`probe_rocm`, factory :class:`RocmPlatform`, ``alias_of="cuda"``), makes
``trainer.device=rocm`` work too: it says yes only on a ROCm build with devices, and being an alias it is
left out of the automatic choice, where the ``cuda`` spec already counts the same devices.

Together with :mod:`verl.platform.base` this is the only place in core that touches
``torch.cuda``.
"""

from __future__ import annotations

import os
from types import ModuleType

from verl.platform.base import Platform, ProbeResult


def probe_cuda() -> ProbeResult:
    """Whether CUDA/ROCm devices are usable, without initialising CUDA.

    Uses ``torch.cuda.device_count()``, which asks NVML (amdsmi on ROCm) first and so does not
    poison ``fork`` (``torch.cuda.is_available()`` would call ``cuInit``). The catch: a device
    NVML sees may still fail to initialise later; that failure then surfaces at first use with
    CUDA's own error. Never raises: failures become ``ProbeResult(False, reason)``.
    """
    try:
        import torch
    except Exception as exc:  # a broken torch install is an answer, not a crash
        return ProbeResult(False, f"importing torch failed: {type(exc).__name__}: {exc}")
    try:
        hip = getattr(torch.version, "hip", None)
        if not torch.backends.cuda.is_built():
            return ProbeResult(False, f"torch {torch.__version__} is a CPU-only build (no CUDA or ROCm support)")
        runtime = f"ROCm/HIP {hip}" if hip else f"CUDA {torch.version.cuda}"
        if getattr(torch.cuda, "_is_in_bad_fork", lambda: False)():
            return ProbeResult(
                False, "this process was forked after CUDA was initialised in its parent; start it with 'spawn'"
            )
        count = torch.cuda.device_count()
    except Exception as exc:
        return ProbeResult(False, f"querying CUDA devices failed: {type(exc).__name__}: {exc}")
    if count <= 0:
        env = RocmPlatform.visible_devices_env if hip else CudaPlatform.visible_devices_env
        return ProbeResult(
            False, f"torch {torch.__version__} ({runtime}) sees no devices ({env}={os.environ.get(env)!r})"
        )
    return ProbeResult(True, f"{count} device(s), {runtime}")


def probe_rocm() -> ProbeResult:
    """Whether AMD GPUs are usable through ROCm: :func:`probe_cuda` on a ROCm (HIP) build of torch, else no,
    naming the build (``torch 2.6.0+cu124 is a CUDA build (CUDA 12.4), not ROCm; ...``). Never raises."""
    try:
        import torch
    except Exception as exc:  # a broken torch install is an answer, not a crash
        return ProbeResult(False, f"importing torch failed: {type(exc).__name__}: {exc}")
    try:
        hip = getattr(torch.version, "hip", None)
        cuda = getattr(torch.version, "cuda", None)
        built = torch.backends.cuda.is_built()
    except Exception as exc:
        return ProbeResult(False, f"querying the torch build failed: {type(exc).__name__}: {exc}")
    if hip:
        return probe_cuda()
    install = "install a ROCm build of torch (https://pytorch.org/get-started/locally/, ROCm wheels)"
    if built and cuda:
        return ProbeResult(
            False,
            f"torch {torch.__version__} is a CUDA build (CUDA {cuda}), not ROCm; use trainer.device=cuda, or {install}",
        )
    return ProbeResult(False, f"torch {torch.__version__} is a CPU-only build, not ROCm; {install}")


class CudaPlatform(Platform):
    """NVIDIA GPUs (``torch.cuda``, NCCL, Ray resource ``GPU``)."""

    name = "cuda"
    device_type = "cuda"
    vendor = "nvidia"
    dist_backend = "nccl"
    visible_devices_env = "CUDA_VISIBLE_DEVICES"
    ray_resource_name = "GPU"

    @classmethod
    def probe(cls) -> ProbeResult:
        """See :func:`probe_cuda`."""
        return probe_cuda()

    @property
    def device_module(self) -> ModuleType:
        """``torch.cuda``."""
        import torch

        return torch.cuda

    def device_name(self, index: int | None = None) -> str:
        """``torch.cuda.get_device_name`` of ``index`` (default: current); initialises CUDA."""
        import torch

        return torch.cuda.get_device_name(self.current_device() if index is None else index)

    def supports_ipc(self) -> bool:
        """``True``: CUDA (and HIP) IPC handles share device memory between processes."""
        return True


class RocmPlatform(CudaPlatform):
    """AMD GPUs through ROCm: torch device type ``cuda``, RCCL behind the ``nccl`` name."""

    name = "rocm"
    vendor = "amd"
    visible_devices_env = "HIP_VISIBLE_DEVICES"


def make_cuda_platform() -> CudaPlatform:
    """Factory of the ``cuda`` spec: :class:`RocmPlatform` on a ROCm build of torch, else
    :class:`CudaPlatform`."""
    import torch

    return RocmPlatform() if getattr(torch.version, "hip", None) else CudaPlatform()
