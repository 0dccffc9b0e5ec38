"""Which TCP addresses a process listens on, read from ``/proc`` (Linux): for tests that check where sockets bind.

``/proc/<pid>/net/tcp`` and ``tcp6`` list the sockets of the process's network namespace with their inodes;
``/proc/<pid>/fd`` links to ``socket:[inode]`` for the ones the process holds. A socket in state ``0A`` (LISTEN)
held by the process is one of its listeners.
"""

from __future__ import annotations

import ipaddress
import os
import re
import socket
import struct

__all__ = ["WILDCARD_HOSTS", "listening_addresses"]

#: The addresses that mean "every interface".
WILDCARD_HOSTS = frozenset({"0.0.0.0", "::"})
_LISTEN = "0A"
_SOCKET_LINK = re.compile(r"^socket:\[(\d+)\]$")


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    fd_dir = f"/proc/{pid}/fd"
    for name in os.listdir(fd_dir):
        try:
            match = _SOCKET_LINK.match(os.readlink(os.path.join(fd_dir, name)))
        except OSError:  # closed while we looked
            continue
        if match:
            inodes.add(match.group(1))
    return inodes


def _decode(hex_address: str, family: int) -> str:
    raw = bytes.fromhex(hex_address)
    if family == socket.AF_INET:
        return str(ipaddress.IPv4Address(struct.pack("<I", struct.unpack(">I", raw)[0])))
    # tcp6: four 32-bit words, each in host (little-endian) order
    words = struct.unpack(">4I", raw)
    return str(ipaddress.IPv6Address(b"".join(struct.pack("<I", w) for w in words)))


def listening_addresses(pid: int | None = None) -> list[tuple[str, int]]:
    """``[(address, port), ...]`` of the TCP sockets process ``pid`` (default: this one) holds in LISTEN state.

    ``0.0.0.0`` / ``::`` (:data:`WILDCARD_HOSTS`) mean every interface; an IPv4-mapped IPv6 address is given in its
    IPv4 form (``::ffff:127.0.0.1`` -> ``127.0.0.1``).

    Raises:
        OSError: not Linux (no ``/proc``), or the process is gone or not ours to inspect.
    """
    pid = os.getpid() if pid is None else int(pid)
    inodes = _socket_inodes(pid)
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            with open(f"/proc/{pid}/net/{table}", encoding="ascii") as handle:
                rows = handle.read().splitlines()[1:]
        except FileNotFoundError:  # no IPv6 in this kernel
            continue
        for row in rows:
            fields = row.split()
            local, state, inode = fields[1], fields[3], fields[9]
            if state != _LISTEN or inode not in inodes:
                continue
            host_hex, port_hex = local.split(":")
            host = _decode(host_hex, family)
            mapped = ipaddress.ip_address(host)
            if isinstance(mapped, ipaddress.IPv6Address) and mapped.ipv4_mapped is not None:
                host = str(mapped.ipv4_mapped)
            found.append((host, int(port_hex, 16)))
    return sorted(found)
