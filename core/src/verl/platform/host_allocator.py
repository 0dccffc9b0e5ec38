"""Host-memory allocator of a CPU worker: keep freed tensor memory in the process, as a device's caching allocator does.

Why this exists: PyTorch's CPU tensors come from the C library's ``malloc``. glibc serves every block above its mmap
threshold (128 KiB, growing to at most 32 MiB) with a fresh ``mmap`` and unmaps it again on ``free``, and it gives
the top of its heap back to the kernel once more than the trim threshold is free there. The activations,
gradients and logits of a CPU update are exactly such blocks, allocated and freed again every micro-batch, so each
is new memory: the kernel zero-fills and maps every 4 KiB page on first touch. A GRPO update of SmolLM2-135M
(7001 tokens, ``benchmarks/grpo_step.py``'s batch) takes 1.4-1.9 M such page faults and 2.3-3.1 s of system time;
in a process that has built vLLM's CPU engine the same faults cost 6.6-10.4 s (``benchmarks/README.md``).

The ``caching`` setting (the default on the ``cpu`` platform) makes glibc behave like CUDA's caching allocator:
``mallopt(M_MMAP_MAX, 0)`` serves large blocks from the heap too, and ``mallopt(M_TRIM_THRESHOLD, -1)`` keeps freed
heap pages in the process (both documented in mallopt(3)), so the next micro-batch reuses pages that are already
mapped. Memory freed after a phase's peak is kept until :func:`release_host_cache` (``Platform.empty_cache`` on the
``cpu`` platform) hands it back with ``malloc_trim``; the peak itself can grow a little (1-4% measured), because a
block that fits none of the heap's holes extends it. Where the heap cannot grow glibc still falls back to
``mmap``, so no allocation fails because of it.

Scope: the settings govern the main heap, where a worker's tensors come from (the engines run on the main
thread). Threads other than the main one allocate from their own arenas of at most 64 MiB, where glibc still maps
larger blocks one by one (the ``hf`` async server's decode thread, for instance): those keep glibc's behaviour.

The environment variable ``VERL_CPU_ALLOCATOR`` chooses (read when a worker configures its platform):

* ``caching`` (default): the settings above, where the C library is glibc; elsewhere (musl, macOS) nothing changes;
* ``system``: leave the C library's defaults (freed memory goes back to the kernel at once).

An allocator preloaded with ``LD_PRELOAD`` (jemalloc, tcmalloc) keeps its own policy: nothing is changed then.
"""

from __future__ import annotations

import ctypes
import functools
import os
import threading
from typing import Any

#: Environment variable choosing the host allocator policy of a CPU worker.
ALLOCATOR_ENV = "VERL_CPU_ALLOCATOR"
#: Values of :data:`ALLOCATOR_ENV`.
ALLOCATOR_MODES = ("caching", "system")
_DEFAULT_MODE = "caching"

# mallopt(3) parameter numbers (glibc's malloc.h).
_M_TRIM_THRESHOLD = -1
_M_MMAP_MAX = -4

_PRELOADED = ("jemalloc", "tcmalloc", "mimalloc")

_lock = threading.Lock()
_applied: str | None = None


@functools.cache
def _libc() -> Any | None:
    """The process's glibc (the symbols already loaded), or ``None`` where the C library is not glibc."""
    try:
        libc = ctypes.CDLL(None)
    except (OSError, TypeError):  # Windows: CDLL(None) is a TypeError
        return None
    # gnu_get_libc_version exists only in glibc: musl and macOS have a mallopt stub or none at all.
    if not hasattr(libc, "gnu_get_libc_version") or not hasattr(libc, "mallopt"):
        return None
    return libc


def requested_mode(environ: dict[str, str] | None = None) -> str:
    """The policy :data:`ALLOCATOR_ENV` asks for (``caching`` when unset or empty).

    Raises:
        ValueError: the variable holds anything but ``caching`` or ``system`` (the message names both).
    """
    env = os.environ if environ is None else environ
    value = env.get(ALLOCATOR_ENV, "").strip().lower() or _DEFAULT_MODE
    if value not in ALLOCATOR_MODES:
        raise ValueError(
            f"{ALLOCATOR_ENV}={env.get(ALLOCATOR_ENV)!r} is not a host allocator policy: use 'caching' (keep freed "
            "tensor memory in the process, the default) or 'system' (the C library's defaults)"
        )
    return value


def configure_host_allocator(environ: dict[str, str] | None = None) -> str:
    """Apply the policy of :data:`ALLOCATOR_ENV` to this process; idempotent (the first call decides).

    Returns:
        What is in effect: ``"caching"`` (glibc tuned as described in the module docstring), ``"system"`` (asked
        for), ``"system (not glibc)"`` (no glibc ``mallopt`` to tune), ``"preloaded (<name>)"`` (an allocator in
        ``LD_PRELOAD`` is left alone) or ``"system (mallopt refused)"``.

    Raises:
        ValueError: :data:`ALLOCATOR_ENV` holds an unknown policy.
    """
    global _applied
    mode = requested_mode(environ)
    with _lock:
        if _applied is not None:
            return _applied
        env = os.environ if environ is None else environ
        preload = env.get("LD_PRELOAD", "")
        preloaded = next((name for name in _PRELOADED if name in preload), None)
        libc = _libc()
        if mode == "system":
            _applied = "system"
        elif preloaded is not None:
            _applied = f"preloaded ({preloaded})"
        elif libc is None:
            _applied = "system (not glibc)"
        else:
            libc.mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
            libc.mallopt.restype = ctypes.c_int
            # Trimming off first: once large blocks live in the heap, a free at its top must not unmap it.
            ok = libc.mallopt(_M_TRIM_THRESHOLD, -1) == 1 and libc.mallopt(_M_MMAP_MAX, 0) == 1
            _applied = "caching" if ok else "system (mallopt refused)"
        return _applied


def release_host_cache() -> bool:
    """Give the free memory the C library holds back to the kernel (glibc ``malloc_trim(0)``: the heap's top and
    every whole free page inside it).

    Returns:
        True when memory was released, False when there was none or the C library is not glibc.
    """
    libc = _libc()
    if libc is None or not hasattr(libc, "malloc_trim"):
        return False
    libc.malloc_trim.argtypes = (ctypes.c_size_t,)
    libc.malloc_trim.restype = ctypes.c_int
    return libc.malloc_trim(0) == 1
