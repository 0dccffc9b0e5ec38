"""A platform whose probe says yes but whose factory fails is refused with the plugin named, never a traceback;
a host-memory platform's default ``torch_device`` equals the device of CPU tensors.

The platforms are stand-ins registered on a test PluginManager beside core's real built-in plugin."""

from __future__ import annotations

import types

import pytest
import torch

from verl.platform import Platform, ProbeResult
from verl.plugins import PlatformSpec, PlatformUnavailableError, PluginManager, hookimpl, resolve_platform
from verl.plugins import builtin as builtin_plugin


def _yes() -> ProbeResult:
    return ProbeResult(True, "1 stand-in device")


def _exploding_factory() -> Platform:
    raise RuntimeError("driver libmyaccel.so.3 not found")


class HostPlatform(Platform):
    """Stand-in host-memory accelerator: device_type cpu, no device module, no torch_device override."""

    name = "host"
    device_type = "cpu"
    vendor = "stand-in"
    dist_backend = "gloo"
    visible_devices_env = None
    ray_resource_name = "CPU"

    @classmethod
    def probe(cls) -> ProbeResult:
        return _yes()

    @property
    def device_module(self) -> None:
        return None

    def device_name(self, index: int | None = None) -> str:
        return "stand-in"


def _manager(*platforms: PlatformSpec) -> PluginManager:
    pm = PluginManager(load_entry_points=False)
    pm.register(builtin_plugin, name="builtin", dist_name="verl-core", version="0.1.0")
    vendor = types.ModuleType("vendor_platforms")
    vendor.verl_platforms = hookimpl(lambda: list(platforms))
    pm.register(vendor, dist_name="verl-myaccel", version="0.3")
    return pm


def test_a_failing_factory_names_the_plugin_and_the_exception():
    pm = _manager(PlatformSpec(name="myaccel", probe=_yes, factory=_exploding_factory, device_type="cpu"))
    with pytest.raises(PlatformUnavailableError) as info:
        resolve_platform("myaccel", plugin_manager=pm)
    text = str(info.value)
    assert "platform 'myaccel' from plugin" in text and "verl-myaccel 0.3" in text
    assert "its factory raised RuntimeError: driver libmyaccel.so.3 not found" in text
    assert "set trainer.device to another platform" in text
    assert isinstance(info.value.__cause__, RuntimeError)
    assert isinstance(info.value, ValueError)  # `verl train` prints it as a one-line error (exit 2)


def test_host_memory_platform_default_torch_device_is_plain_cpu():
    platform = resolve_platform(
        "host", plugin_manager=_manager(PlatformSpec(name="host", probe=_yes, factory=HostPlatform))
    )
    assert platform.torch_device() == torch.device("cpu")
    assert platform.torch_device(1) == torch.zeros(1).device  # CPU tensors carry no index
