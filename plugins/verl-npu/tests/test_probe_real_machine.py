"""The probe's steps against this machine (no Ascend driver, no CANN): each answers no with its reason,
nothing raises, and torch_npu is never imported in this process."""

from __future__ import annotations

import importlib.util
import os
import sys

import pytest
from verl_npu.probe import ProbeRoots, check_cann, check_devices, check_import, check_package, probe_npu, run_probe

HAS_TORCH_NPU = importlib.util.find_spec("torch_npu") is not None
ASCEND_HERE = os.path.isdir("/usr/local/Ascend") or any(
    os.environ.get(v) for v in ("ASCEND_HOME_PATH", "ASCEND_TOOLKIT_HOME")
)
NODES_HERE = os.path.isdir("/dev") and any(n.startswith("davinci") and n[7:].isdigit() for n in os.listdir("/dev"))

pytestmark = pytest.mark.skipif(
    ASCEND_HERE or NODES_HERE, reason="this machine has Ascend pieces; these tests expect none"
)


def test_the_whole_probe_answers_no_with_the_first_missing_piece():
    report = run_probe()
    result = report.result
    assert result.available is False
    if HAS_TORCH_NPU:
        assert [s.name for s in report.steps] == ["package", "cann"]
        assert result.reason.startswith(
            "CANN toolkit not found (no CANN toolkit at /usr/local/Ascend/ascend-toolkit/latest"
        )
        assert "TORCH_DEVICE_BACKEND_AUTOLOAD=0" in result.reason
    else:
        assert [s.name for s in report.steps] == ["package"]
        assert result.reason.startswith(
            "torch-npu is not installed: from the verl checkout: pip install './plugins/verl-npu[npu]'"
        )
    assert probe_npu() == result  # the cached platform probe says the same
    assert "torch_npu" not in sys.modules


def test_each_step_on_this_machine():
    roots = ProbeRoots.from_env()
    assert roots.home_source == "default" and roots.npu_smi is None and roots.python == sys.executable
    package = check_package()
    assert package.ok is HAS_TORCH_NPU
    cann = check_cann(roots)
    assert not cann.ok and "looked at the default path" in cann.reason
    assert "source /usr/local/Ascend/ascend-toolkit/set_env.sh" in cann.reason
    devices = check_devices(roots)
    assert not devices.ok
    assert devices.reason.startswith(
        "no Ascend device nodes (/dev/davinci<N>) and no npu-smi (it comes with the driver)"
    )
    assert "--device /dev/davinci0" in devices.reason
    child = check_import(roots)  # the expensive step, run anyway: it must fail cleanly too
    assert not child.ok and child.reason.startswith("import torch_npu failed in a child process: ")
    if HAS_TORCH_NPU:  # the real wheel without CANN: its native library is missing
        assert ".so" in child.reason and "set_env.sh" in child.reason
    else:
        assert "ModuleNotFoundError: No module named 'torch_npu'" in child.reason
    assert "torch_npu" not in sys.modules
