"""PluginManager with plugin modules registered directly (no entry points)."""

from __future__ import annotations

import pickle
import types

import pytest

from verl.plugins import (
    PLUGIN_API_VERSION,
    AdvantageEstimatorSpec,
    IncompatiblePluginError,
    PlatformResolutionError,
    PluginConflictError,
    PluginError,
    PluginManager,
    PluginValidationError,
    RolloutEngineSpec,
    TrainingEngineSpec,
    UnknownPluginError,
    hookimpl,
)


def _factory(*args, **kwargs):
    return None


def make_module(name: str, **attrs: object) -> types.ModuleType:
    module = types.ModuleType(name)
    for key, value in attrs.items():
        setattr(module, key, value)
    return module


def rollout_plugin(module_name: str, *names: str, **attrs):
    specs = [RolloutEngineSpec(name=n, factory=_factory) for n in names]

    @hookimpl
    def verl_rollout_engines():
        return specs

    return make_module(module_name, verl_rollout_engines=verl_rollout_engines, **attrs), specs


@pytest.fixture
def pm() -> PluginManager:
    return PluginManager(load_entry_points=False)


def test_get_returns_the_plugins_own_record(pm):
    module, (alpha, beta) = rollout_plugin("fake_alpha", "alpha", "beta")
    info = pm.register(module, dist_name="verl-alpha", version="0.3")
    assert pm.get("rollout_engine", "alpha") is alpha
    assert pm.available("rollout_engine") == {"alpha": alpha, "beta": beta}
    assert pm.providers("rollout_engine") == {"alpha": info, "beta": info}
    assert (info.name, info.distribution, info.version, info.module) == (
        "fake_alpha",
        "verl-alpha",
        "0.3",
        "fake_alpha",
    )
    assert pm.plugins == [info]
    assert pm.provides(info) == {"rollout_engine": ("alpha", "beta")}
    assert pm.provides("fake_alpha") == {"rollout_engine": ("alpha", "beta")}
    assert pm.available("training_engine") == {}


def test_plugin_objects_other_than_modules_work(pm):
    spec = AdvantageEstimatorSpec(name="my_adv", fn=_factory)

    class Plugin:
        @hookimpl
        def verl_advantage_estimators(self):
            return [spec]

    pm.register(Plugin(), name="obj", dist_name="my-dist")
    assert pm.get("advantage_estimator", "my_adv") is spec


def test_unknown_name_lists_available_names_and_a_close_match(pm):
    module, _ = rollout_plugin("fake_names", "alpha", "beta")
    pm.register(module, dist_name="verl-names")
    with pytest.raises(UnknownPluginError) as err:
        pm.get("rollout_engine", "alpah")
    assert isinstance(err.value, ValueError)
    text = str(err.value)
    assert "unknown rollout engine 'alpah'; available: alpha, beta" in text
    assert "Did you mean 'alpha'?" in text
    assert (err.value.kind, err.value.name, err.value.available) == ("rollout_engine", "alpah", ("alpha", "beta"))
    assert "pip install" not in text


def test_unknown_well_known_backend_gets_an_install_hint(pm):
    with pytest.raises(UnknownPluginError, match=r"no plugin provides any rollout engine") as err:
        pm.get("rollout_engine", "vllm")
    assert "verl-vllm plugin, which is not installed; from the verl checkout" in str(err.value)
    assert "pip install './plugins/verl-vllm[cpu]'" in str(err.value)
    with pytest.raises(UnknownPluginError, match=r"pip install \./plugins/verl-fsdp"):
        pm.get("training_engine", "fsdp")
    with pytest.raises(UnknownPluginError, match=r"pip install '\./plugins/verl-npu\[npu\]' \(Ascend NPU"):
        pm.get("platform", "npu")
    with pytest.raises(UnknownPluginError, match=r"pip install '\./plugins/verl-megatron\[cpu\]' \(CPU: megatron-core"):
        pm.get("training_engine", "megatron")
    with pytest.raises(UnknownPluginError, match=r"pip install '\./plugins/verl-sglang\[cuda\]' \(NVIDIA GPU"):
        pm.get("rollout_engine", "sglang")
    with pytest.raises(UnknownPluginError, match=r"pip install '\./plugins/verl-trtllm\[cuda\]'"):
        pm.get("rollout_engine", "tensorrt_llm")
    # algorithm kinds never get backend hints
    with pytest.raises(UnknownPluginError) as err:
        pm.get("advantage_estimator", "vllm")
    assert "pip install" not in str(err.value)


