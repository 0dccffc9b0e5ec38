"""Rollout placement checks (verl's ``RolloutMode``), tensor-parallel size and mode, run by ``validate_config``.

* ``rollout.mode=async`` (verl's server-based agent-loop rollout) is refused: it is not built yet, and
  accepting it would silently run the synchronous path;
* placement: ``hybrid`` needs ``rollout.nnodes = 0`` and the in-process ``colocated`` weight sync;
  ``colocated`` and ``standalone`` run the rollout as Ray actors (``trainer.controller=ray``) synced by
  ``broadcast``; ``standalone`` needs ``rollout.nnodes > 0``, ``colocated`` needs ``rollout.nnodes = 0`` (it
  uses the trainer's devices);
* ``rollout.tensor_model_parallel_size`` >= 1 and divides the rollout world size; the model-dependent
  checks (heads, key/value heads, vocabulary) run when the trainer loads the model config
  (:func:`verl.engines.weight_sync.layout.tensor_parallel_problems`).
"""

from __future__ import annotations

from verl.config.errors import IssueCollector
from verl.config.placement import rollout_placement, rollout_world_size
from verl.config.schema import RootConfig

ARR = "actor_rollout_ref"
TP_KEY = f"{ARR}.rollout.tensor_model_parallel_size"


def check_rollout(cfg: RootConfig, report: IssueCollector) -> None:
    """Add the rollout placement / mode / TP errors of a resolved config to ``report``."""
    rollout = cfg.actor_rollout_ref.rollout
    if rollout.mode == "async":
        report.error(
            f"{ARR}.rollout.mode",
            "=async (server-based rollout with agent loops) is not implemented yet; use mode=sync "
            "(generation inside the trainer's step, the only mode this version runs)",
        )
    if rollout.nnodes < 0 or rollout.n_gpus_per_node < 1:
        report.error(
            f"{ARR}.rollout.nnodes",
            f"({rollout.nnodes}) must be >= 0 and rollout.n_gpus_per_node ({rollout.n_gpus_per_node}) >= 1",
        )
        return
    placement = rollout_placement(cfg)
    backend_key = f"{ARR}.rollout.checkpoint_engine.backend"
    backend = rollout.checkpoint_engine.backend
    key = f"{ARR}.rollout.placement"
    if placement == "hybrid":
        if rollout.nnodes > 0:
            report.error(
                key,
                f"=hybrid runs the rollout on the trainer's workers, but rollout.nnodes={rollout.nnodes} asks for a "
                "pool of its own; set placement=standalone (or rollout.nnodes=0)",
            )
        if backend == "broadcast":
            report.error(
                backend_key,
                "=broadcast sends weights to rollout processes of their own; with placement=hybrid the rollout "
                f"lives in the trainer's processes: set {backend_key}=colocated",
            )
    else:
        if cfg.trainer.controller != "ray":
            report.error(
                key if rollout.nnodes == 0 else f"{ARR}.rollout.nnodes",
                f"placement={placement} runs the rollout in processes of its own, as Ray actors; set "
                "trainer.controller=ray (or placement=hybrid)",
            )
        if backend == "colocated":
            report.error(
                backend_key,
                "colocated hands weights over inside one process, but the rollout "
                f"(placement={placement}) lives in other processes; set {backend_key}=broadcast",
            )
        if placement == "standalone" and rollout.nnodes == 0:
            report.error(key, "=standalone needs devices of its own: set rollout.nnodes and rollout.n_gpus_per_node")
        if placement == "colocated" and rollout.nnodes > 0:
            report.error(
                key,
                f"=colocated shares the trainer's devices, but rollout.nnodes={rollout.nnodes} asks for others; "
                "set rollout.nnodes=0 (or placement=standalone)",
            )
    tp = rollout.tensor_model_parallel_size
    world = rollout_world_size(cfg)
    if tp < 1:
        report.error(TP_KEY, f"must be >= 1, got {tp}")
    elif world % tp:
        valid = [d for d in range(1, world + 1) if world % d == 0]
        report.error(
            TP_KEY,
            f"={tp} must divide the rollout world size {world} ({placement}: replicas x tensor-parallel size); "
            f"valid: {valid}",
        )
    else:
        per_node = rollout.n_gpus_per_node if placement == "standalone" else cfg.trainer.n_gpus_per_node
        if per_node % tp:
            report.warn(
                TP_KEY,
                f"={tp} does not divide the {per_node} workers per node: some tensor-parallel groups span machines, "
                "and every layer's all-reduce then crosses the network",
            )
