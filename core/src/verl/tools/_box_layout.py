"""What the code interpreter's box holds, for both isolation modes (bubblewrap and kernel namespaces).

Inside, ``/`` is an empty read-only tmpfs holding only:

* the system, read-only: ``/usr`` and the ``/bin`` ``/sbin`` ``/lib*`` folders (as the symlinks they are on a
  merged-/usr system, else bound), and from ``/etc`` only ``ld.so.cache`` (the dynamic loader needs it) and
  ``localtime``;
* the interpreter (:class:`Interpreter`), read-only at its own path (shared libraries name their absolute
  location); by default the trainer's *base* interpreter with the standard library only (every site-packages
  folder and every folder of the trainer's ``sys.path`` under it shows empty); a dedicated interpreter
  (config ``python``) with its own packages;
* a new ``/proc`` (the box's PID namespace only) and a read-only ``/dev`` with ``null zero full random urandom``;
* the call's throw-away folder read-write at ``/tmp`` (the working folder, ``HOME`` and ``TMPDIR``): the only
  writable place.

Nothing else of the host exists inside: not the run folder, checkpoints, the home folder (only the folders
leading to an interpreter installed under it, themselves empty but for it), the trainer's virtual environment
or site-packages, ``/etc/shadow``, ``/sys``, other users' files.
"""

from __future__ import annotations

import functools
import json
import os
import site
import stat
import subprocess
import sys
import sysconfig
from collections.abc import Iterable

import attrs

__all__ = ["BOX_GID", "BOX_UID", "Interpreter", "dedicated_interpreter", "system_layout", "trainer_interpreter"]

#: The unprivileged uid/gid the code runs as inside the box (``nobody`` / ``nogroup``); also the host uid the
#: trainer drops to before starting the box when it runs as root.
BOX_UID = BOX_GID = 65534
SYSTEM_DIRS = ("/usr", "/bin", "/sbin", "/lib", "/lib32", "/lib64", "/libx32")
ETC_FILES = ("/etc/ld.so.cache", "/etc/localtime")

_ASK = (
    "import json, os, site, sys\n"
    "print(json.dumps({'prefixes': [sys.prefix, sys.exec_prefix, sys.base_prefix, sys.base_exec_prefix],"
    " 'executable': sys.executable, 'path': [p for p in sys.path if p],"
    " 'site': site.getsitepackages() if hasattr(site, 'getsitepackages') else [],"
    " 'version': '.'.join(map(str, sys.version_info[:3]))}))"
)


@attrs.frozen
class Interpreter:
    """The Python a box runs and what of its installation is visible inside.

    Attributes:
        executable: the path run inside the box (the same path as on the host).
        roots: real paths of the folders bound read-only at their own path (none under ``/usr``: bound anyway).
        hidden: real paths of folders under a bound folder shown as an empty read-only tmpfs.
        packages: whether its installed packages are visible (a dedicated interpreter) or only the standard
            library (the default).
        version: ``"3.11.7"``.
    """

    executable: str
    roots: tuple[str, ...]
    hidden: tuple[str, ...]
    packages: bool
    version: str

    def describe(self) -> str:
        """One line: the executable, the Python version and what of its packages is visible."""
        what = "with its installed packages" if self.packages else "standard library only"
        return f"Python {self.version} at {self.executable} ({what})"


def _under(path: str, folder: str) -> bool:
    return path == folder or path.startswith(folder.rstrip("/") + "/")


def _outermost(paths: Iterable[str]) -> tuple[str, ...]:
    """The paths not inside another of them, sorted."""
    kept: list[str] = []
    for path in sorted(set(paths), key=len):
        if not any(_under(path, k) for k in kept):
            kept.append(path)
    return tuple(sorted(kept))


def _real_dirs(paths: Iterable[str]) -> set[str]:
    return {os.path.realpath(p) for p in paths if p and os.path.isdir(p)}


def _bound_system() -> tuple[str, ...]:
    return tuple(os.path.realpath(d) for d in SYSTEM_DIRS if os.path.isdir(d))


def _stdlib_dirs() -> set[str]:
    paths = sysconfig.get_paths()
    dirs = _real_dirs(paths[k] for k in ("stdlib", "platstdlib"))
    return dirs | _real_dirs(os.path.join(d, "lib-dynload") for d in list(dirs))


def trainer_code_dirs() -> set[str]:
    """Real paths of the trainer's own code folders: site-packages (user and system) and every ``sys.path``
    entry that is not the standard library. These are never visible in a box unless a dedicated interpreter
    uses the same folder."""
    candidates = list(sys.path)
    if hasattr(site, "getsitepackages"):
        candidates += site.getsitepackages()
    candidates.append(site.getusersitepackages())
    return _real_dirs(candidates) - _stdlib_dirs()


def _hidden(candidates: set[str], roots: tuple[str, ...], keep: Iterable[str]) -> tuple[str, ...]:
    """The candidates inside a bound folder, except one that would cover a bound folder itself or a path of
    ``keep`` (the interpreter and its standard library: a ``PYTHONPATH=/usr`` must not empty the box)."""
    visible = roots + _bound_system()
    kept = [os.path.realpath(p) for p in keep]
    return _outermost(
        d for d in candidates if any(_under(d, r) and d != r for r in visible) and not any(_under(k, d) for k in kept)
    )


