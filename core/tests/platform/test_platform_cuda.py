"""The cuda platform (CUDA and ROCm): probe answers simulated on any torch build; real-device
checks marked ``gpu`` and skipped without a CUDA/ROCm device."""

from __future__ import annotations

import types

import pytest
import torch

from verl.platform import ProbeResult
from verl.platform.cuda import CudaPlatform, RocmPlatform, make_cuda_platform, probe_cuda
from verl.plugins import resolve_platform

HAS_GPU = torch.cuda.is_available()


@pytest.fixture
def cuda_build(monkeypatch):
    """Pretend torch was built with CUDA 12.4 and NVML sees ``count`` devices."""

    def configure(count=2, hip=None):
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
        monkeypatch.setattr(torch.version, "cuda", "12.4")
        monkeypatch.setattr(torch.version, "hip", hip)
        monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
        if isinstance(count, BaseException):

            def raising():
                raise count

            monkeypatch.setattr(torch.cuda, "device_count", raising)
        else:
            monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    return configure


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="needs a CPU-only build of torch")
def test_probe_on_a_cpu_only_torch_says_why():
    result = probe_cuda()
    assert result == ProbeResult(False, f"torch {torch.__version__} is a CPU-only build (no CUDA or ROCm support)")
    assert not result


def test_probe_counts_devices_without_initialising_cuda(cuda_build):
    cuda_build(count=2)
    assert probe_cuda() == ProbeResult(True, "2 device(s), CUDA 12.4")


def test_probe_with_no_visible_devices_names_the_env_var(cuda_build, monkeypatch):
    cuda_build(count=0)
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    result = probe_cuda()
    assert not result
    assert result.reason == f"torch {torch.__version__} (CUDA 12.4) sees no devices (CUDA_VISIBLE_DEVICES='')"


def test_rocm_probe_names_hip_visible_devices(cuda_build, monkeypatch):
    cuda_build(count=0, hip="6.2")
    monkeypatch.setenv("HIP_VISIBLE_DEVICES", "7")
    assert probe_cuda().reason.endswith("(ROCm/HIP 6.2) sees no devices (HIP_VISIBLE_DEVICES='7')")


def test_probe_turns_exceptions_into_a_negative_answer(cuda_build):
    cuda_build(count=RuntimeError("NVML driver mismatch"))
    assert probe_cuda() == ProbeResult(False, "querying CUDA devices failed: RuntimeError: NVML driver mismatch")


def test_probe_refuses_a_bad_fork(cuda_build, monkeypatch):
    cuda_build(count=1)
    monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: True)
    result = probe_cuda()
    assert not result and "forked after CUDA was initialised" in result.reason


def test_cuda_and_rocm_attributes(cuda_build):
    cuda_build(hip=None)
    cuda = make_cuda_platform()
    assert type(cuda) is CudaPlatform
    assert (cuda.name, cuda.device_type, cuda.vendor, cuda.dist_backend) == ("cuda", "cuda", "nvidia", "nccl")
    assert (cuda.visible_devices_env, cuda.ray_resource_name) == ("CUDA_VISIBLE_DEVICES", "GPU")
    assert cuda.device_module is torch.cuda
    assert cuda.supports_ipc() is True

    cuda_build(hip="6.2")
    rocm = make_cuda_platform()
    assert type(rocm) is RocmPlatform
    assert (rocm.name, rocm.device_type, rocm.vendor, rocm.dist_backend) == ("rocm", "cuda", "amd", "nccl")
    assert (rocm.visible_devices_env, rocm.ray_resource_name) == ("HIP_VISIBLE_DEVICES", "GPU")


def test_explicit_cuda_without_devices_is_a_clear_error(cuda_build):
    cuda_build(count=0)
    from verl.plugins import PlatformUnavailableError

    with pytest.raises(PlatformUnavailableError) as err:
        resolve_platform("cuda")
    text = str(err.value)
    assert text.startswith("device 'cuda' requested but not available: torch ")
    assert "sees no devices" in text and "Usable here: cpu" in text


class _FakeCudaModule(types.SimpleNamespace):
    """A torch.cuda-like module recording calls, to test Platform's device-module defaults."""

    def __init__(self, count: int):
        super().__init__(calls=[], count=count, current=0)

    def device_count(self):
        return self.count

    def set_device(self, i):
        self.calls.append(("set_device", i))
        self.current = i

    def current_device(self):
        return self.current

    def manual_seed_all(self, seed):
        self.calls.append(("manual_seed_all", seed))

    def memory_allocated(self):
        return 100

    def memory_reserved(self):
        return 300

    def max_memory_allocated(self):
        return 200

    def max_memory_reserved(self):
        return 400

    def reset_peak_memory_stats(self):
        self.calls.append(("reset_peak_memory_stats",))

    def empty_cache(self):
        self.calls.append(("empty_cache",))

    def synchronize(self):
        self.calls.append(("synchronize",))


class _FakeModulePlatform(CudaPlatform):
    def __init__(self, module):
        self._fake = module

    @property
    def device_module(self):
        return self._fake


def test_platform_defaults_delegate_to_the_device_module(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "4,5")
    module = _FakeCudaModule(count=2)
    platform = _FakeModulePlatform(module)
    platform.set_device(1)
    assert platform.current_device() == 1
    assert platform.torch_device() == torch.device("cuda", 1)
    assert platform.torch_device(0) == torch.device("cuda", 0)
    with pytest.raises(ValueError) as err:
        platform.set_device(2)
    assert str(err.value) == (
        "cuda device index 2 is out of range: 2 device(s) visible (CUDA_VISIBLE_DEVICES='4,5'); use an index in [0, 2)"
    )
    with pytest.raises(TypeError):
        platform.set_device(True)
    platform.manual_seed(7)
    platform.empty_cache()
    platform.synchronize()
    assert platform.reset_peak_memory_stats() is True
    assert module.calls == [
        ("set_device", 1),
        ("manual_seed_all", 7),
        ("empty_cache",),
        ("synchronize",),
        ("reset_peak_memory_stats",),
    ]
    assert platform.memory_stats() == {
        "allocated_bytes": 100,
        "reserved_bytes": 300,
        "max_allocated_bytes": 200,
        "max_reserved_bytes": 400,
    }


@pytest.mark.gpu
@pytest.mark.skipif(not HAS_GPU, reason="needs a CUDA or ROCm device")
def test_real_device():
    platform = resolve_platform("cuda")
    assert platform.is_available()
    assert platform.device_count() == torch.cuda.device_count()
    platform.set_device(0)
    assert platform.torch_device() == torch.device("cuda", 0)
    assert platform.device_name() == torch.cuda.get_device_name(0)
    before = platform.memory_stats()["allocated_bytes"]
    block = torch.empty(4 * 1024 * 1024, dtype=torch.uint8, device=platform.torch_device())
    platform.synchronize()
    assert platform.memory_stats()["allocated_bytes"] - before >= 4 * 1024 * 1024
    del block
    platform.empty_cache()
    platform.manual_seed(3)
    first = torch.rand(4, device="cuda").cpu()
    platform.manual_seed(3)
    assert torch.equal(torch.rand(4, device="cuda").cpu(), first)
