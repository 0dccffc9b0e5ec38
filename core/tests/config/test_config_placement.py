"""Rollout placement (verl's RolloutMode), tensor-parallel size and rollout.mode: each does what it says or is
refused with the reason (no key accepted and ignored)."""

from __future__ import annotations

import json

import pytest

from verl.config import ConfigError, load_config
from verl.config.placement import rollout_placement, rollout_world_size

ROLLOUT = "actor_rollout_ref.rollout"
RAY2 = ["trainer.controller=ray", "trainer.n_gpus_per_node=2", "actor_rollout_ref.actor.strategy=fsdp"]


def _error(overrides: list[str]) -> ConfigError:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return info.value


def test_placement_defaults_follow_rollout_nnodes() -> None:
    assert rollout_placement(load_config()) == "hybrid"
    cfg = load_config(
        overrides=[
            *RAY2,
            f"{ROLLOUT}.nnodes=1",
            f"{ROLLOUT}.n_gpus_per_node=4",
            f"{ROLLOUT}.checkpoint_engine.backend=broadcast",
        ]
    )
    assert cfg.actor_rollout_ref.rollout.placement == "standalone" and rollout_world_size(cfg) == 4
    colocated = load_config(
        overrides=[*RAY2, f"{ROLLOUT}.placement=colocated", f"{ROLLOUT}.checkpoint_engine.backend=broadcast"]
    )
    assert rollout_world_size(colocated) == 2


@pytest.mark.parametrize(
    ("overrides", "key", "text"),
    [
        (
            [f"{ROLLOUT}.placement=standalone", *RAY2, f"{ROLLOUT}.checkpoint_engine.backend=broadcast"],
            "placement",
            "needs devices of its own",
        ),
        ([f"{ROLLOUT}.placement=colocated", "trainer.controller=local"], "placement", "set trainer.controller=ray"),
        (
            [f"{ROLLOUT}.placement=colocated", *RAY2],
            "checkpoint_engine.backend",
            "set actor_rollout_ref.rollout.checkpoint_engine.backend=broadcast",
        ),
        ([f"{ROLLOUT}.placement=hybrid", *RAY2, f"{ROLLOUT}.nnodes=1"], "placement", "asks for a pool of its own"),
        ([f"{ROLLOUT}.checkpoint_engine.backend=broadcast"], "checkpoint_engine.backend", "with placement=hybrid"),
    ],
)
def test_inconsistent_placements_name_the_key_and_the_fix(overrides, key, text) -> None:
    error = _error(overrides)
    assert any(issue.key == f"{ROLLOUT}.{key}" and text in issue.message for issue in error.issues), str(error)


def test_tp_size_must_divide_the_rollout_world() -> None:
    error = _error([*RAY2, f"{ROLLOUT}.tensor_model_parallel_size=3"])
    assert error.key == f"{ROLLOUT}.tensor_model_parallel_size"
    assert "=3 must divide the rollout world size 2 (hybrid: replicas x tensor-parallel size); valid: [1, 2]" in str(
        error
    )
    assert load_config(overrides=[*RAY2, f"{ROLLOUT}.tensor_model_parallel_size=2"])
    assert "must be >= 1" in str(_error([f"{ROLLOUT}.tensor_model_parallel_size=0"]))


def test_tp_size_the_model_cannot_split_is_one_config_error(tmp_path) -> None:
    """SmolLM2-135M has 9 heads and 3 key/value heads: TP=2 is refused before any worker starts."""
    from verl.trainer.ppo_trainer import check_model_fits_rollout

    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "hidden_size": 576,
        "intermediate_size": 1536,
        "num_attention_heads": 9,
        "num_key_value_heads": 3,
        "num_hidden_layers": 30,
        "vocab_size": 49152,
    }
    (tmp_path / "config.json").write_text(json.dumps(config))
    cfg = load_config(overrides=[*RAY2, f"{ROLLOUT}.tensor_model_parallel_size=2"])
    with pytest.raises(ConfigError) as info:
        check_model_fits_rollout(cfg, tmp_path)
    message = str(info.value)
    assert info.value.key == f"{ROLLOUT}.tensor_model_parallel_size"
    assert "does not divide num_attention_heads (9)" in message and "num_key_value_heads (3)" in message
    assert "valid sizes for this model and world: [1]" in message
    check_model_fits_rollout(load_config(overrides=RAY2), tmp_path)  # TP=1 always fits


def test_tp_needs_a_rollout_engine_that_splits_the_model() -> None:
    error = _error([*RAY2, f"{ROLLOUT}.name=sglang", f"{ROLLOUT}.tensor_model_parallel_size=2", "trainer.device=cuda"])
    assert any("does not declare tensor parallelism" in i.message for i in error.issues), str(error)
