"""Where the rollout runs relative to the trainer (verl's ``RolloutMode``), and the world sizes that follow.

* ``hybrid``: the rollout engine lives in the trainer's worker processes (``trainer.nnodes x
  trainer.n_gpus_per_node`` ranks); the trainer switches the devices between generation and training every
  step and syncs weights in place (``checkpoint_engine.backend=colocated``).
* ``colocated``: the rollout has its own processes on the trainer's devices (as many ranks); weights are
  broadcast through host memory (``backend=broadcast``), and it sleeps while the trainer trains.
* ``standalone``: the rollout has devices of its own (``rollout.nnodes x rollout.n_gpus_per_node``); weights
  are broadcast; it never sleeps.
"""

from __future__ import annotations

from typing import Any


def rollout_placement(cfg: Any) -> str:
    """The resolved ``actor_rollout_ref.rollout.placement`` (null: ``standalone`` when ``rollout.nnodes > 0``)."""
    rollout = cfg.actor_rollout_ref.rollout
    value = getattr(rollout, "placement", None)
    if value is None:
        return "standalone" if rollout.nnodes > 0 else "hybrid"
    return str(value)


def trainer_world_size(cfg: Any) -> int:
    """Worker processes of the trainer (actor) pool: ``trainer.nnodes x trainer.n_gpus_per_node``."""
    return int(cfg.trainer.nnodes) * int(cfg.trainer.n_gpus_per_node)


def rollout_world_size(cfg: Any) -> int:
    """Ranks of the rollout world: the trainer's (hybrid, colocated) or the rollout pool's (standalone)."""
    if rollout_placement(cfg) == "standalone":
        rollout = cfg.actor_rollout_ref.rollout
        return int(rollout.nnodes) * int(rollout.n_gpus_per_node)
    return trainer_world_size(cfg)


def separate_rollout_pool(cfg: Any) -> bool:
    """True when the rollout runs in processes of its own (colocated or standalone)."""
    return rollout_placement(cfg) != "hybrid"
