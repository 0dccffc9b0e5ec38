"""Run a Python program in a separate, resource-limited process: :func:`run_python` (the code interpreter's engine).

Each run gets a fresh ``python -I -u`` interpreter started with ``asyncio.create_subprocess_exec`` (never a fork
of the trainer, whose torch threads and locks a fork would copy), in a session and process group of its own,
with a throw-away working folder (deleted afterwards), a scrubbed environment (``PATH``, ``HOME`` / ``TMPDIR`` =
the folder, a UTF-8 locale, one BLAS thread), stdin on ``/dev/null`` and stdout / stderr read through pipes up to
a byte cap. The child protects itself before the code runs (:mod:`verl.tools._sandbox_child`: network namespace,
rlimits, audit hook) and reports what it applied. The parent kills the whole group when the wall-clock limit
passes, when the output cap is reached, when the caller is cancelled, and after a normal exit (so nothing the
program left behind in its group survives).

Concurrency: :class:`ThreadSafeSemaphore` bounds the runs in flight across every thread and event loop of the
process (the agent manager runs one event loop per worker thread, all sharing one tool).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import json
import os
import shutil
import signal
import stat
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import attrs

__all__ = ["RunResult", "SandboxLimits", "ThreadSafeSemaphore", "run_python"]

_CHILD = Path(__file__).with_name("_sandbox_child.py")
_LIMITS = Path(__file__).resolve().parents[1] / "rewards" / "process_limits.py"
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
        output_bytes: bytes kept of stdout and of stderr each; more kills the run (it could only be thrown away).
        network_namespace: try ``unshare(CLONE_NEWNET)`` (the audit hook refuses network use either way).
        python: the interpreter to run (default: this one, so the run sees the same installed packages).

    Raises:
        ValueError: a value that is not a positive number of its kind.
    """

    timeout_s: float = attrs.field(default=10.0, validator=_positive((int, float)))
    memory_mb: int | None = attrs.field(default=512, validator=_positive(int, allow_none=True))
    cpu_s: int | None = attrs.field(default=None, validator=_positive(int, allow_none=True))
    file_size_mb: int = attrs.field(default=16, validator=_positive(int))
    open_files: int = attrs.field(default=64, validator=_positive(int))
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
        protections: the child's report ``{"applied": [...], "skipped": {name: reason}}``; ``applied`` is empty
            and ``skipped`` says why when the child died before reporting.
    """

    stdout: str
    stderr: str
    exit_code: int
    timed_out: bool
    truncated: bool
    duration_s: float
    protections: dict[str, Any]


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


def _environment(workdir: str) -> dict[str, str]:
    # Nothing of the trainer's environment (tokens, cluster addresses) reaches the program.
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": workdir,
        "TMPDIR": workdir,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def _remove_tree(path: str) -> None:
    """Delete the run's folder even where the program removed its own permissions on something in it."""

    def retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            os.chmod(os.path.dirname(target), stat.S_IRWXU)
            os.chmod(target, stat.S_IRWXU)
        with contextlib.suppress(OSError):
            func(target)

    shutil.rmtree(path, onerror=retry)  # onexc is 3.12+; onerror still works there


async def _drain(stream: asyncio.StreamReader, cap: int, on_overflow: Any) -> tuple[bytes, bool]:
    buf = bytearray()
    while True:
        chunk = await stream.read(_CHUNK)
        if not chunk:
            return bytes(buf), False
        room = cap - len(buf)
        if len(chunk) > room:
            buf += chunk[:room]
            on_overflow()
            return bytes(buf), True
        buf += chunk


async def _exited(proc: asyncio.subprocess.Process, deadline: float) -> bool:
    """Wait until the child itself exits (True) or ``deadline`` (``time.monotonic()``) passes (False).

    Not ``proc.wait()``: that also waits for the pipes to close, which a descendant holding them delays.
    """
    delay = 0.002
    while proc.returncode is None:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return False
        await asyncio.sleep(min(delay, remaining))
        delay = min(delay * 2, 0.025)
    return True


def _read_report(fd: int) -> dict[str, Any]:
    data = b""
    with contextlib.suppress(OSError):
        os.set_blocking(fd, False)
        while chunk := os.read(fd, 4096):
            data += chunk
    with contextlib.suppress(ValueError):
        report = json.loads(data.decode() or "null")
        if isinstance(report, dict):
            return report
    return {"applied": [], "skipped": {"all": "the child exited before reporting its protections"}}


async def run_python(code: str, limits: SandboxLimits | None = None) -> RunResult:
    """Run ``code`` as a Python program under ``limits``; see the module docstring for what surrounds it.

    Cancelling the awaiting task kills the process group and deletes the folder before re-raising.

    Raises:
        TypeError: ``code`` is not a string.
        RuntimeError: not a POSIX system (process groups and rlimits are needed).
        OSError: the interpreter could not be started.
    """
    if not isinstance(code, str):
        raise TypeError(f"run_python: code must be str, got {type(code).__name__}")
    if os.name != "posix":
        raise RuntimeError("the code interpreter sandbox needs a POSIX system (process groups, rlimits)")
    limits = limits or SandboxLimits()
    root = tempfile.mkdtemp(prefix="verl-code-")
    report_r, report_w = os.pipe()
    proc = None
    drains: list[asyncio.Future] = []
    try:
        workdir = os.path.join(root, "work")
        os.mkdir(workdir, 0o700)
        code_path = os.path.join(root, "code.py")
        Path(code_path).write_text(code, encoding="utf-8")
        settings = {
            "code_path": code_path,
            "limits_path": str(_LIMITS),
            "report_fd": report_w,
            "memory_mb": limits.memory_mb,
            "cpu_s": limits.cpu_seconds(),
            "file_size_mb": limits.file_size_mb,
            "open_files": limits.open_files,
            "network_namespace": limits.network_namespace,
        }
        start = time.monotonic()
        proc = await asyncio.create_subprocess_exec(
            limits.python,
            "-I",
            "-u",
            str(_CHILD),
            json.dumps(settings),
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.PIPE,
            cwd=workdir,
            env=_environment(workdir),
            start_new_session=True,
            pass_fds=(report_w,),
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
        _kill_group(pgid)  # at the timeout; else whatever the program left running in its group dies with it
        await proc.wait()
        done, _ = await asyncio.wait(drains, timeout=_DRAIN_AFTER_KILL_S)
        (out, out_cut), (err, err_cut) = (
            task.result() if task in done else (b"", False) for task in (out_task, err_task)
        )
        return RunResult(
            stdout=out.decode("utf-8", "replace"),
            stderr=err.decode("utf-8", "replace"),
            exit_code=int(proc.returncode if proc.returncode is not None else -signal.SIGKILL),
            timed_out=timed_out,
            truncated=out_cut or err_cut,
            duration_s=duration,
            protections=_read_report(report_r),
        )
    finally:
        for task in drains:
            task.cancel()
        if proc is not None and proc.returncode is None:  # cancelled or failed midway
            _kill_group(proc.pid)
            with contextlib.suppress(BaseException):
                await asyncio.wait_for(asyncio.shield(proc.wait()), _DRAIN_AFTER_KILL_S)
        for fd in (report_r, report_w):
            if fd >= 0:
                with contextlib.suppress(OSError):
                    os.close(fd)
        _remove_tree(root)
