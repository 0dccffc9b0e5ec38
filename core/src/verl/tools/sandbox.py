"""Run a Python program in a box: :func:`run_python` (the code interpreter's engine).

Each run gets a fresh ``python -I -u`` interpreter started with ``asyncio.create_subprocess_exec`` (never a fork
of the trainer, whose torch threads and locks a fork would copy), in a session and process group of its own,
with a throw-away folder (deleted afterwards), a scrubbed environment (``PATH``, ``HOME`` / ``TMPDIR`` = the
working folder, a UTF-8 locale, one BLAS thread), stdin on ``/dev/null`` and stdout / stderr read through pipes up
to a byte cap. The isolation (:mod:`verl.tools.isolation`) decides what surrounds it: a box built by bubblewrap or
by the kernel's namespaces (:mod:`verl.tools._box_layout` says what is inside, :mod:`verl.tools._box_launch` how
it starts), or nothing (``unsafe_none``). Inside, :mod:`verl.tools._sandbox_child` sets the rlimits, checks the
walls and reports what it applied. The parent kills the whole group when the wall-clock limit passes, when the
output cap is reached, when the caller is cancelled, and after a normal exit; in a box, the end of its PID
namespace's first process kills every process the program left, whatever session or group it moved to.

Concurrency: :class:`ThreadSafeSemaphore` bounds the runs in flight across every thread and event loop of the
process (the agent manager runs one event loop per worker thread, all sharing one tool).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

import attrs

from verl.tools._box_launch import build_launch, call_folder, open_box_files
from verl.tools.isolation import Isolation, resolve_isolation

__all__ = ["RunResult", "SandboxLimits", "SandboxSetupError", "ThreadSafeSemaphore", "run_python", "run_python_sync"]

_CHUNK = 1 << 16
_DRAIN_AFTER_KILL_S = 2.0  # a descendant that left the group may hold the pipes open: stop waiting for it


def _positive(kind: type, allow_none: bool = False) -> Any:
    def check(instance: Any, attribute: attrs.Attribute, value: Any) -> None:
        if value is None and allow_none:
            return
        if isinstance(value, bool) or not isinstance(value, kind) or not value > 0:
            raise ValueError(f"{attribute.name}={value!r} must be a positive {kind.__name__}")

    return check


@attrs.frozen(kw_only=True)
class SandboxLimits:
    """The limits of one run.

    Attributes:
        timeout_s: wall clock, seconds; the process group is SIGKILLed when it passes.
        memory_mb: address space (``RLIMIT_AS``), MiB; None = unlimited.
        cpu_s: CPU seconds (``RLIMIT_CPU``; the kernel kills with SIGXCPU); None = ``ceil(timeout_s) + 1``.
        file_size_mb: largest file the program may write (``RLIMIT_FSIZE``), MiB.
        open_files: file descriptors (``RLIMIT_NOFILE``).
        processes: processes and threads of the box's user (``RLIMIT_NPROC``, counted in the box's own user
            namespace, its 2-3 supervising processes included); beyond it ``fork`` fails with ``EAGAIN``.
        output_bytes: bytes kept of stdout and of stderr each; more kills the run (it could only be thrown away).
        network_namespace: ``unsafe_none`` only: try ``unshare(CLONE_NEWNET)`` (a box always has its own).
        python: ``unsafe_none`` only: the interpreter to run (a box runs :attr:`Isolation.interpreter`).

    Raises:
        ValueError: a value that is not a positive number of its kind.
    """

    timeout_s: float = attrs.field(default=10.0, validator=_positive((int, float)))
    memory_mb: int | None = attrs.field(default=512, validator=_positive(int, allow_none=True))
    cpu_s: int | None = attrs.field(default=None, validator=_positive(int, allow_none=True))
    file_size_mb: int = attrs.field(default=16, validator=_positive(int))
    open_files: int = attrs.field(default=64, validator=_positive(int))
    processes: int = attrs.field(default=32, validator=_positive(int))
    output_bytes: int = attrs.field(default=64 * 1024, validator=_positive(int))
    network_namespace: bool = True
    python: str = sys.executable

    def cpu_seconds(self) -> int:
        """The CPU limit: ``cpu_s``, or one second more than the wall clock (the wall clock normally ends it)."""
        return self.cpu_s if self.cpu_s is not None else int(-(-self.timeout_s // 1)) + 1


@attrs.frozen(kw_only=True)
class RunResult:
    """What one run did.

    Attributes:
        stdout / stderr: decoded output (UTF-8, undecodable bytes replaced), at most ``output_bytes`` bytes each.
        exit_code: the process's status; negative = killed by that signal (``-9`` after a timeout).
        timed_out: the wall-clock limit killed it.
        truncated: the output cap was reached (and the run killed).
        duration_s: wall-clock seconds from start to exit.
        protections: the child's report ``{"isolation": mode, "applied": [...], "skipped": {name: reason}}``;
            ``applied`` is empty and ``skipped`` says why when the child died before reporting.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    truncated: bool
    duration_s: float
    protections: dict[str, Any]


