"""Options, config integration and the single-process (1-rank group) path of the fsdp engine."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from verl.config import ConfigError, load_config
from verl.engines.reference.training import EngineSettings, ReferenceTrainingEngine
from verl.testing.tiny import make_tiny_model


def test_half_configured_rendezvous_is_an_error(monkeypatch):
    from verl_fsdp.dist import ensure_process_group

    if dist.is_initialized():
        pytest.skip("a process group already exists in this process")
    monkeypatch.setenv("RANK", "0")
    for key in ("WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    with pytest.raises(RuntimeError, match="MASTER_ADDR"):
        ensure_process_group("gloo")


def test_plugin_is_registered():
    from verl_fsdp.options import FSDPEngineOptions

    from verl.plugins import get_plugin_manager

    spec = get_plugin_manager().get("training_engine", "fsdp")
    assert spec.options_cls is FSDPEngineOptions
    assert spec.devices == ("cpu", "cuda", "npu")


def test_unknown_option_is_a_config_error_naming_the_key():
    with pytest.raises(ConfigError, match=r"actor_rollout_ref\.actor\.engine_kwargs\.fsdp\.bogus"):
        load_config(
            overrides=["actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.actor.engine_kwargs.fsdp.bogus=1"]
        )


def test_bad_dtype_is_a_config_error():
    with pytest.raises(ConfigError, match="param_dtype"):
        load_config(
            overrides=[
                "actor_rollout_ref.actor.strategy=fsdp",
                "actor_rollout_ref.actor.engine_kwargs.fsdp.mixed_precision.param_dtype=int8",
            ]
        )


def _fsdp_options(cfg, role="actor"):
    """The options the worker hands the fsdp factory for ``role`` (core's one rule, the plugin's real spec)."""
    from verl.config import role_options
    from verl.plugins import get_plugin_manager

    return role_options(cfg, role, get_plugin_manager().get("training_engine", "fsdp"))


def test_options_are_read_from_engine_kwargs():
    from verl_fsdp.options import FSDPEngineOptions, MixedPrecisionOptions

    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.actor.engine_kwargs.fsdp.mixed_precision.param_dtype=bf16",
            "actor_rollout_ref.actor.engine_kwargs.fsdp.fsdp_size=2",
            "actor_rollout_ref.actor.engine_kwargs.fsdp.reshard_after_forward=false",
        ]
    )
    opts = _fsdp_options(cfg)
    assert opts == FSDPEngineOptions(
        mixed_precision=MixedPrecisionOptions(param_dtype="bf16"), fsdp_size=2, reshard_after_forward=False
    )
    assert _fsdp_options(load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp"])) == FSDPEngineOptions()
    with pytest.raises(ValueError, match="fsdp_size"):
        FSDPEngineOptions(fsdp_size=0)


def test_fsdp_size_must_divide_world_size():
    from verl_fsdp.engine import build_mesh

    with pytest.raises(ValueError, match="fsdp_size=3 must divide the world size 4"):
        build_mesh("cpu", 4, 3)


def test_factory_checks_role_and_world_size():
    from verl_fsdp.builder import build_fsdp_training_engine

    cfg = load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp"])
    with pytest.raises(ValueError, match="role"):
        build_fsdp_training_engine(cfg, role="policy", model="unused", options=None)
    with pytest.raises(ValueError, match="world_size=2"):
        build_fsdp_training_engine(cfg, role="ref", model="unused", options=_fsdp_options(cfg, "ref"), world_size=2)
    with pytest.raises(TypeError, match="options must be an FSDPEngineOptions"):
        build_fsdp_training_engine(cfg, role="actor", model="unused", options={"fsdp_size": 1})


def _optim():
    return SimpleNamespace(lr=1e-2, betas=(0.9, 0.999), weight_decay=0.01, lr_warmup_steps=0)


def test_single_process_engine_matches_reference_and_notices_once(caplog, monkeypatch, scenarios, two_rank_results):
    """A lone process gets a 1-rank group; param_offload on cpu is logged once, then the math is the reference's."""
    import verl_fsdp.engine as engine_mod
    from verl_fsdp.engine import FSDPTrainingEngine
    from verl_fsdp.options import FSDPEngineOptions

    monkeypatch.setattr(engine_mod, "_NOTICED", set())
    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    settings = EngineSettings(mini_batch_size=8, micro_batch_size=3, infer_micro_batch_size=5)
    opts = FSDPEngineOptions(param_offload=True)
    with caplog.at_level(logging.WARNING, logger="verl_fsdp.engine"):
        fsdp = FSDPTrainingEngine(make_tiny_model(seed=1), settings, options=opts, optim=_optim())
        FSDPTrainingEngine(make_tiny_model(seed=1), settings, options=opts)
    notices = [r for r in caplog.records if "param_offload" in r.getMessage()]
    assert len(notices) == 1 and "no effect on the cpu device" in notices[0].getMessage()
    assert dist.get_world_size() == 1
    ref = ReferenceTrainingEngine(make_tiny_model(seed=1), settings, optim=_optim())
    data = scenarios.make_batch()
    got = fsdp.compute_log_prob(data).batch["old_log_probs"]
    want = ref.compute_log_prob(data).batch["old_log_probs"]
    assert torch.allclose(got, want, atol=1e-5, rtol=0)
    m_got = fsdp.train_batch(data, scenarios.token_mean_loss)
    m_want = ref.train_batch(data, scenarios.token_mean_loss)
    assert m_got["actor/grad_norm"][0] == pytest.approx(m_want["actor/grad_norm"][0], rel=1e-5)
    w_got = dict(fsdp.iter_weights())
    for name, tensor in ref.iter_weights():
        assert torch.allclose(w_got[name], tensor, atol=1e-5, rtol=0), name
    # A checkpoint of 2 ranks cannot resume a 1-rank run (LR/counter files are per rank).
    out, _ = two_rank_results
    with pytest.raises(ValueError, match="saved by 2 ranks but this run has world_size=1"):
        fsdp.load_checkpoint(out / "dcp")


