"""The workers hand every engine factory the options config load validated, and the engines never read
``engine_kwargs`` themselves (issue #16, "validate backend options once").

The plugin here is a stand-in (``recording_*`` specs) whose factories record what they were given and then call
core's real ``reference`` / ``hf`` / ``colocated`` factories with a config whose ``engine_kwargs`` raise on
access: a real engine that still read them would fail these tests. Expected options are written out by hand
from the rule (critic its own, ref the actor's overridden by its own).
"""

from __future__ import annotations

import importlib.metadata
import types
from typing import Any

import attrs
import pytest

from verl.config import load_config
from verl.controller import ClassWithInitArgs, LocalWorkerGroup
from verl.engines.reference.builders import (
    HFRolloutOptions,
    ReferenceEngineOptions,
    build_hf_rollout_engine,
    build_reference_training_engine,
)
from verl.engines.weight_sync.colocated import ColocatedOptions, build_colocated_checkpoint_engine
from verl.plugins import CheckpointEngineSpec, PluginManager, RolloutEngineSpec, TrainingEngineSpec, hookimpl
from verl.plugins import builtin as builtin_plugin
from verl.plugins import manager as manager_module
from verl.testing.tiny import save_tiny_model
from verl.workers.actor_rollout_ref import ActorRolloutRefWorker
from verl.workers.critic import CriticWorker

A, REF, R = "actor_rollout_ref.actor", "actor_rollout_ref.ref", "actor_rollout_ref.rollout"


class _Poisoned:
    """A read-only view of a config tree whose ``engine_kwargs`` raise: what an engine reads through it is
    everything but the raw backend options."""

    def __init__(self, target: Any, path: str = "") -> None:
        self._target, self._path = target, path

    def __getattr__(self, name: str) -> Any:
        if name == "engine_kwargs":
            raise AssertionError(f"an engine read {self._path}.engine_kwargs; it must use the options it was given")
        value = getattr(self._target, name)
        return _Poisoned(value, f"{self._path}.{name}".lstrip(".")) if attrs.has(type(value)) else value


def _recording(real: Any, calls: list[tuple[str, dict]], kind: str) -> Any:
    def factory(config: Any, **kwargs: Any) -> Any:
        calls.append((kind, kwargs))
        return real(_Poisoned(config), **kwargs)

    return factory


@pytest.fixture
def calls(monkeypatch) -> list[tuple[str, dict]]:
    """The process-wide manager: core's built-ins plus the stand-in recording plugin."""
    seen: list[tuple[str, dict]] = []
    plugin = types.ModuleType("recording_plugin")
    plugin.verl_training_engines = hookimpl(
        lambda: [
            TrainingEngineSpec(
                name="recording",
                factory=_recording(build_reference_training_engine, seen, "training"),
                options_cls=ReferenceEngineOptions,
                capabilities={"share_module"},
            )
        ]
    )
    plugin.verl_rollout_engines = hookimpl(
        lambda: [
            RolloutEngineSpec(
                name="recording_hf",
                factory=_recording(build_hf_rollout_engine, seen, "rollout"),
                options_cls=HFRolloutOptions,
                capabilities={"share_module"},
            )
        ]
    )
    plugin.verl_checkpoint_engines = hookimpl(
        lambda: [
            CheckpointEngineSpec(
                name="recording_sync",
                factory=_recording(build_colocated_checkpoint_engine, seen, "checkpoint"),
                options_cls=ColocatedOptions,
            )
        ]
    )
    pm = PluginManager(load_entry_points=False)
    pm.register(builtin_plugin, name="builtin", dist_name="verl-core", version=importlib.metadata.version("verl-core"))
    pm.register(plugin, dist_name="verl-recording", version="1.0")
    monkeypatch.setattr(manager_module, "_manager", pm)
    return seen


@pytest.fixture(scope="module")
def tiny(tmp_path_factory):
    return save_tiny_model(tmp_path_factory.mktemp("tiny") / "m", num_layers=1, hidden_size=32)


def _config(tiny, *overrides: str):
    return load_config(
        overrides=[
            f"actor_rollout_ref.model.path={tiny}",
            "trainer.device=cpu",
            "algorithm.adv_estimator=gae",
            f"{A}.strategy=recording",
            f"{A}.use_kl_loss=true",
            f"{R}.name=recording_hf",
            f"{R}.checkpoint_engine.backend=recording_sync",
            f"{A}.engine_kwargs.recording.param_offload=true",
            f"{A}.engine_kwargs.recording.optimizer_offload=true",
            f"{REF}.engine_kwargs.recording.param_offload=false",
            f"{R}.engine_kwargs.recording_hf.sleep_level=1",
            f"{R}.checkpoint_engine.engine_kwargs.recording_sync.bucket_bytes=4096",
            "critic.engine_kwargs.recording.optimizer_offload=false",
            *overrides,
        ]
    )


def test_the_worker_hands_each_factory_its_validated_options(calls, tiny) -> None:
    cfg = _config(tiny)
    wg = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, cfg, "actor_rollout_ref"))
    wg.init_model(1)
    by_kind: dict[str, list[dict]] = {}
    for kind, kwargs in calls:
        by_kind.setdefault(kind, []).append(kwargs)
    actor, ref = by_kind["training"]
    assert (actor["role"], ref["role"]) == ("actor", "ref")
    assert actor["options"] == ReferenceEngineOptions(param_offload=True, optimizer_offload=True)
    # ref: the actor's options with its own param_offload on top.
    assert ref["options"] == ReferenceEngineOptions(param_offload=False, optimizer_offload=True)
    assert [k["options"] for k in by_kind["rollout"]] == [HFRolloutOptions(sleep_level=1)]
    assert [k["options"] for k in by_kind["checkpoint"]] == [ColocatedOptions(bucket_bytes=4096)]
    # The engines were built from those (and only those): the values reached them.
    worker = wg.workers[0]
    assert (worker.actor.param_offload, worker.actor.optimizer_offload) == (True, True)
    assert (worker.ref.param_offload, worker.ref.optimizer_offload) == (False, True)
    assert worker.rollout.options == HFRolloutOptions(sleep_level=1)
    assert worker.weight_sync.bucket_bytes == 4096


def test_the_critic_gets_its_own_options_not_the_actor_s(calls, tiny) -> None:
    cfg = _config(tiny)
    wg = LocalWorkerGroup(ClassWithInitArgs(CriticWorker, cfg))
    wg.init_model(1)
    [(kind, kwargs)] = calls
    assert (kind, kwargs["role"]) == ("training", "critic")
    # The actor's param_offload/optimizer_offload=true do not reach the value model (verl: its own fsdp_config).
    assert kwargs["options"] == ReferenceEngineOptions()
    critic = wg.workers[0].critic
    assert (critic.param_offload, critic.optimizer_offload) == (False, False)


def test_a_raw_dict_is_refused_by_the_factories(calls, tiny) -> None:
    cfg = _config(tiny)
    with pytest.raises(TypeError, match="options must be a ReferenceEngineOptions"):
        build_reference_training_engine(cfg, role="actor", model=tiny, options={"param_offload": True})
    with pytest.raises(TypeError, match="options must be a ColocatedOptions"):
        build_colocated_checkpoint_engine(cfg, options={"bucket_bytes": 4096})
