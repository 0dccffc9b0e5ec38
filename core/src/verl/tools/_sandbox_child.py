"""The code interpreter's child: ``python -I -u _sandbox_child.py SETTINGS_JSON``, run by :mod:`verl.tools.sandbox`.

A script, not an import: it runs in an isolated interpreter (``-I``: no PYTHON* variables, no user site, no
script folder on ``sys.path``) and uses the standard library only (its helpers are loaded by their paths). It
writes JSON lines on ``report_fd``: first ``{"isolation", "applied": [...], "skipped": {name: reason}}`` (with
``"failed"`` when the box could not be built: then nothing of the model's runs and the status is 125), last
``{"exit": {"code": n}}`` or ``{"exit": {"signal": n}}`` (how the model's process ended). ``SETTINGS["isolation"]``:

* ``bubblewrap``: bwrap built the box and started this script inside it (uid 65534, new namespaces, the
  read-only system, the call's folder at ``/tmp``); this process supervises, the model's code runs in a child;
* ``namespaces``: :func:`verl.tools._sandbox_ns.enter` builds the same box around this process and returns in
  PID 1 of its new PID namespace, which supervises; the model's code runs in a child;
* ``unsafe_none`` (the opt-out): no box; as before isolation existed, this process tries an empty network
  namespace and runs the code itself.

Before the model's code runs, in its own process: resource limits (:func:`verl.rewards.process_limits
.apply_limits`, with ``RLIMIT_NPROC`` in a box), a check of the walls it must find (uid 65534, no capabilities,
``no_new_privs``; a box that fails it runs nothing), an audit hook (:func:`sys.addaudithook`, which cannot be
removed: an extra layer refusing network and process events, not the boundary), then ``report_fd`` is closed so
the code cannot write a report of its own. The code runs as ``__main__`` (file name ``<code>``); an uncaught
exception prints its traceback without this script's frames and exits with status 1.
"""

from __future__ import annotations

import builtins
import ctypes
import importlib.util
import json
import linecache
import os
import signal
import sys
import traceback
import types

CLONE_NEWNET = 0x40000000
CLONE_NEWUSER = 0x10000000
PR_SET_DUMPABLE = 4
BOX_UID = BOX_GID = 65534
SETUP_FAILED = 125

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


def _load(path: str, name: str) -> types.ModuleType:
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


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


def _limits(settings: dict, limits: types.ModuleType, processes: int | None) -> tuple[list[str], dict[str, str]]:
    return limits.apply_limits(
        memory_mb=settings["memory_mb"],
        cpu_s=settings["cpu_s"],
        file_size_mb=settings["file_size_mb"],
        open_files=settings["open_files"],
        processes=processes,
    )


def _protect_unsafe(settings: dict, limits: types.ModuleType) -> dict:
    """``unsafe_none``: what this process can do for itself without a box."""
    applied: list[str] = []
    skipped: dict[str, str] = {"box": "isolation: unsafe_none (the code sees the trainer's files, user and processes)"}
    if limits.die_with_parent():
        applied.append("die_with_parent")
    how = None
    if settings["network_namespace"]:
        try:
            how = _new_network_namespace()
            applied.append(f"network_namespace({how})")
        except OSError as exc:
            skipped["network_namespace"] = f"unshare refused: {exc}"
    else:
        skipped["network_namespace"] = "disabled by config (network_namespace: false)"
    # RLIMIT_NPROC counts per user namespace: only in one of its own does it bound this run and not the user.
    processes = settings["processes"] if how == "user+net" else None
    if processes is None:
        skipped["rlimit_nproc"] = "no user namespace of its own: the limit would count every process of the user"
    done, refused = _limits(settings, limits, processes)
    applied += done
    skipped.update(refused)
    sys.addaudithook(_audit_hook)
    applied.append("audit_hook")
    return {"isolation": "unsafe_none", "applied": applied, "skipped": skipped}


def _status_fields() -> dict[str, str]:
    with open("/proc/self/status", encoding="ascii") as fh:
        return dict(line.rstrip("\n").split(":\t", 1) for line in fh if ":\t" in line)


def _check_walls() -> tuple[list[str], str | None]:
    """What this process can see of its own box: the names confirmed, or what is wrong."""
    status = _status_fields()
    wrong = []
    if (os.getuid(), os.geteuid(), os.getgid(), os.getegid()) != (BOX_UID, BOX_UID, BOX_GID, BOX_GID):
        wrong.append(f"uid/gid {os.getuid()}/{os.getgid()}, expected {BOX_UID}/{BOX_GID}")
    for field in ("CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"):
        if int(status.get(field, "1"), 16) != 0:
            wrong.append(f"{field} {status.get(field)} is not empty")
    if status.get("NoNewPrivs", "0").strip() != "1":
        wrong.append("no_new_privs is not set")
    if wrong:
        return [], "the box is not as required: " + "; ".join(wrong)
    return [f"uid({BOX_UID})", "no_capabilities", "no_new_privs"], None