def test_iter_weights_gathers_in_buckets_and_empty_batch_leaves_weights(monkeypatch, scenarios):
    """Small buckets -> several all-gather rounds, same tensors; a batch without response tokens
    changes no weight and reports grad norm 0 (as the reference, whose optimizer sees no gradient)."""
    from verl_fsdp.engine import FSDPTrainingEngine

    for key in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(key, raising=False)
    engine = FSDPTrainingEngine(
        make_tiny_model(seed=1), EngineSettings(mini_batch_size=8, micro_batch_size=4), optim=_optim()
    )
    engine.bucket_bytes = 4096
    rounds = []
    original = engine._gather
    monkeypatch.setattr(engine, "_gather", lambda bucket: rounds.append(len(bucket)) or original(bucket))
    before = dict(engine.iter_weights())
    hf = make_tiny_model(seed=1).state_dict()
    assert list(before) == list(hf) and sum(rounds) == len(hf) and len(rounds) > 2
    assert all(torch.equal(before[k], hf[k]) for k in hf)

    data = scenarios.make_batch()
    data.batch["response_mask"].zero_()
    data.batch["attention_mask"][:, scenarios.PROMPT_LEN :] = 0
    metrics = engine.train_batch(data, scenarios.token_mean_loss)
    assert metrics["actor/grad_norm"] == [0.0] and metrics["actor/skipped_steps"] == [0.0]
    after = dict(engine.iter_weights())
    assert all(torch.equal(before[k], after[k]) for k in hf)
    ref = ReferenceTrainingEngine(make_tiny_model(seed=1), EngineSettings(mini_batch_size=8), optim=_optim())
    ref_metrics = ref.train_batch(data, scenarios.token_mean_loss)
    assert ref_metrics["actor/grad_norm"] == [0.0]
    assert all(torch.equal(w, hf[k]) for k, w in ref.iter_weights())


def test_verl_fsdp_config_keys_and_ref_overrides():
    from verl_fsdp.options import FSDPEngineOptions

    cfg = load_config(
        overrides=[
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.actor.use_kl_loss=true",
            "actor_rollout_ref.actor.fsdp_config.fsdp_size=2",  # verl's key for engine_kwargs.fsdp
            "actor_rollout_ref.ref.fsdp_config.param_offload=true",
        ]
    )
    assert _fsdp_options(cfg) == FSDPEngineOptions(fsdp_size=2)
    # The reference policy takes the actor's options, with its own on top.
    assert _fsdp_options(cfg, "ref") == FSDPEngineOptions(fsdp_size=2, param_offload=True)
    with pytest.raises(ConfigError, match="actor_rollout_ref.ref.engine_kwargs.fsdp.no_such"):
        load_config(overrides=["actor_rollout_ref.actor.strategy=fsdp", "actor_rollout_ref.ref.fsdp_config.no_such=1"])
