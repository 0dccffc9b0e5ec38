"""Which box the code interpreter runs model-written code in: :func:`resolve_isolation`, :class:`Isolation`.

Modes (config ``isolation``):

* ``bubblewrap``: `bwrap <https://github.com/containers/bubblewrap>`_ (Debian/Ubuntu/Fedora package
  ``bubblewrap``) builds the box: new user, mount, PID, network, IPC and UTS namespaces, uid 65534 inside, no
  capabilities, ``no_new_privs``, no nested user namespaces, the layout of :mod:`verl.tools._box_layout`.
  When the trainer runs as root it first drops to the host uid/gid 65534 (so the box's uid is not the host's
  root), which requires every folder bound into the box to be reachable by that uid;
* ``namespaces``: the same box built by the child itself with the kernel's namespaces
  (:mod:`verl.tools._sandbox_ns`; x86_64 and aarch64);
* ``auto`` (default): ``bubblewrap`` where it works, else ``namespaces``, else an error;
* ``unsafe_none``: no box (the opt-out): the code runs as the trainer's user and sees what the trainer sees.

Each mode is probed once per process and interpreter by running a trivial program in it (the real start path,
not a guess); the answer is cached. When no box can be built, :class:`IsolationUnavailableError` says what is
missing and how to fix it.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
import tempfile
import threading
from pathlib import Path

import attrs

from verl.tools import _box_layout as layout
from verl.tools._box_layout import BOX_GID, BOX_UID, Interpreter

__all__ = [
    "MODES",
    "Isolation",
    "IsolationUnavailableError",
    "box_unavailable_reason",
    "diagnose_user_namespaces",
    "resolve_isolation",
]

MODES = ("auto", "bubblewrap", "namespaces", "unsafe_none")
BOXES = ("bubblewrap", "namespaces")
_PROBE_TIMEOUT_S = 60.0
_PROC_SYS = "/proc/sys"

_cache: dict[tuple, str | None] = {}
_cache_lock = threading.Lock()


class IsolationUnavailableError(RuntimeError):
    """No box can be built for model-written code; the message names what is missing and the fixes."""


@attrs.frozen
class Isolation:
    """The isolation a code interpreter uses.

    Attributes:
        mode: ``"bubblewrap"``, ``"namespaces"`` or ``"unsafe_none"``.
        interpreter: what the box runs (None for ``unsafe_none``, which runs ``SandboxLimits.python``).
        bwrap: the ``bwrap`` executable (bubblewrap mode), else None.
        disable_userns: bwrap knows ``--disable-userns`` (0.8+): the code cannot create user namespaces.
    """

    mode: str
    interpreter: Interpreter | None = None
    bwrap: str | None = None
    disable_userns: bool = False

    @property
    def drops_to_box_uid(self) -> bool:
        """Whether the trainer starts the box as host uid/gid 65534 (it runs as root)."""
        return self.mode != "unsafe_none" and os.geteuid() == 0

    def describe(self) -> str:
        """One line for logs and ``verl train``'s start-up printout."""
        if self.mode == "unsafe_none":
            return (
                "isolation unsafe_none: NO box, model-written code runs as the trainer's user and can read and "
                "write what the trainer can (opted out in the tool config)"
            )
        host = f"host uid {BOX_UID}" if os.geteuid() == 0 else f"host uid {os.geteuid()} (the trainer's)"
        how = f"bubblewrap ({self.bwrap})" if self.mode == "bubblewrap" else "kernel namespaces"
        return (
            f"isolation {self.mode}: {how}; uid {BOX_UID} inside ({host}), own user/mount/PID/network/IPC/UTS "
            f"namespaces, read-only system, only the call's folder writable, no capabilities; "
            f"{self.interpreter.describe()}"
        )


def diagnose_user_namespaces(proc_sys: str | None = None) -> list[str]:
    """The kernel settings that refuse user namespaces, each with its fix (empty: none found).

    ``proc_sys``: the sysctl tree to read (None: this machine's ``/proc/sys``).
    """
    proc_sys = proc_sys or _PROC_SYS
    found = []
    checks = (
        ("user/max_user_namespaces", "0", "user.max_user_namespaces = 0", "sysctl -w user.max_user_namespaces=15000"),
        (
            "kernel/unprivileged_userns_clone",
            "0",
            "kernel.unprivileged_userns_clone = 0",
            "sysctl -w kernel.unprivileged_userns_clone=1",
        ),
        (
            "kernel/apparmor_restrict_unprivileged_userns",
            "1",
            "kernel.apparmor_restrict_unprivileged_userns = 1 (AppArmor)",
            "give bwrap an AppArmor profile that allows userns, or sysctl -w "
            "kernel.apparmor_restrict_unprivileged_userns=0",
        ),
    )
    for name, bad, what, fix in checks:
        try:
            value = Path(proc_sys, name).read_text().strip()
        except OSError:
            continue
        if value == bad:
            found.append(f"user namespaces are disabled by {what}: {fix}")
    return found


