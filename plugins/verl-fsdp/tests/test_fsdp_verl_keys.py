"""verl's ``fsdp_config`` keys that round three of issue #15 made load: what each does to the FSDP2 module.

``reshard_after_forward`` and ``forward_prefetch`` are checked on the sharded module itself (1-rank gloo group:
FSDP2's own state after a forward), ``ulysses_sequence_parallel_size`` and ``turbo_config`` at config load.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch
from torch.distributed.tensor import DTensor

from verl.config import ConfigError, load_config
from verl.engines.reference.training import EngineSettings
from verl.testing.tiny import make_tiny_model

FSDP = ["actor_rollout_ref.actor.strategy=fsdp"]


@pytest.fixture
def lone_process(monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)


def _engine(**options):
    from verl_fsdp.engine import FSDPTrainingEngine
    from verl_fsdp.options import FSDPEngineOptions

    settings = EngineSettings(mini_batch_size=8, micro_batch_size=4)
    optim = SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.0, lr_warmup_steps=0)
    return FSDPTrainingEngine(make_tiny_model(seed=1), settings, options=FSDPEngineOptions(**options), optim=optim)


def _forward(engine) -> torch.Tensor:
    ids = torch.arange(12).reshape(2, 6) % 50
    return engine.model(input_ids=ids).logits


@pytest.mark.parametrize("reshard", [True, False])
def test_reshard_after_forward_decides_what_a_layer_holds_after_forward(lone_process, reshard):
    engine = _engine(reshard_after_forward=reshard)
    layers = list(engine.model.model.layers)
    assert len(layers) == 2 and all(isinstance(p, DTensor) for p in layers[0].parameters())
    _forward(engine)  # with grad: FSDP2 keeps or frees each layer's gathered parameters for backward
    kinds = {type(p) for layer in layers for p in layer.parameters()}
    # Resharded: the registered parameters are the DTensor shards again; kept: the unsharded plain tensors.
    assert kinds == ({DTensor} if reshard else {torch.nn.Parameter})


def test_forward_prefetch_links_each_layer_to_the_next_and_keeps_the_values(lone_process):
    plain, prefetch = _engine(), _engine(forward_prefetch=True)
    first, second = list(prefetch.model.model.layers)
    assert first._get_fsdp_state()._states_to_forward_prefetch == [second._get_fsdp_state()]
    assert second._get_fsdp_state()._states_to_forward_prefetch == []  # depth 1: the last layer has no next
    assert all(not layer._get_fsdp_state()._states_to_forward_prefetch for layer in plain.model.model.layers)
    torch.testing.assert_close(_forward(prefetch), _forward(plain), rtol=0, atol=0)


def _fsdp_options(cfg, role="actor"):
    """The options the worker hands the fsdp factory for ``role`` (core's one rule, the plugin's real spec)."""
    from verl.config import role_options
    from verl.plugins import get_plugin_manager

    return role_options(cfg, role, get_plugin_manager().get("training_engine", "fsdp"))


def test_verl_keys_reach_the_options_for_actor_and_ref():
    cfg = load_config(
        overrides=[
            *FSDP,
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.fsdp_config.reshard_after_forward=false",
            "actor_rollout_ref.actor.fsdp_config.forward_prefetch=true",
            "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=1",
            "actor_rollout_ref.ref.fsdp_config.offload_policy=true",
            "actor_rollout_ref.ref.fsdp_config.param_offload=true",
            "actor_rollout_ref.ref.fsdp_config.forward_prefetch=false",
        ]
    )
    actor, ref = _fsdp_options(cfg), _fsdp_options(cfg, "ref")
    assert (actor.reshard_after_forward, actor.forward_prefetch, actor.offload_policy) == (False, True, False)
    assert (ref.reshard_after_forward, ref.forward_prefetch, ref.offload_policy, ref.param_offload) == (
        False,
        False,
        True,
        True,
    )


@pytest.mark.parametrize(
    "override",
    [
        "actor_rollout_ref.actor.fsdp_config.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.ref.fsdp_config.ulysses_sequence_parallel_size=4",
        "critic.model.fsdp_config.ulysses_sequence_parallel_size=8",
        "actor_rollout_ref.actor.ulysses_sequence_parallel_size=2",
        "actor_rollout_ref.ref.ulysses_sequence_parallel_size=4",
        "critic.ulysses_sequence_parallel_size=8",
    ],
)
def test_ulysses_above_one_is_refused_as_not_built(override):
    section = override.split(".fsdp_config")[0].split(".ulysses")[0].replace("critic.model", "critic")
    with pytest.raises(ConfigError, match="Ulysses sequence parallelism") as info:
        load_config(overrides=[*FSDP, "critic.strategy=fsdp", override])
    [issue] = info.value.issues
    assert issue.key.startswith(section) and "ulysses_sequence_parallel_size" in issue.message
    assert "not built" in issue.message and "set it to 1" in issue.message


def test_ulysses_one_loads_for_every_role():
    cfg = load_config(
        overrides=[
            *FSDP,
            *(f"{r}.ulysses_sequence_parallel_size=1" for r in ("actor_rollout_ref.actor", "actor_rollout_ref.ref")),
            "critic.ulysses_sequence_parallel_size=1",
        ]
    )
    assert cfg.actor_rollout_ref.actor.ulysses_sequence_parallel_size == 1


def test_turbo_config_is_refused_naming_fsdp_turbo_and_empty_is_accepted():
    from verl_fsdp.options import FSDPEngineOptions

    with pytest.raises(ConfigError, match="fsdp_turbo") as info:
        load_config(overrides=[*FSDP, "actor_rollout_ref.actor.fsdp_config.turbo_config.distributed.x=2"])
    assert "turbo_config" in str(info.value)
    assert FSDPEngineOptions(turbo_config={}).turbo_config == {}
    with pytest.raises(TypeError, match="forward_prefetch"):
        FSDPEngineOptions(forward_prefetch="yes")
