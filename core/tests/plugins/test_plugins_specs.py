"""Spec records and the hookspec module: validation, immutability, the fixed kind/hook names."""

from __future__ import annotations

import dataclasses
import inspect

import attrs
import pytest

from verl.plugins import (
    KINDS,
    AdvantageEstimatorSpec,
    CheckpointEngineSpec,
    PlatformSpec,
    PolicyLossSpec,
    RolloutEngineSpec,
    TrainingEngineSpec,
    hookimpl,
    hookspecs,
)


def _fn():
    return None


@attrs.define
class _AttrsOptions:
    gpu_memory_utilization: float = 0.5


@dataclasses.dataclass
class _DataclassOptions:
    tp: int = 1


def test_kinds_and_hooks_match_the_contract():
    assert KINDS == (
        "platform",
        "training_engine",
        "rollout_engine",
        "checkpoint_engine",
        "advantage_estimator",
        "policy_loss",
        "agent_loop",
    )
    assert hookspecs.HOOK_FOR_KIND == {
        "platform": "verl_platforms",
        "training_engine": "verl_training_engines",
        "rollout_engine": "verl_rollout_engines",
        "checkpoint_engine": "verl_checkpoint_engines",
        "advantage_estimator": "verl_advantage_estimators",
        "policy_loss": "verl_policy_losses",
        "agent_loop": "verl_agent_loops",
    }


def test_every_hookspec_is_marked_documented_and_takes_no_arguments():
    for hook in hookspecs.HOOK_FOR_KIND.values():
        fn = getattr(hookspecs, hook)
        assert hasattr(fn, "verl_spec"), hook  # pluggy's marker attribute for project "verl"
        assert "For plugin authors" in fn.__doc__ and "@hookimpl" in fn.__doc__, hook
        assert inspect.signature(fn).parameters == {}, hook
    assert hookimpl.project_name == "verl"


def test_defaults_of_engine_specs():
    spec = TrainingEngineSpec(name="fsdp", factory=_fn)
    assert spec.options_cls is None
    assert spec.devices == ("cpu", "cuda")
    assert spec.capabilities == frozenset()
    assert CheckpointEngineSpec(name="colocated", factory=_fn).devices == ("cpu", "cuda")
    assert PlatformSpec(name="npu", probe=_fn, factory=_fn).accelerator is True


def test_collections_are_normalised():
    spec = RolloutEngineSpec(name="vllm", factory=_fn, devices=["cuda"], capabilities=["sleep", "async", "sleep"])
    assert spec.devices == ("cuda",)
    assert spec.capabilities == frozenset({"sleep", "async"})


@pytest.mark.parametrize(
    "cls,kwargs",
    [
        (PlatformSpec, {"probe": _fn, "factory": _fn}),
        (TrainingEngineSpec, {"factory": _fn}),
        (RolloutEngineSpec, {"factory": _fn}),
        (CheckpointEngineSpec, {"factory": _fn}),
        (AdvantageEstimatorSpec, {"fn": _fn}),
        (PolicyLossSpec, {"fn": _fn}),
    ],
)
def test_records_are_frozen_kw_only_and_validate_names(cls, kwargs):
    spec = cls(name="ok_name-2", **kwargs)
    with pytest.raises(attrs.exceptions.FrozenInstanceError):
        spec.name = "other"
    with pytest.raises(TypeError):
        cls("positional", *kwargs.values())
    for bad in ["", "1abc", "a.b", "a b", "_hidden", "vllm\n"]:
        with pytest.raises(ValueError, match=r"not a valid name"):
            cls(name=bad, **kwargs)
    with pytest.raises(TypeError, match=r"name must be a str, got int"):
        cls(name=3, **kwargs)
    callable_field = next(iter(kwargs))
    with pytest.raises(TypeError, match=rf"{cls.__name__}\.{callable_field} must be callable"):
        cls(name="x", **{**kwargs, callable_field: "not callable"})


def test_devices_reject_a_bare_string_and_empty():
    with pytest.raises(TypeError, match=r"RolloutEngineSpec\.devices must be a list/tuple/set of str, got str"):
        RolloutEngineSpec(name="vllm", factory=_fn, devices="cuda")
    with pytest.raises(ValueError, match=r"at least one device"):
        TrainingEngineSpec(name="fsdp", factory=_fn, devices=())
    with pytest.raises(TypeError, match=r"non-empty strings"):
        TrainingEngineSpec(name="fsdp", factory=_fn, devices=("cpu", 3))
    with pytest.raises(TypeError, match=r"capabilities must be"):
        TrainingEngineSpec(name="fsdp", factory=_fn, capabilities="lora")


def test_options_cls_must_be_an_attrs_class_or_dataclass():
    assert RolloutEngineSpec(name="vllm", factory=_fn, options_cls=_AttrsOptions).options_cls is _AttrsOptions
    assert RolloutEngineSpec(name="vllm", factory=_fn, options_cls=_DataclassOptions).options_cls is _DataclassOptions
    for bad in (dict, _AttrsOptions(), "VllmOptions"):
        with pytest.raises(TypeError, match=r"options_cls must be an attrs class"):
            RolloutEngineSpec(name="vllm", factory=_fn, options_cls=bad)


def test_accelerator_must_be_a_bool():
    with pytest.raises(TypeError):
        PlatformSpec(name="cpu", probe=_fn, factory=_fn, accelerator=0)


def test_engine_kinds_are_distinct_types():
    # One kind's record must never pass as another's (the manager checks isinstance per hook).
    rollout = RolloutEngineSpec(name="hf", factory=_fn)
    assert not isinstance(rollout, TrainingEngineSpec)
    assert not isinstance(rollout, CheckpointEngineSpec)
    assert {cls.KIND for cls in (TrainingEngineSpec, RolloutEngineSpec, CheckpointEngineSpec)} == {
        "training_engine",
        "rollout_engine",
        "checkpoint_engine",
    }
