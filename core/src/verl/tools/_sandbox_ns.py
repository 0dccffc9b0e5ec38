"""The code interpreter's box built from the kernel's namespaces (``isolation: namespaces``), stdlib only.

Loaded by path by :mod:`verl.tools._sandbox_child` (a ``python -I`` script) when bubblewrap is not used. The
trainer passes a *layout* (what to bind where, see :mod:`verl.tools._box_layout`); :func:`enter` builds the box
around the calling process and returns inside it, in a new process that is PID 1 of a new PID namespace:

1. ``unshare`` of the mount, PID, network, IPC and UTS namespaces, plus a user namespace when the trainer is not
   root (its uid and gid are mapped to 65534 inside, ``setgroups`` denied);
2. a tmpfs as the new root holding only the layout: read-only bind mounts of the system folders and the
   interpreter, empty read-only tmpfs over the folders to hide (site-packages), a read-only ``/dev`` with the
   null / zero / full / random / urandom nodes, and the call's folder read-write at ``/tmp``;
3. ``fork``: the child is PID 1 of the new PID namespace (when it exits, the kernel kills every process left in
   it); the parent stays outside, waits for it and exits with its status;
4. in PID 1: a new ``/proc``, ``pivot_root`` into the new root, the old root detached, every mount read-only
   but ``/tmp``, the host name ``sandbox``, the namespace's own loopback interface up; when the trainer is root, the host uid/gid 65534 (``setresuid``) and
   then a user namespace of its own (so ``RLIMIT_NPROC`` counts this box's processes only); no further user
   namespaces (``user.max_user_namespaces = 0`` inside); an empty capability set (bounding, ambient,
   permitted, effective, inheritable); ``no_new_privs``; a new session keyring; ``PR_SET_PDEATHSIG``.

Only x86_64 and aarch64: ``pivot_root`` and ``keyctl`` have no libc wrapper, and those are the architectures
whose system call numbers this module carries. Any step that fails raises :class:`BoxError` naming the step and
the error; nothing of the model's runs then.
"""

from __future__ import annotations

import ctypes
import fcntl
import os
import platform
import signal
import socket
import struct
import sys

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
CLONE_NEWIPC = 0x08000000
CLONE_NEWUSER = 0x10000000
CLONE_NEWPID = 0x20000000
CLONE_NEWNET = 0x40000000

MS_RDONLY = 0x1
MS_NOSUID = 0x2
MS_NODEV = 0x4
MS_NOEXEC = 0x8
MS_REMOUNT = 0x20
MS_BIND = 0x1000
MS_REC = 0x4000
MS_PRIVATE = 0x40000
MNT_DETACH = 0x2

PR_SET_PDEATHSIG = 1
PR_SET_DUMPABLE = 4
PR_CAPBSET_DROP = 24
PR_SET_NO_NEW_PRIVS = 38
PR_CAP_AMBIENT = 47
PR_CAP_AMBIENT_CLEAR_ALL = 4
LINUX_CAPABILITY_VERSION_3 = 0x20080522
KEYCTL_JOIN_SESSION_KEYRING = 1
SIOCGIFFLAGS = 0x8913
SIOCSIFFLAGS = 0x8914
IFF_UP = 0x1

#: System call numbers without a libc wrapper, per ``platform.machine()``.
SYSCALLS = {
    "x86_64": {"pivot_root": 155, "keyctl": 250},
    "aarch64": {"pivot_root": 41, "keyctl": 219},
}

#: Mount options (``/proc/self/mountinfo``) a read-only remount must keep: in a user namespace they are locked.
_KEPT_OPTIONS = {"nosuid": MS_NOSUID, "nodev": MS_NODEV, "noexec": MS_NOEXEC}

DEVICES = ("null", "zero", "full", "random", "urandom")


class BoxError(OSError):
    """A step of building the box failed; the message names the step and the kernel's error."""


_libc = ctypes.CDLL(None, use_errno=True)