def test_no_install_hint_when_the_distribution_is_installed(pm):
    module, _ = rollout_plugin("fake_vllm_other", "vllm_async")
    pm.register(module, dist_name="verl_vLLM")  # same distribution after PEP 503 normalisation
    with pytest.raises(UnknownPluginError) as err:
        pm.get("rollout_engine", "vllm")
    assert "pip install" not in str(err.value)


def test_two_distributions_claiming_one_name_conflict_naming_both(pm):
    first, _ = rollout_plugin("fake_vllm_a", "vllm", "hf")
    second, _ = rollout_plugin("fake_vllm_b", "vllm")
    pm.register(first, name="vllm", dist_name="verl-vllm", version="0.1")
    pm.register(second, name="vllm", dist_name="vllm-fork", version="9.9")
    with pytest.raises(PluginConflictError) as err:
        pm.get("rollout_engine", "vllm")
    text = str(err.value)
    assert "rollout engine 'vllm' is provided by 2 plugins" in text
    assert "verl-vllm 0.1" in text and "vllm-fork 9.9" in text
    assert isinstance(err.value, ValueError)
    assert [i.distribution for i in err.value.conflicts["vllm"]] == ["verl-vllm", "vllm-fork"]
    assert [c.plugin.distribution for c in pm.claims("rollout_engine")] == ["verl-vllm", "verl-vllm", "vllm-fork"]
    assert list(pm.conflicts("rollout_engine")) == ["vllm"]
    assert pm.available("training_engine") == {}  # other kinds are unaffected


def test_a_conflict_blocks_only_its_own_name(pm):
    """Two unrelated plugins both claim ``foo``: ``hf`` (and every other name) still resolves; ``foo`` is left
    out of ``available``/``providers`` (neither claimant silently wins) and only asking for it raises."""
    core, (hf,) = rollout_plugin("fake_core_hf", "hf")
    first, _ = rollout_plugin("fake_foo_a", "foo", "bar")
    second, _ = rollout_plugin("fake_foo_b", "foo")
    pm.register(core, dist_name="verl-core", version="0.1.0")
    pm.register(first, dist_name="verl-foo-a", version="1.0")
    pm.register(second, dist_name="verl-foo-b", version="2.0")
    assert pm.get("rollout_engine", "hf") is hf
    assert list(pm.available("rollout_engine")) == ["hf", "bar"]
    assert {n: i.distribution for n, i in pm.providers("rollout_engine").items()} == {
        "hf": "verl-core",
        "bar": "verl-foo-a",
    }
    assert pm.provider("rollout_engine", "bar").distribution == "verl-foo-a"
    with pytest.raises(PluginConflictError) as err:
        pm.get("rollout_engine", "foo")
    assert str(err.value).splitlines()[0] == (
        "rollout engine 'foo' is provided by 2 plugins: verl-foo-a 1.0 (entry point 'fake_foo_a', module fake_foo_a); "
        "verl-foo-b 2.0 (entry point 'fake_foo_b', module fake_foo_b)"
    )
    assert list(err.value.conflicts) == ["foo"]
    with pytest.raises(UnknownPluginError) as unknown:
        pm.get("rollout_engine", "baz")
    assert "available: hf, bar" in str(unknown.value)
    assert "Not available because two plugins claim them: 'foo' (verl-foo-a 1.0" in str(unknown.value)


def test_same_name_in_different_kinds_is_not_a_conflict(pm):
    rollout, (r_spec,) = rollout_plugin("fake_kinds", "shared")
    t_spec = TrainingEngineSpec(name="shared", factory=_factory)
    pm.register(rollout, dist_name="a")
    pm.register(make_module("fake_kinds_t", verl_training_engines=hookimpl(lambda: [t_spec])), dist_name="b")
    assert pm.get("rollout_engine", "shared") is r_spec
    assert pm.get("training_engine", "shared") is t_spec