class SandboxSetupError(RuntimeError):
    """The box of one call could not be built (a mount, a namespace, a check of its walls failed); nothing of
    the program ran. The message names the step and the kernel's error."""


class ThreadSafeSemaphore:
    """An async semaphore usable from any thread's event loop (``asyncio.Semaphore`` is bound to one loop).

    ``async with sem:`` waits without blocking its loop; permits go to waiters first come, first served;
    a waiter cancelled while waiting (or just after being granted) never keeps a permit.

    Raises:
        ValueError: ``value`` < 1.
    """

    def __init__(self, value: int) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"ThreadSafeSemaphore value={value!r} must be an int >= 1")
        self._lock = threading.Lock()
        self._free = value
        self._waiters: collections.deque[asyncio.Future] = collections.deque()

    async def acquire(self) -> None:
        """Take a permit, waiting for one."""
        loop = asyncio.get_running_loop()
        with self._lock:
            if self._free > 0 and not self._waiters:
                self._free -= 1
                return
            waiter = loop.create_future()
            self._waiters.append(waiter)
        try:
            await waiter
        except asyncio.CancelledError:
            with self._lock:
                if waiter in self._waiters:  # never granted
                    self._waiters.remove(waiter)
                    raise
            if waiter.done() and not waiter.cancelled():  # granted, then cancelled before resuming
                self.release()
            # else: the grant is still on its way; _grant sees the cancelled future and passes the permit on
            raise

    def release(self) -> None:
        """Return a permit (to the longest waiter, on its own loop)."""
        with self._lock:
            while self._waiters:
                waiter = self._waiters.popleft()
                try:
                    waiter.get_loop().call_soon_threadsafe(self._grant, waiter)
                    return
                except RuntimeError:  # its loop is closed: that waiter is gone
                    continue
            self._free += 1

    def _grant(self, waiter: asyncio.Future) -> None:
        if waiter.cancelled():
            self.release()
        else:
            waiter.set_result(None)

    async def __aenter__(self) -> ThreadSafeSemaphore:
        await self.acquire()
        return self

    async def __aexit__(self, *exc: Any) -> None:
        self.release()


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


async def _drain(stream: asyncio.StreamReader, cap: int, on_overflow: Any) -> tuple[bytes, bool]:
    """Read ``stream`` to its end, keeping the first ``cap`` bytes; past them, call ``on_overflow`` once and read
    the rest only to throw it away (a pipe left unread would keep its transport open after the call)."""
    buf = bytearray()
    overflowed = False
    while chunk := await stream.read(_CHUNK):
        room = cap - len(buf)
        if len(chunk) > room and not overflowed:
            buf += chunk[:room]
            overflowed = True
            on_overflow()
        elif not overflowed:
            buf += chunk
    return bytes(buf), overflowed


async def _exited(proc: asyncio.subprocess.Process, deadline: float) -> bool:
    """Wait until the child itself exits (True) or ``deadline`` (``time.monotonic()``) passes (False).

    Not ``proc.wait()``: that also waits for the pipes to close, which a descendant holding them delays. Polls
    every 2-5 ms during the first second (most calls end there, and a coarser step would add up to its length to
    each), then every 25 ms.
    """
    delay, fine_until = 0.002, time.monotonic() + 1.0
    while proc.returncode is None:
        now = time.monotonic()
        if now >= deadline:
            return False
        await asyncio.sleep(min(delay, deadline - now))
        delay = 0.005 if now < fine_until else 0.025
    return True


def _read_report(fd: int) -> tuple[dict[str, Any], dict[str, int] | None]:
    """The child's protections record and its exit record (None when the supervisor did not write one)."""
    data = b""
    with contextlib.suppress(OSError):
        os.set_blocking(fd, False)
        while chunk := os.read(fd, 4096):
            data += chunk
    protections: dict[str, Any] | None = None
    exit_record = None
    for line in data.decode(errors="replace").splitlines():
        with contextlib.suppress(ValueError):
            record = json.loads(line)
            if isinstance(record, dict) and isinstance(record.get("exit"), dict):
                exit_record = record["exit"]
            elif isinstance(record, dict) and protections is None:
                protections = record
    if protections is None:
        protections = {"applied": [], "skipped": {"all": "the child exited before reporting its protections"}}
    return protections, exit_record


def _exit_code(exit_record: dict[str, int] | None, returncode: int | None) -> int:
    # The supervisor's record is how the model's own process ended; bwrap would report a signal as 128 + n.
    if exit_record and isinstance(exit_record.get("signal"), int):
        return -exit_record["signal"]
    if exit_record and isinstance(exit_record.get("code"), int):
        return exit_record["code"]
    return int(returncode if returncode is not None else -signal.SIGKILL)


def _checked(result: RunResult) -> RunResult:
    failed = result.protections.get("failed")
    if failed:
        raise SandboxSetupError(f"the code interpreter's box could not be set up, nothing ran: {failed}")
    return result


def _resolve(isolation: Isolation | None) -> Isolation:
    return isolation if isolation is not None else resolve_isolation("auto", None)


