"""``code_interpreter``: the model runs Python and reads what it printed (the shape of verl's sandbox-fusion tool,
``verl/tools/sandbox_fusion_tools.py`` at ``5a506cc58^``: argument ``code``, reply = stdout + stderr).

Instead of sending the code to a sandbox-fusion server, each call runs it locally in a box
(:func:`verl.tools.sandbox.run_python`, isolation from :mod:`verl.tools.isolation`):

* **the box** (``isolation``: ``auto`` = ``bubblewrap`` where bwrap works, else ``namespaces``): its own user
  (uid 65534, unprivileged; when the trainer is root, also host uid 65534), mount, PID, network, IPC and UTS
  namespaces, no capabilities, ``no_new_privs``, no nested user namespaces, a new session keyring. Inside: the
  system folders read-only, the interpreter read-only (the standard library only, unless config ``python``
  names a dedicated interpreter whose packages it then sees), a new ``/proc`` and a minimal ``/dev``, and the
  call's throw-away folder at ``/tmp``, the only writable place. The run folder, checkpoints, the home folder,
  the trainer's site-packages and ``/etc/shadow`` do not exist inside; the trainer's processes cannot be seen or
  signalled; there is no network (only the box's own loopback). When the call ends (exit, timeout, output cap,
  cancellation), the box's PID 1 ends and the kernel kills every process left in it, whatever session it moved
  to. When no box can be built the tool refuses to start, saying what is missing
  (:class:`~verl.tools.isolation.IsolationUnavailableError`);
* rlimits: address space ``memory_limit_mb`` (512 MiB), CPU seconds, file size, open files, processes
  (``max_processes``, ``RLIMIT_NPROC`` counted in the box's own user namespace), no core dumps;
* a fresh ``python -I -u`` interpreter (never a fork of the trainer), a scrubbed environment, stdin on
  ``/dev/null``, output read up to ``max_output_bytes`` per stream;
* an audit hook, as an extra layer inside the box (not the boundary): it refuses ``socket.connect`` / ``bind``
  / ``sendto`` / ``sendmsg``, name lookups, ``subprocess.Popen``, ``os.exec*`` / ``posix_spawn`` / ``spawn*`` /
  ``system`` / ``fork`` / ``forkpty`` and signals to other processes, so a model's ``pip install`` or HTTP
  request fails with a clear ``PermissionError``.

Each call's metrics say which isolation and protections were in force (``protections``); the first run that
skips one logs a warning. The tool logs its isolation when it is built, and ``verl train`` prints it.

What it still does NOT cover, plainly: the box shares the host's kernel, so a kernel bug reachable from an
unprivileged process (the whole system call interface: there is no seccomp filter) is an escape; the CPU and
the memory bandwidth are shared (only rlimits bound one call: a box's processes each get the CPU and address
space limits); the call folder lives on the host's disk (``file_size_limit_mb`` bounds each file, not their
number); a dedicated interpreter's packages are readable by the code; a non-root trainer's box runs as the
trainer's host uid (the mount, PID and user namespaces are what separate it). ``isolation: unsafe_none`` (the
opt-out) removes the box: the code then runs as the trainer's user, reads and writes what the trainer can and can
signal it; only the limits and the audit hook remain, which ``ctypes`` gets around. For untrusted code at scale,
SandboxFusion (:mod:`verl.tools.sandbox_fusion`, a remote service) keeps the code off the training machine.
"""

from __future__ import annotations

import logging
import shutil
import signal
import sys
from typing import Any, ClassVar

from verl.tools import default_schemas
from verl.tools.base import BaseTool, _positive
from verl.tools.isolation import MODES, resolve_isolation
from verl.tools.sandbox import RunResult, SandboxLimits, ThreadSafeSemaphore, run_python
from verl.tools.schemas import ToolResponse

__all__ = ["CodeInterpreterTool", "format_result"]

logger = logging.getLogger(__name__)
_LOGGED: set[str] = set()