@pytest.mark.parametrize(
    "declared,needle",
    [
        ((3, 0), "was built for verl plugin API 3.0, but this verl-core serves API 2.6"),
        ((0, 9), "was built for verl plugin API 0.9"),
        # A plugin of API 1.x hears what 2.0 changed: its factories must take the validated options.
        (
            (1, 0),
            "serves API 2.6: install a release of verl-old built for API 2.x, or a verl-core serving API 1.x "
            "(what changed: API 2.0: engine factories take a required keyword 'options'",
        ),
        ((2, 7), "needs verl plugin API 2.7, but this verl-core serves API 2.6: upgrade verl-core"),
        ("1.0", "VERL_PLUGIN_API='1.0'; it must be a (major, minor) tuple of ints"),
        ((1,), "it must be a (major, minor) tuple"),
        ((True, 0), "it must be a (major, minor) tuple"),
    ],
)
def test_incompatible_api_versions_are_refused(pm, declared, needle):
    module, _ = rollout_plugin("fake_api", "x", VERL_PLUGIN_API=declared)
    with pytest.raises(IncompatiblePluginError) as err:
        pm.register(module, dist_name="verl-old", version="0.0.1")
    assert needle in str(err.value)
    assert "verl-old 0.0.1" in str(err.value)
    assert pm.plugins == []


def test_compatible_api_versions_are_recorded(pm):
    assert PLUGIN_API_VERSION == (2, 6)
    same, _ = rollout_plugin("fake_api_same", "a", VERL_PLUGIN_API=(2, 6))
    # 2.1 only added names to the surface: a plugin built for 2.0 is accepted as it is.
    older_minor, _ = rollout_plugin("fake_api_older", "c", VERL_PLUGIN_API=(2, 0))
    undeclared, _ = rollout_plugin("fake_api_none", "b")
    assert pm.register(same).api_version == (2, 6)
    assert pm.register(older_minor).api_version == (2, 0)
    assert pm.register(undeclared).api_version is None


def test_unmarked_hook_function_is_refused(pm):
    def verl_platforms():
        return []

    with pytest.raises(PluginValidationError, match=r"verl_platforms\(\) is not marked with @verl.plugins.hookimpl"):
        pm.register(make_module("fake_unmarked", verl_platforms=verl_platforms))


def test_marked_function_matching_no_hook_is_refused(pm):
    with pytest.raises(PluginValidationError) as err:
        pm.register(make_module("fake_typo", verl_platfroms=hookimpl(lambda: [])))
    assert "@hookimpl verl_platfroms() matches no verl hook" in str(err.value)
    assert "verl_platforms" in str(err.value)


def test_wrappers_and_hook_arguments_are_refused(pm):
    def verl_policy_losses():
        yield

    with pytest.raises(PluginValidationError, match=r"is a wrapper"):
        pm.register(make_module("fake_wrapper", verl_policy_losses=hookimpl(wrapper=True)(verl_policy_losses)))

    def verl_rollout_engines(config):
        return []

    with pytest.raises(PluginValidationError, match=r"Argument\(s\) \{'config'\}"):
        pm.register(make_module("fake_args", verl_rollout_engines=hookimpl(verl_rollout_engines)))
    assert pm.plugins == []


def test_registering_the_same_module_twice_is_refused(pm):
    module, _ = rollout_plugin("fake_twice", "a")
    pm.register(module, dist_name="d")
    with pytest.raises(PluginValidationError, match=r"already registered"):
        pm.register(module, name="again", dist_name="d")


def test_a_raising_hook_is_recorded_and_does_not_hide_other_plugins(pm, caplog):
    good, (good_spec,) = rollout_plugin("fake_good", "hf")

    @hookimpl
    def verl_rollout_engines():
        raise ModuleNotFoundError("No module named 'vllm'")

    pm.register(make_module("fake_bad", verl_rollout_engines=verl_rollout_engines), dist_name="verl-vllm", version="2")
    pm.register(good, dist_name="good-dist")
    with caplog.at_level("WARNING", logger="verl.plugins"):
        assert pm.available("rollout_engine") == {"hf": good_spec}
    (failure,) = pm.failures
    assert (failure.stage, failure.plugin.distribution) == ("hook:verl_rollout_engines", "verl-vllm")
    assert failure.error == "ModuleNotFoundError: No module named 'vllm'"
    assert isinstance(failure.exception, ModuleNotFoundError)
    assert "verl-vllm 2" in caplog.text and "No module named 'vllm'" in caplog.text
    with pytest.raises(UnknownPluginError) as err:
        pm.get("rollout_engine", "vllm")
    text = str(err.value)
    assert "Plugins that failed to load" in text
    assert "verl-vllm 2 (entry point 'fake_bad', module fake_bad) [hook:verl_rollout_engines]" in text
    assert "ModuleNotFoundError: No module named 'vllm'" in text
    assert "pip install" not in text  # verl-vllm is installed, it failed
    assert err.value.failures == (failure,)
    pm.get("rollout_engine", "hf")
    assert len(pm.failures) == 1  # recorded once, not per lookup


