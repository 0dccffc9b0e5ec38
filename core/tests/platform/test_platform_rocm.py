"""``trainer.device=rocm``: the built-in ``rocm`` spec says yes only on a ROCm build and, as an alias of
``cuda``, never makes an AMD machine look like two accelerators. The torch builds are simulated by
monkeypatching ``torch.version`` / ``torch.backends.cuda.is_built`` / ``torch.cuda.device_count`` (no GPU is
touched); the specs, resolution and config load are core's real ones."""

from __future__ import annotations

import pytest
import torch

from verl.config import load_config
from verl.config.backend_options import validate_backend_options
from verl.platform import ProbeResult
from verl.platform.cuda import CudaPlatform, RocmPlatform, probe_cuda, probe_rocm
from verl.plugins import PlatformUnavailableError, PluginManager, resolve_platform
from verl.plugins import builtin as builtin_plugin
from verl.plugins.platforms import probe_platforms


@pytest.fixture
def build(monkeypatch):
    """Simulate a torch build: ``build("rocm", 2)``, ``build("cuda", 1)`` or ``build("cpu")``."""

    def configure(kind: str, count: int = 0) -> None:
        monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: kind != "cpu")
        monkeypatch.setattr(torch.version, "cuda", "12.4" if kind == "cuda" else None)
        monkeypatch.setattr(torch.version, "hip", "6.2.41133" if kind == "rocm" else None)
        monkeypatch.setattr(torch.cuda, "_is_in_bad_fork", lambda: False)
        monkeypatch.setattr(torch.cuda, "device_count", lambda: count)

    return configure


@pytest.fixture
def core_only() -> PluginManager:
    """Core's built-in plugin alone (no installed vendor platform can add a second accelerator)."""
    pm = PluginManager(load_entry_points=False)
    pm.register(builtin_plugin, name="builtin", dist_name="verl-core", version="0.1.0")
    return pm


def test_rocm_probe_on_a_cpu_build_says_it_is_not_rocm(build):
    build("cpu")
    result = probe_rocm()
    assert not result
    assert result.reason.startswith(f"torch {torch.__version__} is a CPU-only build, not ROCm; install a ROCm build")


def test_rocm_probe_on_a_cuda_build_points_to_cuda(build):
    build("cuda", 2)
    assert probe_cuda() == ProbeResult(True, "2 device(s), CUDA 12.4")
    result = probe_rocm()
    assert not result
    assert result.reason.startswith(
        f"torch {torch.__version__} is a CUDA build (CUDA 12.4), not ROCm; use trainer.device=cuda"
    )


def test_rocm_probe_on_a_rocm_build_counts_devices(build):
    build("rocm", 2)
    assert probe_rocm() == probe_cuda() == ProbeResult(True, "2 device(s), ROCm/HIP 6.2.41133")


def test_an_amd_machine_has_one_automatic_candidate_and_both_names_work(build, core_only):
    build("rocm", 2)
    answers = {a.name: a for a in probe_platforms(core_only)}
    assert answers["cuda"].available and answers["rocm"].available  # both say yes ...
    assert answers["rocm"].alias_of == "cuda" and answers["rocm"].device_type == "cuda"
    assert answers["rocm"].describe().startswith("rocm (alias of cuda) [verl-core 0.1.0]: yes, 2 device(s)")
    auto = resolve_platform(plugin_manager=core_only)  # ... but only cuda counts: no ambiguity error
    assert type(auto) is RocmPlatform and auto.name == "rocm"
    assert type(resolve_platform("rocm", plugin_manager=core_only)) is RocmPlatform
    assert type(resolve_platform("cuda", plugin_manager=core_only)) is RocmPlatform  # verl's spelling on AMD


def test_rocm_named_on_an_nvidia_machine_is_unavailable_with_the_reason(build, core_only):
    build("cuda", 1)
    assert type(resolve_platform(plugin_manager=core_only)) is CudaPlatform
    with pytest.raises(PlatformUnavailableError) as info:
        resolve_platform("rocm", plugin_manager=core_only)
    text = str(info.value)
    assert text.startswith("device 'rocm' requested but not available: torch ")
    assert "is a CUDA build (CUDA 12.4), not ROCm" in text and "Usable here: cpu, cuda" in text


def test_trainer_device_rocm_passes_config_load_with_core_engines(core_only):
    # No device is probed or built at config load: rocm's device type (cuda) comes from its spec.
    cfg = load_config(overrides=["trainer.device=rocm"], plugin_manager=core_only)
    assert cfg.trainer.device == "rocm"
    assert "actor_rollout_ref.actor.engine_kwargs.reference" in validate_backend_options(cfg, core_only)
