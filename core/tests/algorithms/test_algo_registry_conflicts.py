"""A plugin providing an estimator/loss name that core (or another plugin) also has is a PluginConflictError.

The plugin-aware lookups are :func:`verl.plugins.get_adv_estimator_fn` / ``get_policy_loss_fn`` (what the trainer,
the workers and config load use); ``verl.algorithms``' own lookups see the in-process registry only."""

from __future__ import annotations

import types
import uuid

import pytest

import verl.plugins
from verl.algorithms import (
    ADV_ESTIMATOR_REGISTRY,
    POLICY_LOSS_REGISTRY,
    AdvantageEstimator,
    compute_grpo_outcome_advantage,
    compute_policy_loss_vanilla,
    register_adv_est,
)
from verl.plugins import (
    AdvantageEstimatorSpec,
    PluginConflictError,
    PluginManager,
    PolicyLossSpec,
    get_adv_estimator_fn,
    get_policy_loss_fn,
    hookimpl,
)
from verl.plugins import builtin as builtin_plugin


def plugin_module(name: str, estimators=(), losses=()) -> types.ModuleType:
    module = types.ModuleType(name)

    @hookimpl
    def verl_advantage_estimators():
        return [AdvantageEstimatorSpec(name=n, fn=f) for n, f in estimators]

    @hookimpl
    def verl_policy_losses():
        return [PolicyLossSpec(name=n, fn=f) for n, f in losses]

    module.verl_advantage_estimators = verl_advantage_estimators
    module.verl_policy_losses = verl_policy_losses
    return module


def plugin_grpo(**kwargs):
    return "plugin"


def plugin_vanilla(*args, **kwargs):
    return "plugin"


@pytest.fixture
def pm(monkeypatch) -> PluginManager:
    manager = PluginManager(load_entry_points=False)
    manager.register(builtin_plugin, name="builtin", dist_name="verl-core", version="0.0.test")
    monkeypatch.setattr(verl.plugins, "get_plugin_manager", lambda: manager)
    return manager


@pytest.fixture
def fresh_name():
    names = []

    def make(prefix):
        names.append(f"{prefix}_{uuid.uuid4().hex[:8]}")
        return names[-1]

    yield make
    for name in names:
        ADV_ESTIMATOR_REGISTRY.pop(name, None)
        POLICY_LOSS_REGISTRY.pop(name, None)


def test_plugin_claiming_a_core_estimator_names_both_providers(pm):
    pm.register(plugin_module("fake_grpo_plugin", estimators=[("grpo", plugin_grpo)]), dist_name="verl-foo")
    for query in ("grpo", AdvantageEstimator.GRPO):
        with pytest.raises(PluginConflictError) as err:
            get_adv_estimator_fn(query)
        text = str(err.value)
        assert "advantage estimator 'grpo' is provided by 2 plugins" in text
        assert "verl-core 0.0.test" in text and "verl-foo" in text
        assert "compute_grpo_outcome_advantage" in text and "plugin_grpo" in text
        assert isinstance(err.value, ValueError)
    assert [info.distribution for info in err.value.conflicts["grpo"]] == ["verl-core", "verl-foo"]


def test_plugin_claiming_a_core_loss_names_both_providers(pm):
    pm.register(plugin_module("fake_loss_plugin", losses=[("vanilla", plugin_vanilla)]), dist_name="verl-bar")
    with pytest.raises(PluginConflictError, match=r"policy loss 'vanilla' is provided by 2 plugins.*verl-bar"):
        get_policy_loss_fn("vanilla")
    assert get_policy_loss_fn("gspo").__name__ == "compute_policy_loss_gspo"  # other names are unaffected


def test_a_conflict_is_never_reported_as_an_unknown_name(pm, fresh_name):
    own = fresh_name("own")
    pm.register(
        plugin_module("fake_mixed", estimators=[("grpo", plugin_grpo), (own, plugin_grpo)]), dist_name="verl-foo"
    )
    with pytest.raises(PluginConflictError, match="'grpo' is provided by 2 plugins"):
        get_adv_estimator_fn("grpo")
    assert get_adv_estimator_fn(own) is plugin_grpo  # a conflict blocks its own name only, never another


def test_two_plugins_claiming_one_new_name(pm, fresh_name):
    name = fresh_name("dup")
    pm.register(plugin_module("fake_a", estimators=[(name, plugin_grpo)]), dist_name="verl-a", version="1")
    pm.register(plugin_module("fake_b", estimators=[(name, lambda **kw: None)]), dist_name="verl-b", version="2")
    with pytest.raises(PluginConflictError) as err:
        get_adv_estimator_fn(name)
    assert "verl-a 1" in str(err.value) and "verl-b 2" in str(err.value)


def test_in_process_registration_after_collection_still_conflicts(pm, fresh_name):
    name = fresh_name("late")
    pm.register(plugin_module("fake_late", estimators=[(name, plugin_grpo)]), dist_name="verl-late")
    assert get_adv_estimator_fn(name) is plugin_grpo  # only the plugin has it so far

    @register_adv_est(name)
    def mine(**kwargs):
        return "mine"

    with pytest.raises(PluginConflictError) as err:
        get_adv_estimator_fn(name)
    assert "verl-late" in str(err.value) and "mine" in str(err.value)


def test_the_same_function_offered_again_is_not_a_conflict(pm, fresh_name):
    name = fresh_name("same")

    @register_adv_est(name)
    def shared(**kwargs):
        return "shared"

    pm.register(plugin_module("fake_same", estimators=[(name, shared)]), dist_name="verl-same")
    assert get_adv_estimator_fn(name) is shared


def test_without_rival_plugins_core_and_plugin_names_resolve(pm, fresh_name):
    name = fresh_name("extra")
    pm.register(plugin_module("fake_extra", losses=[(name, plugin_vanilla)]), dist_name="verl-extra")
    assert get_adv_estimator_fn("grpo") is compute_grpo_outcome_advantage
    assert get_policy_loss_fn("vanilla") is compute_policy_loss_vanilla
    assert get_policy_loss_fn(name) is plugin_vanilla


def test_registering_a_different_function_twice_raises_as_verl(fresh_name):
    name = fresh_name("twice")
    register_adv_est(name)(plugin_grpo)
    with pytest.raises(ValueError, match=f"advantage estimator '{name}' is already registered"):
        register_adv_est(name)(plugin_vanilla)
    with pytest.raises(ValueError, match="Unknown advantage estimator 'no_such_thing'.*grpo_vectorized"):
        get_adv_estimator_fn("no_such_thing")


def test_config_validation_reports_the_conflict(pm):
    from verl.config import ConfigError
    from verl.config.backend_options import validate_registered_names
    from verl.config.schema import RootConfig

    pm.register(plugin_module("fake_grpo_cfg", estimators=[("grpo", plugin_grpo)]), dist_name="verl-foo")
    import attrs

    cfg = RootConfig()
    cfg = attrs.evolve(cfg, algorithm=attrs.evolve(cfg.algorithm, adv_estimator="grpo"))
    with pytest.raises(ConfigError, match=r"algorithm.adv_estimator.*provided by 2 plugins.*verl-foo"):
        validate_registered_names(cfg)