def _bwrap_reason(interpreter: Interpreter) -> tuple[str | None, str | None]:
    """``(bwrap path, None)`` or ``(None, why bubblewrap cannot be used)`` before trying it."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return None, (
            "bwrap not found on PATH (install bubblewrap: apt-get install bubblewrap, dnf install bubblewrap)"
        )
    if os.geteuid() == 0:
        # bwrap resolves every bound path as the box's host uid: all must be reachable by it.
        for path in (*interpreter.roots, interpreter.executable, tempfile.gettempdir()):
            blocked = layout.unreachable_by(BOX_UID, BOX_GID, path)
            if blocked:
                return None, (
                    f"the trainer runs as root, so the box starts as uid {BOX_UID}, which cannot reach {path}: "
                    f"{blocked} is closed to it. Run the trainer as a non-root user, set the tool's config.python "
                    f"to an interpreter installed where every user can read it (e.g. /usr/bin/python3), or make "
                    f"the folder readable by uid {BOX_UID} (the call folders are made under TMPDIR: it must be "
                    f"reachable too)"
                )
    return bwrap, None


def _probe(isolation: Isolation) -> str | None:
    """Run ``print("ok")`` in ``isolation``; None when it ran with the box in force, else why not."""
    from verl.tools import sandbox  # the launcher; imported here because it imports this module

    key = (isolation.mode, isolation.interpreter, isolation.bwrap, os.geteuid())
    with _cache_lock:
        if key in _cache:
            return _cache[key]
        try:
            result = sandbox.run_python_sync(
                'print("ok")', sandbox.SandboxLimits(timeout_s=_PROBE_TIMEOUT_S), isolation
            )
        except (OSError, RuntimeError) as exc:
            reason: str | None = f"{type(exc).__name__}: {exc}"
        else:
            ok = result.stdout == "ok\n" and result.exit_code == 0
            reason = None if ok else (result.stderr.strip().splitlines() or [f"exit status {result.exit_code}"])[-1]
        _cache[key] = reason
        return reason


@functools.cache
def _bwrap_has_disable_userns(bwrap: str) -> bool:
    try:
        out = subprocess.run([bwrap, "--help"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.SubprocessError):
        return False
    return "--disable-userns" in out.stdout


def resolve_isolation(mode: str, python: str | None) -> Isolation:
    """The isolation for config ``isolation: mode`` and ``python`` (None: the trainer's interpreter).

    Probes each candidate box once per process (cached).

    Raises:
        ValueError: ``mode`` is not one of :data:`MODES`, or ``python`` is not a usable interpreter.
        IsolationUnavailableError: the mode asked for (or, for ``auto``, every box) cannot be built here; the
            message says what is missing and how to fix it, or how to opt out.
    """
    if mode not in MODES:
        raise ValueError(f"config.isolation={mode!r} is not a mode; use one of {list(MODES)}")
    if mode == "unsafe_none":
        return Isolation(mode="unsafe_none")
    interpreter = layout.dedicated_interpreter(python) if python else layout.trainer_interpreter()
    reasons: dict[str, str] = {}
    for candidate in BOXES if mode == "auto" else (mode,):
        if candidate == "bubblewrap":
            bwrap, reason = _bwrap_reason(interpreter)
            isolation = Isolation(
                mode="bubblewrap",
                interpreter=interpreter,
                bwrap=bwrap,
                disable_userns=bool(bwrap) and _bwrap_has_disable_userns(bwrap),
            )
        else:
            from verl.tools import _sandbox_ns

            reason = _sandbox_ns.unavailable_reason()
            isolation = Isolation(mode="namespaces", interpreter=interpreter)
        if reason is None:
            reason = _probe(isolation)
        if reason is None:
            return isolation
        if "namespace" in reason or "unshare" in reason or "Operation not permitted" in reason:
            hints = diagnose_user_namespaces()
            if hints:
                reason += "; " + "; ".join(hints)
        reasons[candidate] = reason
    lines = "\n".join(f"  - {name}: {why}" for name, why in reasons.items())
    raise IsolationUnavailableError(
        f"code_interpreter: cannot isolate model-written code on this machine (isolation: {mode}):\n{lines}\n"
        "Fix one of these, use a remote sandbox (verl.tools.sandbox_fusion.SandboxFusionTool), or opt out with "
        "isolation: unsafe_none in the tool's config (the code then runs as the trainer's user and can read and "
        "write the trainer's files, including checkpoints)."
    )


def box_unavailable_reason() -> str | None:
    """Why the default (``isolation: auto``, the trainer's interpreter) cannot build a box here; None when it
    can. For callers that must decide before building a tool (tests skip with this reason)."""
    try:
        resolve_isolation("auto", None)
    except (IsolationUnavailableError, ValueError) as exc:
        return str(exc)
    return None
