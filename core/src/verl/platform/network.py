"""Where verl's own sockets listen: on loopback unless the run spans nodes, then on the node's address in the cluster.

A rendezvous store (torch's ``TCPStore``) accepts any client that reaches its port and hands out what the ranks put
in it; a Gloo pair socket takes part in collectives. torch's ``TCPStore`` server listens on every interface whatever
host it is given (checked with torch 2.13: ``TCPStore("127.0.0.1", 0, is_master=True)`` listens on ``*:port``), and
Gloo's default device binds the address the host name resolves to. So the socket is created here, bound to the one
address the group needs, and handed to the store (``master_listen_fd``); Gloo devices are pinned to that address
(an explicit device for the groups verl builds itself, ``GLOO_SOCKET_IFNAME`` for the default group and the groups
torch derives from it, as torch reads only that).

Which address: :func:`listen_host` — loopback when every process of the group runs on one node, else the node's
address. Ray's own services (GCS, raylet, workers' gRPC servers) are Ray's to bind; docs/ray.md says what they do.
"""

from __future__ import annotations

import datetime
import ipaddress
import logging
import os
import socket
from typing import Any

__all__ = [
    "LOOPBACK_HOST",
    "bound_listener",
    "free_port",
    "init_process_group",
    "is_loopback",
    "join_default_group",
    "listen_host",
    "loopback_collective_env",
    "loopback_interface",
    "pin_collectives_to_loopback",
    "tcp_store",
]

logger = logging.getLogger(__name__)

LOOPBACK_HOST = "127.0.0.1"
#: The environment variables torch's Gloo and NCCL read for the interface their own sockets use.
GLOO_IFNAME = "GLOO_SOCKET_IFNAME"
NCCL_IFNAME = "NCCL_SOCKET_IFNAME"


def is_loopback(host: str) -> bool:
    """Whether ``host`` (an IP address or ``localhost``) is a loopback address (``127.0.0.0/8``, ``::1``)."""
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def listen_host(spans_nodes: bool, node_ip: str) -> str:
    """The address a group's listening sockets bind: ``127.0.0.1`` when all its processes share one node, else
    ``node_ip`` (this node's address in the cluster, e.g. ``ray.util.get_node_ip_address()``)."""
    return node_ip if spans_nodes else LOOPBACK_HOST


def bound_listener(host: str, port: int = 0, backlog: int = 2048) -> socket.socket:
    """A TCP socket bound to ``host:port`` (0: the OS picks a free port) and listening.

    ``SO_REUSEADDR`` is set as torch's own store server sets it, so a port freed a moment ago can be bound again.

    Raises:
        OSError: the address is not on this machine, or the port is taken.
    """
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, int(port)))
        sock.listen(backlog)
    except BaseException:
        sock.close()
        raise
    return sock


def free_port(host: str = LOOPBACK_HOST) -> int:
    """A TCP port that was free on ``host`` a moment ago (bind to port 0, read it, close).

    Another process may take it before the store binds it; callers pick it on the host of rank 0.
    """
    with socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def tcp_store(
    host: str, port: int, world_size: int, *, is_master: bool, timeout_s: float, wait_for_workers: bool = False
) -> Any:
    """A ``torch.distributed.TCPStore`` whose server (``is_master``) listens on ``host:port`` only.

    Args:
        host: the address clients connect to; the master binds exactly it (loopback on one node).
        port: the store's port (the master binds it; 0 = any free one, read back from ``store.port``).
        world_size: clients + master.
        is_master: host the server in this process.
        timeout_s: connect / wait timeout, seconds.
        wait_for_workers: the master waits for ``world_size - 1`` clients before returning.

    Raises:
        OSError: the master cannot bind ``host:port``.
        RuntimeError / DistStoreError: a client cannot reach the server within ``timeout_s``.
    """
    import torch.distributed as dist

    timeout = datetime.timedelta(seconds=timeout_s)
    if not is_master:
        return dist.TCPStore(host, int(port), world_size, False, timeout=timeout)
    listener = bound_listener(host, port)
    bound_port = int(listener.getsockname()[1])
    # The store owns the descriptor from here on (libuv closes it when the store shuts down).
    return dist.TCPStore(
        host,
        bound_port,
        world_size,
        True,
        timeout=timeout,
        wait_for_workers=wait_for_workers,
        master_listen_fd=listener.detach(),
    )


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS / BSD), or None if neither
    exists."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except OSError:
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)


