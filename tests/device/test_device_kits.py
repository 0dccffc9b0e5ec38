"""verl's conformance kits on the session's device: the platform, the training engine and the rollout engine.

The kits build everything from the plugins' specs and a loaded config, on the device the session names
(``VERL_TEST_DEVICE``), against the reference engine on the CPU in float32. The weight-sync kit
(``CheckpointEngineTests``) runs on the CPU by design (host trainer and receiver) and is left to the CPU
sessions. Tolerances on an accelerator are ``VERL_TEST_ATOL`` (default ``1e-4``, the platform kit's device
tolerance): its float32 kernels sum in another order than the CPU's (the kits' CPU defaults are ``1e-5``).
"""

from __future__ import annotations

import os

import pytest
import torch.distributed as dist

from verl.testing.conformance import PlatformTests, RolloutEngineTests, TrainingEngineTests

# Class attributes are read when the module is imported; the session fixture `matrix` skips everything when
# VERL_TEST_DEVICE is unset, so these defaults (cpu, reference, hf) never build anything there.
DEVICE = os.environ.get("VERL_TEST_DEVICE") or "cpu"
TRAINING = os.environ.get("VERL_TEST_TRAINING") or "reference"
ROLLOUT = os.environ.get("VERL_TEST_ROLLOUT") or "hf"
ACCELERATOR_ATOL = float(os.environ.get("VERL_TEST_ATOL", "1e-4"))


@pytest.fixture(scope="module", autouse=True)
def world_of_one(matrix, device_platform):
    """A 1-rank default process group on the platform's backend (FSDP2 needs one), torn down after the module."""
    from verl.engines.weight_sync import free_port

    if device_platform.device_type != "cpu":
        device_platform.set_device(0)
    created = not dist.is_initialized()
    if created:
        url = f"tcp://127.0.0.1:{free_port()}"
        dist.init_process_group(device_platform.dist_backend, init_method=url, rank=0, world_size=1)
    yield
    if created:
        dist.destroy_process_group()


class _OnTheDevice:
    """The session's device, and tolerances that allow for an accelerator's float32 kernels."""

    @pytest.fixture(scope="class")
    @classmethod
    def device(cls, device_platform):
        return device_platform.torch_device(0)

    @pytest.fixture(scope="class")
    @classmethod
    def logprob_atol(cls, device_platform) -> float:
        return 1e-5 if device_platform.device_type == "cpu" else ACCELERATOR_ATOL


class TestDevicePlatform(PlatformTests):
    platform_name = DEVICE
    forbidden_imports = ("torch_npu", "vllm", "sglang", "tensorrt_llm")  # no probe may import a backend


class TestDeviceTrainingEngine(_OnTheDevice, TrainingEngineTests):
    strategy = TRAINING

    @pytest.fixture(scope="class")
    @classmethod
    def weight_atol(cls, device_platform) -> float:
        return 1e-5 if device_platform.device_type == "cpu" else ACCELERATOR_ATOL


class TestDeviceRolloutEngine(_OnTheDevice, RolloutEngineTests):
    rollout_name = ROLLOUT