@pytest.mark.parametrize(
    "result,needle",
    [
        ("hf", "returned str; it must return a list of RolloutEngineSpec"),
        ([TrainingEngineSpec(name="hf", factory=_factory)], "returned TrainingEngineSpec items"),
    ],
)
def test_hook_returning_the_wrong_type_is_recorded(pm, result, needle):
    pm.register(make_module("fake_wrong", verl_rollout_engines=hookimpl(lambda: result)), dist_name="wrong")
    assert pm.available("rollout_engine") == {}
    (failure,) = pm.failures
    assert needle in failure.error and failure.error.startswith("PluginValidationError")


def test_hook_returning_none_provides_nothing(pm):
    pm.register(make_module("fake_none", verl_policy_losses=hookimpl(lambda: None)))
    assert pm.available("policy_loss") == {}
    assert pm.failures == []


def test_invalid_record_built_inside_a_hook_is_recorded(pm):
    @hookimpl
    def verl_rollout_engines():
        return [RolloutEngineSpec(name="bad name", factory=_factory)]

    pm.register(make_module("fake_badname", verl_rollout_engines=verl_rollout_engines), dist_name="d")
    assert pm.available("rollout_engine") == {}
    assert "'bad name' is not a valid name" in pm.failures[0].error


def test_registering_invalidates_collected_specs(pm):
    first, (a,) = rollout_plugin("fake_first", "a")
    second, (b,) = rollout_plugin("fake_second", "b")
    pm.register(first)
    assert pm.available("rollout_engine") == {"a": a}
    pm.register(second)
    assert pm.available("rollout_engine") == {"a": a, "b": b}


def test_bad_kind_and_bad_name_type(pm):
    with pytest.raises(ValueError, match=r"unknown plugin kind 'rollout'; expected one of: platform, training_engine"):
        pm.get("rollout", "vllm")
    with pytest.raises(TypeError, match=r"rollout engine name must be a str, got NoneType"):
        pm.get("rollout_engine", None)


def test_errors_survive_pickling_with_their_attributes(pm):
    class NeedsArgs(Exception):  # cannot be re-created from args: must not break pickling
        def __init__(self, code, detail):
            super().__init__(f"{code}: {detail}")

    @hookimpl
    def verl_rollout_engines():
        raise NeedsArgs(7, "driver")

    pm.register(make_module("fake_pickle_bad", verl_rollout_engines=verl_rollout_engines), dist_name="bad-dist")
    with pytest.raises(UnknownPluginError) as err:
        pm.get("rollout_engine", "vllm")
    clone = pickle.loads(pickle.dumps(err.value))
    assert str(clone) == str(err.value)
    assert (clone.kind, clone.name) == ("rollout_engine", "vllm")
    (failure,) = clone.failures
    assert failure == err.value.failures[0]
    assert (failure.plugin.distribution, failure.error, failure.plugin.plugin) == (
        "bad-dist",
        "NeedsArgs: 7: driver",
        None,
    )

    first, _ = rollout_plugin("fake_pickle_a", "dup")
    second, _ = rollout_plugin("fake_pickle_b", "dup")
    pm.register(first, dist_name="a")
    pm.register(second, dist_name="b")
    with pytest.raises(PluginConflictError) as err:
        pm.get("rollout_engine", "dup")
    clone = pickle.loads(pickle.dumps(err.value))
    assert [i.distribution for i in clone.conflicts["dup"]] == ["a", "b"]
    amb = pickle.loads(pickle.dumps(PlatformResolutionError("two probes", answers=("a", "b"))))
    assert amb.answers == ("a", "b") and isinstance(amb, PluginError)
