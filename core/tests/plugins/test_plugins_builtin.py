"""Core's built-in plugin, loaded through the installed ``verl.plugins`` entry point."""

from __future__ import annotations

import importlib.metadata
import importlib.util
import types

import pytest

from verl.plugins import PLUGIN_API_VERSION, AdvantageEstimatorSpec, PolicyLossSpec, get_plugin_manager, hookimpl
from verl.plugins import builtin as builtin_plugin

needs_algorithms = pytest.mark.skipif(
    importlib.util.find_spec("verl.algorithms.registry") is None,
    reason="verl.algorithms.registry is not present in this checkout",
)


def test_builtin_comes_first_with_core_distribution_metadata():
    info = get_plugin_manager().plugins[0]
    assert (info.name, info.module, info.distribution) == ("builtin", "verl.plugins.builtin", "verl-core")
    assert info.version == importlib.metadata.version("verl-core")
    assert info.api_version == PLUGIN_API_VERSION == builtin_plugin.VERL_PLUGIN_API
    assert info.plugin is builtin_plugin


def test_builtin_platforms():
    from verl.platform.cpu import CpuPlatform

    pm = get_plugin_manager()
    cpu, cuda = pm.get("platform", "cpu"), pm.get("platform", "cuda")
    assert cpu.accelerator is False and cuda.accelerator is True
    assert isinstance(cpu.factory(), CpuPlatform)
    assert bool(cpu.probe()) is True
    assert cuda.probe.__name__ == "probe_cuda"
    assert cuda.factory.__name__ == "make_cuda_platform"
    assert pm.providers("platform")["cuda"].distribution == "verl-core"


@needs_algorithms
def test_builtin_algorithms_mirror_the_local_registries():
    from verl.algorithms.registry import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY

    pm = get_plugin_manager()
    adv = pm.available("advantage_estimator")
    losses = pm.available("policy_loss")
    assert {name: spec.fn for name, spec in adv.items()} == ADV_ESTIMATOR_REGISTRY
    assert {name: spec.fn for name, spec in losses.items()} == POLICY_LOSS_REGISTRY
    # verl's core estimator and loss names (verl/trainer/ppo/core_algos.py)
    assert {"gae", "grpo", "rloo", "reinforce_plus_plus", "remax"} <= set(adv)
    assert {"vanilla", "gspo"} <= set(losses)
    assert pm.failures == []


@needs_algorithms
def test_plugin_aware_lookup_reaches_plugin_provided_entries():
    import verl.algorithms
    from verl.plugins import get_adv_estimator_fn, get_policy_loss_fn

    def my_adv(**kwargs):
        return None

    def my_loss(**kwargs):
        return None

    plugin = types.ModuleType("fake_algo_plugin")
    plugin.verl_advantage_estimators = hookimpl(lambda: [AdvantageEstimatorSpec(name="my_adv_xyz", fn=my_adv)])
    plugin.verl_policy_losses = hookimpl(lambda: [PolicyLossSpec(name="my_loss_xyz", fn=my_loss)])
    get_plugin_manager().register(plugin, dist_name="my-algos")
    assert get_adv_estimator_fn("my_adv_xyz") is my_adv
    assert get_policy_loss_fn("my_loss_xyz") is my_loss
    # verl.algorithms' own lookup (verl's) sees the in-process registry only, and says where to look instead.
    with pytest.raises(ValueError, match="verl.plugins.get_adv_estimator_fn"):
        verl.algorithms.get_adv_estimator_fn("my_adv_xyz")
