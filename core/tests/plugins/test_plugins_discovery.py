"""Discovery through installed distributions: fake ``*.dist-info`` folders on ``sys.path``."""

from __future__ import annotations

import importlib.metadata
import sys
import threading

import pytest

from verl.plugins import (
    PluginConflictError,
    UnknownPluginError,
    get_plugin_manager,
    reset_plugin_manager,
)
from verl.plugins.manager import PluginManager

GOOD = """
from verl.plugins import hookimpl
from verl.plugins.specs import RolloutEngineSpec

VERL_PLUGIN_API = (2, 0)

def _make(*args, **kwargs):
    raise AssertionError("factories must not run during discovery")

@hookimpl
def verl_rollout_engines():
    return [RolloutEngineSpec(name="{name}", factory=_make, devices=("cuda",))]
"""


def test_installed_plugin_is_found_with_its_distribution(fake_dist):
    fake_dist("verl-foo", "1.2.3", entry_points={"foo": "foo_plugin"}, modules={"foo_plugin": GOOD.format(name="foo")})
    pm = PluginManager()
    spec = pm.get("rollout_engine", "foo")
    assert spec.devices == ("cuda",)
    builtin, foo = pm.plugins
    assert (builtin.name, builtin.distribution) == ("builtin", "verl-core")
    assert (foo.name, foo.distribution, foo.version, foo.module, foo.api_version) == (
        "foo",
        "verl-foo",
        "1.2.3",
        "foo_plugin",
        (2, 0),
    )
    assert foo.plugin is sys.modules["foo_plugin"]
    assert pm.provides(foo) == {"rollout_engine": ("foo",)}
    assert pm.failures == []


def test_plugins_load_lazily_on_first_query(fake_dist):
    fake_dist("verl-lazy", entry_points={"lazy": "lazy_plugin"}, modules={"lazy_plugin": GOOD.format(name="lazy")})
    pm = get_plugin_manager()
    assert get_plugin_manager() is pm
    assert "lazy_plugin" not in sys.modules  # creating the manager imports nothing
    pm.available("rollout_engine")
    assert "lazy_plugin" in sys.modules
    reset_plugin_manager()
    assert get_plugin_manager() is not pm


def test_import_error_is_recorded_with_distribution_and_shown_in_lookups(fake_dist, caplog):
    broken = "import verl_test_missing_backend_xyz\n"
    fake_dist("verl-vllm", "0.4.0", entry_points={"vllm": "broken_vllm_plugin"}, modules={"broken_vllm_plugin": broken})
    pm = PluginManager()
    with caplog.at_level("WARNING", logger="verl.plugins"):
        assert [p.name for p in pm.plugins] == ["builtin"]  # discovery did not crash
    (failure,) = pm.failures
    assert failure.stage == "import"
    assert (failure.plugin.name, failure.plugin.distribution, failure.plugin.version) == ("vllm", "verl-vllm", "0.4.0")
    assert failure.plugin.module == "broken_vllm_plugin"
    assert failure.error == "ModuleNotFoundError: No module named 'verl_test_missing_backend_xyz'"
    assert "verl-vllm 0.4.0" in caplog.text
    with pytest.raises(UnknownPluginError) as err:
        pm.get("rollout_engine", "vllm")
    text = str(err.value)
    assert "verl-vllm 0.4.0 (entry point 'vllm', module broken_vllm_plugin) [import]" in text
    assert "No module named 'verl_test_missing_backend_xyz'" in text
    assert "pip install" not in text


def test_any_exception_at_import_is_recorded(fake_dist):
    fake_dist(
        "verl-boom", entry_points={"boom": "boom_plugin"}, modules={"boom_plugin": "raise RuntimeError('no CANN')"}
    )
    fake_dist("verl-gone", entry_points={"gone": "module_that_does_not_exist_xyz"}, modules={})
    pm = PluginManager()
    errors = {f.plugin.name: f.error for f in pm.failures}
    assert errors == {
        "boom": "RuntimeError: no CANN",
        "gone": "ModuleNotFoundError: No module named 'module_that_does_not_exist_xyz'",
    }


def test_api_mismatch_on_disk_is_refused_and_reported(fake_dist):
    source = GOOD.format(name="old").replace("VERL_PLUGIN_API = (2, 0)", "VERL_PLUGIN_API = (0, 3)")
    fake_dist("verl-old", "0.0.9", entry_points={"old": "old_plugin"}, modules={"old_plugin": source})
    pm = PluginManager()
    (failure,) = pm.failures
    assert failure.stage == "api_version"
    assert "built for verl plugin API 0.3, but this verl-core serves API 2.6" in failure.error
    assert failure.error.startswith("IncompatiblePluginError")
    with pytest.raises(UnknownPluginError, match=r"verl-old 0.0.9 .*\[api_version\]"):
        pm.get("rollout_engine", "old")


def test_hook_api_violation_on_disk_is_refused_and_reported(fake_dist):
    source = "def verl_platforms():\n    return []\n"
    fake_dist("verl-unmarked", entry_points={"unmarked": "unmarked_plugin"}, modules={"unmarked_plugin": source})
    (failure,) = PluginManager().failures
    assert failure.stage == "validation"
    assert "verl_platforms() is not marked with @verl.plugins.hookimpl" in failure.error


