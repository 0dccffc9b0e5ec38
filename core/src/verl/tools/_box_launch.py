"""How one code-interpreter call is started in its isolation mode: the call folder and the command line.

:func:`call_folder` makes the throw-away folder (``code.py``, ``work/`` = ``/tmp`` inside, ``box/`` = the new
root's mount point in namespaces mode) and deletes it afterwards; :func:`build_launch` gives the command, its
environment and the file descriptors it inherits:

* ``unsafe_none``: ``python -I -u _sandbox_child.py SETTINGS`` in ``work/`` (the child does what it can alone);
* ``namespaces``: the same command with the interpreter of the box and the box's layout in ``SETTINGS`` (the
  child builds the box, :mod:`verl.tools._sandbox_ns`); ``-S`` (no ``site``) when the box shows the standard
  library only;
* ``bubblewrap``: ``bwrap <namespaces, layout> -- python -I -u /.verl/_sandbox_child.py SETTINGS``; the child
  script, its two helpers and ``code.py`` are copied into the box read-only by bwrap from descriptors the
  trainer opened (``--ro-bind-data``), so they need not be reachable by the box's uid. As root, the trainer
  starts bwrap as uid/gid 65534 (no supplementary groups): bwrap then maps 65534 inside to 65534 outside.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs

from verl.tools._box_layout import BOX_GID, BOX_UID, system_layout
from verl.tools.isolation import Isolation

__all__ = ["CallFolder", "Launch", "build_launch", "call_folder"]

_HERE = Path(__file__).resolve().parent
CHILD = _HERE / "_sandbox_child.py"
NS = _HERE / "_sandbox_ns.py"
LIMITS = _HERE.parent / "rewards" / "process_limits.py"
BOX_FILES = "/.verl"  # where bwrap puts the child script, its helpers and the code inside the box
BOX_TMP = "/tmp"
_BWRAP_NAMESPACES = [
    "user_namespace",
    "mount_namespace",
    "pid_namespace",
    "network_namespace",
    "ipc_namespace",
    "uts_namespace",
]


@attrs.define
class CallFolder:
    """The throw-away folder of one call: ``root`` (0711), ``code`` (the program), ``work`` (its ``/tmp``)."""

    root: str
    code: str
    work: str


@attrs.frozen
class Launch:
    """What to start: ``argv`` with ``env`` in ``cwd``, inheriting ``pass_fds``; as ``user``/``group`` (with no
    supplementary groups) when they are not None."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    pass_fds: tuple[int, ...]
    user: int | None = None
    group: int | None = None

    def subprocess_kwargs(self) -> dict[str, Any]:
        """Keyword arguments for ``subprocess.Popen`` / ``asyncio.create_subprocess_exec`` (no preexec_fn)."""
        kwargs: dict[str, Any] = {"cwd": self.cwd, "env": self.env, "pass_fds": self.pass_fds}
        if self.user is not None:
            kwargs.update(user=self.user, group=self.group, extra_groups=[])
        return kwargs


def environment(home: str) -> dict[str, str]:
    """The program's whole environment: nothing of the trainer's (tokens, cluster addresses) reaches it."""
    return {
        "PATH": "/usr/local/bin:/usr/bin:/bin",
        "HOME": home,
        "TMPDIR": home,
        "LANG": "C.UTF-8",
        "LC_ALL": "C.UTF-8",
        "OMP_NUM_THREADS": "1",
        "OPENBLAS_NUM_THREADS": "1",
        "MKL_NUM_THREADS": "1",
    }


def _remove_tree(path: str) -> None:
    """Delete the call's folder even where the program removed its own permissions on something in it."""

    def retry(func: Any, target: str, _exc: Any) -> None:
        with contextlib.suppress(OSError):
            for path in (os.path.dirname(target), target):
                if not os.path.islink(path):  # chmod follows links: never onto whatever the program linked to
                    os.chmod(path, stat.S_IRWXU)
        with contextlib.suppress(OSError):
            if func in (os.rmdir, os.unlink, os.remove):
                func(target)
            elif os.path.isdir(target) and not os.path.islink(target):  # it could not be opened or listed
                shutil.rmtree(target, ignore_errors=True)

    shutil.rmtree(path, onerror=retry)  # onexc is 3.12+; onerror still works there


@contextlib.contextmanager
def call_folder(code: str, isolation: Isolation) -> Iterator[CallFolder]:
    """A fresh folder in the temporary folder holding ``code``; deleted (whatever is in it) on exit."""
    root = tempfile.mkdtemp(prefix="verl-code-")
    try:
        work = os.path.join(root, "work")
        os.mkdir(work, 0o700)
        code_path = os.path.join(root, "code.py")
        Path(code_path).write_text(code, encoding="utf-8")
        if isolation.mode == "namespaces":
            os.mkdir(os.path.join(root, "box"), 0o700)
        if isolation.drops_to_box_uid:
            # The code runs as host uid 65534: its folder is that uid's; the root only lets it pass through.
            os.chown(work, BOX_UID, BOX_GID)
            os.chmod(root, 0o711)
        yield CallFolder(root=root, code=code_path, work=work)
    finally:
        _remove_tree(root)


