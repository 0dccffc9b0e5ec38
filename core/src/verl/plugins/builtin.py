"""Core's own plugin: the ``cpu`` and ``cuda`` platforms and the algorithms of :mod:`verl.algorithms`.

Registered through the public entry-point group (``builtin = "verl.plugins.builtin"`` in
verl-core's ``pyproject.toml``), so core exercises the same path as third-party plugins. It is
always loaded, whatever ``VERL_PLUGINS`` says. Heavy imports happen inside the hooks.
"""

from __future__ import annotations

from verl.plugins.discovery import PLUGIN_API_VERSION
from verl.plugins.hookspecs import hookimpl
from verl.plugins.specs import AdvantageEstimatorSpec, PlatformSpec, PolicyLossSpec

VERL_PLUGIN_API = PLUGIN_API_VERSION


@hookimpl
def verl_platforms() -> list[PlatformSpec]:
    """``cpu`` (the fallback, always available) and ``cuda`` (NVIDIA CUDA or AMD ROCm)."""
    from verl.platform.cpu import CpuPlatform
    from verl.platform.cuda import make_cuda_platform, probe_cuda

    return [
        PlatformSpec(name="cpu", probe=CpuPlatform.probe, factory=CpuPlatform, accelerator=False),
        PlatformSpec(name="cuda", probe=probe_cuda, factory=make_cuda_platform),
    ]


@hookimpl
def verl_advantage_estimators() -> list[AdvantageEstimatorSpec]:
    """Every estimator registered with ``verl.algorithms.register_adv_est`` (gae, grpo, rloo, ...)."""
    from verl.algorithms.registry import ADV_ESTIMATOR_REGISTRY

    return [AdvantageEstimatorSpec(name=name, fn=fn) for name, fn in ADV_ESTIMATOR_REGISTRY.items()]


@hookimpl
def verl_policy_losses() -> list[PolicyLossSpec]:
    """Every loss registered with ``verl.algorithms.register_policy_loss`` (vanilla, gspo, ...)."""
    from verl.algorithms.registry import POLICY_LOSS_REGISTRY

    return [PolicyLossSpec(name=name, fn=fn) for name, fn in POLICY_LOSS_REGISTRY.items()]
