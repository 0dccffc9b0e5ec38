"""Worker groups for each rollout placement (verl's ``RolloutMode``; :mod:`verl.config.placement`).

* ``hybrid``: one group of ``ActorRolloutRefWorker(role="actor_rollout_ref")``; the rollout engine lives in
  the trainer's processes (in-process with ``trainer.controller=local``).
* ``colocated``: two groups on *one* resource pool, a bundle per device shared by an actor(+ref) worker and a
  rollout worker (``max_colocate_count=2``, half a device and half a CPU slot each); weights are broadcast
  over a gloo group through host memory (NCCL cannot join two processes on one GPU).
* ``standalone``: the actor(+ref) pool and a rollout pool of ``rollout.nnodes x rollout.n_gpus_per_node``
  workers on other devices; weights broadcast with the platform's backend.
"""

from __future__ import annotations

from typing import Any

from verl.config.placement import rollout_placement


def build_worker_groups(cfg: Any, platform: Any) -> tuple[Any, Any]:
    """``(actor group, rollout group)`` for ``cfg``: the same object in hybrid placement.

    ``controller=local``: one in-process worker. ``controller=ray``: Ray actors in resource pools of the
    platform's resource (one CPU slot each on CPU), Ray started lazily or joined through
    ``ray_kwargs.ray_init.address`` / ``RAY_ADDRESS``.
    """
    from verl.controller import ClassWithInitArgs, LocalWorkerGroup
    from verl.workers.actor_rollout_ref import ActorRolloutRefWorker

    placement = rollout_placement(cfg)
    if cfg.trainer.controller == "local":
        group = LocalWorkerGroup(ClassWithInitArgs(ActorRolloutRefWorker, cfg, "actor_rollout_ref"))
        return group, group
    from verl.controller.ray import RayResourcePool, RayWorkerGroup, init_ray

    init_ray(dict(cfg.ray_kwargs.ray_init))
    trainer = cfg.trainer
    colocated = placement == "colocated"
    pool = RayResourcePool(
        [trainer.n_gpus_per_node] * trainer.nnodes,
        platform=platform,
        name_prefix="verl_actor",
        max_colocate_count=2 if colocated else 1,
        cpus_per_worker=0.5 if colocated else 1.0,
    )
    if placement == "hybrid":
        worker = ClassWithInitArgs(ActorRolloutRefWorker, cfg, "actor_rollout_ref")
        group = RayWorkerGroup(pool, worker, name_prefix="actor_rollout_ref", platform=platform)
        return group, group
    actor = RayWorkerGroup(pool, ClassWithInitArgs(ActorRolloutRefWorker, cfg, "actor_ref"), name_prefix="actor_ref")
    rollout = cfg.actor_rollout_ref.rollout
    rollout_pool = (
        pool
        if colocated
        else RayResourcePool([rollout.n_gpus_per_node] * rollout.nnodes, platform=platform, name_prefix="verl_rollout")
    )
    try:
        rollout_wg = RayWorkerGroup(
            rollout_pool, ClassWithInitArgs(ActorRolloutRefWorker, cfg, "rollout"), name_prefix="rollout"
        )
    except BaseException:
        actor.shutdown()
        raise
    return actor, rollout_wg


def init_weight_sync_group(actor_wg: Any, rollout_wg: Any) -> None:
    """Join the actor pool's rank 0 and every rollout worker in one broadcast group (both pools at once).

    The group listens on loopback when both pools run on one node, on the sender's node address otherwise."""
    spans_nodes = len(actor_wg.node_ids | rollout_wg.node_ids) > 1
    addr, port = actor_wg.weight_sync_address(spans_nodes)
    world = rollout_wg.world_size
    # Both pools must join at once (the rendezvous blocks), hence the non-blocking calls.
    for future in [g.init_weight_sync(addr, port, world) for g in (actor_wg, rollout_wg)]:
        future.get()


def sync_weights(actor_wg: Any, rollout_wg: Any) -> list[dict[str, float]]:
    """Actor weights -> rollout engines; returns every rank's ``weight_sync/*`` metrics.

    Hybrid (one group): the in-process hand-over / resharding on every rank. Otherwise both pools at once:
    the actor pool sends, the rollout pool receives.
    """
    if rollout_wg is actor_wg:
        return list(actor_wg.update_weights())
    results: list[dict[str, float]] = []
    for future in [g.sync_weights() for g in (actor_wg, rollout_wg)]:
        results.extend(future.get())
    return results
