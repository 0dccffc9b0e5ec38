"""``code_interpreter``: the model runs Python and reads what it printed (the shape of verl's sandbox-fusion tool,
``verl/tools/sandbox_fusion_tools.py`` at ``5a506cc58^``: argument ``code``, reply = stdout + stderr).

Instead of sending the code to a sandbox-fusion server, each call runs it locally in a separate, resource-limited
process (:func:`verl.tools.sandbox.run_python`):

* a fresh ``python -I -u`` interpreter (``subprocess``, never a fork of the trainer) in its own session and
  process group, the whole group SIGKILLed at the wall-clock limit (``timeout``, default 10 s), when the output
  cap is reached and when the agent loop gives up on the call;
* rlimits: address space ``memory_limit_mb`` (512 MiB), CPU seconds, file size, open files, no core dumps;
* a throw-away working folder (deleted afterwards), a scrubbed environment, stdin on ``/dev/null``, output read up
  to ``max_output_bytes`` per stream;
* no network: an empty network namespace (``unshare(CLONE_NEWUSER|CLONE_NEWNET)``, where the kernel allows it
  unprivileged) and an audit hook installed before the code runs that refuses ``socket.connect`` / ``bind`` /
  ``sendto`` / ``sendmsg``, name lookups, ``subprocess.Popen``, ``os.exec*`` / ``posix_spawn`` / ``spawn*`` /
  ``system`` / ``fork`` / ``forkpty``, and signals to other processes. Each call's metrics say which protections
  were applied and why any were skipped (``protections``); the first run that skips one logs a warning.

What it does NOT protect against, plainly: **it is not a security boundary against hostile code.** Audit hooks
are a CPython convenience, not a sandbox: ``ctypes`` (or ``_posixsubprocess``, or writing ``/proc/self/mem``)
reaches the system calls they watch, and the rlimits' hard limits are the values set, which ``ctypes`` cannot
raise but a process with ``CAP_SYS_RESOURCE`` (root in the host namespace, when the user namespace was refused)
can. Reading the filesystem outside the folder is not blocked (the trainer's files, ``~/.ssh``, credentials in
files are readable by the program), nor is writing wherever the trainer's user may write; without a network
namespace (containers often refuse ``unshare``), a program that bypasses the hook reaches the network. The
number of processes is not limited (``RLIMIT_NPROC`` counts the whole user's processes). Run untrusted code in a
container or a sandbox-fusion server, not here. The protections are against the accidents of a model writing
code: infinite loops, memory bombs, runaway output, a stray ``pip install`` or HTTP request, files left behind.
"""

from __future__ import annotations

import logging
import shutil
import signal
import sys
from typing import Any, ClassVar

from verl.tools import default_schemas
from verl.tools.base import BaseTool, _positive
from verl.tools.sandbox import RunResult, SandboxLimits, ThreadSafeSemaphore, run_python
from verl.tools.schemas import ToolResponse

__all__ = ["CodeInterpreterTool", "format_result"]

logger = logging.getLogger(__name__)

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
    """Runs the model's ``code`` argument locally under the limits of the module docstring.

    Config keys (all optional): ``timeout`` (wall-clock seconds per run, 10), ``memory_limit_mb`` (512),
    ``cpu_time_s`` (null = ``ceil(timeout) + 1``), ``file_size_limit_mb`` (16), ``max_open_files`` (64),
    ``max_output_bytes`` (65536, per stream), ``max_concurrency`` (2 runs at once in this process, queued
    beyond), ``network_namespace`` (true), ``python`` (null = this interpreter), ``tool_timeout`` (below) and
    verl's ``type: native``.

    :attr:`timeout_s` (how long the agent loop waits for one call) is ``tool_timeout`` when set, else
    ``60 + 4 * timeout`` seconds, not ``timeout``: the tool kills a run after ``timeout`` itself, so the agent
    loop's limit only has to cover the wait for a free slot among ``max_concurrency``; when it still fires, the
    cancelled call kills its process and the model is told the tool did not answer.

    Raises:
        ValueError: an unknown config key or a value that is not positive.
        RuntimeError: not a POSIX system.
    """

    default_tool_schema: ClassVar[dict[str, Any]] = default_schemas.CODE_INTERPRETER

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: Any = None) -> None:
        config = dict(config or {})
        unknown = sorted(set(config) - set(CONFIG_DEFAULTS))
        if unknown:
            raise ValueError(f"CodeInterpreterTool config: unknown key(s) {unknown}; known: {sorted(CONFIG_DEFAULTS)}")
        settings = {**CONFIG_DEFAULTS, **{k: v for k, v in config.items() if v is not None}}
        for key in ("memory_limit_mb", "cpu_time_s", "file_size_limit_mb", "max_open_files", "max_output_bytes"):
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
        super().__init__({**config, "timeout": settings["timeout"]}, tool_schema)
        if sys.platform == "win32":
            raise RuntimeError("CodeInterpreterTool needs a POSIX system (process groups, rlimits)")
        run_timeout = self.timeout_s  # BaseTool validated config.timeout
        python = settings["python"] or sys.executable
        if shutil.which(python) is None:
            raise ValueError(f"CodeInterpreterTool config.python={python!r} is not an executable interpreter")
        self.limits = SandboxLimits(
            timeout_s=run_timeout,
            memory_mb=settings["memory_limit_mb"],
            cpu_s=settings["cpu_time_s"],
            file_size_mb=settings["file_size_limit_mb"],
            open_files=settings["max_open_files"],
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

    async def execute(
        self, instance_id: str, parameters: dict[str, Any], **kwargs: Any
    ) -> tuple[ToolResponse, float, dict[str, Any]]:
        """Run ``parameters["code"]``; returns ``(reply of format_result, 0.0, metrics)``.

        ``metrics``: ``exit_code``, ``timed_out``, ``truncated``, ``duration_s``, ``protections``. The step reward
        is 0.0: running code earns nothing by itself (verl's tool returns no score).

        Raises:
            TypeError: ``code`` is missing or not a string (the agent loop's schema check catches it first).
        """
        code = parameters.get("code")
        if not isinstance(code, str):
            raise TypeError(f"code_interpreter: 'code' must be a string of Python, got {type(code).__name__}")
        async with self._slots:
            result = await run_python(code, self.limits)
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
            if name not in self._warned and not reason.startswith("disabled by config"):
                self._warned.add(name)
                logger.warning("code_interpreter: protection %s not applied: %s", name, reason)
