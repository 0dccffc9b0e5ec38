"""``verl train`` says once at start which platform it chose and why, and which engines (with their plugins)
it builds; an engine that does not run on an automatically chosen platform is refused before anything loads.

The vendor platforms here are stand-ins (``Pretend*`` classes on :class:`CpuPlatform`); the ``verl train``
path, the trainer and the built-in engines are real. The runs stop at data loading (a missing train file), just
after the print, so no model is trained."""

from __future__ import annotations

import importlib.metadata
import types

import pytest

from verl.cli.main import main
from verl.config import load_config
from verl.platform.cpu import CpuPlatform
from verl.platform.cuda import probe_cuda
from verl.plugins import PlatformSpec, PluginManager, hookimpl
from verl.plugins import builtin as builtin_plugin
from verl.plugins import manager as manager_module
from verl.trainer.ppo_trainer import PPOTrainer

CORE = f"verl-core {importlib.metadata.version('verl-core')}"


class PretendPlatform(CpuPlatform):
    """Stand-in vendor platform of device type ``cpu``."""

    name = "pretend"


class OddPlatform(CpuPlatform):
    """Stand-in vendor platform of a device type no core engine lists."""

    name = "odd"
    device_type = "odd"


def _install(monkeypatch, *platforms: PlatformSpec) -> PluginManager:
    """Make the process-wide manager core's built-ins plus a stand-in vendor plugin with ``platforms``."""
    pm = PluginManager(load_entry_points=False)
    pm.register(builtin_plugin, name="builtin", dist_name="verl-core", version=importlib.metadata.version("verl-core"))
    vendor = types.ModuleType("vendor_platforms")
    vendor.verl_platforms = hookimpl(lambda: list(platforms))
    pm.register(vendor, dist_name="verl-vendor", version="2.0")
    monkeypatch.setattr(manager_module, "_manager", pm)
    return pm


def _start(tmp_path, capsys, *overrides: str) -> tuple[int, list[str]]:
    missing = tmp_path / "no-such-train.parquet"
    rc = main(["train", "--run-dir", str(tmp_path / "run"), f"data.train_files=[{missing}]", *overrides])
    return rc, [line for line in capsys.readouterr().out.splitlines() if line.startswith("verl train: ")]


@pytest.mark.skipif(bool(probe_cuda()), reason="the fallback case needs a machine without CUDA/ROCm devices")
def test_verl_train_prints_the_fallback_platform_and_the_engines(tmp_path, capsys, monkeypatch):
    _install(monkeypatch)
    rc, lines = _start(tmp_path, capsys, "trainer.device=null")  # the built-in CPU run config names cpu
    assert rc == 2  # stopped at the missing data file, after the print
    (platform,) = [line for line in lines if line.startswith("verl train: platform: ")]
    assert platform.startswith(f"verl train: platform: cpu (device type cpu) [{CORE}]: fallback: no accelerator")
    assert f"(cuda: {probe_cuda().reason}); probe: always available" in platform
    assert "rocm:" not in platform  # an alias is not an accelerator of its own
    engines = lines[lines.index(platform) + 1 :]
    assert engines == [
        f"verl train: actor: training engine reference [{CORE}]",  # the built-in GRPO run: no critic, no ref
        f"verl train: rollout: rollout engine hf [{CORE}]",
        f"verl train: checkpoint: checkpoint engine colocated [{CORE}]",
    ]


def test_verl_train_prints_a_named_platform_and_the_ref_engine(tmp_path, capsys, monkeypatch):
    _install(monkeypatch, PlatformSpec(name="pretend", probe=lambda: True, factory=PretendPlatform))
    rc, lines = _start(
        tmp_path,
        capsys,
        "trainer.device=pretend",
        "algorithm.adv_estimator=grpo",
        "actor_rollout_ref.actor.use_kl_loss=true",
    )
    assert rc == 2
    platform = next(line for line in lines if line.startswith("verl train: platform: "))
    assert platform == (
        "verl train: platform: pretend (device type cpu) [verl-vendor 2.0]: named by trainer.device; probe: "
        "probe answered yes"
    )
    engines = lines[lines.index(platform) + 1 :]
    assert [line.split(": ", 2)[1] for line in engines] == ["actor", "ref", "rollout", "checkpoint"]


def test_the_only_accelerator_answering_yes_is_said_and_engines_are_held_to_its_device_type(monkeypatch, tmp_path):
    if probe_cuda():
        pytest.skip("a CUDA/ROCm device would be a second accelerator answering yes")
    _install(monkeypatch, PlatformSpec(name="pretend", probe=lambda: True, factory=PretendPlatform))
    trainer = PPOTrainer(load_config(overrides=["algorithm.adv_estimator=grpo"]), tmp_path)
    assert trainer.selection.splitlines()[0] == (
        "platform: pretend (device type cpu) [verl-vendor 2.0]: only accelerator answering yes; probe: probe answered yes"
    )
    _install(monkeypatch, PlatformSpec(name="odd", probe=lambda: True, factory=OddPlatform))
    with pytest.raises(ValueError) as info:
        PPOTrainer(load_config(overrides=["algorithm.adv_estimator=grpo"]), tmp_path)
    assert str(info.value).splitlines() == [
        "actor_rollout_ref.actor.strategy: training engine 'reference' does not run on platform 'odd' (supports: cpu, "
        "cuda, npu); choose a training engine that lists 'odd' in its devices, or a platform whose name or device "
        "type is one of cpu, cuda, npu (trainer.device)",
        "actor_rollout_ref.rollout.name: rollout engine 'hf' does not run on platform 'odd' (supports: cpu, cuda, "
        "npu); choose a rollout engine that lists 'odd' in its devices, or a platform whose name or device type is "
        "one of cpu, cuda, npu (trainer.device)",
        "actor_rollout_ref.rollout.checkpoint_engine.backend: checkpoint engine 'colocated' does not run on platform "
        "'odd' (supports: cpu, cuda, npu); choose a checkpoint engine that lists 'odd' in its devices, or a platform "
        "whose name or device type is one of cpu, cuda, npu (trainer.device)",
    ]


@pytest.mark.skipif(bool(probe_cuda()), reason="needs a machine where the stand-in is the only accelerator")
def test_cpu_named_while_an_accelerator_answers_yes_gets_a_note(tmp_path, capsys, monkeypatch):
    """The built-in run config pins trainer.device=cpu: a user who installed a platform plugin is told how to use it."""
    _install(monkeypatch, PlatformSpec(name="pretend", probe=lambda: True, factory=PretendPlatform))
    rc, lines = _start(tmp_path, capsys)  # no trainer.device override: the run config's cpu
    assert rc == 2
    platform = next(i for i, line in enumerate(lines) if line.startswith("verl train: platform: cpu "))
    assert "named by trainer.device" in lines[platform]
    assert lines[platform + 1] == (
        "verl train: note: trainer.device=cpu (the built-in run config's value, unless your config set it) although "
        "pretend answer(s) yes here; to use it: trainer.device=pretend, or trainer.device=null to choose automatically"
    )
    # Naming the accelerator itself gets no note.
    rc, lines = _start(tmp_path, capsys, "trainer.device=pretend")
    assert not [line for line in lines if "note:" in line]
