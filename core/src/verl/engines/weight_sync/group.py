"""A standalone process group for weight sync, outside torch.distributed's default group.

The trainer pool and the rollout pool are different processes (different Ray worker groups) with
their own default process groups (or none), so the sync group is built by hand from a
``TCPStore`` hosted by rank 0 and the platform's :meth:`~verl.platform.Platform.new_sync_group`, like vLLM's
``StatelessProcessGroup`` / verl's checkpoint engines do. Nothing here calls
``torch.distributed.init_process_group`` or registers the group globally.
"""

from __future__ import annotations

import datetime
import socket
from typing import Any

import torch.distributed as dist

from verl.platform.base import UnsupportedBackendError

__all__ = ["UnsupportedBackendError", "check_backend", "free_port", "make_backend", "make_store"]


def free_port(host: str = "127.0.0.1") -> int:
    """Return a TCP port that was free on ``host`` a moment ago (bind to port 0, read it, close).

    Another process may take it before the store binds it; callers pick it on the host of rank 0.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def check_backend(backend: str, *, platform: Any) -> None:
    """Raise :class:`UnsupportedBackendError` unless ``platform`` can build a ``backend`` group here.

    Asks :meth:`verl.platform.Platform.check_sync_backend`: core's platforms know gloo and nccl, a vendor's
    its own (``hccl`` from verl-npu), so core never imports a vendor extension.

    Raises:
        UnsupportedBackendError: the platform does not build ``backend`` (the message lists what it builds),
            or this process lacks what the backend needs (NCCL in this torch build, the vendor extension).
    """
    try:
        platform.check_sync_backend(backend)
    except UnsupportedBackendError as exc:
        raise UnsupportedBackendError(f"broadcast checkpoint engine: {exc}") from exc


def make_store(master_addr: str, master_port: int, rank: int, world_size: int, timeout_s: float) -> Any:
    """Connect to (rank 0: host) the ``TCPStore`` at ``master_addr:master_port``, under a private prefix."""
    timeout = datetime.timedelta(seconds=timeout_s)
    store = dist.TCPStore(
        master_addr, int(master_port), world_size, is_master=rank == 0, timeout=timeout, wait_for_workers=False
    )
    return dist.PrefixStore("verl/sync/broadcast", store)


def make_backend(backend: str, store: Any, rank: int, world_size: int, timeout_s: float, *, platform: Any) -> Any:
    """Build the collective backend object of the group with ``platform.new_sync_group``
    (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` from core, ``ProcessGroupHCCL`` from verl-npu).

    Blocks until all ``world_size`` ranks have joined (Gloo rendezvous; NCCL/HCCL connect lazily on the
    first collective). Raises :class:`UnsupportedBackendError` as :func:`check_backend`.
    """
    try:  # new_sync_group checks the backend itself (check_sync_backend): not checked twice here
        return platform.new_sync_group(backend, store, rank, world_size, timeout_s)
    except UnsupportedBackendError as exc:
        raise UnsupportedBackendError(f"broadcast checkpoint engine: {exc}") from exc
