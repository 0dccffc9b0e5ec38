"""Fixture trees for the npu probe: a CANN install, device nodes, a stand-in ``npu-smi``, a stand-in
``torch_npu`` package. They test parsing and the order of the probe's steps, not NPU support."""

from __future__ import annotations

import importlib.metadata as metadata
import os
import shutil
import stat
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from packaging.version import Version
from verl_npu.probe import ProbeRoots

# Shaped like `npu-smi info` on an Atlas 800T A2 (two 910B3 NPUs, one with a process).
NPU_SMI_INFO = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 25.3.rc1                 Version: 25.3.rc1                                             |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.2        38                0    / 0             |
| 0                         | 0000:C1:00.0  | 0           0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Warning       | 89.5        37                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          3162 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| 0       0                 | 421337        | python3.11               | 6270                    |
+===========================+===============+====================================================+
| No running processes found in NPU 1                                                            |
+===========================+===============+====================================================+
"""

NPU_SMI_BOARD = """\
        NPU ID                         : 0
        Product Name                   : IT21PDDA01
        Model                          : NA
        Manufacturer                   : Huawei
        Serial Number                  : 033VNY10N1000123
        Software Version               : 25.3.rc1.2
        Firmware Version               : 7.7.0.6.236
        Compatibility                  : OK
        Board ID                       : 0x33
        PCIe Bus Info                  : 0000:C1:00.0
        Chip Count                     : 1
"""

TOOLKIT_INFO = """\
package_name=Ascend-cann-toolkit
version={version}
innerversion=V100R001C23SPC001B235
compatible_version=[V100R001C15],[V100R001C18],[V100R001C19],[V100R001C20],[V100R001C21],[V100R001C23]
arch={arch}
os=linux
path=/usr/local/Ascend/ascend-toolkit/{version}/{arch}-linux
"""


def write_executable(path: Path, text: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    path.chmod(path.stat().st_mode | stat.S_IXUSR | stat.S_IXGRP | stat.S_IXOTH)
    return path


def stand_in_npu_smi(folder: Path, info: str = NPU_SMI_INFO, board: str = NPU_SMI_BOARD, rc: int = 0) -> Path:
    """A shell script standing in for ``npu-smi``: prints ``info`` / ``board`` and logs each call to
    ``<folder>/npu-smi.log`` (so tests can see whether the probe asked it)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "info.txt").write_text(info)
    (folder / "board.txt").write_text(board)
    return write_executable(
        folder / "npu-smi",
        f"""#!/bin/sh
echo "$@" >> "{folder}/npu-smi.log"
if [ {rc} -ne 0 ]; then
  echo "dcmi model initialized failed, because the device is used. ret is -8020" >&2; exit {rc}
fi
if [ "$1 $2" = "info -t" ]; then cat "{folder}/board.txt"; else cat "{folder}/info.txt"; fi
""",
    )


@pytest.fixture
def cann_tree(tmp_path: Path):
    """Build a fixture machine: ``make(version=..., nodes=..., smi=...)`` returns its :class:`ProbeRoots`."""

    def make(
        version: str | None = "8.3.RC1", nodes: tuple[str, ...] = ("davinci0", "davinci1"), smi: bool = True, **smi_kw
    ) -> ProbeRoots:
        arch = "x86_64"
        home = tmp_path / "Ascend" / "ascend-toolkit" / "latest"
        (home / f"{arch}-linux").mkdir(parents=True, exist_ok=True)
        info = home / f"{arch}-linux" / "ascend_toolkit_install.info"
        info.unlink(missing_ok=True)  # one tree per test, rebuilt by each call
        if version is not None:
            info.write_text(TOOLKIT_INFO.format(version=version, arch=arch))
        dev = tmp_path / "dev"
        if dev.exists():
            shutil.rmtree(dev)
        dev.mkdir()
        for name in (*nodes, "davinci_manager", "devmm_svm", "hisi_hdc"):  # plain files standing in for nodes
            (dev / name).write_text("")
        npu_smi = stand_in_npu_smi(tmp_path / "smi", **smi_kw) if smi else None
        return ProbeRoots(
            dev_dir=str(dev),
            ascend_home=str(home),
            home_source="ASCEND_HOME_PATH",
            npu_smi=None if npu_smi is None else str(npu_smi),
            python=sys.executable,
            arch=arch,
            timeout_s=60,
        )

    return make


def torch_release() -> str:
    return ".".join(str(n) for n in Version(metadata.version("torch")).release[:3])


@pytest.fixture
def fake_torch_npu(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """Install a stand-in ``torch_npu`` (a package folder with a ``torch-npu`` dist-info) first on ``sys.path``
    and on the child's ``PYTHONPATH``. ``make(torch_pin=..., count=...)`` returns its folder.

    Imported under pytest it raises (the driver must never import it); in the probe's child it registers a
    stand-in ``torch.npu`` whose ``device_count()`` is ``count``.
    """

    def make(torch_pin: str | None = None, count: int = 2, version: str = "2.13.0") -> Path:
        site = tmp_path / "fake-site"
        pkg = site / "torch_npu"
        pkg.mkdir(parents=True, exist_ok=True)
        (pkg / "__init__.py").write_text(
            f'''"""Stand-in torch_npu for the probe's child process (not Ascend's package)."""
import sys
if "pytest" in sys.modules:
    raise AssertionError("the driver imported torch_npu")
import types
import torch
__version__ = "{version}"
torch.npu = types.SimpleNamespace(device_count=lambda: {count})
'''
        )
        info = site / f"torch_npu-{version}.dist-info"
        info.mkdir(exist_ok=True)
        pin = torch_pin if torch_pin is not None else f"{torch_release()}.*"
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: torch-npu\nVersion: {version}\nRequires-Dist: torch=={pin}\n"
            "Requires-Dist: numpy\nRequires-Dist: pyyaml\n"
        )
        monkeypatch.syspath_prepend(str(site))
        monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [str(site), os.environ.get("PYTHONPATH")])))
        return site

    return make


@pytest.fixture
def fx() -> SimpleNamespace:
    """The fixture texts and helpers of this file (test modules cannot import conftest in importlib mode)."""
    return SimpleNamespace(
        NPU_SMI_INFO=NPU_SMI_INFO,
        NPU_SMI_BOARD=NPU_SMI_BOARD,
        TOOLKIT_INFO=TOOLKIT_INFO,
        torch_release=torch_release,
        write_executable=write_executable,
        stand_in_npu_smi=stand_in_npu_smi,
    )
