"""verl's per-GPU batch keys count over data-parallel ranks: with megatron TP=2 on 2 workers there is one."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config

BASE = [
    "actor_rollout_ref.actor.strategy=megatron",
    "trainer.n_gpus_per_node=2",
    "data.train_batch_size=2",
    "actor_rollout_ref.rollout.n=1",
    "actor_rollout_ref.actor.ppo_mini_batch_size=2",
]


def test_tp2_on_two_workers_has_one_data_parallel_rank():
    # Per data-parallel rank the mini-batch is 2 sequences: a micro-batch of 2 fits (world size alone says 1).
    cfg = load_config(
        overrides=[
            *BASE,
            "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
            "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2",
        ]
    )
    assert cfg.actor_rollout_ref.actor.engine_kwargs["megatron"]["tensor_model_parallel_size"] == 2


def test_error_names_the_data_parallel_size():
    with pytest.raises(ConfigError, match=r"data-parallel size \(1 = 2 workers / 2 ranks per model replica\)"):
        load_config(
            overrides=[
                *BASE,
                "actor_rollout_ref.actor.megatron.tensor_model_parallel_size=2",
                "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=4",
            ]
        )


def test_tp1_counts_over_the_world():
    with pytest.raises(ConfigError, match=r"world size \(2\)"):
        load_config(overrides=[*BASE, "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"])
