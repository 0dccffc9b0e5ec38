"""Resource limits a child process puts on itself before it runs untrusted code (stdlib only).

Used by the reward worker (:mod:`verl.rewards._procworker`: memory, no core dumps) and by the code interpreter's
child (:mod:`verl.tools._sandbox_child`, which loads this file by path in a ``python -I`` interpreter, so this
module must import nothing outside the standard library). Linux and macOS; ``resource`` does not exist on Windows.

Every limit only *lowers* the soft and hard limits (never above the current hard limit, which an unprivileged
process cannot raise), so the limits a container or ``ulimit`` already sets stay in force.
"""

from __future__ import annotations

import contextlib
import ctypes
import signal
import sys

__all__ = ["apply_limits", "die_with_parent", "limit_memory"]

_MB = 1024 * 1024


def _lower(kind: int, soft: int, hard: int | None = None) -> None:
    """Set ``kind`` to ``(soft, hard)`` (``hard`` None: keep the current hard limit), capped at the hard limit."""
    import resource

    infinity = resource.RLIM_INFINITY  # -1 on Linux: never compare it with min()
    _, current_hard = resource.getrlimit(kind)
    if current_hard != infinity:
        soft = min(soft, current_hard)
        hard = current_hard if hard is None else min(hard, current_hard)
    elif hard is None:
        hard = infinity
    if hard != infinity:
        soft = min(soft, hard)
    resource.setrlimit(kind, (soft, hard))


def limit_memory(limit_mb: int | None) -> None:
    """No core dumps; with ``limit_mb``, an address-space limit (``RLIMIT_AS``) of that many MiB.

    A process over the limit gets ``MemoryError`` from Python's allocator (or fails to map memory), instead of
    driving the machine into the OOM killer. The hard limit is kept, so the process could raise its own soft
    limit again: this protects against accidents, not against code that wants to escape.

    Raises:
        ValueError / OSError: ``setrlimit`` refused the limit (e.g. ``RLIMIT_AS`` on macOS).
    """
    import resource

    # A crashing scorer or program must not fill the disk with core dumps.
    resource.setrlimit(resource.RLIMIT_CORE, (0, resource.getrlimit(resource.RLIMIT_CORE)[1]))
    if limit_mb is None:
        return
    _lower(resource.RLIMIT_AS, int(limit_mb) * _MB)


def apply_limits(
    *,
    memory_mb: int | None = None,
    cpu_s: int | None = None,
    file_size_mb: int | None = None,
    open_files: int | None = None,
    processes: int | None = None,
) -> tuple[list[str], dict[str, str]]:
    """Apply every given limit (soft = hard = the value, so the process cannot raise it back); None skips one.

    The exception is the CPU limit, whose hard limit is one second above the soft one: at the soft limit the
    kernel sends ``SIGXCPU``, at the hard one ``SIGKILL``, and with both equal the process would just vanish.

    * ``RLIMIT_CORE`` 0 always, ``RLIMIT_AS`` = ``memory_mb`` MiB (as :func:`limit_memory`, but hard too);
    * ``RLIMIT_CPU`` = ``cpu_s`` CPU seconds (hard: one more): the kernel sends ``SIGXCPU`` (the process dies);
    * ``RLIMIT_FSIZE`` = ``file_size_mb`` MiB per written file (Python ignores ``SIGXFSZ``, so a write past it
      raises ``OSError: [Errno 27] File too large``);
    * ``RLIMIT_NOFILE`` = ``open_files`` descriptors;
    * ``RLIMIT_NPROC`` = ``processes``: a ``fork`` / ``clone`` (threads too) fails with ``EAGAIN`` once the real
      uid has that many tasks. Since Linux 5.14 the count is per user namespace, so it bounds one box only when
      the process runs in a user namespace of its own; outside one it counts every process of the user on the
      machine (and root is exempt).

    Returns:
        ``(applied, skipped)``: the names applied (``"rlimit_core"``, ``"rlimit_as"``, ...) and, for each one
        ``setrlimit`` refused, the reason. A refused limit does not stop the others.
    """
    import resource

    wanted = [
        ("rlimit_core", resource.RLIMIT_CORE, 0),
        ("rlimit_as", resource.RLIMIT_AS, None if memory_mb is None else int(memory_mb) * _MB),
        ("rlimit_cpu", resource.RLIMIT_CPU, None if cpu_s is None else int(cpu_s)),
        ("rlimit_fsize", resource.RLIMIT_FSIZE, None if file_size_mb is None else int(file_size_mb) * _MB),
        ("rlimit_nofile", resource.RLIMIT_NOFILE, None if open_files is None else int(open_files)),
        ("rlimit_nproc", resource.RLIMIT_NPROC, None if processes is None else int(processes)),
    ]
    applied: list[str] = []
    skipped: dict[str, str] = {}
    for name, kind, value in wanted:
        if value is None:
            continue
        # CPU: the hard limit one second later, so the soft limit's SIGXCPU (not SIGKILL) is what the process gets.
        hard = value + 1 if name == "rlimit_cpu" else value
        try:
            _lower(kind, value, hard)
        except (ValueError, OSError) as exc:
            skipped[name] = f"{type(exc).__name__}: {exc}"
        else:
            applied.append(name)
    return applied, skipped


def die_with_parent() -> bool:
    """Linux: have the kernel SIGKILL this process when the thread that started it exits (``PR_SET_PDEATHSIG``).

    So a hung child never outlives a killed trainer. Returns whether it was set (False off Linux or on failure).
    """
    if not sys.platform.startswith("linux"):
        return False
    with contextlib.suppress(OSError, AttributeError):
        return ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL) == 0  # PR_SET_PDEATHSIG
    return False