def loopback_collective_env(*, nccl: bool = True) -> dict[str, str]:
    """``{GLOO_SOCKET_IFNAME: lo[, NCCL_SOCKET_IFNAME: lo]}`` for the variables this process's environment does not
    set already (a user's choice wins); empty when there is no loopback interface.

    torch builds the Gloo device of every group made by ``init_process_group`` / ``new_group`` from
    ``GLOO_SOCKET_IFNAME`` alone, and NCCL picks its bootstrap interface from ``NCCL_SOCKET_IFNAME``: for processes
    whose every group stays on this node, loopback keeps those sockets off the network.
    """
    name = loopback_interface()
    if name is None:
        logger.warning("no loopback interface found: Gloo/NCCL sockets bind where their defaults put them")
        return {}
    keys = [GLOO_IFNAME, NCCL_IFNAME] if nccl else [GLOO_IFNAME]
    return {key: name for key in keys if not os.environ.get(key)}


def pin_collectives_to_loopback(*, nccl: bool = True) -> dict[str, str]:
    """Set :func:`loopback_collective_env` in this process's environment; returns what it set.

    Call it only in a process whose every group stays on this node, before the groups are made.
    """
    env = loopback_collective_env(nccl=nccl)
    os.environ.update(env)
    return env


def init_process_group(
    backend: str,
    host: str,
    port: int,
    rank: int,
    world_size: int,
    timeout_s: float | None = None,
    *,
    pin_nccl: bool = False,
) -> None:
    """``torch.distributed.init_process_group`` over a store whose server binds ``host`` only (rank 0 hosts it).

    When ``host`` is a loopback address the group lives on one node: Gloo's sockets are pinned to the loopback
    interface too, and NCCL's bootstrap with ``pin_nccl`` (only where no later group of this process leaves the
    node: NCCL reads one process-wide variable; a Ray worker group sets it for a one-node cluster).

    Args:
        backend: ``gloo`` / ``nccl`` / ``hccl`` (the platform's ``dist_backend``).
        host, port: rank 0's rendezvous address (``MASTER_ADDR`` / ``MASTER_PORT``).
        rank, world_size: this process's rank and the group's size.
        timeout_s: the group's timeout, seconds (None: torch's default).

    Raises:
        OSError: rank 0 cannot bind ``host:port``. RuntimeError / DistStoreError: the rendezvous failed.
    """
    import torch.distributed as dist

    if is_loopback(host):
        pin_collectives_to_loopback(nccl=pin_nccl)
    store_timeout = 300.0 if timeout_s is None else float(timeout_s)
    store = tcp_store(host, port, world_size, is_master=rank == 0, timeout_s=store_timeout)
    extra = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    dist.init_process_group(backend=backend, store=store, rank=rank, world_size=world_size, **extra)


_RENDEZVOUS_ENV = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def join_default_group(backend: str, timeout_s: float | None = None, *, owner: str = "verl") -> bool:
    """Make sure the default process group exists; return True if this call created it.

    * already initialised: nothing happens (whatever backend it uses);
    * ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and ``MASTER_PORT`` all set (a Ray worker group, torchrun):
      :func:`init_process_group` at that address, rank 0 hosting the store; under torchrun
      (``TORCHELASTIC_USE_AGENT_STORE=True``: torchrun's agent already serves the store on ``MASTER_PORT``) the
      ranks join that store (``env://``), and when every rank is on this node (``LOCAL_WORLD_SIZE == WORLD_SIZE``)
      Gloo and NCCL are pinned to loopback;
    * otherwise (a lone process): a 1-rank group over a loopback store, Gloo and NCCL pinned to loopback.

    Args:
        backend: ``gloo`` (cpu), ``nccl`` (cuda), ``hccl`` (npu): the platform's ``dist_backend``.
        timeout_s: the group's collective timeout in seconds; None = torch's default.
        owner: names the caller in the half-configured error.

    Raises:
        RuntimeError: only some of the rendezvous variables are set (names the missing ones).
    """
    import torch.distributed as dist

    if dist.is_initialized():
        return False
    present = [k for k in _RENDEZVOUS_ENV if os.environ.get(k)]
    if present and len(present) < len(_RENDEZVOUS_ENV):
        missing = [k for k in _RENDEZVOUS_ENV if k not in present]
        raise RuntimeError(
            f"{owner}: torch.distributed rendezvous is half configured: {present} set but {missing} missing; "
            "set all of RANK, WORLD_SIZE, MASTER_ADDR, MASTER_PORT (or none for a single process)"
        )
    extra = {} if timeout_s is None else {"timeout": datetime.timedelta(seconds=timeout_s)}
    if not present:
        init_process_group(backend, LOOPBACK_HOST, 0, 0, 1, timeout_s, pin_nccl=True)
        logger.info("%s: started a 1-rank %s process group on loopback (no RANK/WORLD_SIZE set)", owner, backend)
        return True
    env = os.environ
    if env.get("TORCHELASTIC_USE_AGENT_STORE") == "True":
        if env.get("LOCAL_WORLD_SIZE") == env["WORLD_SIZE"]:
            pin_collectives_to_loopback(nccl=True)
        dist.init_process_group(backend=backend, init_method="env://", **extra)
        return True
    init_process_group(
        backend, env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["RANK"]), int(env["WORLD_SIZE"]), timeout_s
    )
    return True
