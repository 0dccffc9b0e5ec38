"""Device-aware selection: one rule (platform name or device type in the engine's ``devices``) for config
load and ``verl plugins``; platform device types known from the spec without building the platform.

The platforms here are stand-ins (``Pretend*`` classes built on :class:`CpuPlatform`): they give a name and a
device type, no device; the engines are core's real built-in specs."""

from __future__ import annotations

import types

import pytest

from verl.config import ConfigError, load_config
from verl.config.backend_options import validate_backend_options
from verl.platform import ProbeResult
from verl.platform.cpu import CpuPlatform
from verl.plugins import PlatformSpec, PluginManager, hookimpl
from verl.plugins import builtin as builtin_plugin
from verl.plugins.selection import device_mismatch, engine_runs_on, platform_device_type
from verl.plugins.specs import TrainingEngineSpec

ACTOR = "actor_rollout_ref.actor"


class PretendPlatform(CpuPlatform):
    """Stand-in vendor platform: its own name, tensors in host memory (device type ``cpu``)."""

    name = "pretend"
    vendor = "pretend"


class OddPlatform(CpuPlatform):
    """Stand-in vendor platform of a device type no core engine lists."""

    name = "odd"
    device_type = "odd"


def _yes() -> ProbeResult:
    return ProbeResult(True, "1 stand-in device")


def _manager(*platforms: PlatformSpec) -> PluginManager:
    """Core's built-in plugin (real engines) plus a stand-in vendor plugin with ``platforms``."""
    pm = PluginManager(load_entry_points=False)
    pm.register(builtin_plugin, name="builtin", dist_name="verl-core", version="0.1.0")
    vendor = types.ModuleType("vendor_platforms")
    vendor.verl_platforms = hookimpl(lambda: list(platforms))
    pm.register(vendor, dist_name="verl-vendor", version="2.0")
    return pm


def test_device_type_is_derived_from_a_platform_class_factory_else_the_name():
    assert PlatformSpec(name="pretend", probe=_yes, factory=PretendPlatform).device_type == "cpu"
    assert PlatformSpec(name="odd", probe=_yes, factory=OddPlatform).device_type == "odd"
    # A function factory is never called to find out: the name is the device type unless declared.
    assert PlatformSpec(name="npu", probe=_yes, factory=lambda: None).device_type == "npu"
    assert PlatformSpec(name="rocm", probe=_yes, factory=lambda: None, device_type="cuda").device_type == "cuda"
    # Declared wins over the factory class's attribute.
    assert PlatformSpec(name="x", probe=_yes, factory=OddPlatform, device_type="cpu").device_type == "cpu"


@pytest.mark.parametrize("bad", ["", "cu da", 3, "1cuda"])
def test_a_bad_device_type_is_refused(bad):
    with pytest.raises(TypeError, match="PlatformSpec.device_type must be a torch device type"):
        PlatformSpec(name="x", probe=_yes, factory=lambda: None, device_type=bad)


def test_platform_device_type_of_a_stand_in_spec_without_the_field():
    assert platform_device_type(types.SimpleNamespace(name="cuda")) == "cuda"
    assert platform_device_type(types.SimpleNamespace(name="p", factory=PretendPlatform)) == "cpu"


@pytest.mark.parametrize(
    ("devices", "name", "device_type", "expected"),
    [
        (("cpu", "cuda"), "pretend", "cpu", True),  # by device type
        (("cpu", "cuda"), "rocm", "cuda", True),
        (("pretend",), "pretend", "cpu", True),  # by platform name
        (("cpu", "cuda"), "npu", "npu", False),
        (("cuda",), "cpu", "cpu", False),
        ((), "npu", "npu", True),  # no declaration, no restriction
    ],
)
def test_engine_runs_on_name_or_device_type(devices, name, device_type, expected):
    assert engine_runs_on(devices, name, device_type) is expected


def test_mismatch_message_names_engine_platform_device_type_and_fix():
    spec = TrainingEngineSpec(name="reference", factory=_yes, devices=("cpu", "cuda"))
    assert device_mismatch("training_engine", spec, "pretend", "cpu") is None
    text = device_mismatch("training_engine", spec, "odd", "odd-type")
    assert text == (
        "training engine 'reference' does not run on platform 'odd' (device type 'odd-type') (supports: cpu, cuda); "
        "choose a training engine that lists 'odd-type' in its devices, or a platform whose name or device type is "
        "one of cpu, cuda (trainer.device)"
    )


