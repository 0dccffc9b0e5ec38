"""NPUPlatform: class facts, IPC support from fixture npu-smi/CANN versions, and seeding/memory through a
STAND-IN ``torch.npu`` (it shows which device-module calls the platform makes, not that Ascend answers)."""

from __future__ import annotations

import importlib.util
import sys
import types

import attrs
import pytest
import torch
from verl_npu.platform import NPUPlatform, driver_version

from verl.platform import Platform


def test_class_facts():
    p = NPUPlatform()
    assert isinstance(p, Platform)
    assert (p.name, p.device_type, p.vendor, p.dist_backend) == ("npu", "npu", "huawei", "hccl")
    assert (p.visible_devices_env, p.ray_resource_name) == ("ASCEND_RT_VISIBLE_DEVICES", "NPU")
    assert p.sync_backends == ("gloo", "hccl")
    assert repr(p) == "<NPUPlatform name='npu' device_type='npu' vendor='huawei'>"
    assert "torch_npu" not in sys.modules  # building the platform imports nothing


@pytest.mark.skipif(
    importlib.util.find_spec("torch_npu") is not None and hasattr(torch, "npu"), reason="torch_npu works here"
)
def test_device_module_without_a_working_torch_npu_says_why():
    with pytest.raises(
        RuntimeError, match=r"the npu platform needs torch_npu in this process, and importing it failed"
    ) as info:
        _ = NPUPlatform().device_module
    assert "source CANN's set_env.sh" in str(info.value)


@pytest.mark.parametrize(
    ("smi_version", "cann", "answer", "reason"),
    [
        ("25.3.rc1", "8.3.RC1", True, "npu-smi driver 25.3.rc1 >= 25.3.rc1, CANN 8.3.RC1 >= 8.3.rc1"),
        ("25.3.rc1", "8.2.RC1", False, "CANN 8.2.RC1 is older than 8.3.rc1"),
        ("24.1.rc2", "8.3.RC1", False, "npu-smi driver 24.1.rc2 is older than 25.3.rc1"),
        ("25.3.rc1", None, False, "CANN version unknown"),
    ],
)
def test_fixture_ipc_support_from_npu_smi_and_cann(cann_tree, fx, smi_version, cann, answer, reason):
    info = fx.NPU_SMI_INFO.replace("25.3.rc1", smi_version)
    roots = cann_tree(version=cann, info=info)
    platform = NPUPlatform(roots)
    assert platform.supports_ipc() is answer
    assert reason in platform.ipc_support()[1]


def test_fixture_driver_version_falls_back_to_the_board_query(cann_tree, fx, tmp_path):
    roots = cann_tree(info="npu-smi: no header here\n")
    assert driver_version(roots.npu_smi) == "25.3.rc1.2"  # "Software Version" of `info -t board -i 0`
    assert (tmp_path / "smi" / "npu-smi.log").read_text().splitlines() == ["info", "info -t board -i 0"]
    assert driver_version(None) is None
    assert NPUPlatform(attrs.evolve(roots, npu_smi=None)).ipc_support() == (
        False,
        "npu-smi driver version unknown; IPC needs npu-smi driver >= 25.3.rc1",
    )


class StandInNpuModule(types.ModuleType):
    """Stand-in for ``torch.npu``: records calls, returns fixed memory numbers (not Ascend's module)."""

    def __init__(self):
        super().__init__("torch.npu")
        self.calls: list[tuple] = []
        for name, value in [
            ("memory_allocated", 100),
            ("memory_reserved", 300),
            ("max_memory_allocated", 150),
            ("max_memory_reserved", 400),
            ("device_count", 2),
            ("current_device", 1),
        ]:
            setattr(self, name, self._recorder(name, value))
        for name in ("manual_seed_all", "set_device", "synchronize", "empty_cache", "reset_peak_memory_stats"):
            setattr(self, name, self._recorder(name, None))
        self.get_device_name = self._recorder("get_device_name", "Ascend910B3")

    def _recorder(self, name, value):
        def call(*args):
            self.calls.append((name, *args))
            return value

        return call


@pytest.fixture
def stand_in_torch_npu(monkeypatch):
    """``import torch_npu`` finds an empty stand-in and ``torch.npu`` is a :class:`StandInNpuModule`."""
    module = StandInNpuModule()
    monkeypatch.setitem(sys.modules, "torch_npu", types.ModuleType("torch_npu"))
    monkeypatch.setattr(torch, "npu", module, raising=False)
    return module


def test_stand_in_seeding_memory_and_devices_go_through_torch_npu(stand_in_torch_npu):
    p = NPUPlatform()
    assert p.device_module is stand_in_torch_npu
    p.manual_seed(1234)
    assert ("manual_seed_all", 1234) in stand_in_torch_npu.calls
    assert torch.initial_seed() == 1234  # the CPU generator too (Platform.manual_seed)
    assert p.memory_stats() == {
        "allocated_bytes": 100,
        "reserved_bytes": 300,
        "max_allocated_bytes": 150,
        "max_reserved_bytes": 400,
    }
    assert p.reset_peak_memory_stats() is True
    p.set_device(1)
    with pytest.raises(
        ValueError, match=r"npu device index 2 is out of range: 2 device\(s\) visible \(ASCEND_RT_VISIBLE_DEVICES="
    ):
        p.set_device(2)
    assert p.device_name() == "Ascend910B3"
    assert ("get_device_name", 1) in stand_in_torch_npu.calls  # the current device
    p.synchronize()
    p.empty_cache()
    # (torch.device('npu') itself exists only once the real torch_npu has renamed torch's privateuse1 backend)
    names = [c[0] for c in stand_in_torch_npu.calls]
    assert {"set_device", "synchronize", "empty_cache", "reset_peak_memory_stats"} <= set(names)