def _settings(limits: Any, isolation: Isolation, report_fd: int) -> dict[str, Any]:
    return {
        "isolation": isolation.mode,
        "report_fd": report_fd,
        "memory_mb": limits.memory_mb,
        "cpu_s": limits.cpu_seconds(),
        "file_size_mb": limits.file_size_mb,
        "open_files": limits.open_files,
        "processes": limits.processes,
        "network_namespace": limits.network_namespace,
    }


def _bwrap_argv(isolation: Isolation, folder: CallFolder, data_fds: dict[str, int]) -> list[str]:
    fixed = system_layout(isolation.interpreter)
    # --as-pid-1: the child script is PID 1 (signals from inside cannot kill it; its exit ends the namespace).
    argv = [isolation.bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--as-pid-1"]
    if isolation.disable_userns:
        argv.append("--disable-userns")
    argv += ["--uid", str(BOX_UID), "--gid", str(BOX_GID), "--hostname", "sandbox"]
    for target, link in fixed["symlinks"]:
        argv += ["--symlink", target, link]
    for source, dest in fixed["ro_binds"]:
        argv += ["--ro-bind", source, dest]
    for dest in fixed["masks"]:
        argv += ["--perms", "0555", "--size", "4096", "--tmpfs", dest, "--remount-ro", dest]
    argv += ["--proc", "/proc", "--dev", "/dev", "--remount-ro", "/dev"]
    argv += ["--bind", folder.work, BOX_TMP, "--chdir", BOX_TMP]
    for name, fd in data_fds.items():
        argv += ["--perms", "0444", "--ro-bind-data", str(fd), f"{BOX_FILES}/{name}"]
    argv += ["--remount-ro", "/"]
    return argv


def _flags(isolation: Isolation) -> list[str]:
    # Standard library only: no site module either (its folders are hidden anyway, and in namespaces mode it would
    # run the interpreter's .pth files on the host before the box exists).
    return ["-I", "-u"] if isolation.interpreter.packages else ["-I", "-S", "-u"]


def build_launch(
    isolation: Isolation, limits: Any, folder: CallFolder, report_fd: int, data_fds: dict[str, int]
) -> Launch:
    """The command of one call. ``data_fds`` (bubblewrap only): open descriptors of ``_sandbox_child.py``,
    ``_sandbox_ns.py``, ``process_limits.py`` and ``code.py``, from :func:`open_box_files`."""
    settings = _settings(limits, isolation, report_fd)
    if isolation.mode == "unsafe_none":
        settings.update(code_path=folder.code, limits_path=str(LIMITS))
        argv = [limits.python, "-I", "-u", str(CHILD), json.dumps(settings)]
        return Launch(argv=argv, env=environment(folder.work), cwd=folder.work, pass_fds=(report_fd,))
    if isolation.mode == "namespaces":
        box = system_layout(isolation.interpreter)
        box.update(root=os.path.join(folder.root, "box"), rw_binds=[[folder.work, BOX_TMP]], chdir=BOX_TMP)
        settings.update(code_path=folder.code, limits_path=str(LIMITS), ns_path=str(NS), layout=box)
        argv = [isolation.interpreter.executable, *_flags(isolation), str(CHILD), json.dumps(settings)]
        return Launch(argv=argv, env=environment(BOX_TMP), cwd=folder.work, pass_fds=(report_fd,))
    settings.update(
        code_path=f"{BOX_FILES}/code.py",
        limits_path=f"{BOX_FILES}/process_limits.py",
        ns_path=f"{BOX_FILES}/_sandbox_ns.py",
        bwrap_applied=["bubblewrap", *_BWRAP_NAMESPACES, "die_with_parent"]
        + (["no_nested_user_namespaces"] if isolation.disable_userns else []),
    )
    child = [
        isolation.interpreter.executable,
        *_flags(isolation),
        f"{BOX_FILES}/_sandbox_child.py",
        json.dumps(settings),
    ]
    argv = _bwrap_argv(isolation, folder, data_fds) + ["--", *child]
    drop = isolation.drops_to_box_uid
    return Launch(
        argv=argv,
        env=environment(BOX_TMP),
        cwd="/",
        pass_fds=(report_fd, *data_fds.values()),
        user=BOX_UID if drop else None,
        group=BOX_GID if drop else None,
    )


@contextlib.contextmanager
def open_box_files(isolation: Isolation, folder: CallFolder) -> Iterator[dict[str, int]]:
    """Read-only descriptors of the files bwrap copies into the box (none for the other modes); closed on exit."""
    if isolation.mode != "bubblewrap":
        yield {}
        return
    fds: dict[str, int] = {}
    try:
        for name, path in (
            ("_sandbox_child.py", CHILD),
            ("_sandbox_ns.py", NS),
            ("process_limits.py", LIMITS),
            ("code.py", folder.code),
        ):
            fds[name] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        yield fds
    finally:
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
