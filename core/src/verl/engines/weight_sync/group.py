"""A standalone process group for weight sync, outside torch.distributed's default group.

The trainer pool and the rollout pool are different processes (different Ray worker groups) with
their own default process groups (or none), so the sync group is built by hand from a
``TCPStore`` hosted by rank 0 and the platform's backend constructor, like vLLM's
``StatelessProcessGroup`` / verl's checkpoint engines do. Nothing here calls
``torch.distributed.init_process_group`` or registers the group globally.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch.distributed as dist

SUPPORTED_BACKENDS = ("gloo", "nccl", "hccl")


class UnsupportedBackendError(ValueError):
    """The platform's ``dist_backend`` cannot build a standalone sync group in this torch build."""


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (bind to port 0, read it, close).

    Another process may take it before the store binds it; callers pick it on the host of rank 0.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_backend(backend: str) -> None:
    """Raise :class:`UnsupportedBackendError` unless ``backend`` can build a group here.

    Raises:
        UnsupportedBackendError: unknown name (lists the supported ones), ``torch.distributed``
            missing, NCCL missing from this torch build, or ``torch_npu`` not installed for HCCL.
    """
    if backend not in SUPPORTED_BACKENDS:
        raise UnsupportedBackendError(
            f"broadcast checkpoint engine: dist_backend {backend!r} is not supported; "
            f"supported: {', '.join(SUPPORTED_BACKENDS)} (set by the platform, see `verl plugins`)"
        )
    if not dist.is_available():
        raise UnsupportedBackendError(
            f"broadcast checkpoint engine: this torch build has no torch.distributed ({backend!r})"
        )
    if backend == "gloo" and not dist.is_gloo_available():
        raise UnsupportedBackendError("broadcast checkpoint engine: this torch build has no Gloo backend ('gloo')")
    if backend == "nccl" and not dist.is_nccl_available():
        raise UnsupportedBackendError(
            "broadcast checkpoint engine: this torch build has no NCCL ('nccl'); install a CUDA build of torch"
        )
    if backend == "hccl":
        _hccl_class()


def _hccl_class() -> Any:
    try:
        import torch_npu  # noqa: F401  (registers the NPU device and HCCL)
        from torch_npu._C._distributed_c10d import ProcessGroupHCCL
    except ImportError as exc:
        raise UnsupportedBackendError(
            f"broadcast checkpoint engine: backend 'hccl' needs torch_npu with ProcessGroupHCCL ({exc})"
        ) from exc
    return ProcessGroupHCCL


def make_store(master_addr: str, master_port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    """Connect to (rank 0: host) the ``TCPStore`` at ``master_addr:master_port``, under a private prefix."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(
        master_addr, int(master_port), world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
    )
    return dist.PrefixStore("verl/sync/broadcast", store)


def make_backend(backend: str, store: Any, rank: int, world_size: int, timeout_s: float) -> Any:
    """Build the collective backend object (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` / ``ProcessGroupHCCL``).

    Blocks until all ``world_size`` ranks have joined (Gloo rendezvous; NCCL/HCCL connect lazily on the
    first collective). Raises :class:`UnsupportedBackendError` as :func:`check_backend`.
    """
    check_backend(backend)
    timeout = datetime.timedelta(seconds=timeout_s)
    if backend == "gloo":
        return dist.ProcessGroupGloo(store, rank, world_size, timeout)
    cls = dist.ProcessGroupNCCL if backend == "nccl" else _hccl_class()
    options = cls.Options()
    options._timeout = timeout
    return cls(store, rank, world_size, options)