async def run_python(code: str, limits: SandboxLimits | None = None, isolation: Isolation | None = None) -> RunResult:
    """Run ``code`` as a Python program under ``limits`` in ``isolation``; see the module docstring.

    ``isolation`` None: :func:`~verl.tools.isolation.resolve_isolation` ``("auto", None)`` (probed once per
    process). Cancelling the awaiting task kills the process group and deletes the folder before re-raising.

    Raises:
        TypeError: ``code`` is not a string.
        RuntimeError: not a POSIX system (process groups and rlimits are needed).
        IsolationUnavailableError: ``isolation`` None and no box can be built here.
        SandboxSetupError: the box could not be built for this call (nothing of the code ran).
        OSError: the interpreter (or bwrap) could not be started.
    """
    if not isinstance(code, str):
        raise TypeError(f"run_python: code must be str, got {type(code).__name__}")
    if os.name != "posix":
        raise RuntimeError("the code interpreter sandbox needs a POSIX system (process groups, rlimits)")
    limits = limits or SandboxLimits()
    isolation = _resolve(isolation)
    report_r, report_w = os.pipe()
    proc = None
    drains: list[asyncio.Future] = []
    try:
        with call_folder(code, isolation) as folder, open_box_files(isolation, folder) as data_fds:
            launch = build_launch(isolation, limits, folder, report_w, data_fds)
            start = time.monotonic()
            try:
                proc = await asyncio.create_subprocess_exec(
                    *launch.argv,
                    stdin=asyncio.subprocess.DEVNULL,
                    stdout=asyncio.subprocess.PIPE,
                    stderr=asyncio.subprocess.PIPE,
                    start_new_session=True,
                    **launch.subprocess_kwargs(),
                )
                os.close(report_w)
                report_w = -1
                pgid = proc.pid  # start_new_session: the child leads its own session and group
                assert proc.stdout is not None and proc.stderr is not None
                out_task = asyncio.ensure_future(_drain(proc.stdout, limits.output_bytes, lambda: _kill_group(pgid)))
                err_task = asyncio.ensure_future(_drain(proc.stderr, limits.output_bytes, lambda: _kill_group(pgid)))
                drains = [out_task, err_task]
                timed_out = not await _exited(proc, start + limits.timeout_s)
                duration = time.monotonic() - start
                _kill_group(pgid)  # at the timeout; else whatever the program left running in its group dies
                await proc.wait()
                done, _ = await asyncio.wait(drains, timeout=_DRAIN_AFTER_KILL_S)
                (out, out_cut), (err, err_cut) = (
                    task.result() if task in done else (b"", False) for task in (out_task, err_task)
                )
                protections, exit_record = _read_report(report_r)
                return _checked(
                    RunResult(
                        stdout=out.decode("utf-8", "replace"),
                        stderr=err.decode("utf-8", "replace"),
                        exit_code=_exit_code(None if timed_out else exit_record, proc.returncode),
                        timed_out=timed_out,
                        truncated=out_cut or err_cut,
                        duration_s=duration,
                        protections=protections,
                    )
                )
            finally:
                for task in drains:
                    task.cancel()
                if proc is not None and proc.returncode is None:  # cancelled or failed midway
                    _kill_group(proc.pid)
                    with contextlib.suppress(BaseException):
                        await asyncio.wait_for(asyncio.shield(proc.wait()), _DRAIN_AFTER_KILL_S)
    finally:
        for fd in (report_r, report_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)


def run_python_sync(code: str, limits: SandboxLimits, isolation: Isolation) -> RunResult:
    """:func:`run_python` without an event loop, for short programs (the isolation probe): output is kept whole
    (no ``output_bytes`` cap), the wall-clock limit kills the process group.

    Raises:
        SandboxSetupError: the box could not be built (the message says which step failed).
        OSError: the interpreter (or bwrap) could not be started.
    """
    report_r, report_w = os.pipe()
    try:
        with call_folder(code, isolation) as folder, open_box_files(isolation, folder) as data_fds:
            launch = build_launch(isolation, limits, folder, report_w, data_fds)
            start = time.monotonic()
            proc = subprocess.Popen(
                launch.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                start_new_session=True,
                **launch.subprocess_kwargs(),
            )
            os.close(report_w)
            report_w = -1
            try:
                out, err = proc.communicate(timeout=limits.timeout_s)
                timed_out = False
            except subprocess.TimeoutExpired:
                _kill_group(proc.pid)
                out, err = proc.communicate()
                timed_out = True
            _kill_group(proc.pid)
            protections, exit_record = _read_report(report_r)
            return _checked(
                RunResult(
                    stdout=out.decode("utf-8", "replace"),
                    stderr=err.decode("utf-8", "replace"),
                    exit_code=_exit_code(None if timed_out else exit_record, proc.returncode),
                    timed_out=timed_out,
                    truncated=False,
                    duration_s=time.monotonic() - start,
                    protections=protections,
                )
            )
    finally:
        for fd in (report_r, report_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