def test_a_vendor_platform_of_device_type_cpu_is_selectable_by_its_name_with_core_engines():
    pm = _manager(PlatformSpec(name="pretend", probe=_yes, factory=PretendPlatform))
    cfg = load_config(overrides=["trainer.device=pretend"], plugin_manager=pm)
    options = validate_backend_options(cfg, pm)
    # reference / hf / colocated (core's defaults) all accepted on 'pretend', with their options structured.
    assert set(options) == {
        f"{ACTOR}.engine_kwargs.reference",
        "actor_rollout_ref.rollout.engine_kwargs.hf",
        "actor_rollout_ref.rollout.checkpoint_engine.engine_kwargs.colocated",
        "critic.engine_kwargs.reference",  # the default estimator (gae) trains a critic
    }


def test_a_vendor_platform_of_an_unlisted_device_type_is_refused_at_config_load():
    pm = _manager(PlatformSpec(name="odd", probe=_yes, factory=OddPlatform))
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["trainer.device=odd"], plugin_manager=pm)
    keys = [issue.key for issue in info.value.issues]
    assert keys == [
        f"{ACTOR}.strategy",
        "actor_rollout_ref.rollout.name",
        "actor_rollout_ref.rollout.checkpoint_engine.backend",
        "critic.strategy",
    ]
    assert "training engine 'reference' does not run on platform 'odd' (supports: cpu, cuda, npu)" in str(info.value)


def test_verl_plugins_uses_the_same_rule(monkeypatch):
    """``verl plugins`` on a machine whose only accelerator answering yes is the stand-in ``pretend``."""
    from verl.cli import plugins_cmd
    from verl.plugins import manager as manager_module

    pm = _manager(PlatformSpec(name="pretend", probe=_yes, factory=PretendPlatform))
    monkeypatch.setattr(manager_module, "_manager", pm)
    report = plugins_cmd.build_report()
    if report["platform"]["name"] != "pretend":  # a CUDA machine: two accelerators answer yes
        pytest.skip(f"automatic choice here is not the stand-in: {report['platform']}")
    rows = {(kind, r["name"]): r for kind, rows in report["specs"].items() for r in rows}
    assert rows[("training_engine", "reference")]["usable"] is True
    assert rows[("training_engine", "reference")]["reason"] == "runs on pretend"
    assert rows[("platform", "pretend")]["reason"] == "1 stand-in device"


def test_a_factory_building_another_device_type_than_the_spec_says_is_refused_when_built():
    from verl.plugins import PluginValidationError
    from verl.plugins.platforms import resolve_platform

    # A function factory: the undeclared device type is the name, 'pretend'; the platform it builds says 'cpu'.
    pm = _manager(PlatformSpec(name="pretend", probe=_yes, factory=lambda: PretendPlatform()))
    with pytest.raises(PluginValidationError) as info:
        resolve_platform("pretend", plugin_manager=pm)
    assert "returned a platform of device type 'cpu', but its PlatformSpec has device_type='pretend'" in str(info.value)
    assert "declare PlatformSpec(name='pretend', ..., device_type='cpu')" in str(info.value)
    declared = _manager(PlatformSpec(name="pretend", probe=_yes, factory=lambda: PretendPlatform(), device_type="cpu"))
    assert type(resolve_platform("pretend", plugin_manager=declared)) is PretendPlatform


class OtherPretendPlatform(CpuPlatform):
    """A second stand-in vendor platform of device type ``cpu``."""

    name = "otherpretend"


def test_two_accelerators_answering_yes_the_advice_works_end_to_end():
    """``trainer.device: null`` with two positive probes fails listing both; following its advice passes config
    load (core's engines, by device type) and resolves to the named platform."""
    from verl.plugins import PlatformResolutionError
    from verl.plugins.platforms import resolve_platform

    pm = _manager(
        PlatformSpec(name="pretend", probe=_yes, factory=PretendPlatform),
        PlatformSpec(name="otherpretend", probe=lambda: True, factory=OtherPretendPlatform),
    )
    cfg = load_config(plugin_manager=pm)  # null: nothing to check at config load
    with pytest.raises(PlatformResolutionError) as info:
        resolve_platform(cfg.trainer.device, plugin_manager=pm)
    text = str(info.value)
    assert "  - pretend [verl-vendor 2.0]: yes, 1 stand-in device" in text
    assert "  - otherpretend [verl-vendor 2.0]: yes, probe answered yes" in text
    advice = text.splitlines()[-1]
    assert advice == "Set trainer.device to one of: pretend, otherpretend (e.g. trainer.device=pretend)"
    for name, cls in (("pretend", PretendPlatform), ("otherpretend", OtherPretendPlatform)):
        cfg = load_config(overrides=[f"trainer.device={name}"], plugin_manager=pm)
        assert validate_backend_options(cfg, pm)  # reference / hf / colocated accepted
        assert type(resolve_platform(cfg.trainer.device, plugin_manager=pm)) is cls