def trainer_interpreter() -> Interpreter:
    """The default: the trainer's base interpreter (not its virtual environment), standard library only."""
    base = getattr(sys, "_base_executable", None) or sys.executable
    executable = os.path.realpath(base)
    prefixes = _real_dirs([sys.base_prefix, sys.base_exec_prefix])
    roots = tuple(r for r in _outermost(prefixes) if not any(_under(r, s) for s in _bound_system()))
    base_site = (
        site.getsitepackages([sys.base_prefix, sys.base_exec_prefix]) if hasattr(site, "getsitepackages") else []
    )
    hidden = _hidden(trainer_code_dirs() | _real_dirs(base_site), roots, [executable, *_stdlib_dirs()])
    version = ".".join(map(str, sys.version_info[:3]))
    _check_inside(executable, roots, "the trainer's base interpreter")
    return Interpreter(executable=executable, roots=roots, hidden=hidden, packages=False, version=version)


@functools.lru_cache(maxsize=16)
def _ask(python: str) -> dict:
    """What ``python`` says about its installation (run once per path and process)."""
    try:
        out = subprocess.run([python, "-I", "-c", _ASK], capture_output=True, text=True, timeout=60, check=True)
        return json.loads(out.stdout)
    except (OSError, subprocess.SubprocessError, ValueError) as exc:
        detail = getattr(exc, "stderr", "") or exc
        raise ValueError(
            f"CodeInterpreterTool config.python={python!r} did not answer as a Python interpreter: {detail}"
        ) from None


def dedicated_interpreter(python: str) -> Interpreter:
    """A dedicated interpreter (config ``python``): its prefixes visible with their packages.

    When ``python`` is the trainer's own environment (same ``sys.prefix``), this is :func:`trainer_interpreter`
    instead: the trainer's packages stay hidden.

    Raises:
        ValueError: ``python`` does not run, or lives outside the folders it reports as its installation.
    """
    info = _ask(python)
    prefixes = _real_dirs(info["prefixes"])
    if os.path.realpath(sys.prefix) in _real_dirs(info["prefixes"][:1]):
        return trainer_interpreter()
    roots = tuple(r for r in _outermost(prefixes) if not any(_under(r, s) for s in _bound_system()))
    own = _real_dirs(info["path"]) | _real_dirs(info["site"])
    executable = os.path.abspath(info["executable"])
    hidden = _hidden(trainer_code_dirs() - own, roots, [executable, *own])
    _check_inside(executable, roots, f"CodeInterpreterTool config.python={python!r}")
    return Interpreter(executable=executable, roots=roots, hidden=hidden, packages=True, version=info["version"])


#: Folders the box makes itself: an interpreter installed under one of them would be covered.
BOX_OWN = ("/tmp", "/proc", "/dev", "/.verl")


def _check_inside(executable: str, roots: tuple[str, ...], what: str) -> None:
    for root in roots:
        covered = next((own for own in BOX_OWN if _under(root, own)), None)
        if covered:
            raise ValueError(
                f"{what}: its installation folder {root} is under {covered}, which the box replaces with its own "
                f"(the call's folder for /tmp); install the interpreter elsewhere, e.g. under /opt"
            )
    visible = roots + _bound_system() + tuple(d for d in SYSTEM_DIRS if os.path.isdir(d))
    for path in (executable, os.path.realpath(executable)):
        if not any(_under(path, r) for r in visible):
            raise ValueError(
                f"{what}: {path} is outside its installation folders {list(roots)} and the system folders, so "
                "the box would not contain it; point config.python at the interpreter inside its installation"
            )


def system_layout(interpreter: Interpreter) -> dict:
    """The box's fixed part: ``{"symlinks": [[target, path]], "ro_binds": [[source, dest]], "masks": [dest]}``."""
    symlinks, binds = [], []
    for folder in SYSTEM_DIRS:
        if os.path.islink(folder):
            symlinks.append([os.readlink(folder), folder])
        elif os.path.isdir(folder):
            binds.append([folder, folder])
    for name in ETC_FILES:
        if os.path.islink(name):
            symlinks.append([os.readlink(name), name])
        elif os.path.isfile(name):
            binds.append([name, name])
    binds += [[root, root] for root in interpreter.roots]
    return {"symlinks": symlinks, "ro_binds": binds, "masks": list(interpreter.hidden)}


def unreachable_by(uid: int, gid: int, path: str) -> str | None:
    """The first folder on the way to ``path`` that ``uid``/``gid`` (no other groups) may not enter, or None.

    Checks the permission bits only (an ACL may allow more; the box's start then says so itself).
    """
    current = "/"
    for part in [p for p in os.path.realpath(path).split("/") if p]:
        st = os.stat(current)
        if st.st_uid == uid:
            allowed = st.st_mode & stat.S_IXUSR
        elif st.st_gid == gid:
            allowed = st.st_mode & stat.S_IXGRP
        else:
            allowed = st.st_mode & stat.S_IXOTH
        if not allowed:
            return f"{current} (mode {stat.S_IMODE(st.st_mode):04o}, owner uid {st.st_uid})"
        current = os.path.join(current, part)
    return None