def _check(result: int, what: str) -> int:
    if result < 0:
        err = ctypes.get_errno()
        raise BoxError(err, f"{what}: {os.strerror(err)}")
    return result


def _mount(source: str | None, target: str | None, fstype: str | None, flags: int, data: str | None = None) -> None:
    enc = [None if v is None else v.encode() for v in (source, target, fstype, data)]
    _check(
        _libc.mount(enc[0], enc[1], enc[2], ctypes.c_ulong(flags), enc[3]),
        f"mount({source!r}, {target!r}, {fstype!r}, {flags:#x})",
    )


def _prctl(option: int, arg: int, what: str) -> None:
    _check(_libc.prctl(option, ctypes.c_ulong(arg), ctypes.c_ulong(0), ctypes.c_ulong(0), ctypes.c_ulong(0)), what)


def _syscall(name: str, *args: object) -> int:
    return _libc.syscall(ctypes.c_long(SYSCALLS[platform.machine()][name]), *args)


def unavailable_reason() -> str | None:
    """Why this module cannot build a box on this machine (None: it may, the kernel decides)."""
    if not sys.platform.startswith("linux"):
        return f"kernel namespaces are Linux-only (this is {sys.platform})"
    if platform.machine() not in SYSCALLS:
        return (
            f"the namespaces box knows the system call numbers of {sorted(SYSCALLS)} only; this machine is "
            f"{platform.machine()} (install bubblewrap instead)"
        )
    return None


def _write(path: str, text: str) -> None:
    fd = os.open(path, os.O_WRONLY)
    try:
        os.write(fd, text.encode())
    except OSError as exc:
        raise BoxError(exc.errno, f"write {text.strip()!r} to {path}: {exc.strerror}") from None
    finally:
        os.close(fd)


def _unshare_user(inside_uid: int, inside_gid: int, more_flags: int, what: str) -> None:
    """Enter a new user namespace (and ``more_flags``) mapping this process's uid/gid to ``inside_*``.

    Mapping one's own ids needs no privilege; ``setgroups`` is denied first, as the kernel requires then.
    """
    uid, gid = os.geteuid(), os.getegid()  # read before: inside, unmapped ids read as the overflow id
    _check(_libc.unshare(ctypes.c_int(CLONE_NEWUSER | more_flags)), what)
    _write("/proc/self/setgroups", "deny")
    _write("/proc/self/uid_map", f"{inside_uid} {uid} 1\n")
    _write("/proc/self/gid_map", f"{inside_gid} {gid} 1\n")


def _inside(root: str, path: str) -> str:
    return os.path.join(root, path.lstrip("/"))


def _make_target(target: str, is_dir: bool) -> None:
    os.makedirs(target if is_dir else os.path.dirname(target), exist_ok=True)
    if not is_dir and not os.path.exists(target):
        os.close(os.open(target, os.O_WRONLY | os.O_CREAT, 0o444))


def _build_root(root: str, layout: dict) -> None:
    """Mount the new root's tmpfs at ``root`` and everything of ``layout`` into it (still writable here)."""
    _mount("tmpfs", root, "tmpfs", MS_NOSUID | MS_NODEV, "mode=0755,size=1m")
    for target, link in layout["symlinks"]:
        os.makedirs(os.path.dirname(_inside(root, link)), exist_ok=True)
        os.symlink(target, _inside(root, link))
    for source, dest in layout["ro_binds"]:
        target = _inside(root, dest)
        _make_target(target, os.path.isdir(source))
        _mount(source, target, None, MS_BIND | MS_REC)
    for dest in layout["masks"]:  # empty, read-only: the folder exists but holds nothing
        _mount("tmpfs", _inside(root, dest), "tmpfs", MS_RDONLY | MS_NOSUID | MS_NODEV, "mode=0555,size=4k")
    dev = _inside(root, "/dev")
    os.makedirs(dev, exist_ok=True)
    for name in DEVICES:
        _make_target(os.path.join(dev, name), False)
        _mount(f"/dev/{name}", os.path.join(dev, name), None, MS_BIND)
    for name, target in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1")):
        os.symlink(target, os.path.join(dev, name))
    os.symlink("/proc/self/fd/2", os.path.join(dev, "stderr"))
    for source, dest in layout["rw_binds"]:
        target = _inside(root, dest)
        _make_target(target, True)
        _mount(source, target, None, MS_BIND | MS_REC)
    os.makedirs(_inside(root, "/proc"), exist_ok=True)


