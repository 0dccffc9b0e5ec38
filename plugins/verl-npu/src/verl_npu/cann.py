"""Where the CANN toolkit is and which version it is, read from files only (no library is loaded).

CANN's ``set_env.sh`` exports ``ASCEND_HOME_PATH`` (older releases ``ASCEND_TOOLKIT_HOME``) pointing at
``.../ascend-toolkit/latest``; the version is the ``version=`` line of
``<home>/<arch>-linux/ascend_toolkit_install.info`` (``version=8.3.RC1``), the file verl reads too.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

import attrs

__all__ = ["DEFAULT_ASCEND_HOME", "HOME_VARIABLES", "CannInstall", "find_ascend_home", "read_cann", "set_env_hint"]

DEFAULT_ASCEND_HOME = "/usr/local/Ascend/ascend-toolkit/latest"
#: Variables naming the toolkit home, in the order they are asked.
HOME_VARIABLES = ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")


@attrs.frozen
class CannInstall:
    """What :func:`read_cann` found.

    Attributes:
        home: the toolkit home that was looked at.
        info_file: ``<home>/<arch>-linux/ascend_toolkit_install.info``.
        version: the ``version=`` value (``"8.3.RC1"``), or ``None`` when not found.
        problem: why ``version`` is ``None`` (``""`` when found).
    """

    home: str
    info_file: str
    version: str | None
    problem: str = ""


def find_ascend_home(environ: Mapping[str, str] | None = None) -> tuple[str, str]:
    """``(home, source)``: the first set variable of :data:`HOME_VARIABLES`, else :data:`DEFAULT_ASCEND_HOME`;
    ``source`` is the variable's name or ``"default"``."""
    env = os.environ if environ is None else environ
    for name in HOME_VARIABLES:
        value = env.get(name, "").strip()
        if value:
            return value, name
    return DEFAULT_ASCEND_HOME, "default"


def set_env_hint(home: str) -> str:
    """The command that puts a CANN install into the environment (its ``set_env.sh`` beside ``latest/``)."""
    root = Path(home)
    script = (root.parent if root.name == "latest" else root) / "set_env.sh"
    return f"source {script}"


def read_cann(home: str, arch: str) -> CannInstall:
    """Read the CANN version under ``home`` for machine ``arch`` (``x86_64``, ``aarch64``). Never raises."""
    info = Path(home) / f"{arch}-linux" / "ascend_toolkit_install.info"
    if not Path(home).is_dir():
        return CannInstall(home, str(info), None, f"no CANN toolkit at {home}")
    try:
        text = info.read_text(errors="replace")
    except OSError as exc:
        return CannInstall(home, str(info), None, f"cannot read {info} ({type(exc).__name__}: {exc.strerror or exc})")
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key.strip() == "version" and value.strip():
            return CannInstall(home, str(info), value.strip().strip("\"'"))
    return CannInstall(home, str(info), None, f"{info} has no version= line")
