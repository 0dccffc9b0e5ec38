"""The tensor-parallel group of one SGLang engine inside the trainer's torch.distributed world.

Layout (verl's hybrid engine, ``rollout.tensor_model_parallel_size = T`` in a world of ``W`` ranks): ranks
``[k*T, (k+1)*T)`` are one rollout replica. SGLang runs a TP engine as ``T`` scheduler processes of its own,
which ``sglang.Engine(tp_size=T, base_gpu_id=g)`` spawns on GPUs ``g .. g+T-1``; so the group's first rank (the
leader) builds the one ``sglang.Engine`` and drives it, as verl's ``ServerAdapter`` only lets the TP leader talk
to its server. The other ranks take part in the weight sync (each packs its copy on its own GPU, the leader
gathers one payload per TP rank, the way SGLang's ``weight_sync/utils.py`` does) and receive the leader's
generations. The object collectives run on a gloo group of the same ranks (CPU objects, any device backend).
"""

from __future__ import annotations

from typing import Any

import attrs


@attrs.frozen
class TPGroup:
    """One engine's ranks.

    Attributes:
        world: ranks in the trainer's world (1 without torch.distributed).
        rank: this process's rank.
        tp: ranks per engine (``rollout.tensor_model_parallel_size``).
        group: the gloo process group of this engine's ranks (None when ``tp == 1``).
    """

    world: int
    rank: int
    tp: int
    group: Any = None

    @property
    def leader_rank(self) -> int:
        """Global rank of the group's first rank (the one that owns the ``sglang.Engine``)."""
        return self.rank - self.rank % self.tp

    @property
    def is_leader(self) -> bool:
        """Whether this rank owns the group's ``sglang.Engine``."""
        return self.rank % self.tp == 0

    def gather(self, obj: Any) -> list[Any] | None:
        """``obj`` of every rank of the group, in rank order, on the leader (None elsewhere)."""
        if self.tp == 1:
            return [obj]
        import torch.distributed as dist

        out: list[Any] | None = [None] * self.tp if self.is_leader else None
        dist.gather_object(obj, out, dst=self.leader_rank, group=self.group)
        return out

    def broadcast(self, obj: Any) -> Any:
        """The leader's ``obj`` on every rank of the group."""
        if self.tp == 1:
            return obj
        import torch.distributed as dist

        box = [obj if self.is_leader else None]
        dist.broadcast_object_list(box, src=self.leader_rank, group=self.group)
        return box[0]


def make_tp_group(tp: int) -> TPGroup:
    """This process's :class:`TPGroup` for TP size ``tp`` (collective: every rank of the world calls it, in the
    same order, because ``new_group`` is).

    Raises:
        ValueError: ``tp`` does not divide the world, or ``tp > 1`` without a torch.distributed world of that size,
            naming the valid sizes.
    """
    import torch.distributed as dist

    from verl.engines.weight_sync.layout import TP_KEY, divisors

    initialized = dist.is_available() and dist.is_initialized()
    world = dist.get_world_size() if initialized else 1
    rank = dist.get_rank() if initialized else 0
    if tp < 1 or world % tp:
        raise ValueError(
            f"{TP_KEY}={tp}: the sglang rollout needs a torch.distributed world whose size is a multiple of it (this "
            f"process's world: {world} ranks; valid: {divisors(world)}); each TP group of the trainer's workers runs "
            "one SGLang engine (trainer.controller=ray, trainer.n_gpus_per_node x nnodes workers)"
        )
    if tp == 1:
        return TPGroup(world, rank, 1)
    mine = None
    for start in range(0, world, tp):
        group = dist.new_group(list(range(start, start + tp)), backend="gloo")
        if start <= rank < start + tp:
            mine = group
    return TPGroup(world, rank, tp, mine)
