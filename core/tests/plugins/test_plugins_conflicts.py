"""Two unrelated installed plugins (stand-in distributions written by the ``fake_dist`` fixture) both claim
rollout engine ``foo``: only ``foo`` is blocked, through the real entry-point discovery, config load and
``verl plugins``."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config
from verl.plugins import PluginConflictError, get_plugin_manager

FOO = """
from verl.plugins import hookimpl
from verl.plugins.specs import RolloutEngineSpec

VERL_PLUGIN_API = (2, 0)


def _make(*args, **kwargs):
    raise AssertionError("factories must not run during discovery")


@hookimpl
def verl_rollout_engines():
    return [RolloutEngineSpec(name="foo", factory=_make)]
"""


@pytest.fixture
def two_foos(fake_dist):
    fake_dist("verl-foo-a", "1.0", entry_points={"a": "foo_a_plugin"}, modules={"foo_a_plugin": FOO})
    fake_dist("verl-foo-b", "2.0", entry_points={"b": "foo_b_plugin"}, modules={"foo_b_plugin": FOO})


def test_the_default_hf_engine_still_resolves_and_loads(two_foos):
    pm = get_plugin_manager()
    assert pm.get("rollout_engine", "hf").name == "hf"
    assert "foo" not in pm.available("rollout_engine")
    cfg = load_config(plugin_manager=pm)  # rollout.name=hf: the unrelated conflict does not matter
    assert cfg.actor_rollout_ref.rollout.name == "hf"


def test_asking_for_the_conflicting_name_names_both_providers(two_foos):
    pm = get_plugin_manager()
    with pytest.raises(PluginConflictError) as err:
        pm.get("rollout_engine", "foo")
    text = str(err.value)
    assert "rollout engine 'foo' is provided by 2 plugins" in text
    assert "verl-foo-a 1.0 (entry point 'a', module foo_a_plugin)" in text
    assert "verl-foo-b 2.0 (entry point 'b', module foo_b_plugin)" in text
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["actor_rollout_ref.rollout.name=foo"], plugin_manager=pm)
    assert info.value.key == "actor_rollout_ref.rollout.name" and "provided by 2 plugins" in str(info.value)


def test_verl_plugins_lists_both_claimants_as_not_usable(two_foos, capsys):
    from verl.cli import plugins_cmd

    report = plugins_cmd.build_report()
    rows = [r for r in report["specs"]["rollout_engine"] if r["name"] in ("foo", "hf")]
    assert [(r["name"], r["distribution"], r["usable"], r["reason"]) for r in rows] == [
        ("hf", "verl-core", True, f"runs on {report['platform']['name']}"),
        ("foo", "verl-foo-a", False, "conflict: provided by verl-foo-a and verl-foo-b"),
        ("foo", "verl-foo-b", False, "conflict: provided by verl-foo-a and verl-foo-b"),
    ]
    assert [(c["kind"], c["name"]) for c in report["conflicts"]] == [("rollout_engine", "foo")]
