"""Backend selection and per-backend options (engine_kwargs.<name>) through a fake plugin manager."""

from __future__ import annotations

from types import SimpleNamespace

import attrs
import pytest

import verl.config.backend_options as backend_options
from verl.config import (
    ConfigError,
    load_config,
    structure_options,
    validate_backend_options,
    validate_registered_names,
)

ROLLOUT = "actor_rollout_ref.rollout"
ACTOR = "actor_rollout_ref.actor"


def test_selected_rollout_options_are_structured(fake_backends, plugin_kit) -> None:
    cfg = load_config(overrides=[f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.engine_kwargs.vllm.gpu_memory_utilization=0.4"])
    options = validate_backend_options(cfg, fake_backends)
    assert options[f"{ROLLOUT}.engine_kwargs.vllm"] == plugin_kit.VllmOptions(gpu_memory_utilization=0.4)
    assert options[f"{ACTOR}.engine_kwargs.reference"] is None  # no options class
    assert ("rollout_engine", "vllm") in fake_backends.calls


def test_unknown_backend_option_names_the_full_key_with_suggestion() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.engine_kwargs.vllm.gpu_memory_utilisation=0.4"])
    assert info.value.key == f"{ROLLOUT}.engine_kwargs.vllm.gpu_memory_utilisation"
    assert f"'{ROLLOUT}.engine_kwargs.vllm.gpu_memory_utilization'" in str(info.value)


def test_wrong_type_backend_option() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.engine_kwargs.vllm.tensor_model_parallel_size=two"])
    assert str(info.value).startswith(f"{ROLLOUT}.engine_kwargs.vllm.tensor_model_parallel_size: expected int")


def test_backend_without_options_class_takes_none() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ROLLOUT}.engine_kwargs.hf.max_batch=8"])
    assert info.value.key == f"{ROLLOUT}.engine_kwargs.hf.max_batch"
    assert "backend 'hf' takes no options" in str(info.value)


def test_options_of_unselected_backends_are_not_checked() -> None:
    cfg = load_config(overrides=[f"{ROLLOUT}.name=vllm", f"{ROLLOUT}.engine_kwargs.sglang.anything=1"])
    assert cfg.actor_rollout_ref.rollout.engine_kwargs["sglang"] == {"anything": 1}


def test_training_engine_options_for_actor_and_critic(plugin_kit) -> None:
    cfg = load_config(overrides=[f"{ACTOR}.strategy=fsdp", f"{ACTOR}.engine_kwargs.fsdp.param_offload=true"])
    options = validate_backend_options(cfg, plugin_kit.FakePluginManager())
    assert options[f"{ACTOR}.engine_kwargs.fsdp"] == plugin_kit.FsdpOptions(param_offload=True)
    assert options["critic.engine_kwargs.fsdp"] == plugin_kit.FsdpOptions()  # critic follows the actor strategy
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ACTOR}.strategy=fsdp", "critic.engine_kwargs.fsdp.param_offlaod=true"])
    assert info.value.key == "critic.engine_kwargs.fsdp.param_offlaod"


def test_unknown_backend_name_uses_the_manager_message() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ROLLOUT}.name=vlm"])
    assert info.value.key == f"{ROLLOUT}.name"
    assert "available: hf, vllm, sglang" in str(info.value)


def test_device_support_is_checked_for_an_explicit_device() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ROLLOUT}.name=sglang", "trainer.device=cpu"])
    assert info.value.key == f"{ROLLOUT}.name" and "supports: cuda" in str(info.value)
    load_config(overrides=[f"{ROLLOUT}.name=sglang", "trainer.device=cuda"])
    load_config(overrides=[f"{ROLLOUT}.name=sglang"])  # device auto-detected later


def test_unknown_platform() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["trainer.device=tpu"])
    assert info.value.key == "trainer.device" and "available: cpu, cuda" in str(info.value)


def test_no_plugin_manager_skips_the_checks(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backend_options, "default_plugin_manager", lambda: None)
    cfg = load_config(overrides=[f"{ROLLOUT}.name=anything", f"{ROLLOUT}.engine_kwargs.anything.x=1"])
    assert validate_backend_options(cfg) == {}


def test_a_kind_nobody_provides_is_not_checked(plugin_kit) -> None:
    table = plugin_kit.default_table()
    del table["checkpoint_engine"]
    cfg = load_config(
        overrides=[f"{ROLLOUT}.checkpoint_engine.backend=nccl"], plugin_manager=plugin_kit.FakePluginManager(table)
    )
    assert cfg.actor_rollout_ref.rollout.checkpoint_engine.backend == "nccl"


def test_explicit_plugin_manager_is_used(plugin_kit) -> None:
    table = plugin_kit.default_table()
    table["rollout_engine"] = {"vllm": plugin_kit.spec("vllm", plugin_kit.VllmOptions)}
    with pytest.raises(ConfigError, match="unknown rollout engine 'hf'"):
        load_config(plugin_manager=plugin_kit.FakePluginManager(table))


def test_backend_and_validation_errors_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ROLLOUT}.name=vlm", f"{ROLLOUT}.temperature=0"])
    assert {i.key for i in info.value.issues} == {f"{ROLLOUT}.name", f"{ROLLOUT}.temperature"}


def test_structure_options_with_attrs_validator() -> None:
    @attrs.frozen(kw_only=True)
    class Opts:
        dtype: str = attrs.field(default="float32", validator=attrs.validators.in_(["float32", "bfloat16"]))

    assert structure_options(Opts, {"dtype": "bfloat16"}, "x.engine_kwargs.ref", "ref") == Opts(dtype="bfloat16")
    with pytest.raises(ConfigError) as info:
        structure_options(Opts, {"dtype": "int8"}, "x.engine_kwargs.ref", "ref")
    assert info.value.key == "x.engine_kwargs.ref.dtype" and "int8" in str(info.value)


# ---------------------------------------------------------------- registry names
def test_unknown_advantage_estimator() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=["algorithm.adv_estimator=gpro"])
    assert info.value.key == "algorithm.adv_estimator" and "Registered names: gae, grpo" in str(info.value)


def test_unknown_policy_loss() -> None:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=[f"{ACTOR}.policy_loss.loss_mode=vanila"])
    assert info.value.key == f"{ACTOR}.policy_loss.loss_mode"


def test_registry_without_a_lookup_is_skipped() -> None:
    cfg = load_config()
    validate_registered_names(cfg, SimpleNamespace())  # nothing to check against: no error
    with pytest.raises(ConfigError):
        validate_registered_names(
            cfg, SimpleNamespace(get_adv_estimator_fn=lambda name: (_ for _ in ()).throw(ValueError("nope")))
        )


def test_check_config_gets_the_whole_config_when_it_takes_root() -> None:
    from verl.config.backend_options import _run_check_config

    cfg = load_config(overrides=["trainer.controller=ray"])
    seen = []

    def rollout_only(rollout):
        seen.append(("rollout_only", rollout is cfg.actor_rollout_ref.rollout))
        return []

    def with_root(rollout, *, root=None):
        seen.append(("with_root", root is cfg))
        return [("trainer.controller", f"controller={root.trainer.controller}")]

    assert _run_check_config(rollout_only, cfg) == []
    assert _run_check_config(with_root, cfg) == [("trainer.controller", "controller=ray")]
    assert seen == [("rollout_only", True), ("with_root", True)]
