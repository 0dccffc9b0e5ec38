"""A standalone process group for weight sync, outside torch.distributed's default group.

The trainer pool and the rollout pool are different processes (different Ray worker groups) with
their own default process groups (or none), so the sync group is built by hand from a
``TCPStore`` hosted by rank 0 and the platform's :meth:`~verl.platform.Platform.new_sync_group`, like vLLM's
``StatelessProcessGroup`` / verl's checkpoint engines do. Nothing here calls
``torch.distributed.init_process_group`` or registers the group globally.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

import torch.distributed as dist

from verl.platform.base import UnsupportedBackendError
from verl.platform.network import free_port, is_loopback, tcp_store

logger = logging.getLogger(__name__)

__all__ = ["UnsupportedBackendError", "check_backend", "free_port", "make_backend", "make_store"]


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
    """Connect to (rank 0: host) the ``TCPStore`` at ``master_addr:master_port``, under a private prefix.

    Rank 0's server listens on ``master_addr`` only (:func:`verl.platform.network.tcp_store`): loopback when the
    trainer and the rollout pool share a node, the node's address when they do not; never every interface.
    """
    store = tcp_store(master_addr, master_port, world_size, is_master=rank == 0, timeout_s=timeout_s)
    return dist.PrefixStore("verl/sync/broadcast", store)


def make_backend(
    backend: str, store: Any, rank: int, world_size: int, timeout_s: float, *, platform: Any, master_addr: str = ""
) -> Any:
    """Build the collective backend object of the group with ``platform.new_sync_group``
    (``ProcessGroupGloo`` / ``ProcessGroupNCCL`` from core, ``ProcessGroupHCCL`` from verl-npu).

    Blocks until all ``world_size`` ranks have joined (Gloo rendezvous; NCCL/HCCL connect lazily on the
    first collective). A loopback ``master_addr`` means every rank is on this node: the group's own sockets
    bind loopback too (``host=`` of :meth:`~verl.platform.Platform.new_sync_group`; a platform whose override
    predates that keyword builds its default). Raises :class:`UnsupportedBackendError` as :func:`check_backend`.
    """
    host = master_addr if is_loopback(master_addr) else None
    build = platform.new_sync_group
    kwargs = {}
    if host is not None:
        if "host" in inspect.signature(build).parameters:
            kwargs["host"] = host
        else:
            logger.warning(
                "platform %r's new_sync_group takes no host: the weight-sync group's sockets bind its default",
                getattr(platform, "name", type(platform).__name__),
            )
    try:  # new_sync_group checks the backend itself (check_sync_backend): not checked twice here
        return build(backend, store, rank, world_size, timeout_s, **kwargs)
    except UnsupportedBackendError as exc:
        raise UnsupportedBackendError(f"broadcast checkpoint engine: {exc}") from exc
