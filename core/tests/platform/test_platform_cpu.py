"""The cpu platform."""

from __future__ import annotations

import mmap
import random

import numpy as np
import pytest
import torch

from verl.platform import Platform
from verl.platform.cpu import CpuPlatform
from verl.plugins import resolve_platform

MiB = 1024 * 1024


def _vmrss_bytes() -> int:
    # Independent source: the kernel's own "VmRSS: N kB" line, not /proc/self/statm.
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError("no VmRSS line")


def test_attributes():
    cpu = CpuPlatform()
    assert isinstance(cpu, Platform)
    assert (cpu.name, cpu.device_type, cpu.dist_backend, cpu.ray_resource_name) == ("cpu", "cpu", "gloo", "CPU")
    assert cpu.visible_devices_env is None
    assert cpu.device_module is None
    assert cpu.is_available() is True
    assert cpu.device_count() == 1
    assert cpu.current_device() == 0
    assert cpu.torch_device() == torch.device("cpu")
    assert cpu.torch_device(3) == torch.device("cpu")
    assert cpu.supports_ipc() is False
    assert isinstance(cpu.device_name(), str) and cpu.device_name()
    assert repr(cpu) == "<CpuPlatform name='cpu' device_type='cpu' vendor='generic'>"


def test_set_device_accepts_any_local_rank():
    cpu = CpuPlatform()
    cpu.set_device(0)
    cpu.set_device(5)  # gloo ranks on one host all call set_device(local_rank)
    with pytest.raises(ValueError, match=r"cpu device index must be >= 0, got -1"):
        cpu.set_device(-1)
    with pytest.raises(TypeError, match=r"device index must be an int, got str"):
        cpu.set_device("0")


def test_manual_seed_seeds_python_numpy_and_torch():
    cpu = CpuPlatform()

    def draw():
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    cpu.manual_seed(1234)
    first = draw()
    cpu.manual_seed(1234)
    assert draw() == first
    # the values are those of independently seeded generators
    assert first[0] == random.Random(1234).random()
    assert first[1] == float(np.random.RandomState(1234).rand())
    assert first[2] == float(torch.rand((), generator=torch.Generator().manual_seed(1234)))
    cpu.manual_seed(1235)
    assert draw() != first
    cpu.manual_seed(2**40 + 7)  # larger than numpy's 32-bit seed range
    with pytest.raises(TypeError, match=r"seed must be an int"):
        cpu.manual_seed(1.5)


def test_memory_stats_report_the_process_rss():
    cpu = CpuPlatform()
    before = cpu.memory_stats()
    assert set(before) == {"allocated_bytes", "reserved_bytes", "max_allocated_bytes", "max_reserved_bytes"}
    assert before["allocated_bytes"] == before["reserved_bytes"]
    assert abs(before["allocated_bytes"] - _vmrss_bytes()) < 8 * MiB
    # A fresh anonymous mapping, fully written: 64 MiB of new resident pages whatever malloc has cached.
    block = mmap.mmap(-1, 64 * MiB)
    try:
        block.write(b"\x01" * (64 * MiB))
        after = cpu.memory_stats()
    finally:
        block.close()
    assert after["allocated_bytes"] - before["allocated_bytes"] >= 60 * MiB
    assert after["max_allocated_bytes"] >= after["allocated_bytes"]


def test_peak_rss_resets_to_the_current_rss():
    """After a 64 MiB block is freed, the peak still counts it until reset_peak_memory_stats (Linux VmHWM)."""
    cpu = CpuPlatform()
    if not cpu.reset_peak_memory_stats():
        pytest.skip("this kernel does not allow resetting the peak RSS (/proc/self/clear_refs)")
    block = mmap.mmap(-1, 64 * MiB)
    block.write(b"\x01" * (64 * MiB))
    block.close()
    peak = cpu.memory_stats()["max_allocated_bytes"]
    assert peak >= cpu.memory_stats()["allocated_bytes"] + 60 * MiB
    assert cpu.reset_peak_memory_stats()
    after = cpu.memory_stats()
    assert after["max_allocated_bytes"] <= peak - 60 * MiB
    assert after["max_allocated_bytes"] == after["max_reserved_bytes"] >= after["allocated_bytes"] - MiB


def test_empty_cache_and_synchronize_return_nothing():
    # empty_cache trims the C library's free memory (test_host_allocator.py measures that); synchronize is a no-op.
    cpu = CpuPlatform()
    assert cpu.empty_cache() is None
    assert cpu.synchronize() is None


def test_explicit_cpu_resolves_to_the_cpu_platform():
    assert isinstance(resolve_platform("cpu"), CpuPlatform)


def test_configure_threads_shares_the_cores_among_the_node_workers(monkeypatch):
    import os

    import torch

    from verl.platform.cpu import CpuPlatform

    before = torch.get_num_threads()
    try:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
        monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1, 2, 3, 4, 5}, raising=False)
        assert CpuPlatform().configure_threads(1) == 6 and torch.get_num_threads() == 6
        assert CpuPlatform().configure_threads(4) == 1  # 6 cores // 4 workers, at least one each
        assert CpuPlatform().configure_threads(2) == 3 and torch.get_num_threads() == 3
        monkeypatch.setenv("OMP_NUM_THREADS", "2")  # an explicit setting wins (Ray sets it per actor)
        assert CpuPlatform().configure_threads(1) == 2 and torch.get_num_threads() == 2
    finally:
        torch.set_num_threads(before)
