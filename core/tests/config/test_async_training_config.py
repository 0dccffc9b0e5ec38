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


ONE_UPDATE = [*STANDALONE, "data.train_batch_size=4", "actor_rollout_ref.actor.ppo_mini_batch_size=4"]
AC = "algorithm.rollout_correction"


@pytest.mark.parametrize(
    ("extra", "expected"),
    [
        ([], "on_policy"),  # one epoch, one mini-batch: the update's own forward is the old policy's
        (["actor_rollout_ref.actor.reuse_on_policy_log_prob=false"], "recompute"),
        (
            ["actor_rollout_ref.actor.ppo_mini_batch_size=2", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=2"],
            "recompute",
        ),
        (["actor_rollout_ref.actor.ppo_epochs=2"], "recompute"),
        (["algorithm.use_kl_in_reward=true"], "recompute"),  # the in-reward KL reads them before the update
        ([f"{AC}.rollout_is=token"], "recompute"),  # compares the old policy with the stale rollout's
        ([f"{AC}.rollout_rs=token_k1", f"{AC}.rollout_rs_threshold=0.5_2.0"], "recompute"),
        ([f"{AC}.bypass_mode=true"], "rollout"),
    ],
)
def test_staleness_one_takes_the_old_log_probs_as_the_synchronous_loop(extra: list[str], expected: str) -> None:
    from verl.trainer.step import StepStages

    class Probe(StepStages):
        def __init__(self, cfg) -> None:
            self.config = cfg

    sync = Probe(load_config(overrides=[*ONE_UPDATE, *extra])).old_log_prob_source()
    stale = Probe(load_config(overrides=[*ONE_UPDATE, *extra, "async_training.staleness_threshold=1"]))
    assert sync == expected
    assert stale.old_log_prob_source() == expected
