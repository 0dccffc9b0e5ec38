"""Fakes for the plugin manager and the algorithm registries, so config tests don't depend on
which plugins are installed (or on importing torch through verl.algorithms)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import attrs
import pytest

import verl.config.backend_options as backend_options


@attrs.frozen(kw_only=True)
class VllmOptions:
    gpu_memory_utilization: float = 0.5
    tensor_model_parallel_size: int = 1
    enforce_eager: bool = False


@attrs.frozen(kw_only=True)
class FsdpOptions:
    param_offload: bool = False
    fsdp_size: int = -1


class FakePluginManager:
    """``get(kind, name)`` / ``available(kind)`` over a fixed table, like verl.plugins.PluginManager."""

    def __init__(self, table: dict[str, dict[str, Any]] | None = None) -> None:
        self.table = table if table is not None else default_table()
        self.calls: list[tuple[str, str]] = []

    def available(self, kind: str) -> dict[str, Any]:
        return dict(self.table.get(kind, {}))

    def get(self, kind: str, name: str) -> Any:
        self.calls.append((kind, name))
        specs = self.table.get(kind, {})
        if name not in specs:
            raise ValueError(f"unknown {kind.replace('_', ' ')} {name!r}; available: {', '.join(specs)}")
        return specs[name]


def spec(
    name: str,
    options_cls: type | None = None,
    devices: tuple[str, ...] = ("cpu", "cuda"),
    capabilities: frozenset[str] = frozenset(),
) -> Any:
    return SimpleNamespace(name=name, options_cls=options_cls, devices=devices, capabilities=capabilities)


def default_table() -> dict[str, dict[str, Any]]:
    return {
        "platform": {"cpu": spec("cpu"), "cuda": spec("cuda")},
        "training_engine": {
            "reference": spec("reference", capabilities=frozenset({"lora"})),
            "fsdp": spec("fsdp", FsdpOptions, capabilities=frozenset({"data_parallel", "lora"})),
        },
        "rollout_engine": {
            "hf": spec("hf", capabilities=frozenset({"tensor_parallel", "async_server"})),
            "vllm": spec("vllm", VllmOptions),
            "sglang": spec("sglang", devices=("cuda",)),
        },
        "checkpoint_engine": {"colocated": spec("colocated"), "broadcast": spec("broadcast")},
        "agent_loop": {
            name: SimpleNamespace(name=name, factory=object) for name in ("single_turn_agent", "tool_agent")
        },
    }


ADV_ESTIMATORS = ("gae", "grpo", "grpo_passk", "rloo", "reinforce_plus_plus", "remax", "opo", "gpg")
POLICY_LOSSES = ("vanilla", "gspo", "sapo", "gpg", "clip_cov", "kl_cov")


class FakeRegistry:
    @staticmethod
    def get_adv_estimator_fn(name: str) -> Any:
        if name not in ADV_ESTIMATORS:
            raise ValueError(f"Unknown advantage estimator {name!r}. Registered names: {', '.join(ADV_ESTIMATORS)}")
        return len

    @staticmethod
    def get_policy_loss_fn(name: str) -> Any:
        if name not in POLICY_LOSSES:
            raise ValueError(f"Unknown policy loss {name!r}. Registered names: {', '.join(POLICY_LOSSES)}")
        return len


@pytest.fixture(autouse=True)
def fake_backends(monkeypatch: pytest.MonkeyPatch) -> FakePluginManager:
    """Every config test sees the fake plugin manager and registry by default."""
    manager = FakePluginManager()
    monkeypatch.setattr(backend_options, "default_plugin_manager", lambda: manager)
    monkeypatch.setattr(backend_options, "default_algorithm_registry", lambda: FakeRegistry)
    return manager


@pytest.fixture
def plugin_kit() -> SimpleNamespace:
    """The fake classes, for tests that build their own manager (test dirs are not packages)."""
    return SimpleNamespace(
        FakePluginManager=FakePluginManager,
        spec=spec,
        default_table=default_table,
        VllmOptions=VllmOptions,
        FsdpOptions=FsdpOptions,
        FakeRegistry=FakeRegistry,
    )