def _protect_in_box(settings: dict, limits: types.ModuleType, applied: list[str]) -> dict:
    """In the model's process, inside a box: limits, the walls checked, the audit hook."""
    applied = list(applied)
    done, skipped = _limits(settings, limits, settings["processes"])
    applied += [name for name in done if name not in applied]
    report = {"isolation": settings["isolation"], "applied": applied, "skipped": skipped}
    seen, wrong = _check_walls()
    applied += [name for name in seen if name not in applied]
    if wrong is None and "rlimit_nproc" in skipped:
        wrong = f"RLIMIT_NPROC could not be set: {skipped['rlimit_nproc']}"
    if wrong:
        report["failed"] = wrong
        return report
    sys.addaudithook(_audit_hook)
    applied.append("audit_hook")
    return report


def _write_line(fd: int, record: dict) -> None:
    os.write(fd, (json.dumps(record) + "\n").encode())


def _supervise(settings: dict, code: str, limits: types.ModuleType, applied: list[str], is_pid1: bool) -> int:
    """Run the code in a child and report how it ended; in PID 1, also reap what the code orphaned."""
    report_fd = settings["report_fd"]
    pid = os.fork()
    if pid == 0:
        report = _protect_in_box(settings, limits, applied)
        _write_line(report_fd, report)
        os.close(report_fd)
        ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 1, 0, 0, 0)  # the supervisor's 0 was inherited; nothing to hide now
        if "failed" in report:
            sys.stderr.write(f"code interpreter: {report['failed']}\n")
            return SETUP_FAILED
        return _run_code(code)
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # PID 1 ignores a signal it has no handler for
    while True:
        done, status = os.wait() if is_pid1 else os.waitpid(pid, 0)
        if done == pid:
            break
    if os.WIFSIGNALED(status):
        _write_line(report_fd, {"exit": {"signal": os.WTERMSIG(status)}})
        if not is_pid1:  # end the same way, so that bwrap's own status says so too
            signal.signal(os.WTERMSIG(status), signal.SIG_DFL)
            os.kill(os.getpid(), os.WTERMSIG(status))
        os._exit(128 + os.WTERMSIG(status))
    code_status = os.waitstatus_to_exitcode(status)
    _write_line(report_fd, {"exit": {"code": code_status}})
    os._exit(code_status)


def _fail(settings: dict, isolation: str, message: str) -> int:
    _write_line(settings["report_fd"], {"isolation": isolation, "applied": [], "skipped": {}, "failed": message})
    sys.stderr.write(f"code interpreter: {message}\n")
    return SETUP_FAILED


def main() -> int:
    settings = json.loads(sys.argv[1])
    with open(settings["code_path"], encoding="utf-8") as fh:
        code = fh.read()
    limits = _load(settings["limits_path"], "_verl_process_limits")
    isolation = settings["isolation"]
    if isolation == "unsafe_none":
        report = _protect_unsafe(settings, limits)
        _write_line(settings["report_fd"], report)
        os.close(settings["report_fd"])
        return _run_code(code)
    if isolation == "namespaces":
        box = _load(settings["ns_path"], "_verl_sandbox_ns")

        def failed_in_pid1(message: str) -> None:
            _fail(settings, isolation, message)

        try:
            applied = box.enter(settings["layout"], BOX_UID, BOX_GID, failed_in_pid1)
        except OSError as exc:
            return _fail(settings, isolation, f"namespaces box: {exc}")
        if box.join_session_keyring():
            applied.append("new_session_keyring")
        return _supervise(settings, code, limits, applied, is_pid1=True)
    # bubblewrap: the box exists already; what bwrap was asked for comes in the settings.
    ctypes.CDLL(None).prctl(PR_SET_DUMPABLE, 0, 0, 0, 0)  # no ptrace or /proc/<pid>/fd of this process
    os.environ.pop("PWD", None)  # bwrap's --chdir adds it; the environment is the trainer's list, nothing more
    applied = list(settings["bwrap_applied"])
    if _load(settings["ns_path"], "_verl_sandbox_ns").join_session_keyring():
        applied.append("new_session_keyring")
    return _supervise(settings, code, limits, applied, is_pid1=True)


def _run_code(code: str) -> int:
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
