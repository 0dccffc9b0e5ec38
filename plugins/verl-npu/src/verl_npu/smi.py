"""``npu-smi`` (Ascend's ``nvidia-smi``, installed with the driver): find it, run it, read its tables.

``npu-smi info`` prints a header ``| npu-smi 25.3.rc1   Version: 25.3.rc1 |`` (the driver version, which
verl's IPC rule compares) and one row per NPU (``| 0     910B3    | OK    | ...``) followed by a chip row;
``npu-smi info -t board -i <id>`` prints ``Software Version : 25.3.rc1.2`` among ``key : value`` lines.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping, Sequence

import attrs

__all__ = [
    "NPU_SMI_FALLBACKS",
    "SmiInfo",
    "find_npu_smi",
    "parse_board_software_version",
    "parse_npu_smi_info",
    "run_npu_smi",
]

#: Where the Ascend driver installs npu-smi when it is not on ``PATH`` (root installs, containers).
NPU_SMI_FALLBACKS = ("/usr/local/sbin/npu-smi", "/usr/local/bin/npu-smi")

_HEADER = re.compile(r"npu-smi\s+(?P<tool>\S+)\s+Version:\s*(?P<version>[0-9][^\s|]*)", re.IGNORECASE)
# An NPU row: id, then a name (chip rows have only an id), then a health word (process rows have a pid).
_NPU_ROW = re.compile(r"^\|\s*(?P<id>\d+)\s+(?P<name>[^|\s][^|]*?)\s*\|\s*(?P<health>[A-Za-z]+)\s*\|")
_SOFTWARE = re.compile(r"^\s*Software Version\s*:\s*(?P<version>\S+)", re.IGNORECASE | re.MULTILINE)


@attrs.frozen
class SmiInfo:
    """What ``npu-smi info`` said.

    Attributes:
        version: the header's ``Version:`` (driver), or ``None`` when there is no header.
        npus: ``(npu_id, name, health)`` per NPU row, e.g. ``(0, "910B3", "OK")``.
    """

    version: str | None
    npus: tuple[tuple[int, str, str], ...]


def parse_npu_smi_info(text: str) -> SmiInfo:
    """Parse ``npu-smi info`` output (the process table after the NPU table is skipped)."""
    header = _HEADER.search(text)
    npus = []
    for line in text.splitlines():
        if "Process id" in line or "Process name" in line:
            break  # the process table's rows also start with an NPU id
        row = _NPU_ROW.match(line.strip())
        if row and row["name"].strip().lower() != "name":
            npus.append((int(row["id"]), row["name"].strip(), row["health"]))
    return SmiInfo(header["version"] if header else None, tuple(npus))


def parse_board_software_version(text: str) -> str | None:
    """``Software Version`` of ``npu-smi info -t board -i <id>``, or ``None``."""
    match = _SOFTWARE.search(text)
    return match["version"] if match else None


def find_npu_smi(environ: Mapping[str, str] | None = None) -> str | None:
    """``npu-smi`` on ``PATH`` (of ``environ``), else the first executable of :data:`NPU_SMI_FALLBACKS`."""
    env = os.environ if environ is None else environ
    found = shutil.which("npu-smi", path=env.get("PATH"))
    if found:
        return found
    return next((p for p in NPU_SMI_FALLBACKS if os.access(p, os.X_OK)), None)


def run_npu_smi(path: str, args: Sequence[str], timeout_s: float = 15.0) -> tuple[bool, str]:
    """Run ``path args...``; ``(True, stdout)`` when it exits 0, else ``(False, why)``. Never raises."""
    try:
        proc = subprocess.run([path, *args], capture_output=True, text=True, timeout=timeout_s, check=False)
    except subprocess.TimeoutExpired:
        return False, f"`{path} {' '.join(args)}` did not answer within {timeout_s:g} s"
    except OSError as exc:
        return False, f"cannot run {path}: {type(exc).__name__}: {exc.strerror or exc}"
    if proc.returncode != 0:
        last = (proc.stderr.strip() or proc.stdout.strip() or "no output").splitlines()[-1][:300]
        return False, f"`{path} {' '.join(args)}` exited {proc.returncode}: {last}"
    return True, proc.stdout
