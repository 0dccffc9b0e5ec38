"""``async_training.*`` (one-step off-policy): verl's names, the built values, and the refused combinations."""

from __future__ import annotations

import pytest

from verl.config import ConfigError, load_config

STANDALONE = [
    "trainer.controller=ray",
    "actor_rollout_ref.rollout.nnodes=1",
    "actor_rollout_ref.rollout.n_gpus_per_node=1",
    "actor_rollout_ref.rollout.checkpoint_engine.backend=broadcast",
]


def _issues(overrides: list[str]) -> dict[str, str]:
    with pytest.raises(ConfigError) as info:
        load_config(overrides=overrides)
    return {issue.key: issue.message for issue in info.value.issues}


def test_defaults_keep_the_synchronous_loop() -> None:
    cfg = load_config()
    assert cfg.async_training.staleness_threshold == 0
    assert cfg.async_training.trigger_parameter_sync_step == 1


def test_staleness_one_with_a_standalone_pool_loads() -> None:
    cfg = load_config(overrides=[*STANDALONE, "async_training.staleness_threshold=1"])
    assert cfg.async_training.staleness_threshold == 1


@pytest.mark.parametrize("value", ["0.1", "0.5", "2"])
def test_values_other_than_zero_and_one_are_refused(value: str) -> None:
    issues = _issues([*STANDALONE, f"async_training.staleness_threshold={value}"])
    message = issues["async_training.staleness_threshold"]
    assert f"={float(value)} is not built" in message and "fully async rollouter" in message


def test_other_sync_schedules_are_refused() -> None:
    issues = _issues(
        [*STANDALONE, "async_training.staleness_threshold=1", "async_training.trigger_parameter_sync_step=4"]
    )
    assert "=4 is not built" in issues["async_training.trigger_parameter_sync_step"]


@pytest.mark.parametrize(
    "placement",
    [[], ["trainer.controller=ray", "actor_rollout_ref.rollout.placement=colocated"]],
    ids=["hybrid", "colocated"],
)
def test_staleness_needs_a_standalone_pool(placement: list[str]) -> None:
    message = _issues([*placement, "async_training.staleness_threshold=1"])["async_training.staleness_threshold"]
    assert "actor_rollout_ref.rollout.placement" in message and "rollout.nnodes" in message
    assert "cannot overlap training" in message


def test_filter_groups_and_remax_are_refused_with_the_reason() -> None:
    dapo = _issues(
        [
            *STANDALONE,
            "async_training.staleness_threshold=1",
            "algorithm.filter_groups.enable=true",
            "algorithm.filter_groups.metric=acc",
        ]
    )["async_training.staleness_threshold"]
    assert "algorithm.filter_groups.enable" in dapo and "cannot be generated ahead" in dapo
    remax = _issues([*STANDALONE, "async_training.staleness_threshold=1", "algorithm.adv_estimator=remax"])
    assert "greedy-baseline pass" in remax["async_training.staleness_threshold"]


def test_staleness_one_always_recomputes_the_old_log_probs() -> None:
    from verl.trainer.step import StepStages

    class Probe(StepStages):
        def __init__(self, cfg) -> None:
            self.config = cfg

    one_update = [*STANDALONE, "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
    on_policy = load_config(overrides=one_update)
    stale = load_config(overrides=[*one_update, "async_training.staleness_threshold=1"])
    # The same batch sizes: the synchronous loop reuses the update's forward, the stale rollout cannot.
    assert Probe(on_policy).old_log_prob_source() == "on_policy"
    assert Probe(stale).old_log_prob_source() == "recompute"