#: config key -> default (``tool_timeout`` None: see :class:`CodeInterpreterTool`).
CONFIG_DEFAULTS: dict[str, Any] = {
    "type": "native",
    "timeout": 10,
    "tool_timeout": None,
    "memory_limit_mb": 512,
    "cpu_time_s": None,
    "file_size_limit_mb": 16,
    "max_open_files": 64,
    "max_output_bytes": 64 * 1024,
    "max_concurrency": 2,
    "max_processes": 32,
    "isolation": "auto",
    "network_namespace": True,
    "python": None,
}


def format_result(result: RunResult, limits: SandboxLimits) -> str:
    """The reply the model reads: stdout, then stderr, then one line per way the run was cut short.

    * timed out: ``"TimeoutError: killed after {timeout} s (the code interpreter's time limit)"``;
    * output cap: ``"[output truncated: more than {n} bytes; the program was stopped]"``;
    * killed by another signal (e.g. ``SIGXCPU`` at the CPU limit): ``"[killed by signal SIGXCPU]"``.
    """
    parts = [result.stdout, result.stderr]
    notes = []
    if result.timed_out:
        notes.append(f"TimeoutError: killed after {limits.timeout_s:g} s (the code interpreter's time limit)")
    elif result.truncated:
        notes.append(f"[output truncated: more than {limits.output_bytes} bytes; the program was stopped]")
    elif result.exit_code < 0:
        try:
            name = signal.Signals(-result.exit_code).name
        except ValueError:
            name = str(-result.exit_code)
        notes.append(f"[killed by signal {name}]")
    text = "".join(p if p.endswith("\n") or not p else p + "\n" for p in parts)
    return text + "".join(n + "\n" for n in notes)


