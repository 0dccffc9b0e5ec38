"""Checks of ``async_training.*`` (one-step off-policy training), run by ``validate_config``.

Errors:
* ``staleness_threshold`` other than 0 or 1: verl's fractional values (and > 1) belong to its fully async
  rollouter, which streams samples through a message queue with partial rollouts; not built here;
* ``trigger_parameter_sync_step`` other than 1 (a sync every step is the only schedule built);
* ``staleness_threshold=1`` without a standalone rollout pool (``actor_rollout_ref.rollout.placement`` /
  ``rollout.nnodes``): a hybrid or colocated rollout shares the trainer's devices, so there is nothing to overlap;
* ``staleness_threshold=1`` with DAPO's ``algorithm.filter_groups.enable`` (a step's later generation rounds
  depend on the rewards of its earlier ones, so the next step's batch cannot be generated ahead) or ReMax
  (``algorithm.adv_estimator=remax``: its greedy baseline pass calls the rollout pool inside the step, behind
  the next step's generation).
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.placement import rollout_placement
from verl.config.schema import RootConfig

AT = "async_training"
STALENESS = f"{AT}.staleness_threshold"


def check_async_training(cfg: RootConfig, report: IssueCollector) -> None:
    """Record the problems listed in the module docstring in ``report``."""
    at = cfg.async_training
    staleness = at.staleness_threshold
    if staleness not in (0, 1):
        report.error(
            STALENESS,
            f"={staleness} is not built: 0 (the synchronous loop) or 1 (one-step off-policy: the next step's "
            "batch is generated while this step trains). verl's fractional and larger values need its fully "
            "async rollouter (a sample queue with partial rollouts), which is not part of this trainer",
        )
        return
    if at.trigger_parameter_sync_step != 1:
        report.error(
            f"{AT}.trigger_parameter_sync_step",
            f"={at.trigger_parameter_sync_step} is not built: the weights go to the rollout pool once per step "
            "(1); verl's larger values belong to its fully async trainer",
        )
    if staleness == 0:
        return
    placement = rollout_placement(cfg)
    if placement != "standalone":
        report.error(
            STALENESS,
            f"=1 needs a standalone rollout pool, but actor_rollout_ref.rollout.placement resolves to {placement!r}: "
            "a hybrid or colocated rollout shares the trainer's devices, so generation cannot overlap training. "
            "Set actor_rollout_ref.rollout.placement=standalone with rollout.nnodes / rollout.n_gpus_per_node "
            f"(and trainer.controller=ray), or {STALENESS}=0",
        )
    if cfg.algorithm.filter_groups.enable:
        report.error(
            STALENESS,
            "=1 cannot be combined with algorithm.filter_groups.enable (DAPO dynamic sampling): a step's further "
            "generation rounds depend on the rewards of its earlier ones, so the next batch cannot be generated "
            f"ahead. Turn one of them off ({STALENESS}=0 or algorithm.filter_groups.enable=false)",
        )
    if cfg.algorithm.adv_estimator == "remax":
        report.error(
            STALENESS,
            "=1 cannot be combined with algorithm.adv_estimator=remax: its greedy-baseline pass calls the rollout "
            "pool inside the step, where it would wait behind the next step's generation. Use another estimator "
            f"or {STALENESS}=0",
        )
