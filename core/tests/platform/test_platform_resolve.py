"""Platform resolution: explicit name > exactly one positive accelerator probe > cpu; errors list
every probe's answer."""

from __future__ import annotations

import types

import pytest

from verl.platform import Platform, ProbeResult
from verl.platform.cpu import CpuPlatform
from verl.plugins import (
    PlatformResolutionError,
    PlatformSpec,
    PlatformUnavailableError,
    PluginConflictError,
    PluginManager,
    PluginValidationError,
    UnknownPluginError,
    current_platform,
    hookimpl,
    probe_platforms,
    reset_plugin_manager,
    resolve_platform,
)


class _FakeAccel(CpuPlatform):
    """A cpu-backed stand-in for an accelerator platform (only identity matters here)."""

    name = "fake"
    device_type = "fake"


def _accel(name: str, probe) -> PlatformSpec:
    cls = type(f"Fake_{name}", (_FakeAccel,), {"name": name, "device_type": name})
    return PlatformSpec(name=name, probe=probe, factory=cls)


def _manager(*specs: PlatformSpec, with_cpu: bool = True) -> PluginManager:
    pm = PluginManager(load_entry_points=False)
    all_specs = list(specs)
    if with_cpu:
        all_specs.insert(0, PlatformSpec(name="cpu", probe=CpuPlatform.probe, factory=CpuPlatform, accelerator=False))
    module = types.ModuleType("fake_platforms")
    module.verl_platforms = hookimpl(lambda: all_specs)
    pm.register(module, dist_name="fake-platforms", version="1.0")
    return pm


def _raise():
    raise OSError("libnpu.so not found")


def test_no_positive_accelerator_probe_falls_back_to_cpu():
    pm = _manager(_accel("npu", lambda: ProbeResult(False, "no device")), _accel("xpu", lambda: False))
    assert type(resolve_platform(plugin_manager=pm)) is CpuPlatform


def test_exactly_one_positive_accelerator_probe_wins():
    pm = _manager(_accel("npu", lambda: ProbeResult(True, "8 devices")), _accel("xpu", lambda: False))
    platform = resolve_platform(plugin_manager=pm)
    assert (platform.name, type(platform).__name__) == ("npu", "Fake_npu")


def test_two_positive_probes_are_an_error_listing_every_answer():
    pm = _manager(
        _accel("npu", lambda: ProbeResult(True, "8 devices")),
        _accel("xpu", lambda: True),
        _accel("tpu", _raise),
    )
    with pytest.raises(PlatformResolutionError) as err:
        resolve_platform(plugin_manager=pm)
    text = str(err.value)
    assert text.startswith("cannot choose a platform: 2 accelerator probes answered yes and no device was named")
    assert "  - cpu (fallback) [fake-platforms 1.0]: yes, always available" in text
    assert "  - npu [fake-platforms 1.0]: yes, 8 devices" in text
    assert "  - xpu [fake-platforms 1.0]: yes, probe answered yes" in text
    assert "  - tpu [fake-platforms 1.0]: no, probe raised OSError: libnpu.so not found" in text
    assert text.endswith("Set trainer.device to one of: npu, xpu (e.g. trainer.device=npu)")
    assert [(a.name, a.available) for a in err.value.answers] == [
        ("cpu", True),
        ("npu", True),
        ("xpu", True),
        ("tpu", False),
    ]
    assert isinstance(err.value, ValueError)


def test_an_explicit_name_settles_the_ambiguity():
    pm = _manager(_accel("npu", lambda: True), _accel("xpu", lambda: True))
    assert resolve_platform("xpu", plugin_manager=pm).name == "xpu"
    assert type(resolve_platform("cpu", plugin_manager=pm)) is CpuPlatform


def test_explicit_but_unavailable_platform_says_why():
    pm = _manager(_accel("npu", lambda: ProbeResult(False, "torch_npu is not installed")), _accel("xpu", lambda: True))
    with pytest.raises(PlatformUnavailableError) as err:
        resolve_platform("npu", plugin_manager=pm)
    assert str(err.value) == (
        "device 'npu' requested but not available: torch_npu is not installed. Usable here: cpu, xpu; "
        "set trainer.device to one of them, or to null to choose automatically"
    )
    assert isinstance(err.value, PlatformResolutionError)


def test_explicit_unknown_platform_lists_the_platforms():
    pm = _manager(_accel("xpu", lambda: False))
    with pytest.raises(UnknownPluginError, match=r"unknown platform 'npu'; available: cpu, xpu") as err:
        resolve_platform("npu", plugin_manager=pm)
    assert "'npu' is provided by the verl-npu plugin, which is not installed" in str(err.value)
    assert "pip install './plugins/verl-npu[npu]'" in str(err.value)


def test_probe_answers_are_normalised():
    pm = _manager(_accel("a", _raise), _accel("b", lambda: 1), _accel("c", lambda: ProbeResult(True, "ok")))
    answers = {a.name: (a.available, a.reason) for a in probe_platforms(pm)}
    assert answers["a"] == (False, "probe raised OSError: libnpu.so not found")
    assert answers["b"] == (False, "probe returned int (1); it must return bool or ProbeResult")
    assert answers["c"] == (True, "ok")
    assert answers["cpu"][0] is True


def test_missing_cpu_fallback_is_an_error():
    pm = _manager(_accel("npu", lambda: False), with_cpu=False)
    with pytest.raises(
        PlatformResolutionError, match=r"no accelerator probe answered yes and the 'cpu' fallback is missing"
    ):
        resolve_platform(plugin_manager=pm)


def test_factory_must_return_a_platform():
    pm = _manager(PlatformSpec(name="bad", probe=lambda: True, factory=lambda: "cuda"))
    with pytest.raises(PluginValidationError) as err:
        resolve_platform("bad", plugin_manager=pm)
    assert "factory of platform 'bad' from plugin fake-platforms 1.0" in str(err.value)
    assert "returned str; it must return a verl.platform.Platform instance" in str(err.value)


def test_conflicting_platform_names_block_resolution():
    pm = _manager(_accel("npu", lambda: True))
    other = types.ModuleType("other_platforms")
    other.verl_platforms = hookimpl(lambda: [_accel("npu", lambda: True)])
    pm.register(other, dist_name="npu-fork")
    with pytest.raises(PluginConflictError, match=r"platform 'npu' is provided by 2 plugins"):
        resolve_platform(plugin_manager=pm)


def test_platform_subclasses_must_define_the_class_attributes():
    class Incomplete(CpuPlatform):
        pass

    class NoAttributes(Platform):
        pass

    assert Incomplete().name == "cpu"  # inherited attributes count
    with pytest.raises(TypeError, match=r"NoAttributes must define class attribute\(s\): name, device_type, vendor"):
        NoAttributes()

    class Abstract(Platform):
        name = device_type = vendor = dist_backend = ray_resource_name = "x"
        visible_devices_env = None

    with pytest.raises(TypeError, match=r"abstract"):
        Abstract()


def test_current_platform_is_cached_per_plugin_manager():
    first = current_platform()
    assert current_platform() is first
    assert first.name == resolve_platform().name
    reset_plugin_manager()
    assert current_platform() is not first
