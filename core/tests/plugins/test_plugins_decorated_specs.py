"""A plugin that registers an estimator / policy loss with verl's decorators *and* returns it as a spec.

Core's built-in plugin relays the decorator registries, so such a name is claimed twice with one function
object: that is one provider (the plugin), not a conflict. A different function under the name still is.
"""

from __future__ import annotations

import pytest

from verl.algorithms.registry import ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY
from verl.plugins import PluginConflictError, PluginManager, get_adv_estimator_fn, get_policy_loss_fn

NAMES = ("decorated_est", "plain_est", "decorated_loss", "plain_loss")

BOTH_WAYS = """
from verl.algorithms import register_adv_est, register_policy_loss
from verl.plugins import hookimpl
from verl.plugins.specs import AdvantageEstimatorSpec, PolicyLossSpec

VERL_PLUGIN_API = (2, 0)

@register_adv_est("decorated_est")
def decorated_est(**kwargs):
    return "decorated_est"

def plain_est(**kwargs):
    return "plain_est"

@register_policy_loss("decorated_loss")
def decorated_loss(*args, **kwargs):
    return "decorated_loss"

def plain_loss(*args, **kwargs):
    return "plain_loss"

@hookimpl
def verl_advantage_estimators():
    return [AdvantageEstimatorSpec(name="decorated_est", fn=decorated_est),
            AdvantageEstimatorSpec(name="plain_est", fn=plain_est)]

@hookimpl
def verl_policy_losses():
    return [PolicyLossSpec(name="decorated_loss", fn=decorated_loss),
            PolicyLossSpec(name="plain_loss", fn=plain_loss),
            PolicyLossSpec(name="plain_loss", fn=plain_loss)]  # the same record listed twice
"""

# Registers one function with the decorator and offers a *different* one under the same name.
TWO_FUNCTIONS = """
from verl.algorithms import register_adv_est
from verl.plugins import hookimpl
from verl.plugins.specs import AdvantageEstimatorSpec

VERL_PLUGIN_API = (2, 0)

@register_adv_est("decorated_est")
def decorated_est(**kwargs):
    return "registered"

def other(**kwargs):
    return "offered"

@hookimpl
def verl_advantage_estimators():
    return [AdvantageEstimatorSpec(name="decorated_est", fn=other)]
"""


@pytest.fixture(autouse=True)
def _clean_registries():
    yield
    for registry in (ADV_ESTIMATOR_REGISTRY, POLICY_LOSS_REGISTRY):
        for name in NAMES:
            registry.pop(name, None)


def _install(fake_dist, source: str) -> None:
    fake_dist("verl-both", "0.2", entry_points={"both": "both_plugin"}, modules={"both_plugin": source})


def test_decorated_and_returned_function_counts_once(fake_dist):
    _install(fake_dist, BOTH_WAYS)
    pm = PluginManager()
    assert pm.conflicts("advantage_estimator") == {}
    assert pm.conflicts("policy_loss") == {}
    # Looking up the plugin's other names no longer trips over the doubled one.
    assert pm.get("advantage_estimator", "plain_est").fn() == "plain_est"
    assert pm.get("advantage_estimator", "decorated_est").fn() == "decorated_est"
    assert pm.get("policy_loss", "plain_loss").fn() == "plain_loss"
    assert pm.get("policy_loss", "decorated_loss").fn() == "decorated_loss"
    # The name is the plugin's, not core's, in what `verl plugins` reports.
    both = next(p for p in pm.plugins if p.distribution == "verl-both")
    core = next(p for p in pm.plugins if p.distribution == "verl-core")
    assert pm.providers("advantage_estimator")["decorated_est"] == both
    assert pm.providers("policy_loss")["decorated_loss"] == both
    assert pm.provides(both) == {
        "advantage_estimator": ("decorated_est", "plain_est"),
        "policy_loss": ("decorated_loss", "plain_loss"),
    }
    assert not set(NAMES) & {n for names in pm.provides(core).values() for n in names}
    # Core's own estimators are unaffected.
    assert pm.providers("advantage_estimator")["grpo"] == core


def test_decorated_names_resolve_through_the_plugin_aware_lookup(fake_dist, monkeypatch):
    _install(fake_dist, BOTH_WAYS)
    from verl.plugins import manager

    monkeypatch.setattr(manager, "_manager", PluginManager())
    assert get_adv_estimator_fn("plain_est")() == "plain_est"
    assert get_adv_estimator_fn("decorated_est")() == "decorated_est"
    assert get_policy_loss_fn("plain_loss")() == "plain_loss"


def test_a_different_function_under_the_decorated_name_is_still_a_conflict(fake_dist):
    _install(fake_dist, TWO_FUNCTIONS)
    pm = PluginManager()
    conflicts = pm.conflicts("advantage_estimator")
    assert [i.distribution for i in conflicts["decorated_est"]] == ["verl-core", "verl-both"]
    with pytest.raises(PluginConflictError, match="advantage estimator 'decorated_est' is provided by 2 plugins"):
        pm.get("advantage_estimator", "decorated_est")
    assert pm.get("advantage_estimator", "grpo").name == "grpo"  # the conflict blocks its own name only


def test_verl_plugins_lists_the_decorated_name_once_under_the_plugin(fake_dist, monkeypatch):
    _install(fake_dist, BOTH_WAYS)
    from verl.cli.plugins_cmd import build_report
    from verl.plugins import manager

    monkeypatch.setattr(manager, "_manager", PluginManager())
    report = build_report()
    rows = [r for r in report["specs"]["advantage_estimator"] if r["name"] == "decorated_est"]
    assert [r["distribution"] for r in rows] == ["verl-both"]
    assert report["conflicts"] == []
