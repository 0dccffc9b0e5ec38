"""FSDP2 (2 gloo ranks) with use_fused_kernels / chunked + checkpointed entropy vs the plain single-process
reference engine on the whole batch: same log-probs, entropy, loss metrics and weights after 3 steps; and
``use_orig_params`` accepts only what FSDP2 does."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verl.config import ConfigError, load_config
from verl.engines.reference.training import ReferenceTrainingEngine
from verl.testing.distributed import load_script, run_ranks

HERE = Path(__file__).parent
ATOL = 1e-5


@pytest.fixture(scope="module")
def fused():
    return load_script(HERE / "fused_scenarios.py", "fused_scenarios")


@pytest.fixture(scope="module")
def ranks(tmp_path_factory):
    out = tmp_path_factory.mktemp("fsdp_fused")
    run_ranks(HERE / "fused_scenarios.py", [str(out)], world_size=2, timeout_s=240)
    return [torch.load(out / f"rank{r}.pt", weights_only=False) for r in range(2)]


@pytest.fixture(scope="module")
def plain(fused):
    s = fused.S
    engine = ReferenceTrainingEngine(
        s.make_tiny_model(seed=s.MODEL_SEED),
        s.settings(mini_batch_size=s.ROWS, micro_batch_size=4),
        optim=s.optim(),
        total_training_steps=10,
    )
    full = s.make_batch()
    logp = engine.compute_log_prob(full, calculate_entropy=True).batch
    metrics = s.train(engine, full, fused.entropy_bonus_loss)
    return {"logp": logp, "metrics": metrics, "weights": s.weights(engine)}


@pytest.mark.multiprocess
@pytest.mark.parametrize("name", ["fused", "fused_packed", "chunked_ckpt"])
def test_switch_on_fsdp_matches_the_plain_reference(ranks, plain, name):
    for key in ("old_log_probs", "entropys"):
        got = torch.cat([r[f"{name}_logp"][key] for r in ranks])
        assert torch.allclose(got, plain["logp"][key], atol=ATOL, rtol=0), key
    for r in ranks:
        for got, want in zip(r[f"{name}_metrics"], plain["metrics"], strict=True):
            assert got["test/loss"] == pytest.approx(want["test/loss"], rel=1e-5, abs=1e-7)
            assert got["actor/grad_norm"] == pytest.approx(want["actor/grad_norm"], rel=1e-4)
        assert max(float((r[f"{name}_weights"][k] - v).abs().max()) for k, v in plain["weights"].items()) < ATOL


def test_use_orig_params_accepts_only_what_fsdp2_does():
    base = ["actor_rollout_ref.actor.strategy=fsdp"]
    config = load_config(overrides=[*base, "actor_rollout_ref.actor.fsdp_config.use_orig_params=true"])
    assert config.actor_rollout_ref.actor.engine_kwargs["fsdp"]["use_orig_params"] is True
    with pytest.raises(ConfigError, match="use_orig_params=False: this engine is FSDP2"):
        load_config(overrides=[*base, "actor_rollout_ref.actor.fsdp_config.use_orig_params=false"])


def _fsdp_options(cfg, role="actor"):
    """The options the worker hands the fsdp factory for ``role`` (core's one rule, the plugin's real spec)."""
    from verl.config import role_options
    from verl.plugins import get_plugin_manager

    return role_options(cfg, role, get_plugin_manager().get("training_engine", "fsdp"))


def test_fsdp_config_entropy_keys_override_the_roles_keys():
    config = load_config(
        overrides=[
            "actor_rollout_ref.actor.strategy=fsdp",
            "actor_rollout_ref.actor.entropy_from_logits_with_chunking=true",
            "actor_rollout_ref.actor.fsdp_config.entropy_checkpointing=True",
            "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_with_chunking=False",
        ]
    )
    assert _fsdp_options(config, "actor").token_stats_overrides() == {
        "entropy_checkpointing": True,
        "entropy_from_logits_with_chunking": False,
    }
    with pytest.raises(ConfigError, match="entropy_from_logits_chunk_size must be an int >= 1"):
        load_config(
            overrides=[
                "actor_rollout_ref.actor.strategy=fsdp",
                "actor_rollout_ref.actor.fsdp_config.entropy_from_logits_chunk_size=0",
            ]
        )