def _unescape(field: str) -> str:
    # mountinfo writes space, tab, newline and backslash as \ooo
    out, i = [], 0
    while i < len(field):
        if field[i] == "\\" and field[i + 1 : i + 4].isdigit() and i + 4 <= len(field):
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


def _remount_read_only(writable: set[str]) -> None:
    """Every mount of this namespace read-only except ``writable`` and /proc, keeping the locked options."""
    with open("/proc/self/mountinfo", encoding="utf-8") as fh:
        mounts = [line.split() for line in fh]
    for fields in mounts:
        point, options = _unescape(fields[4]), fields[5].split(",")
        if point in writable or point == "/proc" or point.startswith("/proc/") or "ro" in options:
            continue
        flags = MS_REMOUNT | MS_BIND | MS_RDONLY | MS_NOSUID
        if not point.startswith("/dev/"):  # the device nodes' own binds must stay usable
            flags |= MS_NODEV
        for name, bit in _KEPT_OPTIONS.items():
            if name in options:
                flags |= bit
        _mount(None, point, None, flags)


def _drop_capabilities() -> None:
    with open("/proc/sys/kernel/cap_last_cap", encoding="ascii") as fh:
        last = int(fh.read())
    for cap in range(last + 1):
        _prctl(PR_CAPBSET_DROP, cap, f"prctl(PR_CAPBSET_DROP, {cap})")
    _check(_libc.prctl(PR_CAP_AMBIENT, ctypes.c_ulong(PR_CAP_AMBIENT_CLEAR_ALL), 0, 0, 0), "clear ambient capabilities")
    header = (ctypes.c_uint32 * 2)(LINUX_CAPABILITY_VERSION_3, 0)
    data = (ctypes.c_uint32 * 6)()  # effective, permitted, inheritable x 2 words, all zero
    _check(_libc.capset(header, data), "capset(all zero)")