def test_two_installed_distributions_claiming_one_name_conflict(fake_dist):
    fake_dist(
        "verl-vllm", "0.1", entry_points={"vllm": "vllm_a_plugin"}, modules={"vllm_a_plugin": GOOD.format(name="vllm")}
    )
    fake_dist(
        "vllm-fork", "7.0", entry_points={"vllm": "vllm_b_plugin"}, modules={"vllm_b_plugin": GOOD.format(name="vllm")}
    )
    pm = PluginManager()
    with pytest.raises(PluginConflictError) as err:
        pm.get("rollout_engine", "vllm")
    text = str(err.value)
    assert "verl-vllm 0.1 (entry point 'vllm', module vllm_a_plugin)" in text
    assert "vllm-fork 7.0 (entry point 'vllm', module vllm_b_plugin)" in text
    assert pm.get("platform", "cpu").name == "cpu"  # only the conflicting kind is blocked


@pytest.mark.parametrize("allow", ["none", "NONE", " none , "])
def test_allow_list_none_loads_only_builtins(fake_dist, monkeypatch, allow):
    fake_dist("verl-foo", "1.0", entry_points={"foo": "foo_plugin"}, modules={"foo_plugin": GOOD.format(name="foo")})
    monkeypatch.setenv("VERL_PLUGINS", allow)
    pm = PluginManager()
    assert [p.name for p in pm.plugins] == ["builtin"]
    assert [(d.name, d.distribution) for d in pm.disabled] == [("foo", "verl-foo")]
    assert "foo_plugin" not in sys.modules  # disabled plugins are not imported
    with pytest.raises(UnknownPluginError) as err:
        pm.get("rollout_engine", "foo")
    assert f"VERL_PLUGINS={allow!r} does not list them" in str(err.value)
    assert "verl-foo 1.0 (entry point 'foo', module foo_plugin)" in str(err.value)


@pytest.mark.parametrize("allow", ["foo", "verl-foo", "Verl_Foo", "bar,foo"])
def test_allow_list_matches_entry_point_or_distribution_name(fake_dist, monkeypatch, allow):
    fake_dist("verl-foo", entry_points={"foo": "foo_plugin"}, modules={"foo_plugin": GOOD.format(name="foo")})
    fake_dist("verl-bar", entry_points={"bar": "bar_plugin"}, modules={"bar_plugin": GOOD.format(name="bar")})
    fake_dist("verl-baz", entry_points={"baz": "baz_plugin"}, modules={"baz_plugin": GOOD.format(name="baz")})
    monkeypatch.setenv("VERL_PLUGINS", allow)
    pm = PluginManager()
    loaded = {p.name for p in pm.plugins}
    assert "foo" in loaded and "baz" not in loaded and "builtin" in loaded
    assert ("bar" in loaded) == ("bar" in allow)
    assert pm.failures == []


def test_allow_list_typo_is_reported(fake_dist, monkeypatch):
    monkeypatch.setenv("VERL_PLUGINS", "vlm")
    (failure,) = PluginManager().failures
    assert failure.stage == "allow_list"
    assert "VERL_PLUGINS='vlm' names 'vlm', but no installed plugin has that entry-point or distribution name" in (
        failure.error
    )


def test_builtin_is_registered_directly_without_installed_metadata(monkeypatch):
    monkeypatch.setattr("verl.plugins.manager.iter_entry_points", lambda: [])
    pm = PluginManager()
    (info,) = pm.plugins
    assert (info.name, info.distribution, info.module) == ("builtin", "verl-core", "verl.plugins.builtin")
    assert set(pm.available("platform")) == {"cpu", "cuda", "rocm"}


def test_builtin_entry_point_is_declared_by_verl_core():
    eps = [ep for ep in importlib.metadata.entry_points(group="verl.plugins") if ep.value == "verl.plugins.builtin"]
    assert [(ep.name, ep.dist.metadata["Name"]) for ep in eps] == [("builtin", "verl-core")]


def test_concurrent_first_queries_wait_for_the_whole_load(fake_dist):
    slow = "import time\ntime.sleep(0.3)\n" + GOOD.format(name="slow")
    fake_dist("verl-slow", entry_points={"slow": "slow_plugin"}, modules={"slow_plugin": slow})
    pm = PluginManager()
    results: list[object] = []

    def lookup():
        try:
            results.append(([p.name for p in pm.plugins], pm.get("rollout_engine", "slow").name))
        except Exception as exc:  # collected and asserted below
            results.append(exc)

    threads = [threading.Thread(target=lookup) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert results == [(["builtin", "slow"], "slow")] * 4


def test_a_plugin_querying_the_manager_while_imported_does_not_recurse(fake_dist):
    source = (
        "from verl.plugins import get_plugin_manager\n"
        "SEEN = sorted(get_plugin_manager().available('platform'))\n" + GOOD.format(name="nosy")
    )
    fake_dist("verl-nosy", entry_points={"nosy": "nosy_plugin"}, modules={"nosy_plugin": source})
    pm = get_plugin_manager()
    assert pm.get("rollout_engine", "nosy").name == "nosy"
    assert sys.modules["nosy_plugin"].SEEN == ["cpu", "cuda", "rocm"]  # the built-in loaded before it
    assert pm.failures == []
