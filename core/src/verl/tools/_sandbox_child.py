"""The code interpreter's child: ``python -I -u _sandbox_child.py SETTINGS_JSON``, run by :mod:`verl.tools.sandbox`.

A script, not an import: it runs in an isolated interpreter (``-I``: no PYTHON* variables, no user site, no
script folder on ``sys.path``) and uses the standard library only (the limits module is loaded by its path). In
order, before the model's code runs:

1. ``PR_SET_PDEATHSIG`` (Linux): the kernel kills this process if the parent thread goes away;
2. a new network namespace (``unshare(CLONE_NEWUSER | CLONE_NEWNET)``, falling back to ``CLONE_NEWNET`` alone for
   a privileged process): only a loopback interface that is down, so no address is reachable;
3. resource limits (:func:`verl.rewards.process_limits.apply_limits`);
4. an audit hook (:func:`sys.addaudithook`, which cannot be removed) refusing network and process events;
5. a one-line JSON report ``{"applied": [...], "skipped": {name: reason}}`` on ``report_fd``, which is closed
   before the model's code runs so that code cannot write a report of its own.

Then the code runs as ``__main__`` (file name ``<code>``); an uncaught exception prints its traceback without this
script's frame and exits with status 1.
"""

from __future__ import annotations

import builtins
import ctypes
import importlib.util
import json
import linecache
import os
import sys
import traceback
import types

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000

#: Audit events refused outright: network use (any address family, so also Unix sockets on the filesystem) and
#: starting programs or processes.
BLOCKED_EVENTS = frozenset(
    {
        "socket.connect",
        "socket.bind",
        "socket.sendto",
        "socket.sendmsg",
        "socket.getaddrinfo",
        "socket.gethostbyname",
        "socket.gethostbyaddr",
        "socket.getnameinfo",
        "subprocess.Popen",
        "os.exec",
        "os.posix_spawn",
        "os.spawn",
        "os.system",
        "os.fork",
        "os.forkpty",
        "os.startfile",
    }
)


def _unshare(flags: int) -> None:
    if hasattr(os, "unshare"):  # Python 3.12+
        os.unshare(flags)
        return
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.unshare(ctypes.c_int(flags)) != 0:
        errno = ctypes.get_errno()
        raise OSError(errno, os.strerror(errno))


def _new_network_namespace() -> str:
    """Enter an empty network namespace; returns how, raises OSError when the kernel refuses both ways."""
    if not sys.platform.startswith("linux"):
        raise OSError("network namespaces are Linux-only")
    try:
        _unshare(CLONE_NEWUSER | CLONE_NEWNET)  # unprivileged, where user namespaces are allowed
        return "user+net"
    except OSError as first:
        try:
            _unshare(CLONE_NEWNET)  # root / CAP_SYS_ADMIN without user namespaces (e.g. some containers)
            return "net"
        except OSError:
            raise first from None


def _audit_hook(event: str, args: tuple) -> None:
    if event in BLOCKED_EVENTS:
        raise PermissionError(f"{event} is not allowed in the code interpreter (no network, no new processes)")
    # Signals only to this process (or its own group, which it leads): never to the trainer.
    if event == "os.kill" and args and args[0] not in (0, os.getpid()):
        raise PermissionError("os.kill of another process is not allowed in the code interpreter")
    if event == "os.killpg" and args and args[0] not in (0, os.getpgrp()):
        raise PermissionError("os.killpg of another process group is not allowed in the code interpreter")


def _protect(settings: dict) -> dict:
    applied: list[str] = []
    skipped: dict[str, str] = {}
    spec = importlib.util.spec_from_file_location("_verl_process_limits", settings["limits_path"])
    limits = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(limits)
    if limits.die_with_parent():
        applied.append("die_with_parent")
    if settings["network_namespace"]:
        try:
            how = _new_network_namespace()
            applied.append(f"network_namespace({how})")
        except OSError as exc:
            skipped["network_namespace"] = f"unshare refused: {exc}"
    else:
        skipped["network_namespace"] = "disabled by config (network_namespace: false)"
    done, refused = limits.apply_limits(
        memory_mb=settings["memory_mb"],
        cpu_s=settings["cpu_s"],
        file_size_mb=settings["file_size_mb"],
        open_files=settings["open_files"],
    )
    applied += done
    skipped.update(refused)
    sys.addaudithook(_audit_hook)
    applied.append("audit_hook")
    return {"applied": applied, "skipped": skipped}


def main() -> int:
    settings = json.loads(sys.argv[1])
    with open(settings["code_path"], encoding="utf-8") as fh:
        code = fh.read()
    report = _protect(settings)
    os.write(settings["report_fd"], (json.dumps(report) + "\n").encode())
    os.close(settings["report_fd"])
    # Tracebacks show the model's lines, and code that writes a helper module next to it can import it.
    linecache.cache["<code>"] = (len(code), None, code.splitlines(True), "<code>")
    sys.path.insert(0, os.getcwd())
    sys.argv = ["<code>"]
    # A module of its own as __main__, so classes the code defines pickle and `if __name__ == "__main__"` holds.
    main_module = types.ModuleType("__main__")
    main_module.__dict__.update(__builtins__=builtins, __file__="<code>")
    sys.modules["__main__"] = main_module
    try:
        exec(compile(code, "<code>", "exec"), main_module.__dict__)
    except SystemExit:
        raise
    except BaseException as exc:  # noqa: BLE001 - the model's error, printed as Python would
        _print_error(exc)
        return 1
    return 0


def _print_error(exc: BaseException) -> None:
    """The traceback as Python prints it, without this script's frames (the audit hook's, ``main``'s)."""
    report = traceback.TracebackException.from_exception(exc)
    pending = [report]
    while pending:
        item = pending.pop()
        item.stack = traceback.StackSummary.from_list([f for f in item.stack if f.filename != __file__])
        pending += [e for e in (item.__cause__, item.__context__) if e is not None]
    sys.stderr.write("".join(report.format()))


if __name__ == "__main__":
    sys.exit(main())