def _loopback_up() -> None:
    """Bring up ``lo`` in the new network namespace (as bubblewrap does): the box's own 127.0.0.1 works, and
    is not the host's."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        request = struct.pack("16sH14x", b"lo", 0)
        flags = struct.unpack("16sH14x", fcntl.ioctl(sock.fileno(), SIOCGIFFLAGS, request))[1]
        try:
            fcntl.ioctl(sock.fileno(), SIOCSIFFLAGS, struct.pack("16sH14x", b"lo", flags | IFF_UP))
        except OSError as exc:
            raise BoxError(exc.errno, f"bring up the loopback interface: {exc.strerror}") from None


def _wait_and_mirror(pid: int) -> None:
    """Outside the box: wait for PID 1 and end this process the same way (exit status or signal)."""
    _, status = os.waitpid(pid, 0)
    if os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        signal.signal(sig, signal.SIG_DFL)
        os.kill(os.getpid(), sig)
    os._exit(os.waitstatus_to_exitcode(status) if os.WIFEXITED(status) else 1)


def enter(layout: dict, uid: int, gid: int, report_failure: object) -> list[str]:
    """Build the box of ``layout`` and return in its PID 1, running as ``uid``/``gid`` inside, unprivileged.

    ``report_failure(message)`` is called (then the process exits 125) when a step fails after the fork, where
    raising would have no caller to reach. Returns the names of the protections in force.

    Raises:
        BoxError: a step before the fork failed (``unshare`` refused, a mount failed, ...).
    """
    reason = unavailable_reason()
    if reason:
        raise BoxError(reason)
    as_root = os.geteuid() == 0
    flags = CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWIPC | CLONE_NEWUTS
    names = "CLONE_NEWNS|CLONE_NEWPID|CLONE_NEWNET|CLONE_NEWIPC|CLONE_NEWUTS"
    if as_root:  # privileged already: the user namespace comes after the switch to the box's host uid
        _check(_libc.unshare(ctypes.c_int(flags)), f"unshare({names})")
    else:
        _unshare_user(uid, gid, flags, f"unshare(CLONE_NEWUSER|{names})")
    _mount(None, "/", None, MS_REC | MS_PRIVATE)  # nothing done here reaches the host's mounts
    root = layout["root"]
    _build_root(root, layout)
    lifeline_r, lifeline_w = os.pipe()
    pid = os.fork()
    if pid:
        os.close(lifeline_r)
        _wait_and_mirror(pid)
    os.close(lifeline_w)
    try:
        applied = _become_pid1(root, layout, uid, gid, as_root, lifeline_r)
    except OSError as exc:
        report_failure(f"namespaces box: {exc}")
        os._exit(125)
    return applied


def _become_pid1(root: str, layout: dict, uid: int, gid: int, as_root: bool, lifeline: int) -> list[str]:
    applied = ["mount_namespace", "pid_namespace", "network_namespace", "ipc_namespace", "uts_namespace"]
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(PR_SET_PDEATHSIG)")
    # A new /proc before the old root goes: the kernel lets a user namespace mount proc only while one is visible.
    _mount("proc", _inside(root, "/proc"), "proc", MS_NOSUID | MS_NODEV | MS_NOEXEC)
    os.chdir(root)
    _check(_syscall("pivot_root", b".", b"."), "pivot_root")
    _check(_libc.umount2(b".", ctypes.c_int(MNT_DETACH)), "detach the old root")
    writable = {dest for _, dest in layout["rw_binds"]}
    _remount_read_only(writable)
    os.chdir(layout["chdir"])
    _check(_libc.sethostname(b"sandbox", ctypes.c_size_t(7)), "sethostname")
    _loopback_up()
    if as_root:
        os.setgroups([])
        os.setresgid(gid, gid, gid)
        os.setresuid(uid, uid, uid)  # from root to non-root: the kernel clears every capability
        # ... and makes the process non-dumpable, which gives /proc/self/uid_map to root: take it back.
        _prctl(PR_SET_DUMPABLE, 1, "prctl(PR_SET_DUMPABLE, 1)")
        _unshare_user(uid, gid, 0, f"unshare(CLONE_NEWUSER) as uid {uid}")
    applied.append("user_namespace")
    try:
        _write("/proc/sys/user/max_user_namespaces", "0")  # this namespace's own limit: no nested ones
        applied.append("no_nested_user_namespaces")
    except OSError:
        pass  # reported as not applied by its absence; the capabilities below are dropped either way
    _drop_capabilities()
    _prctl(PR_SET_NO_NEW_PRIVS, 1, "prctl(PR_SET_NO_NEW_PRIVS)")
    applied += ["no_capabilities", "no_new_privs"]
    # Credential changes reset these two, so they are set last.
    _prctl(PR_SET_PDEATHSIG, signal.SIGKILL, "prctl(PR_SET_PDEATHSIG)")
    _prctl(PR_SET_DUMPABLE, 0, "prctl(PR_SET_DUMPABLE, 0)")
    os.set_blocking(lifeline, False)
    try:
        if os.read(lifeline, 1) == b"":  # the process outside is gone: so is the caller
            os._exit(125)
    except BlockingIOError:
        pass
    os.close(lifeline)
    applied.append("die_with_parent")
    return applied


def join_session_keyring() -> bool:
    """A new, empty session keyring, so the trainer's keys are not this process's; False where refused."""
    machine = platform.machine()
    if machine not in SYSCALLS:
        return False
    number = SYSCALLS[machine]["keyctl"]
    return _libc.syscall(ctypes.c_long(number), ctypes.c_int(KEYCTL_JOIN_SESSION_KEYRING), None) >= 0