class CodeInterpreterTool(BaseTool):
    """Runs the model's ``code`` argument locally, in the box of the module docstring.

    Config keys (all optional): ``timeout`` (wall-clock seconds per run, 10), ``memory_limit_mb`` (512),
    ``cpu_time_s`` (null = ``ceil(timeout) + 1``), ``file_size_limit_mb`` (16), ``max_open_files`` (64),
    ``max_processes`` (32: processes and threads in the box, its 2-3 supervisors included), ``max_output_bytes``
    (65536, per stream), ``max_concurrency`` (2 runs at once in this process, queued beyond), ``isolation``
    (``auto`` | ``bubblewrap`` | ``namespaces`` | ``unsafe_none``), ``python`` (null = the trainer's base
    interpreter with the standard library only; a path = a dedicated interpreter whose installed packages the
    code sees), ``network_namespace`` (``unsafe_none`` only: try an empty network namespace; a box always has
    one), ``tool_timeout`` (below) and verl's ``type: native``.

    :attr:`timeout_s` (how long the agent loop waits for one call) is ``tool_timeout`` when set, else
    ``60 + 4 * timeout`` seconds, not ``timeout``: the tool kills a run after ``timeout`` itself, so the agent
    loop's limit only has to cover the wait for a free slot among ``max_concurrency``; when it still fires, the
    cancelled call kills its process and the model is told the tool did not answer.

    Attributes:
        isolation: the :class:`~verl.tools.isolation.Isolation` in force (``isolation.describe()``).

    Raises:
        ValueError: an unknown config key, a value that is not positive, an unknown ``isolation``,
            ``network_namespace: false`` with a box, or a ``python`` that is not a usable interpreter.
        IsolationUnavailableError: no box can be built on this machine (the message says what is missing,
            how to fix it and how to opt out).
        RuntimeError: not a POSIX system.
    """

    default_tool_schema: ClassVar[dict[str, Any]] = default_schemas.CODE_INTERPRETER

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        config = dict(config or {})
        unknown = sorted(set(config) - set(CONFIG_DEFAULTS))
        if unknown:
            raise ValueError(f"CodeInterpreterTool config: unknown key(s) {unknown}; known: {sorted(CONFIG_DEFAULTS)}")
        settings = {**CONFIG_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        for key in (
            "memory_limit_mb",
            "cpu_time_s",
            "file_size_limit_mb",
            "max_open_files",
            "max_output_bytes",
            "max_processes",
        ):
            value = settings[key]
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"CodeInterpreterTool config.{key}={value!r} must be a positive integer")
        if (
            isinstance(settings["max_concurrency"], bool)
            or not isinstance(settings["max_concurrency"], int)
            or (settings["max_concurrency"] < 1)
        ):
            raise ValueError(
                f"CodeInterpreterTool config.max_concurrency={settings['max_concurrency']!r} must be an integer >= 1"
            )
        mode = settings["isolation"]
        if mode not in MODES:
            raise ValueError(f"CodeInterpreterTool config.isolation={mode!r} is not a mode; use one of {list(MODES)}")
        if mode != "unsafe_none" and not settings["network_namespace"]:
            raise ValueError(
                f"CodeInterpreterTool config.network_namespace=false with isolation={mode}: the box always has its "
                "own network namespace (no network); network_namespace only applies to isolation: unsafe_none"
            )
        super().__init__({**config, "timeout": settings["timeout"]}, tool_schema)
        if sys.platform == "win32":
            raise RuntimeError("CodeInterpreterTool needs a POSIX system (process groups, rlimits)")
        run_timeout = self.timeout_s  # BaseTool validated config.timeout
        python = settings["python"] or sys.executable
        if shutil.which(python) is None:
            raise ValueError(f"CodeInterpreterTool config.python={python!r} is not an executable interpreter")
        dedicated = shutil.which(settings["python"]) if settings["python"] else None
        self.isolation = resolve_isolation(mode, dedicated)
        self.limits = SandboxLimits(
            timeout_s=run_timeout,
            memory_mb=settings["memory_limit_mb"],
            cpu_s=settings["cpu_time_s"],
            file_size_mb=settings["file_size_limit_mb"],
            open_files=settings["max_open_files"],
            processes=settings["max_processes"],
            output_bytes=settings["max_output_bytes"],
            network_namespace=bool(settings["network_namespace"]),
            python=python,
        )
        self._slots = ThreadSafeSemaphore(settings["max_concurrency"])
        self.max_concurrency = settings["max_concurrency"]
        tool_timeout = settings["tool_timeout"]
        self.timeout_s = (
            60.0 + 4 * run_timeout
            if tool_timeout is None
            else _positive(tool_timeout, "CodeInterpreterTool config.tool_timeout")
        )
        self._warned: set[str] = set()
        description = self.isolation.describe()
        if description not in _LOGGED:  # the tools are built up to three times per run (check, print, use)
            _LOGGED.add(description)
            log = logger.warning if self.isolation.mode == "unsafe_none" else logger.info
            log("code_interpreter: %s", description)

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run ``parameters["code"]``; returns ``(reply of format_result, 0.0, metrics)``.

        ``metrics``: ``exit_code``, ``timed_out``, ``truncated``, ``duration_s``, ``protections`` (``isolation``,
        ``applied``, ``skipped``). The step reward is 0.0: running code earns nothing by itself (verl's tool
        returns no score).

        Raises:
            TypeError: ``code`` is missing or not a string (the agent loop's schema check catches it first).
            SandboxSetupError: the box of this call could not be built (nothing ran; the agent loop reports
                the tool error to the model).
        """
        code = parameters.get("code")
        if not isinstance(code, str):
            raise TypeError(f"code_interpreter: 'code' must be a string of Python, got {type(code).__name__}")
        async with self._slots:
            result = await run_python(code, self.limits, self.isolation)
        self._warn_skipped(result.protections.get("skipped", {}))
        metrics = {
            "exit_code": result.exit_code,
            "timed_out": result.timed_out,
            "truncated": result.truncated,
            "duration_s": result.duration_s,
            "protections": result.protections,
        }
        return ToolResponse(text=format_result(result, self.limits)), 0.0, metrics

    def _warn_skipped(self, skipped: dict[str, str]) -> None:
        for name, reason in skipped.items():
            if name not in self._warned and not reason.startswith(("disabled by config", "isolation: unsafe_none")):
                self._warned.add(name)
                logger.warning("code_interpreter: protection %s not applied: %s", name, reason)
