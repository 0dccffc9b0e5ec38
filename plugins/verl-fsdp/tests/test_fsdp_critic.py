"""The fsdp critic (``critic.strategy=fsdp``) on a 1-rank group: the reference critic's values and update."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch

from verl.config import load_config, role_options
from verl.engines.reference.critic import ReferenceCriticEngine
from verl.engines.reference.training import EngineSettings
from verl.plugins import get_plugin_manager
from verl.testing.tiny import save_tiny_model
from verl.workers.losses import make_value_loss


def _optim():
    return SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01, lr_warmup_steps=0, clip_grad=1.0)


def test_fsdp_critic_matches_the_reference_critic(monkeypatch, scenarios, tmp_path):
    from verl_fsdp.builder import build_fsdp_training_engine
    from verl_fsdp.engine import FSDPCriticEngine

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    path = save_tiny_model(tmp_path / "tiny")
    cfg = load_config(
        overrides=[
            f"actor_rollout_ref.model.path={path}",
            "actor_rollout_ref.actor.strategy=fsdp",
            "algorithm.adv_estimator=gae",
            "critic.ppo_mini_batch_size=8",
            "critic.ppo_micro_batch_size_per_gpu=4",
            "critic.model.enable_gradient_checkpointing=false",
            "critic.optim.lr=0.01",
        ]
    )
    torch.manual_seed(0)  # the value head is freshly initialised on load: same seed, same head
    spec = get_plugin_manager().get("training_engine", "fsdp")
    fsdp = build_fsdp_training_engine(
        cfg, role="critic", model=str(path), options=role_options(cfg, "critic", spec), total_training_steps=4
    )
    assert isinstance(fsdp, FSDPCriticEngine)
    settings = EngineSettings(mini_batch_size=8, micro_batch_size=4, infer_micro_batch_size=4)
    torch.manual_seed(0)
    ref = ReferenceCriticEngine(str(path), settings, optim=_optim())
    data = scenarios.make_batch()
    got = fsdp.compute_values(data).batch["values"]
    want = ref.compute_values(data).batch["values"]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    data.batch["values"] = want
    data.batch["returns"] = torch.ones_like(want) * data.batch["response_mask"]
    loss = make_value_loss(SimpleNamespace(loss_agg_mode="token-mean", cliprange_value=0.5))
    m_got = fsdp.train_batch(copy.deepcopy(data), loss)
    m_want = ref.train_batch(copy.deepcopy(data), loss)
    for key in ("critic/vf_loss", "critic/grad_norm", "critic/vpred_mean"):
        assert m_got[key][0] == pytest.approx(m_want[key][0], rel=1e-5, abs=1e-7), key
    w_got = dict(fsdp.iter_weights())
    for name, tensor in ref.iter_weights():
        assert torch.allclose(w_got[name], tensor, atol=1e-5, rtol=0), name


def test_reference_and_fsdp_critics_get_the_same_options_from_the_same_keys(monkeypatch, tmp_path):
    """One rule (verl.config.role_options) for both engines: the critic takes critic.model.fsdp_config only, never
    the actor's fsdp_config (before, the reference critic inherited the actor's and the fsdp one did not)."""
    from verl_fsdp.options import FSDPEngineOptions

    from verl.engines.reference.builders import ReferenceEngineOptions
    from verl.testing.conformance import build_training_engine

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    path = save_tiny_model(tmp_path / "tiny", num_layers=1, hidden_size=32)
    verl_keys = [
        f"actor_rollout_ref.model.path={path}",
        "algorithm.adv_estimator=gae",
        "actor_rollout_ref.actor.fsdp_config.param_offload=true",  # the actor's: must not reach the critic
        "critic.model.fsdp_config.optimizer_offload=true",  # the critic's own
    ]
    pm = get_plugin_manager()
    flags = {}
    for strategy, options_cls in (("reference", ReferenceEngineOptions), ("fsdp", FSDPEngineOptions)):
        cfg = load_config(overrides=[*verl_keys, f"actor_rollout_ref.actor.strategy={strategy}"])
        spec = pm.get("training_engine", strategy)
        assert role_options(cfg, "critic", spec) == options_cls(optimizer_offload=True)
        assert role_options(cfg, "actor", spec) == options_cls(param_offload=True)
        critic = build_training_engine(spec, cfg, role="critic", model=str(path))
        flags[strategy] = (critic.param_offload, critic.optimizer_offload)
    assert flags == {"reference": (False, True), "fsdp": (False, True)}
